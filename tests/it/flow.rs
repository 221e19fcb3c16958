//! A batch as a concurrency limit on a real sshd fleet: under the default `flow "slots"` a
//! straggler holds only its own slot, never more than `batch` hosts switch at once; under
//! `flow "waves"` the next wave waits for it (per-host hook logs).

use crate::support;

use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

/// api on app1..app4, `batch 2` and `flow`; app1's start takes 2 s. Applies it and returns
/// `(ns, host, what)` of every hook event.
fn rollout(flow: &str) -> Vec<(u128, String, String)> {
    let fleet = Fleet::start(&[
        FleetHost::new("app1", "app"),
        FleetHost::new("app2", "app"),
        FleetHost::new("app3", "app"),
        FleetHost::new("app4", "app"),
    ]);
    fleet.write_platform("/var/lib/drover");
    let dir = &fleet.dir;
    std::fs::write(
        dir.join("policy.kdl"),
        format!("policy \"p\" {{ batch 2; {flow} }}\n"),
    )
    .expect("policy");
    std::fs::write(
        dir.join("site.kdl"),
        format!(
            r####"site "flow" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    start #"{EV}ev start; [ "$DEPLOY_HOST" != app1 ] || sleep 2"#
    check #"{EV}ev checked"#
}}
"####
        ),
    )
    .expect("site");
    let out = support::cli::deploy_in(dir)
        .args(["apply", "site.kdl", "--yes"])
        .output()
        .expect("run deploy");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    support::hooks::events(&fleet)
        .into_iter()
        .map(|(ns, host, what, _)| (ns, host, what))
        .collect()
}

fn at(events: &[(u128, String, String)], host: &str, what: &str) -> u128 {
    events
        .iter()
        .find(|(_, h, w)| h == host && w == what)
        .map(|e| e.0)
        .unwrap_or_else(|| panic!("no `{what}` on {host}: {events:?}"))
}

/// The most hosts between their `start` and their `checked` at once.
fn most_switching(events: &[(u128, String, String)]) -> usize {
    let mut open = std::collections::BTreeSet::new();
    let mut most = 0;
    for (_, host, what) in events {
        match what.as_str() {
            "start" => {
                open.insert(host.clone());
            }
            "checked" => {
                open.remove(host);
            }
            _ => {}
        }
        most = most.max(open.len());
    }
    most
}

#[test]
fn a_straggler_holds_only_its_own_slot() {
    let events = rollout("");
    let slow = at(&events, "app1", "checked");
    for host in ["app3", "app4"] {
        assert!(
            at(&events, host, "checked") < slow,
            "{host} waited for the straggler: {events:?}"
        );
    }
    assert!(most_switching(&events) <= 2, "{events:?}");
}

#[test]
fn whole_waves_wait_for_the_straggler() {
    let events = rollout("flow \"waves\"");
    let slow = at(&events, "app1", "checked");
    for host in ["app3", "app4"] {
        assert!(
            at(&events, host, "start") > slow,
            "{host} started before wave 1 ended: {events:?}"
        );
    }
    assert!(most_switching(&events) <= 2, "{events:?}");
}
