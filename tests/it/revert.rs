//! `on-failure "revert"` on a real sshd fleet: api on five hosts, one at a time, upgraded 1.0 →
//! 2.0 with a changed file; the fourth host's check fails. The three hosts already switched are
//! switched back, last first: from their hooks' own event logs (timestamps), each ran the old
//! version's `start` again after the failure, app3 before app2 before app1; each records 1.0
//! and serves 1.0's file contents again (the file the step replaced put back, nothing of it
//! left beside); app5 was never touched; the run fails, and its NDJSON says what was reverted.

use crate::support;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

const HOSTS: [&str; 5] = ["app1", "app2", "app3", "app4", "app5"];

fn site(version: &str) -> String {
    r####"site "back" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
service "api" {
    version "@V@"
    file "api.conf" to="/srv/api/api.conf"
    stop #"@EV@ev stop-$DEPLOY_OLD_VERSION"#
    install #"@EV@ev install-$DEPLOY_NEW_VERSION"#
    // What it serves: the file as it was when it started, and its version.
    start #"@EV@ev start-$DEPLOY_NEW_VERSION; cp /srv/api/api.conf /srv/api/served; echo "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    check #"if [ "$DEPLOY_HOST" = app4 ] && [ "$DEPLOY_NEW_VERSION" = 2.0 ]; then @EV@ev down; exit 1; fi; @EV@ev up-$DEPLOY_NEW_VERSION"# timeout="2s" interval="200ms"
    rollback #"@EV@ev rollback"#
}
"####
    .replace("@V@", version)
    .replace("@EV@", EV)
}

fn apply(fleet: &Fleet, version: &str, conf: &str) -> std::process::Output {
    fleet.write_platform("/var/lib/drover");
    std::fs::write(fleet.dir.join("api.conf"), conf).expect("api.conf");
    let path = fleet.write_site(
        &site(version),
        "policy \"back\" { batch 1; max-failed 0; on-failure \"revert\"; }\n",
    );
    support::cli::deploy_in(&fleet.dir)
        .args(["apply", path.to_str().unwrap(), "--yes", "--json"])
        .output()
        .expect("run deploy")
}

fn state(fleet: &Fleet, host: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
        .unwrap_or_else(|e| panic!("state of {host}: {e}"));
    serde_json::from_str(&text).expect("state is JSON")
}

fn file(fleet: &Fleet, host: &str, path: &str) -> String {
    std::fs::read_to_string(fleet.host_root(host).join(path)).unwrap_or_default()
}

#[test]
fn the_hosts_switched_before_the_budget_was_spent_are_switched_back_last_first() {
    let hosts: Vec<FleetHost> = HOSTS.iter().map(|h| FleetHost::new(h, "app")).collect();
    let fleet = Fleet::start(&hosts);
    let out = apply(&fleet, "1.0", "conf one\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = support::hooks::events(&fleet).len();

    let out = apply(&fleet, "2.0", "conf two\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{stdout}");
    let events: Vec<(u128, String, String, String)> = support::hooks::events(&fleet)
        .into_iter()
        .skip(before)
        .collect();
    let at = |host: &str, what: &str| -> Vec<u128> {
        events
            .iter()
            .filter(|(_, h, w, _)| h == host && w == what)
            .map(|(ns, ..)| *ns)
            .collect()
    };
    let down = *at("app4", "down").last().expect("app4's check failed");
    // Each switched host ran 2.0 and then, after app4 failed, 1.0 again: stopped 2.0,
    // installed and started 1.0, checked it.
    let mut restarted = Vec::new();
    for host in ["app1", "app2", "app3"] {
        assert_eq!(at(host, "up-2.0").len(), 1, "{host} switched: {events:?}");
        let back = at(host, "start-1.0");
        assert_eq!(back.len(), 1, "{host} started 1.0 again: {events:?}");
        assert!(
            back[0] > down,
            "{host} reverted after app4 failed: {events:?}"
        );
        let stop = at(host, "stop-2.0");
        assert!(
            stop.len() == 1 && stop[0] > down && stop[0] < back[0],
            "{events:?}"
        );
        assert!(at(host, "install-1.0")[0] < back[0], "{events:?}");
        assert!(
            *at(host, "up-1.0").last().expect("checked") > back[0],
            "{events:?}"
        );
        assert!(at(host, "rollback").is_empty(), "{host}: {events:?}");
        restarted.push(back[0]);
        // The host runs 1.0 with 1.0's file, and records so.
        assert_eq!(
            file(&fleet, host, "srv/api/api.conf"),
            "conf one\n",
            "{host}"
        );
        assert_eq!(file(&fleet, host, "srv/api/served"), "conf one\n", "{host}");
        assert_eq!(file(&fleet, host, "srv/api/version"), "1.0\n", "{host}");
        let api = &state(&fleet, host)["services"]["api"];
        assert_eq!(api["version"], "1.0", "{host}: {api}");
        assert_eq!(api["validated"]["outcome"], "success", "{host}: {api}");
        let digest = api["inputs"]["file:/srv/api/api.conf"]
            .as_str()
            .unwrap_or("");
        let first = state(&fleet, "app5")["services"]["api"]["inputs"]["file:/srv/api/api.conf"]
            .as_str()
            .unwrap_or("-")
            .to_string();
        assert_eq!(digest, first, "{host} records 1.0's file again");
        // Nothing of the replaced file is left beside it.
        let private = fleet.host_root(host).join("srv/api/.drover");
        let left: Vec<String> = std::fs::read_dir(&private)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{host}: {left:?}");
    }
    // Last switched first: app3, then app2, then app1.
    assert!(
        restarted[2] < restarted[1] && restarted[1] < restarted[0],
        "{events:?}"
    );
    // The failed host was rolled back by its own step; app5 was never touched.
    assert_eq!(at("app4", "rollback").len(), 1, "{events:?}");
    assert_eq!(state(&fleet, "app4")["services"]["api"]["version"], "1.0");
    assert!(
        events.iter().all(|(_, h, ..)| h != "app5"),
        "app5 ran hooks: {events:?}"
    );
    assert_eq!(file(&fleet, "app5", "srv/api/api.conf"), "conf one\n");

    // The NDJSON says what was reverted.
    let json: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let of = |event: &str| -> Vec<&serde_json::Value> {
        json.iter().filter(|e| e["event"] == event).collect()
    };
    let reverting = of("service-reverting");
    assert_eq!(reverting.len(), 1, "{stdout}");
    assert_eq!(
        reverting[0]["hosts"],
        serde_json::json!(["app3", "app2", "app1"])
    );
    let started: Vec<(&str, &str, &str)> = of("revert-started")
        .iter()
        .map(|e| {
            (
                e["host"].as_str().unwrap_or(""),
                e["from"].as_str().unwrap_or(""),
                e["to"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        started,
        [
            ("app3", "2.0", "1.0"),
            ("app2", "2.0", "1.0"),
            ("app1", "2.0", "1.0")
        ]
    );
    assert!(of("revert-finished").iter().all(|e| e["ok"] == true));
    assert_eq!(of("revert-finished").len(), 3);
    let finished = of("service-finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "reverted", "{stdout}");
    let run = of("run-finished");
    assert_eq!(run[0]["reverted"], 3, "{stdout}");
    assert_eq!(run[0]["converged"], false);

    // The site still says 2.0: the plan shows the reverted hosts pending again.
    let plan = support::cli::deploy_in(&fleet.dir)
        .args([
            "plan",
            fleet.dir.join("site.kdl").to_str().unwrap(),
            "--json",
        ])
        .output()
        .expect("plan");
    let text = String::from_utf8_lossy(&plan.stdout);
    let plan: serde_json::Value = serde_json::from_str(&text).expect("plan JSON");
    assert_eq!(
        plan["services"][0]["policy"]["on_failure"], "revert",
        "{text}"
    );
    let pending: Vec<(&str, &str)> = plan["services"][0]["waves"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|w| w["steps"].as_array().into_iter().flatten())
        .map(|st| {
            (
                st["host"].as_str().unwrap_or(""),
                st["from"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for host in ["app1", "app2", "app3"] {
        assert!(
            pending.contains(&(host, "1.0")),
            "{host} pending: {pending:?}"
        );
    }
}
