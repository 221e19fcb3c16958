//! A second controller takes the site's etcd lock while the first is cut off from etcd (its
//! etcd traffic goes through a relay that stops forwarding, `tests/support/relay.rs`) but
//! still reaches its hosts: with `--break-lock` (it revokes the first's lease at once, breaks
//! its host locks and ends its hooks) and without (it waits for the lease to lapse and the
//! host locks to be given back). Asserted from what the hosts record (every hook's start and
//! end, both controllers', by the hosts' clock; their fence files) and from etcd's revision
//! history (every write ever made under the site's prefix, read with a watch from revision 1):
//! no two controllers ever run hooks on one host at once, the first writes nothing to etcd
//! once the second holds the lock, the store never says a host reached a version its hooks
//! did not, and no host's fencing token ever goes back.
#![cfg(feature = "etcd")]

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::relay::Relay;

const PREFIX: &str = "/drover-test";
const SITE: &str = "shared";
const HOSTS: [&str; 4] = ["app1", "app2", "app3", "app4"];

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A hook that logs `start <version> <hook> <ns>` and `end <version> <hook> <ns> [killed]` in
/// the host's `/var/lib/hooklog` (a `TERM` trap logs its end when it is ended), sleeping
/// `seconds` between.
fn logged(hook: &str, seconds: &str) -> String {
    format!(
        r####"trap 'echo "end $DEPLOY_NEW_VERSION {hook} $(date +%s%N) killed" >> /var/lib/hooklog; exit 143' TERM; echo "start $DEPLOY_NEW_VERSION {hook} $(date +%s%N)" >> /var/lib/hooklog; sleep {seconds} & wait $!; r=$?; echo "end $DEPLOY_NEW_VERSION {hook} $(date +%s%N)" >> /var/lib/hooklog; exit $r"####
    )
}

/// The site at `version` into `dir`, on the fleet's platform with the store at `endpoints`
/// (`lock-ttl="3s"`), batch 1: each step `stop`, `install` (a second long), `start`.
fn write_site(fleet: &Fleet, dir: &Path, endpoints: &str, version: &str) {
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let store =
        format!("store \"etcd\" endpoints=\"{endpoints}\" prefix=\"{PREFIX}\" lock-ttl=\"3s\"");
    let text = text.replacen(
        "platform \"fleet\" {\n",
        &format!("platform \"fleet\" {{\n    {store}\n"),
        1,
    );
    std::fs::write(dir.join("platform.kdl"), text).expect("platform");
    std::fs::write(
        dir.join("policy.kdl"),
        "policy \"default\" { batch 1; max-failed 10; }\n",
    )
    .expect("policy");
    let site = format!(
        r####"site "{SITE}" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{}"# timeout="30s"
    install #"{}"# timeout="30s"
    start #"{}"# timeout="30s"
}}
"####,
        logged("stop", "0.1"),
        logged("install", "1"),
        logged("start", "0.2"),
    );
    std::fs::write(dir.join("site.kdl"), site).expect("site");
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    support::cli::deploy_in(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start deploy")
}

/// `(version, hook, start ns, end ns)` of every hook `host` logged; a hook that never logged
/// its end (killed without its trap, or still running) ends at `u128::MAX`.
fn intervals(fleet: &Fleet, host: &str) -> Vec<(String, String, u128, u128)> {
    let mut open: Vec<(String, String, u128)> = Vec::new();
    let mut out = Vec::new();
    for line in fleet.lines(host, "var-lib/hooklog") {
        let parts: Vec<&str> = line.split(' ').collect();
        let [what, version, hook, at, ..] = parts[..] else {
            continue;
        };
        let at: u128 = at.parse().expect("a time");
        match what {
            "start" => open.push((version.into(), hook.into(), at)),
            "end" => {
                if let Some(i) = open.iter().position(|(v, h, _)| v == version && h == hook) {
                    let (v, h, start) = open.remove(i);
                    out.push((v, h, start, at));
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|(v, h, s)| (v, h, s, u128::MAX)));
    out
}

/// Whether `host` logged a `hook` of `version` that ended by itself (not ended by a signal).
fn completed(fleet: &Fleet, host: &str, version: &str, hook: &str) -> bool {
    fleet.lines(host, "var-lib/hooklog").iter().any(|l| {
        let p: Vec<&str> = l.split(' ').collect();
        p.len() == 4 && p[0] == "end" && p[1] == version && p[2] == hook
    })
}

fn recorded(fleet: &Fleet, host: &str) -> Option<String> {
    let path = fleet.host_root(host).join("var-lib/drover/state.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v["services"]["api"]["version"].as_str().map(str::to_string)
}

/// The fencing token `host` records (0 before any).
fn fence(fleet: &Fleet, host: &str) -> i64 {
    std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/fence"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// One change etcd recorded.
#[derive(Debug)]
struct Change {
    key: String,
    /// `None`: a delete.
    value: Option<serde_json::Value>,
    revision: i64,
    create_revision: i64,
}

/// Every change under `prefix` since revision 1, oldest first, from a watch.
fn history(endpoint: &str, prefix: &str) -> Vec<Change> {
    use etcd_client::{Client, EventType, GetOptions, WatchOptions};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = Client::connect([endpoint], None).await.expect("connect");
        let now = c
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("revision")
            .header()
            .map_or(0, |h| h.revision());
        let mut stream = c
            .watch(
                prefix,
                Some(WatchOptions::new().with_prefix().with_start_revision(1)),
            )
            .await
            .expect("watch");
        let mut out: Vec<Change> = Vec::new();
        while out.last().is_none_or(|c| c.revision < now) {
            let msg = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .expect("the watch answers")
                .expect("watch message");
            let Some(msg) = msg else { break };
            for e in msg.events() {
                let Some(kv) = e.kv() else { continue };
                out.push(Change {
                    key: kv.key_str().expect("utf-8 key").to_string(),
                    value: match e.event_type() {
                        EventType::Put => Some(serde_json::from_slice(kv.value()).unwrap_or(
                            serde_json::Value::String(
                                String::from_utf8_lossy(kv.value()).into_owned(),
                            ),
                        )),
                        EventType::Delete => None,
                    },
                    revision: kv.mod_revision(),
                    create_revision: kv.create_revision(),
                });
            }
            if msg.events().is_empty() && out.is_empty() && now <= 1 {
                break;
            }
        }
        out
    })
}

/// A's rollout of 2.0 through `relay`, cut off from etcd as it runs the `install` of its
/// second host; then B's rollout of 3.0 from another directory, straight to etcd, with or
/// without `--break-lock` (without, tried again while refused); A's relay healed once B runs
/// hooks, so that whatever A still sends reaches etcd.
fn takeover(break_lock: bool) {
    let etcd = Etcd::start();
    let endpoint = etcd.endpoints();
    let relay = Relay::start(etcd.client_addr(0));
    let fleet = Fleet::start(
        &HOSTS
            .iter()
            .map(|h| FleetHost::new(h, "app"))
            .collect::<Vec<_>>(),
    );
    write_site(&fleet, &fleet.dir, &relay.url(), "1.0");
    let out = support::cli::deploy_in(&fleet.dir)
        .args(["apply", "site.kdl", "--yes"])
        .output()
        .expect("run deploy");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Every host's fencing token, read over and over: it never goes back.
    let mut fences: HashMap<&str, i64> = HOSTS.iter().map(|h| (*h, fence(&fleet, h))).collect();
    let mut watch_fences = |fleet: &Fleet| {
        for h in HOSTS {
            let now = fence(fleet, h);
            let was = fences.insert(h, now).unwrap_or(0);
            assert!(
                now >= was,
                "{h}'s fencing token went back from {was} to {now}"
            );
        }
    };
    let wait = |what: &str, f: &mut dyn FnMut() -> bool, watch: &mut dyn FnMut()| {
        let until = Instant::now() + Duration::from_secs(40);
        while !f() {
            watch();
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    write_site(&fleet, &fleet.dir, &relay.url(), "2.0");
    let a = spawn(&fleet.dir, &["apply", "site.kdl", "--yes"]);
    let started = |v: &str, hook: &str| {
        HOSTS
            .iter()
            .filter(|h| {
                intervals(&fleet, h)
                    .iter()
                    .any(|(ver, k, _, _)| ver == v && k == hook)
            })
            .count()
    };
    wait(
        "A's second step",
        &mut || started("2.0", "install") >= 2,
        &mut || watch_fences(&fleet),
    );
    relay.cut();

    let other = tempfile::tempdir().expect("B's directory");
    write_site(&fleet, other.path(), &endpoint, "3.0");
    let mut args = vec!["apply", "site.kdl", "--yes"];
    if break_lock {
        args.push("--break-lock");
    }
    let mut refused = 0;
    let b = loop {
        let mut b = spawn(other.path(), &args);
        let mut healed = false;
        let until = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = b.try_wait().expect("B") {
                break status;
            }
            if !healed && started("3.0", "stop") > 0 {
                relay.heal();
                healed = true;
            }
            watch_fences(&fleet);
            assert!(Instant::now() < until, "B did not end");
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = b.wait_with_output().expect("B's output");
        if status.code() == Some(4) && !break_lock && refused < 200 {
            // Refused: A's lease has not lapsed yet, or its host locks are not given back.
            refused += 1;
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        break out;
    };
    relay.heal();
    assert_eq!(b.status.code(), Some(0), "B converges:\n{}", text(&b));
    let a = a.wait_with_output().expect("A ends");
    watch_fences(&fleet);
    assert_ne!(a.status.code(), Some(0), "A cannot converge:\n{}", text(&a));
    eprintln!(
        "break-lock {break_lock}: B refused {refused} times; A exit {:?}:\n{}",
        a.status.code(),
        text(&a)
    );

    // The hosts: no hook of A's ran beside one of B's, none started once B ran one there,
    // every hook ended; B's version recorded everywhere.
    for host in HOSTS {
        let runs = intervals(&fleet, host);
        assert!(
            runs.iter().all(|r| r.3 != u128::MAX),
            "{host}: a hook never ended: {runs:?}"
        );
        let b_first = runs
            .iter()
            .filter(|r| r.0 == "3.0")
            .map(|r| r.2)
            .min()
            .expect("B ran hooks");
        for (_, h1, s1, e1) in runs.iter().filter(|r| r.0 == "2.0") {
            assert!(
                *s1 < b_first,
                "{host}: A started {h1} after B held the host: {runs:?}"
            );
            for (_, h2, s2, e2) in runs.iter().filter(|r| r.0 == "3.0") {
                assert!(
                    e1 <= s2 || e2 <= s1,
                    "{host}: A's {h1} ({s1}..{e1}) ran beside B's {h2} ({s2}..{e2})"
                );
            }
        }
        assert_eq!(recorded(&fleet, host).as_deref(), Some("3.0"), "{host}");
    }

    // etcd's history.
    let changes = history(&endpoint, PREFIX);
    let lock_key = format!("{PREFIX}/{SITE}/lock");
    let run_of = |c: &Change| {
        c.value
            .as_ref()
            .and_then(|v| v["run"].as_str())
            .map(str::to_string)
    };
    // Each lock taken: (its create revision, the run).
    let locks: Vec<(i64, String)> = changes
        .iter()
        .filter(|c| c.key == lock_key && c.value.is_some() && c.revision == c.create_revision)
        .map(|c| (c.revision, run_of(c).expect("the holder's run")))
        .collect();
    assert!(
        locks.len() >= 3,
        "the setup's, A's and B's locks: {locks:?}"
    );
    let a_run = locks[1].1.clone();
    let b_token = locks[2].0;
    let b_last = locks.last().expect("B's lock").0;
    // A wrote nothing once B held the lock (A's relay was healed while B ran: anything A still
    // sent reached etcd, and was refused by its fence). The keys whose `run` is their writer's:
    // a `running/` or `status/` value names the run that did what the host records, and B
    // publishes what it reads.
    let own = ["desired/", "busy/", "hosts/", "lock"].map(|k| format!("{PREFIX}/{SITE}/{k}"));
    let late: Vec<&Change> = changes
        .iter()
        .filter(|c| c.revision > b_token && run_of(c).as_deref() == Some(a_run.as_str()))
        .filter(|c| own.iter().any(|k| c.key.starts_with(k.as_str())))
        .collect();
    assert!(
        late.is_empty(),
        "A wrote to etcd after B took the lock at revision {b_token}: {late:?}\nlocks {locks:?}"
    );
    // Every version the store ever said a host runs, or succeeded at, the host's hooks reached
    // (its `start` ended by itself).
    let running = format!("{PREFIX}/{SITE}/running/api/");
    let status = format!("{PREFIX}/{SITE}/status/api/");
    let mut last: HashMap<String, String> = HashMap::new();
    for c in &changes {
        let Some(v) = c.value.as_ref() else { continue };
        let version = v["version"].as_str().unwrap_or_default().to_string();
        if let Some(rest) = c.key.strip_prefix(&status) {
            let host = rest.split('/').next().unwrap_or_default();
            assert!(
                v["outcome"] != "success" || completed(&fleet, host, &version, "start"),
                "the store said {host}'s {version} succeeded (revision {}) and its hooks never \
                 got there: {:?}",
                c.revision,
                intervals(&fleet, host)
            );
            continue;
        }
        let Some(host) = c.key.strip_prefix(&running).map(str::to_string) else {
            continue;
        };
        assert!(
            completed(&fleet, &host, &version, "start"),
            "the store said {host} runs {version} (revision {}, run {:?}) and its hooks never \
             got there: {:?}",
            c.revision,
            run_of(c),
            intervals(&fleet, &host)
        );
        last.insert(host, version);
    }
    for host in HOSTS {
        assert_eq!(
            last.get(host).map(String::as_str),
            recorded(&fleet, host).as_deref(),
            "{host}: the store's last word and its state file"
        );
        // The host's token is B's last lock's (the highest), and never went back (above).
        assert_eq!(fence(&fleet, host), b_last, "{host}: {locks:?}");
    }
    let busy = etcd.keys(&format!("{PREFIX}/{SITE}/busy/"));
    assert!(busy.is_empty(), "intents left: {busy:?}");
    // Not vacuous: A was cut mid-run, B took over (with `--break-lock`, while A still ran).
    let a_hosts = HOSTS
        .iter()
        .filter(|h| intervals(&fleet, h).iter().any(|r| r.0 == "2.0"))
        .count();
    assert!(
        a_hosts >= 2 && a_hosts < HOSTS.len(),
        "A on {a_hosts} hosts"
    );
}

#[test]
fn a_second_controller_breaking_the_lock_of_one_cut_off_from_etcd_never_runs_beside_it() {
    takeover(true);
}

#[test]
fn a_second_controller_waiting_for_the_lock_of_one_cut_off_from_etcd_never_runs_beside_it() {
    takeover(false);
}
