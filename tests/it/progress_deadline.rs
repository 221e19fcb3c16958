//! A policy's `progress-deadline` on a real sshd fleet: a service whose check hangs is stopped
//! as failed once no host started or ended its step for that long; its hanging hooks are
//! killed on the hosts (from the hooks' own event logs: none woke up), each host records the
//! step failed, and the run says which hosts it waited on. Another service's steps on those
//! hosts, after the stop, run every hook and converge.

use crate::support;

use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

fn site(version: &str) -> String {
    r####"site "slow" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api"; service "worker" }
service "api" {
    version "@V@"
    start #"@EV@ev start"#
    // 2.0 hangs: its check sleeps well past the deadline (and within its own timeout).
    check #"[ "$DEPLOY_NEW_VERSION" != 2.0 ] && exit 0; @EV@ev checking; sleep 4; @EV@ev woke; exit 0"# timeout="20s"
}
// On the same hosts, stepped once api's steps free them: a chain of hooks that must all run.
service "worker" {
    version "@V@"
    stop #"@EV@ev stop"#
    install #"@EV@ev install"#
    start #"@EV@ev start"#
    check #"@EV@ev checked"#
}
"####
    .replace("@V@", version)
    .replace("@EV@", EV)
}

#[test]
fn a_service_whose_check_hangs_is_stopped_at_its_progress_deadline() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app"), FleetHost::new("app2", "app")]);
    fleet.write_platform("/var/lib/drover");
    let apply = |version: &str| {
        let path = fleet.write_site(
            &site(version),
            "policy \"p\" { batch 2; max-failed 0; progress-deadline \"1500ms\"; }\n",
        );
        support::cli::deploy_in(&fleet.dir)
            .args(["apply", path.to_str().unwrap(), "--yes"])
            .output()
            .expect("run deploy")
    };
    let out = apply("1.0");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = apply("2.0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("progress-deadline") && stderr.contains("waited on app1, app2"),
        "{stderr}"
    );
    // Past the time the checks would have woken: they were killed on their hosts.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let events = support::hooks::events(&fleet);
    for host in ["app1", "app2"] {
        let of: Vec<&str> = events
            .iter()
            .filter(|(_, h, ..)| h == host)
            .map(|(_, _, w, _)| w.as_str())
            .collect();
        assert!(of.contains(&"checking"), "{host}: {of:?}");
        assert!(!of.contains(&"woke"), "{host}'s check ran on: {of:?}");
        let text = std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
            .expect("state");
        let state: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let api = &state["services"]["api"];
        let failed =
            api["validated"]["outcome"] == "failure" || api["configured"]["outcome"] == "failure";
        assert!(failed, "{host} records the step failed: {api}");
        // The worker's step came after api's was stopped there, and ran its whole chain.
        let at = |what: &str, service: &str| {
            events
                .iter()
                .filter(|(_, h, w, s)| h == host && w == what && s == service)
                .map(|(ns, ..)| *ns)
                .next_back()
                .unwrap_or_else(|| panic!("no {service} {what} on {host}: {events:?}"))
        };
        assert!(at("stop", "worker") > at("checking", "api"), "{events:?}");
        for what in ["stop", "install", "start", "checked"] {
            at(what, "worker");
        }
        assert_eq!(state["services"]["worker"]["version"], "2.0", "{state}");
        assert_eq!(
            state["services"]["worker"]["validated"]["outcome"],
            "success"
        );
    }
}
