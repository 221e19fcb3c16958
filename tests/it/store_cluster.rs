//! An etcd cluster under faults mid-rollout, with the sshd fleet: the leader of three members
//! killed (SIGKILL); the controller cut off from two of three members (one relay per member,
//! `tests/support/relay.rs`, two of them stop forwarding) while the members still reach each
//! other; and cut off from four of five, the one it still reaches listed last. A killed leader
//! lets the run carry on (exit 0) or stop cleanly (exit 6, starting no hook once its lease can
//! have expired); a controller that still reaches a member of a whole cluster carries on. Then,
//! with the cluster whole again, a run from a fresh working directory reads every host as its
//! state file says, and the next apply converges with the store agreeing with every host.
#![cfg(feature = "etcd")]

use crate::support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;
use support::relay::Relay;

const PREFIX: &str = "/drover-test";
const APPS: usize = 8;
const TTL: Duration = Duration::from_secs(3);
/// As in `tests/it/store_faults.rs`: hooks and test read one clock.
const CLOCK_MARGIN: Duration = Duration::from_millis(10);

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

fn names() -> Vec<String> {
    (1..=APPS).map(|i| format!("app{i}")).collect()
}

/// The site at `version` (each `start` sleeping `sleep` s) into `dir`, on the fleet's platform
/// with the store at `endpoints`, `lock-ttl="3s"`, policy batch 1.
fn write_site(fleet: &Fleet, dir: &Path, endpoints: &str, version: &str, sleep: &str) {
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
        r####"site "shared" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{EV}ev stop"#
    install #"{EV}ev install"#
    start #"{EV}ev start; sleep {sleep}"#
}}
"####
    );
    std::fs::write(dir.join("site.kdl"), site).expect("site");
}

fn deploy_in(dir: &Path, args: &[&str]) -> Output {
    support::cli::deploy_in(dir)
        .args(args)
        .output()
        .expect("run deploy")
}

/// The version `host`'s state file records for api.
fn recorded(fleet: &Fleet, host: &str) -> Option<String> {
    let path = fleet.host_root(host).join("var-lib/drover/state.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["services"]["api"]["version"].as_str().map(str::to_string)
}

/// `status --json` from `dir`.
fn status(dir: &Path) -> serde_json::Value {
    let out = deploy_in(dir, &["status", "site.kdl", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("status JSON: {}", text(&out)))
}

/// What `status` says `host` runs.
fn said(status: &serde_json::Value, host: &str) -> Option<String> {
    status["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|x| x["host"] == host))
        .and_then(|x| x["services"][0]["running"].as_str())
        .map(str::to_string)
}

#[derive(Clone, Copy)]
enum Fault {
    /// SIGKILL of the member that leads (of three).
    KillLeader,
    /// The relays of the first endpoint and of one other stop forwarding (of three).
    PartitionFromTwo,
    /// Of five members, the relays of the first four endpoints stop forwarding: the member
    /// that still answers is the one tried last.
    PartitionFromAllButLast,
}

impl Fault {
    fn members(&self) -> usize {
        match self {
            Fault::PartitionFromAllButLast => 5,
            _ => 3,
        }
    }
}

/// Rolls 2.0 out over 1.0 on `APPS` hosts, one after the other, and makes `fault` once the
/// third host's step has started; checks the run's end, then what a fresh reader is told,
/// then that the next apply converges.
fn rollout_under(fault: Fault) {
    let etcd = Etcd::cluster_of(fault.members());
    let relays: Vec<Relay> = (0..fault.members())
        .map(|i| Relay::start(etcd.client_addr(i)))
        .collect();
    let endpoints = relays.iter().map(Relay::url).collect::<Vec<_>>().join(",");
    let fleet = Fleet::start(
        &names()
            .iter()
            .map(|h| FleetHost::new(h, "app"))
            .collect::<Vec<_>>(),
    );
    write_site(&fleet, &fleet.dir, &endpoints, "1.0", "0");
    let out = deploy_in(&fleet.dir, &["apply", "site.kdl", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    write_site(&fleet, &fleet.dir, &endpoints, "2.0", "0.5");
    let err_file = fleet.dir.join("apply.err");
    let mut run = support::cli::deploy_in(&fleet.dir)
        .args(["apply", "site.kdl", "--yes"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_file).expect("stderr file"))
        .spawn()
        .expect("start deploy");
    let before = support::hooks::events(&fleet).len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while support::hooks::events(&fleet)[before..]
        .iter()
        .filter(|e| e.2 == "stop")
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "the rollout did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let what = match fault {
        Fault::KillLeader => {
            let leader = etcd.leader();
            etcd.kill(leader);
            format!("leader m{leader} killed")
        }
        Fault::PartitionFromTwo => {
            let other = match etcd.leader() {
                0 => 1,
                l => l,
            };
            relays[0].cut();
            relays[other].cut();
            format!("cut from m0 and m{other} (the leader's or the next)")
        }
        Fault::PartitionFromAllButLast => {
            for r in &relays[..4] {
                r.cut();
            }
            "cut from m0 to m3, m4 answering".to_string()
        }
    };
    let cut = now_ns();
    let code = run.wait().expect("wait").code();
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    let events = support::hooks::events(&fleet);
    let upgraded = events[before..].iter().filter(|e| e.2 == "stop").count();
    eprintln!("{what}: exit {code:?}, {upgraded} of {APPS} hosts started 2.0\n{err}");
    if let Fault::PartitionFromTwo | Fault::PartitionFromAllButLast = fault {
        // The third member serves, and the controller reaches it: the run carries on.
        assert_eq!(code, Some(0), "{what}: the run stopped\n{err}");
    }
    match code {
        Some(0) => {
            for h in names() {
                assert_eq!(recorded(&fleet, &h).as_deref(), Some("2.0"), "{h}\n{err}");
            }
        }
        Some(6) => {
            assert!(err.contains("the site's lock in etcd is lost"), "{err}");
            let limit = cut + (TTL + CLOCK_MARGIN).as_nanos();
            let late: Vec<String> = events[before..]
                .iter()
                .filter(|e| e.0 > limit)
                .map(|e| format!("{} {} {:.3} s after", e.1, e.2, (e.0 - cut) as f64 / 1e9))
                .collect();
            assert!(
                late.is_empty(),
                "hooks started after the lease could have expired (fault + {TTL:?}): \
                 {late:?}\n{err}"
            );
        }
        other => panic!("{what}: neither carried on nor stopped cleanly: {other:?}\n{err}"),
    }
    for debug in ["tonic", "Os {", "Error(", "panicked"] {
        assert!(!err.contains(debug), "{debug:?} in:\n{err}");
    }

    // The cluster whole again, and reachable.
    etcd.restart();
    for r in &relays {
        r.heal();
    }
    // Another controller (a directory with only the site's files: no journal, no
    // `.drover/unpublished`) is told what every host's state file says.
    let other = tempfile::tempdir().expect("other controller");
    write_site(&fleet, other.path(), &endpoints, "2.0", "0.5");
    let told = status(other.path());
    for h in names() {
        assert_eq!(
            said(&told, &h),
            recorded(&fleet, &h),
            "{what}: status says {h} runs {:?}, its state file says otherwise\n{}",
            said(&told, &h),
            serde_json::to_string_pretty(&told).unwrap_or_default()
        );
    }
    // The next apply, from the run's own directory (its `.drover/unpublished` mark, if any);
    // its files written again: `write_platform` rewrote the fleet's platform file.
    write_site(&fleet, &fleet.dir, &endpoints, "2.0", "0.5");
    let out = deploy_in(&fleet.dir, &["apply", "site.kdl", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let told = status(other.path());
    assert_eq!(told["source"], "store", "{told}");
    for h in names() {
        assert_eq!(recorded(&fleet, &h).as_deref(), Some("2.0"), "{h}");
        assert_eq!(said(&told, &h).as_deref(), Some("2.0"), "{h}: {told}");
    }
    let out = deploy_in(other.path(), &["status", "site.kdl", "--hosts", "--json"]);
    let hosts: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("status --hosts JSON: {}", text(&out)));
    let disagreements = hosts["disagreements"].as_array().map_or(0, Vec::len);
    assert_eq!(disagreements, 0, "{hosts}");
    let busy = etcd.keys(&format!("{PREFIX}/shared/busy/"));
    assert!(busy.is_empty(), "intents left after converging: {busy:?}");
}

#[test]
fn a_three_member_cluster_whose_leader_is_killed_mid_rollout_leaves_nothing_false() {
    rollout_under(Fault::KillLeader);
}

#[test]
fn a_controller_cut_off_from_two_of_three_members_mid_rollout_leaves_nothing_false() {
    rollout_under(Fault::PartitionFromTwo);
}

#[test]
fn a_controller_reaching_only_the_last_of_five_members_carries_on_mid_rollout() {
    rollout_under(Fault::PartitionFromAllButLast);
}
