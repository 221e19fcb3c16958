//! One SSH connection per host per run, also past `--max-connections` (issue 42): a fleet of
//! 60 hosts in three tiers (db → api → web, runtime needs) applied with `--max-connections 16`
//! (standing in for 1,000 hosts under the default 256). Counted from the hosts' own sshd logs,
//! every host is connected exactly once per `apply`, on a fresh fleet and on an upgrade; from
//! the hooks' own logs, each host ran what an uncapped run runs, each tier after the one it
//! needs; `deploy plan` past the cap reads every host once.

use crate::support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::fleet::{Fleet, FleetHost};

/// Hosts per tier.
const TIER: usize = 20;

/// d01…d20 run `db`, a01…a20 `api` (needs db), w01…w20 `web` (needs api).
fn fleet() -> Fleet {
    let mut hosts = Vec::new();
    for (prefix, class) in [("d", "db"), ("a", "app"), ("w", "web")] {
        for i in 1..=TIER {
            hosts.push(FleetHost::new(&format!("{prefix}{i:02}"), class));
        }
    }
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// Writes site.kdl at `version` (every service, 30 % at a time); returns its path. Each hook
/// appends `<service> <hook> <old> <new> <seconds.nanos>` to the host's /var/lib/hooks.
fn site(fleet: &Fleet, version: &str) -> PathBuf {
    let service = |name: &str, needs: &str| {
        let hook = |hook: &str| {
            format!(
                "    {hook} #\"echo \"{name} {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION $(date +%s.%N)\" >> /var/lib/hooks\"#\n"
            )
        };
        format!(
            "service \"{name}\" {{\n{needs}{}{}{}}}\n",
            hook("stop"),
            hook("install"),
            hook("start")
        )
    };
    let text = format!(
        "site \"tiers\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
         class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\nclass \"web\" {{ service \"web\" }}\n{}{}{}",
        service("db", ""),
        service("api", "    needs \"db\"\n"),
        service("web", "    needs \"api\"\n"),
    );
    fleet.write_site(
        &text,
        "policy \"default\" { batch \"30%\"; max-failed 0 }\n",
    )
}

/// `deploy ARGS… --max-connections 16` in the fleet's directory: exit code, stdout, stderr.
fn deploy(fleet: &Fleet, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = support::cli::deploy_in(&fleet.dir);
    cmd.args(args).args(["--max-connections", "16"]);
    support::cli::outcome(&mut cmd)
}

/// The hooks' lines on `host`, without their times: `<service> <hook> <old> <new>`.
fn hooks(fleet: &Fleet, host: &str) -> Vec<String> {
    fleet
        .lines(host, "var-lib/hooks")
        .iter()
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l.as_str(), |(h, _)| h)
                .to_string()
        })
        .collect()
}

fn tier<'a>(fleet: &'a Fleet, prefix: &str) -> Vec<&'a str> {
    fleet
        .names()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Each host's version of each of its services, from its state file.
fn versions(fleet: &Fleet) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for host in fleet.names() {
        let text = std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
            .unwrap_or_default();
        let state: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if let Some(services) = state["services"].as_object() {
            for (name, record) in services {
                out.push((
                    format!("{host}/{name}"),
                    record["version"].as_str().unwrap_or("?").to_string(),
                ));
            }
        }
    }
    out
}

/// `deploy apply SITE --yes`, which must exit 0 having logged in to every host exactly once
/// (from the hosts' sshd logs); returns what it said.
fn apply_once(fleet: &Fleet, site: &Path) -> String {
    let before = fleet.logins();
    let (code, stdout, stderr) = deploy(fleet, &["apply", site.to_str().expect("utf-8"), "--yes"]);
    let out = format!("{stdout}\n{stderr}");
    assert_eq!(code, Some(0), "{out}");
    let logins = fleet.logins_since(&before);
    let not_once: Vec<(&str, &usize)> = fleet
        .names()
        .into_iter()
        .zip(&logins)
        .filter(|(_, &n)| n != 1)
        .collect();
    assert!(
        not_once.is_empty(),
        "connections per host not 1: {not_once:?}\n{out}"
    );
    out
}

#[test]
fn past_the_cap_every_host_is_connected_once_per_apply_and_tiers_keep_their_order() {
    let fleet = fleet();
    let names: Vec<String> = fleet.names().iter().map(|n| n.to_string()).collect();
    let service_of = |host: &str| match &host[..1] {
        "d" => "db",
        "a" => "api",
        _ => "web",
    };

    // A fresh fleet.
    let site_1 = site(&fleet, "1.0");
    let out = apply_once(&fleet, &site_1);
    for host in &names {
        let s = service_of(host);
        assert_eq!(
            hooks(&fleet, host),
            [format!("{s} install - 1.0"), format!("{s} start - 1.0")],
            "{host}\n{out}"
        );
    }
    assert!(versions(&fleet).iter().all(|(_, v)| v == "1.0"));

    // An upgrade: the same, each tier's first hook after the last of the tier it needs.
    let site_2 = site(&fleet, "2.0");
    let out = apply_once(&fleet, &site_2);
    for host in &names {
        let s = service_of(host);
        assert_eq!(
            hooks(&fleet, host)[2..],
            [
                format!("{s} stop 1.0 2.0"),
                format!("{s} install 1.0 2.0"),
                format!("{s} start 1.0 2.0")
            ],
            "{host}\n{out}"
        );
    }
    let (d, a, w) = (tier(&fleet, "d"), tier(&fleet, "a"), tier(&fleet, "w"));
    // The first and last time of the upgrade's hook lines of `service` on `hosts`.
    let upgraded = |hosts: &[&str], service: &str| {
        let times: Vec<f64> = hosts
            .iter()
            .flat_map(|h| fleet.lines(h, "var-lib/hooks"))
            .filter(|l| l.starts_with(&format!("{service} ")) && l.contains(" 1.0 2.0 "))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, t)| t.parse::<f64>().ok()))
            .collect();
        (
            times.iter().copied().fold(f64::INFINITY, f64::min),
            times.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let (db, api, web) = (upgraded(&d, "db"), upgraded(&a, "api"), upgraded(&w, "web"));
    assert!(db.1 < api.0, "api started before db ended: {db:?} {api:?}");
    assert!(
        api.1 < web.0,
        "web started before api ended: {api:?} {web:?}"
    );
    assert!(versions(&fleet).iter().all(|(_, v)| v == "2.0"));
    for host in &names {
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }

    // Nothing to change: still one connection each.
    apply_once(&fleet, &site_2);

    // `deploy plan` past the cap reads every host, once: each host's step is planned from
    // what it runs (the site file is rewritten in place, at 3.0).
    let site_3 = site(&fleet, "3.0");
    let before = fleet.logins();
    let (code, stdout, stderr) = deploy(&fleet, &["plan", site_3.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("db → 3.0"), "{stdout}");
    assert!(stdout.contains("2.0 → 3.0: w19, w20"), "{stdout}");
    assert_eq!(
        fleet.logins_since(&before),
        vec![1; names.len()],
        "{stdout}"
    );
}

/// Two services on every host, `api` needing `sidecar` at runtime, 6 hosts under
/// `--max-connections 4`: both are read at their steps, api's after sidecar's on each host
/// (hook times), each host connected once; then `--only api`: hosts whose sidecar is left out
/// of the run are read before it (sidecar counts healthy from what was read), and api
/// upgrades everywhere instead of waiting for a sidecar that has no step.
#[test]
fn a_service_needed_on_the_same_hosts_comes_first_and_only_leaves_it_out() {
    let hosts: Vec<FleetHost> = (1..=6)
        .map(|i| FleetHost::new(&format!("h{i}"), "app"))
        .collect();
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    let write = |api: &str| {
        let hook = |name: &str, hook: &str| {
            format!(
                "    {hook} #\"echo \"{name} {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION $(date +%s.%N)\" >> /var/lib/hooks\"#\n"
            )
        };
        let text = format!(
            "site \"pair\" {{\n    version \"1.0\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
             class \"app\" {{ service \"sidecar\"; service \"api\" }}\n\
             service \"sidecar\" {{\n{}}}\n\
             service \"api\" {{\n    version \"{api}\"\n    needs \"sidecar\"\n{}}}\n",
            hook("sidecar", "start"),
            hook("api", "start"),
        );
        fleet.write_site(
            &text,
            "policy \"default\" { batch \"50%\"; max-failed 0 }\n",
        )
    };
    let site = write("1.0");
    let out = apply_once(&fleet, &site);
    for host in fleet.names() {
        let lines = fleet.lines(host, "var-lib/hooks");
        let time = |s: &str| {
            lines
                .iter()
                .find(|l| l.starts_with(s))
                .and_then(|l| l.rsplit_once(' '))
                .and_then(|(_, t)| t.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{host}: no {s} in {lines:?}\n{out}"))
        };
        assert!(
            time("sidecar start") < time("api start"),
            "{host}: {lines:?}"
        );
    }

    // api alone, to 2.0.
    let site = write("2.0");
    let (code, stdout, stderr) = deploy(
        &fleet,
        &[
            "apply",
            site.to_str().expect("utf-8"),
            "--yes",
            "--only",
            "api",
        ],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for (host, version) in versions(&fleet) {
        let want = if host.ends_with("/api") { "2.0" } else { "1.0" };
        assert_eq!(version, want, "{host}\n{stdout}\n{stderr}");
    }
}
