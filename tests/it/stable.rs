//! `check … stable="2s"` on a real sshd fleet: a host counts as healthy only once its check
//! has passed throughout that long. A version that passes its check and dies a second later
//! fails its step and is rolled back (without `stable` the same version is called healthy);
//! a version that stays up passes, its check run again for the whole window. Asserted from
//! the hooks' own event logs and the hosts' state files.

use crate::support;

use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

/// One service on two hosts, one at a time. Version `2.0` removes its `up` file a second
/// after it starts (it dies); `1.0` and `3.0` stay up. Its check passes while `up` is there.
fn site(version: &str, stable: &str) -> String {
    r####"site "steady" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
service "api" {
    version "@V@"
    start #"@EV@ev start; mkdir -p /srv/api; : >/srv/api/up; [ "$DEPLOY_NEW_VERSION" != 2.0 ] || setsid sh -c 'sleep 1; rm -f /srv/api/up' </dev/null >/dev/null 2>&1 &"#
    stop #"@EV@ev stop; rm -f /srv/api/up"#
    rollback #"@EV@ev rollback; mkdir -p /srv/api; : >/srv/api/up"#
    check #"if [ -e /srv/api/up ]; then @EV@ev passed; else @EV@ev down; exit 1; fi"# timeout="5s" interval="200ms"@STABLE@
}
"####
    .replace("@V@", version)
    .replace("@EV@", EV)
    .replace("@STABLE@", stable)
}

fn apply(fleet: &Fleet, version: &str, stable: &str) -> std::process::Output {
    fleet.write_platform("/var/lib/drover");
    let path = fleet.write_site(
        &site(version, stable),
        "policy \"one\" { batch 1; max-failed 0; }\n",
    );
    support::cli::deploy_in(&fleet.dir)
        .args(["apply", path.to_str().unwrap(), "--yes"])
        .output()
        .expect("run deploy")
}

fn state(fleet: &Fleet, host: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
        .unwrap_or_else(|e| panic!("state of {host}: {e}"));
    serde_json::from_str(&text).expect("state is JSON")
}

/// `(ns, what)` of app host `host`'s events since `skip` of them.
fn events(fleet: &Fleet, host: &str, skip: usize) -> Vec<(u128, String)> {
    support::hooks::events(fleet)
        .into_iter()
        .filter(|(_, h, ..)| h == host)
        .skip(skip)
        .map(|(ns, _, what, _)| (ns, what))
        .collect()
}

#[test]
fn a_service_that_dies_inside_its_stable_window_fails_and_is_rolled_back() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app"), FleetHost::new("app2", "app")]);
    let stable = r#" stable="2s""#;
    let out = apply(&fleet, "1.0", stable);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = events(&fleet, "app1", 0).len();

    let out = apply(&fleet, "2.0", stable);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let ran = events(&fleet, "app1", before);
    let whats: Vec<&str> = ran.iter().map(|(_, w)| w.as_str()).collect();
    // It passed, then went down inside the window: the step failed and rolled back.
    let first_pass = ran
        .iter()
        .find(|(_, w)| w == "passed")
        .expect("passed once")
        .0;
    let down = ran.iter().find(|(_, w)| w == "down").expect("went down").0;
    assert!(down > first_pass, "{whats:?}");
    assert!(
        down - first_pass < 2_000_000_000,
        "down inside the 2 s window: {whats:?}"
    );
    assert_eq!(whats.last(), Some(&"rollback"), "{whats:?}");
    let api = &state(&fleet, "app1")["services"]["api"];
    assert_eq!(api["version"], "1.0", "rolled back: {api}");
    assert_eq!(api["validated"]["outcome"], "failure", "{api}");
    assert!(
        stderr.contains("stable=\\\"2s\\\"") || stderr.contains("stable=\"2s\""),
        "{stderr}"
    );
    // max-failed 0: app2 was never touched.
    assert_eq!(state(&fleet, "app2")["services"]["api"]["version"], "1.0");

    // Without `stable`, the same version is called healthy at its first pass.
    let before2 = events(&fleet, "app2", 0).len();
    let out = apply(&fleet, "2.0", "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(state(&fleet, "app2")["services"]["api"]["version"], "2.0");
    let whats: Vec<String> = events(&fleet, "app2", before2)
        .into_iter()
        .map(|(_, w)| w)
        .collect();
    assert!(!whats.contains(&"rollback".to_string()), "{whats:?}");
}

#[test]
fn a_service_that_stays_up_passes_once_its_check_held_the_whole_window() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app")]);
    let stable = r#" stable="1500ms""#;
    let out = apply(&fleet, "1.0", stable);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = events(&fleet, "app1", 0).len();
    let out = apply(&fleet, "3.0", stable);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran = events(&fleet, "app1", before);
    let passes: Vec<u128> = ran
        .iter()
        .filter(|(_, w)| w == "passed")
        .map(|(ns, _)| *ns)
        .collect();
    // Run again every interval (200 ms) for the whole window: at least 1.5 s of passes.
    assert!(passes.len() >= 5, "{ran:?}");
    let held = passes[passes.len() - 1] - passes[0];
    assert!(held >= 1_500_000_000, "held {held} ns: {ran:?}");
    let api = &state(&fleet, "app1")["services"]["api"];
    assert_eq!(api["version"], "3.0");
    assert_eq!(api["validated"]["outcome"], "success", "{api}");
}
