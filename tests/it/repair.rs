//! `--repair` on a real sshd fleet: a service whose check fails on a host recorded converged
//! (its process died, the file its check tests is gone) is invisible to `plan` and `apply`,
//! seen by `status --check` and `verify`, and re-run (the whole switch-over, old = new) by
//! `apply --repair`, its check run first over the run's connections.

use crate::support;

use std::path::PathBuf;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

fn site(fleet: &Fleet) -> PathBuf {
    fleet.write_platform("/var/lib/drover");
    let site = format!(
        r####"site "fix" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{EV}ev stop; rm -f /srv/api/running"#
    install #"{EV}ev "install:$DEPLOY_OLD_VERSION:$DEPLOY_NEW_VERSION"; mkdir -p /srv/api"#
    start #"{EV}ev start; touch /srv/api/running"#
    check #"[ -f /srv/api/running ] || {{ echo "not running" >&2; echo "/srv/api/running is gone" >&2; exit 3; }}; {EV}ev checked"# timeout="2s" interval="100ms"
}}
"####
    );
    fleet.write_site(&site, "policy \"default\" { batch 1; max-failed 0; }\n")
}

/// Exit code and stdout + stderr of `deploy ARGS`.
fn deploy(fleet: &Fleet, args: &[&str]) -> (Option<i32>, String) {
    let (code, out, err) = support::cli::outcome(support::cli::deploy_in(&fleet.dir).args(args));
    (code, format!("{out}{err}"))
}

/// Events since `from` as `host what`, sorted.
fn since(fleet: &Fleet, from: usize) -> Vec<String> {
    let mut ran: Vec<String> = support::hooks::events(fleet)[from..]
        .iter()
        .map(|(_, h, w, _)| format!("{h} {w}"))
        .collect();
    ran.sort();
    ran
}

#[test]
fn a_dead_service_is_seen_by_status_check_and_repaired_by_apply_repair() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app"), FleetHost::new("app2", "app")]);
    let site = site(&fleet);
    let site = site.to_str().expect("path");
    let (code, out) = deploy(&fleet, &["apply", site, "--yes"]);
    assert_eq!(code, Some(0), "{out}");
    // The service dies on app1: the host still records it converged.
    std::fs::remove_file(fleet.host_root("app1").join("srv/api/running")).expect("kill it");

    // Without --repair, nothing is seen: converged, nothing to change.
    let (code, plan) = deploy(&fleet, &["plan", site]);
    assert_eq!(code, Some(0), "{plan}");
    assert!(plan.contains("skipped, converged: app1, app2"), "{plan}");
    let before = support::hooks::events(&fleet).len();
    let (code, out) = deploy(&fleet, &["apply", site, "--yes"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Nothing to change."), "{out}");
    assert_eq!(since(&fleet, before), Vec::<String>::new(), "no hook ran");
    let (code, out) = deploy(&fleet, &["verify", site]);
    assert_eq!(code, Some(1), "verify sees the failing check:\n{out}");

    // `status --check` runs the checks and shows the failing host (exit 1).
    let (code, status) = deploy(&fleet, &["status", site]);
    assert_eq!(code, Some(0), "{status}");
    assert!(!status.contains("failing"), "{status}");
    let (code, status) = deploy(&fleet, &["status", site, "--check"]);
    assert_eq!(code, Some(1), "{status}");
    assert!(
        status.contains("app1 api: check failed: exited 3: /srv/api/running is gone"),
        "the failing check, with its exit and last line:\n{status}"
    );
    assert!(!status.contains("app2 api: check failed"), "{status}");

    // `plan --repair`: a repair step on app1 only, with why.
    let (code, plan) = deploy(&fleet, &["plan", site, "--repair"]);
    assert_eq!(code, Some(0), "{plan}");
    assert!(
        plan.contains("repair 1.0 (check failed: exited 3: /srv/api/running is gone): app1"),
        "{plan}"
    );
    assert!(plan.contains("skipped, converged: app2"), "{plan}");
    let (code, json) = deploy(&fleet, &["plan", site, "--repair", "--json"]);
    assert_eq!(code, Some(0), "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("plan JSON");
    let step = &json["services"][0]["waves"][0]["steps"][0];
    assert_eq!(step["host"], "app1");
    assert_eq!(step["kind"], "repair");
    assert_eq!(step["path"], "switch-over");
    assert_eq!(step["from"], step["to"]);

    // `apply --repair`: the checks run first (app2's passes), then app1's whole switch-over,
    // with the old version equal to the new.
    let before = support::hooks::events(&fleet).len();
    let (code, out) = deploy(&fleet, &["apply", site, "--yes", "--repair"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        since(&fleet, before),
        [
            "app1 checked",
            "app1 install:1.0:1.0",
            "app1 start",
            "app1 stop",
            "app2 checked"
        ],
        "app1's switch-over ran again, app2's check only:\n{out}"
    );
    assert!(
        out.contains("(1 repaired)"),
        "the summary counts it:\n{out}"
    );
    assert!(fleet.host_root("app1").join("srv/api/running").exists());
    let (code, out) = deploy(&fleet, &["verify", site]);
    assert_eq!(code, Some(0), "verify passes after the repair:\n{out}");
    let (code, status) = deploy(&fleet, &["status", site, "--check"]);
    assert_eq!(code, Some(0), "{status}");
    assert!(status.contains("2 passed, 0 failed"), "{status}");
}
