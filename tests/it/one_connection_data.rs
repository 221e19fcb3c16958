//! Past `--max-connections`, a service whose dependents are handed its addresses is read at
//! its step too (issue 42): the three tiers of the compare harness (db → api → web, web needing
//! api `healthy="50%" addressable="all"`), 40 hosts under `--max-connections 8`. Counted from
//! the hosts' sshd logs, every db and api host is connected once per `apply`; from the hooks'
//! own logs, web starts only once half the api hosts have, and when api's port changes, no
//! web host lists an api host at its old port once that host stops.

use crate::support;

use std::path::PathBuf;
use support::fleet::{Fleet, FleetHost};

const DB: usize = 6;
const API: usize = 24;
const WEB: usize = 10;

fn fleet() -> Fleet {
    let mut hosts = Vec::new();
    for (prefix, class, n) in [("d", "db", DB), ("a", "app", API), ("w", "web", WEB)] {
        for i in 1..=n {
            hosts.push(FleetHost::new(&format!("{prefix}{i:02}"), class));
        }
    }
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// site.kdl at `version`, api on `port`. Each hook appends `<service> <hook> <old> <new>
/// <seconds.nanos>` to the host's /var/lib/hooks; web's also its upstreams file (rendered from
/// the api pool it is given, `address:port` a line), after a `|`.
fn site(fleet: &Fleet, version: &str, port: u16) -> PathBuf {
    let hook = |name: &str, hook: &str, pool: bool| {
        let pool = if pool {
            " |$(tr '\\n' ' ' < /var/lib/upstreams)"
        } else {
            ""
        };
        format!(
            "    {hook} #\"echo \"{name} {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION $(date +%s.%N){pool}\" >> /var/lib/hooks\"#\n"
        )
    };
    let hooks = |name: &str, pool: bool, reload: bool| {
        let mut text: String = ["stop", "install", "start"]
            .iter()
            .map(|h| hook(name, h, pool))
            .collect();
        if reload {
            text.push_str(&hook(name, "reload", pool));
        }
        text
    };
    let text = format!(
        "site \"tiers\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
         class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\nclass \"web\" {{ service \"web\" }}\n\
         service \"db\" {{\n{}}}\n\
         service \"api\" {{\n    port {port}\n    needs \"db\"\n{}}}\n\
         service \"web\" {{\n    needs \"api\" healthy=\"50%\" addressable=\"all\"\n    file \"upstreams.j2\" to=\"/var/lib/upstreams\" template=#true\n{}}}\n",
        hooks("db", false, false),
        hooks("api", false, false),
        hooks("web", true, true),
    );
    // web's upstreams, as the book's example renders them: `address:port` a line.
    std::fs::write(
        fleet.dir.join("upstreams.j2"),
        "{% for h in needs.api -%}\n{{ h.address }}:{{ h.port }}\n{% endfor -%}\n",
    )
    .expect("write upstreams.j2");
    fleet.write_site(
        &text,
        "policy \"default\" { batch \"30%\"; max-failed 0 }\n",
    )
}

/// `deploy apply SITE --yes --max-connections 8`, which must exit 0: what it said, and the
/// logins each host's sshd accepted during it.
fn apply(fleet: &Fleet, site: &std::path::Path) -> (String, Vec<(String, usize)>) {
    let before = fleet.logins();
    let mut cmd = support::cli::deploy_in(&fleet.dir);
    cmd.args(["apply", site.to_str().expect("utf-8"), "--yes"])
        .args(["--max-connections", "8"]);
    let (code, stdout, stderr) = support::cli::outcome(&mut cmd);
    let out = format!("{stdout}\n{stderr}");
    assert_eq!(code, Some(0), "{out}");
    let logins = fleet
        .names()
        .into_iter()
        .map(String::from)
        .zip(fleet.logins_since(&before))
        .collect();
    (out, logins)
}

/// Every db and api host connected exactly once; every web host at most twice (read before
/// the run, and again at its step when its link was not kept).
fn once(out: &str, logins: &[(String, usize)]) {
    for (host, n) in logins {
        match &host[..1] {
            "w" => assert!((1..=2).contains(n), "{host}: {logins:?}\n{out}"),
            _ => assert_eq!(*n, 1, "{host}: {logins:?}\n{out}"),
        }
    }
}

/// A hook line: service, hook, old, new, time, and web's pool.
struct Line {
    service: String,
    hook: String,
    new: String,
    at: f64,
    pool: Vec<String>,
}

fn lines(fleet: &Fleet, host: &str) -> Vec<Line> {
    fleet
        .lines(host, "var-lib/hooks")
        .iter()
        .filter_map(|l| {
            let (head, pool) = l.split_once(" |").unwrap_or((l, ""));
            let words: Vec<&str> = head.split(' ').collect();
            let [service, hook, _, new, at] = words[..] else {
                return None;
            };
            Some(Line {
                service: service.into(),
                hook: hook.into(),
                new: new.into(),
                at: at.parse().ok()?,
                pool: pool.split_whitespace().map(String::from).collect(),
            })
        })
        .collect()
}

fn hosts<'a>(fleet: &'a Fleet, prefix: &str) -> Vec<&'a str> {
    fleet
        .names()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Each web host's last pool, sorted.
fn last_pools(fleet: &Fleet) -> Vec<Vec<String>> {
    hosts(fleet, "w")
        .iter()
        .map(|w| {
            let mut pool = lines(fleet, w)
                .into_iter()
                .rev()
                .find(|l| l.service == "web" && !l.pool.is_empty())
                .map(|l| l.pool)
                .unwrap_or_default();
            pool.sort();
            pool
        })
        .collect()
}

#[test]
fn past_the_cap_hosts_handed_to_a_dependent_are_read_at_their_step_and_never_listed_stopped() {
    let fleet = fleet();
    let apis = hosts(&fleet, "a");
    let pool_at = |port: u16| {
        let mut pool: Vec<String> = apis
            .iter()
            .map(|a| format!("{}:{port}", fleet.address(a)))
            .collect();
        pool.sort();
        pool
    };

    // A fresh fleet: every web host lists every api host.
    let (out, logins) = apply(&fleet, &site(&fleet, "1.0", 9000));
    once(&out, &logins);
    assert!(
        last_pools(&fleet).iter().all(|p| *p == pool_at(9000)),
        "{out}"
    );

    // An upgrade: web's first step starts once half the api hosts have started 2.0.
    let (out, logins) = apply(&fleet, &site(&fleet, "2.0", 9000));
    once(&out, &logins);
    let api_started: Vec<f64> = apis
        .iter()
        .flat_map(|a| lines(&fleet, a))
        .filter(|l| l.service == "api" && l.hook == "start" && l.new == "2.0")
        .map(|l| l.at)
        .collect();
    assert_eq!(api_started.len(), API, "{out}");
    let web_first = hosts(&fleet, "w")
        .iter()
        .flat_map(|w| lines(&fleet, w))
        .filter(|l| l.service == "web" && l.new == "2.0")
        .map(|l| l.at)
        .fold(f64::INFINITY, f64::min);
    let before_web = api_started.iter().filter(|t| **t < web_first).count();
    assert!(
        before_web * 2 >= API,
        "web started with {before_web} of {API} api hosts at 2.0\n{out}"
    );

    // api moves to port 9001: before each api host stops, every web host has dropped it (its
    // last pool before that moment does not list it at 9000); at the end, all at 9001. Each
    // wave's drops and lists again are reconfigures of every web host, each connected anew
    // (their links are not kept over the cap), which may take a kept link's room: the
    // connection counts are not this run's point.
    let (out, _) = apply(&fleet, &site(&fleet, "2.0", 9001));
    let webs: Vec<Vec<Line>> = hosts(&fleet, "w")
        .iter()
        .map(|w| lines(&fleet, w))
        .collect();
    let mut stops = 0;
    for a in &apis {
        let old = format!("{}:9000", fleet.address(a));
        // Its stop of this run: the last one.
        let Some(stop) = lines(&fleet, a)
            .into_iter()
            .rev()
            .find(|l| l.service == "api" && l.hook == "stop")
        else {
            continue;
        };
        stops += 1;
        for (w, web) in hosts(&fleet, "w").iter().zip(&webs) {
            let listed = web
                .iter()
                .rev()
                .find(|l| l.at < stop.at && !l.pool.is_empty())
                .is_some_and(|l| l.pool.contains(&old));
            assert!(!listed, "{w} listed {a} at {old} when it stopped\n{out}");
        }
    }
    assert_eq!(stops, API, "every api host switched over: {out}");
    // Every upstream web was ever given is an api host's address and a port.
    let addresses: Vec<String> = apis.iter().map(|a| fleet.address(a)).collect();
    for (w, web) in hosts(&fleet, "w").iter().zip(&webs) {
        for l in web {
            for member in &l.pool {
                let ok = member.rsplit_once(':').is_some_and(|(address, port)| {
                    addresses.iter().any(|a| a == address) && port.parse::<u16>().is_ok()
                });
                assert!(ok, "{w}: upstream {member:?} in {:?}\n{out}", l.pool);
            }
        }
    }
    assert!(
        last_pools(&fleet).iter().all(|p| *p == pool_at(9001)),
        "{out}"
    );
}
