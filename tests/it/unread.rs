//! Hosts read at their step: `deploy apply --yes` over `--max-connections` leaves the hosts of
//! services that need nothing and are needed by nothing unread before the run, but the cap's
//! worth stepped first, and locks and reads each in the command before its first step, over
//! the one connection its step uses. On a real sshd fleet: every host connected once, hooks
//! told the version each host really ran, a host found converged left untouched, a host
//! whose lock another run holds failing its step (the other run's lock intact), a host that
//! does not answer left alone as unreachable.

use crate::support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::fleet::{Fleet, FleetHost};

const HOSTS: usize = 6;

/// A fleet of six `node` hosts running `agent`, which needs nothing.
fn fleet() -> Fleet {
    let hosts: Vec<FleetHost> = (1..=HOSTS)
        .map(|i| FleetHost::new(&format!("n{i}"), "node"))
        .collect();
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// Writes site.kdl with `agent` at `version` (batch 2); returns its path. Each hook appends
/// `<hook> <old> <new>` to the host's /var/lib/hooks.
fn site(fleet: &Fleet, version: &str) -> PathBuf {
    let hook = |name: &str| {
        format!(
            "    {name} #\"echo \"{name} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION\" >> /var/lib/hooks\"#\n"
        )
    };
    let text = format!(
        "site \"farm\" {{\n    version \"1\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
         class \"node\" {{ service \"agent\" }}\n\
         service \"agent\" {{\n    version \"{version}\"\n{}{}{}}}\n",
        hook("stop"),
        hook("install"),
        hook("start"),
    );
    fleet.write_site(&text, "policy \"default\" { batch 2; max-failed 0 }\n")
}

/// `deploy apply SITE --yes --max-connections 4` (with `--json`: the events on stdout,
/// instead of the plan): its exit code, stdout and stderr.
fn apply(fleet: &Fleet, site: &Path, json: bool) -> (Option<i32>, String, String) {
    let mut cmd = support::cli::deploy_in(&fleet.dir);
    cmd.args(["apply", site.to_str().expect("utf-8"), "--yes"])
        .args(["--max-connections", "4"]);
    if json {
        cmd.arg("--json");
    }
    support::cli::outcome(&mut cmd)
}

/// Hosts with an event `kind` (and, for `step-skipped`, that skip).
fn hosts_with(events: &[Value], kind: &str, skip: Option<&str>) -> Vec<String> {
    let mut hosts: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == kind)
        .filter(|e| skip.is_none_or(|s| e["skip"] == s))
        .filter_map(|e| e["host"].as_str().map(str::to_string))
        .collect();
    hosts.sort();
    hosts
}

/// The lines the hooks wrote on `host`.
fn hooks(fleet: &Fleet, host: &str) -> Vec<String> {
    fleet.lines(host, "var-lib/hooks")
}

#[test]
fn hosts_over_the_cap_are_read_at_their_step_each_connected_once() {
    let fleet = fleet();
    let site_1 = site(&fleet, "1.0");

    // A fresh fleet: the four hosts stepped first are read before the run, the two others
    // at their step; each is connected once, and every one is installed. (n1, locked first,
    // keeps its connection, one of the four, until its lock is given back at the end.)
    let before = fleet.logins();
    let (code, stdout, stderr) = apply(&fleet, &site_1, false);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("2 hosts not read before the run"),
        "the plan says which hosts are read at their step:\n{stdout}"
    );
    assert_eq!(
        fleet.logins_since(&before),
        vec![1; HOSTS],
        "each host connected once"
    );
    for host in fleet.names() {
        assert_eq!(
            hooks(&fleet, host),
            ["install - 1.0", "start - 1.0"],
            "{host}: a fresh install"
        );
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }

    // Nothing changed: the hosts read at their step are found converged and left alone, the
    // run converged, each host connected once again.
    let before = fleet.logins();
    let (code, stdout, stderr) = apply(&fleet, &site_1, true);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let skipped = hosts_with(&ev, "step-skipped", Some("at-version"));
    assert_eq!(skipped.len(), 2, "{stdout}");
    assert!(hosts_with(&ev, "step-started", None).is_empty(), "{stdout}");
    assert_eq!(fleet.logins_since(&before), vec![1; HOSTS]);
    for host in fleet.names() {
        assert_eq!(hooks(&fleet, host).len(), 2, "{host}: no hook ran");
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }

    // An upgrade: the hooks of a host read at its step are told the version it ran.
    let site_2 = site(&fleet, "2.0");
    let (code, stdout, stderr) = apply(&fleet, &site_2, true);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for host in fleet.names() {
        assert_eq!(
            hooks(&fleet, host)[2..],
            ["stop 1.0 2.0", "install 1.0 2.0", "start 1.0 2.0"],
            "{host}: an upgrade from the version it ran"
        );
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
                .expect("state"),
        )
        .expect("json");
        assert_eq!(state["services"]["agent"]["version"], "2.0", "{host}");
    }
}

#[test]
fn a_host_locked_by_another_run_fails_its_step_and_keeps_that_runs_lock() {
    let fleet = fleet();
    let site_1 = site(&fleet, "1.0");
    // n6 is stepped last: read at its step. Another controller's run holds its lock.
    let holder = fleet.lock_as_another_run("n6", "farm");
    let (code, stdout, stderr) = apply(&fleet, &site_1, true);
    assert_ne!(code, Some(0), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let failed: Vec<&Value> = ev
        .iter()
        .filter(|e| e["event"] == "step-finished" && e["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{stdout}");
    assert_eq!(failed[0]["host"], "n6");
    assert_eq!(failed[0]["failed_hook"], "lock");
    assert!(
        failed[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("locked by ops on elsewhere")),
        "{stdout}"
    );
    assert!(hooks(&fleet, "n6").is_empty(), "nothing ran on n6");
    assert_eq!(
        fleet.holder("n6"),
        Some(holder),
        "the other run's lock is untouched"
    );
    for host in ["n1", "n2", "n3", "n4", "n5"] {
        assert_eq!(hooks(&fleet, host).len(), 2, "{host} installed");
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: this run's lock given back"
        );
    }
}

#[test]
fn a_host_that_does_not_answer_at_its_step_is_left_alone_as_unreachable() {
    let fleet = fleet();
    let site_1 = site(&fleet, "1.0");
    fleet.kill_host("n5");
    let (code, stdout, stderr) = apply(&fleet, &site_1, true);
    // Not converged (exit 1), but not a failure that halts the rollout: the others install.
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    assert_eq!(hosts_with(&ev, "step-skipped", Some("unreachable")), ["n5"]);
    assert!(ev
        .iter()
        .all(|e| e["event"] != "step-finished" || e["ok"] == true));
    for host in ["n1", "n2", "n3", "n4", "n6"] {
        assert_eq!(hooks(&fleet, host).len(), 2, "{host} installed");
    }
}

#[test]
fn the_first_host_stays_locked_until_the_run_ends_so_a_second_run_is_refused() {
    let fleet = fleet();
    let site_1 = site(&fleet, "1.0");
    // n6, read at its step and stepped last, takes a while to start.
    let text = std::fs::read_to_string(&site_1).expect("site");
    let text = text.replacen(
        "    start #\"",
        "    start #\"[ \"$DEPLOY_HOST\" != n6 ] || { touch /var/lib/starting; sleep 3; }; ",
        1,
    );
    std::fs::write(&site_1, text).expect("write site");
    let mut run = support::cli::deploy_in(&fleet.dir)
        .args(["apply", site_1.to_str().expect("utf-8"), "--yes"])
        .args(["--max-connections", "4"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run deploy");
    let starting = fleet.host_root("n6").join("var-lib/starting");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !starting.exists() {
        assert!(std::time::Instant::now() < deadline, "n6 never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // n1's step ended long ago; its lock is still held, by this run.
    let holder = fleet.holder("n1").expect("n1 still locked");
    assert!(holder.contains("\"site\":\"farm\""), "{holder}");
    assert!(
        !fleet.lock_dir("n2").exists(),
        "n2's lock went with its step"
    );
    // Another controller (its own directory, so its own controller lock) is refused.
    let other = fleet.dir.join("other");
    std::fs::create_dir_all(&other).expect("other");
    for file in ["site.kdl", "policy.kdl", "platform.kdl"] {
        std::fs::copy(fleet.dir.join(file), other.join(file)).expect("copy");
    }
    let out = support::cli::deploy_in(&other)
        .args(["apply", "site.kdl", "--yes", "--max-connections", "4"])
        .output()
        .expect("run deploy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "refused:\n{stderr}");
    assert!(stderr.contains("host n1 is locked"), "{stderr}");
    let status = run.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    for host in fleet.names() {
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }
}

#[test]
fn when_the_first_host_does_not_answer_every_host_is_read_before_the_run() {
    let fleet = fleet();
    let site_1 = site(&fleet, "1.0");
    fleet.kill_host("n1");
    let before = fleet.logins();
    let (code, stdout, stderr) = apply(&fleet, &site_1, false);
    // n1 is left alone (not locked), so the run does not converge.
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("note: n1 does not answer: every host is locked and read before the run"),
        "{stderr}"
    );
    assert!(!stdout.contains("not read before the run"), "{stdout}");
    assert!(!stdout.contains("read at its step"), "{stdout}");
    // n5 and n6, beyond the cap's worth kept, were read before the run and connected again
    // for their steps (read at their steps, they would have been connected once).
    let counts = fleet.logins_since(&before);
    assert!(counts[4] >= 2 && counts[5] >= 2, "{counts:?}");
    for host in ["n2", "n3", "n4", "n5", "n6"] {
        assert_eq!(hooks(&fleet, host).len(), 2, "{host} installed");
    }
}
