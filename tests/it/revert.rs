//! `on-failure "revert"` on a real sshd fleet: api on five hosts, one at a time, upgraded 1.0 →
//! 2.0 with a changed file; the fourth host's check fails. The three hosts already switched are
//! switched back, last first: from their hooks' own event logs (timestamps), each ran the old
//! version's `start` again after the failure, app3 before app2 before app1; each records 1.0
//! and serves 1.0's file contents again (the file the step replaced put back, nothing of it
//! left beside); app5 was never touched; the run fails, and its NDJSON says what was reverted.
//! A second fleet: the upgrade also changes every hook's text, an `env` value and a secret; the
//! switched hosts run 1.0's own texts with 1.0's `env` again (and the current secret), but one
//! whose record kept no texts (an older deploy), which runs the site's and says so.

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

/// The hooks' events on the fleet after the first `before`: (time, host, what, service).
fn events_since(fleet: &Fleet, before: usize) -> Vec<(u128, String, String, String)> {
    support::hooks::events(fleet)
        .into_iter()
        .skip(before)
        .collect()
}

/// When `host` said `what`, in `events`' order.
fn times(events: &[(u128, String, String, String)], host: &str, what: &str) -> Vec<u128> {
    events
        .iter()
        .filter(|(_, h, w, _)| h == host && w == what)
        .map(|(ns, ..)| *ns)
        .collect()
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
    let events = events_since(&fleet, before);
    let at = |host: &str, what: &str| times(&events, host, what);
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

/// The site at `version` ("1.0" or "2.0"), whose hook texts, `MODE` and secret change with it:
/// each hook logs its own text's mark (`one`, `two`) with the versions and `MODE` it got; 2.0's
/// check fails on app4.
fn changing_site(version: &str) -> String {
    let (mark, mode, fail) = match version {
        "1.0" => ("one", "old", ""),
        _ => (
            "two",
            "new",
            r#"if [ "$DEPLOY_HOST" = app4 ]; then @EV@ev down; exit 1; fi; "#,
        ),
    };
    r####"site "back" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
service "api" {
    version "@V@"
    env "MODE" "@MODE@"
    secret "TOKEN" env="REVERT_TOKEN"
    stop #"@EV@ev stop-@M@-$DEPLOY_OLD_VERSION-$MODE"#
    install #"@EV@ev install-@M@-$DEPLOY_NEW_VERSION-$MODE"#
    migrate #"@EV@ev migrate-@M@-$DEPLOY_OLD_VERSION-$DEPLOY_NEW_VERSION-$MODE"#
    start #"@EV@ev start-@M@-$DEPLOY_NEW_VERSION-$MODE; mkdir -p /srv/api; printf '%s %s %s %s\n' @M@ "$DEPLOY_NEW_VERSION" "$MODE" "$TOKEN" >/srv/api/started"#
    check #"@FAIL@@EV@ev up-@M@-$DEPLOY_NEW_VERSION-$MODE"# timeout="2s" interval="200ms"
    rollback #"@EV@ev rollback"#
}
"####
    .replace("@FAIL@", fail)
    .replace("@V@", version)
    .replace("@M@", mark)
    .replace("@MODE@", mode)
    .replace("@EV@", EV)
}

fn apply_changing(fleet: &Fleet, version: &str, token: &str) -> std::process::Output {
    fleet.write_platform("/var/lib/drover");
    let path = fleet.write_site(
        &changing_site(version),
        "policy \"back\" { batch 1; max-failed 0; on-failure \"revert\"; }\n",
    );
    support::cli::deploy_in(&fleet.dir)
        .args(["apply", path.to_str().unwrap(), "--yes", "--json"])
        .env("REVERT_TOKEN", token)
        .env(
            "DROVER_FINGERPRINT_KEY",
            "a-fingerprint-key-for-the-revert-test",
        )
        .output()
        .expect("run deploy")
}

#[test]
fn a_revert_runs_the_hook_texts_and_env_each_host_recorded_before_the_run() {
    let hosts: Vec<FleetHost> = HOSTS.iter().map(|h| FleetHost::new(h, "app")).collect();
    let fleet = Fleet::start(&hosts);
    let out = apply_changing(&fleet, "1.0", "tok-1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each host keeps 1.0's texts and env (never the secret).
    for host in HOSTS {
        let api = &state(&fleet, host)["services"]["api"];
        let start = api["hooks"]["start"]["command"].as_str().unwrap_or("");
        assert!(start.contains("start-one-"), "{host}: {api}");
        assert_eq!(api["hooks"]["check"]["interval"], "200ms", "{host}: {api}");
        let env = &api["hooks"]["env"];
        assert!(
            env.as_array()
                .is_some_and(|e| e.contains(&serde_json::json!(["MODE", "old"]))),
            "{host}: {api}"
        );
        let text = serde_json::to_string(&state(&fleet, host)).unwrap_or_default();
        assert!(
            !text.contains("tok-1"),
            "{host} recorded the secret: {text}"
        );
    }
    // app2 as an older deploy left it: no texts.
    let path = fleet.host_root("app2").join("var-lib/drover/state.json");
    let mut app2 = state(&fleet, "app2");
    if let Some(api) = app2["services"]["api"].as_object_mut() {
        api.remove("hooks");
    }
    std::fs::write(&path, app2.to_string()).expect("rewrite app2's record");
    let before = support::hooks::events(&fleet).len();

    let out = apply_changing(&fleet, "2.0", "tok-2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{stdout}");
    let events = events_since(&fleet, before);
    let at = |host: &str, what: &str| times(&events, host, what);
    let after = |host: &str, since: u128| -> Vec<String> {
        events
            .iter()
            .filter(|(ns, h, ..)| h == host && *ns > since)
            .map(|(_, _, w, _)| w.clone())
            .collect()
    };
    let down = *at("app4", "down").last().expect("app4's check failed");
    for host in ["app1", "app3"] {
        assert_eq!(at(host, "up-two-2.0-new").len(), 1, "{host}: {events:?}");
        // After app4 failed: 2.0 stopped by this run's `stop` (it stops what runs now), then
        // 1.0's own install, migrate, start and check, with MODE=old.
        assert_eq!(
            after(host, down),
            [
                "stop-two-2.0-new",
                "install-one-1.0-old",
                "migrate-one-2.0-1.0-old",
                "start-one-1.0-old",
                "up-one-1.0-old"
            ],
            "{host}: {events:?}"
        );
        // What it started with: 1.0's text, 1.0's env, the site's current secret.
        assert_eq!(
            file(&fleet, host, "srv/api/started"),
            "one 1.0 old tok-2\n",
            "{host}"
        );
        let api = &state(&fleet, host)["services"]["api"];
        assert_eq!(api["version"], "1.0", "{host}: {api}");
        assert_eq!(api["validated"]["outcome"], "success", "{host}: {api}");
        let start = api["hooks"]["start"]["command"].as_str().unwrap_or("");
        assert!(start.contains("start-one-"), "{host}: {api}");
        // Its inputs are 1.0's (as app5's, untouched), but for the secret, the current one.
        let app5 = &state(&fleet, "app5")["services"]["api"]["inputs"];
        for key in ["hook:start", "hook:check", "env:MODE"] {
            assert_eq!(api["inputs"][key], app5[key], "{host} {key}: {api}");
        }
        assert_ne!(
            api["inputs"]["secret:TOKEN"], app5["secret:TOKEN"],
            "{host}: {api}"
        );
    }
    // app2 recorded no texts: the site's (2.0's) ran, with MODE=new.
    assert_eq!(
        after("app2", down),
        [
            "stop-two-2.0-new",
            "install-two-1.0-new",
            "migrate-two-2.0-1.0-new",
            "start-two-1.0-new",
            "up-two-1.0-new"
        ],
        "{events:?}"
    );
    assert_eq!(
        file(&fleet, "app2", "srv/api/started"),
        "two 1.0 new tok-2\n"
    );
    assert!(events.iter().all(|(_, h, ..)| h != "app5"), "{events:?}");

    // The NDJSON says which reverts ran the recorded texts, and that the secret is current.
    let started: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "revert-started")
        .collect();
    let said: Vec<(&str, &str)> = started
        .iter()
        .map(|e| {
            (
                e["host"].as_str().unwrap_or(""),
                e["hooks"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        said,
        [("app3", "recorded"), ("app2", "site"), ("app1", "recorded")],
        "{stdout}"
    );
    assert!(
        started
            .iter()
            .all(|e| e["secrets"] == serde_json::json!(["TOKEN"])),
        "{stdout}"
    );
    // The step's log says it, and never the secret.
    let logs = fleet.dir.join(".drover/runs");
    let mut texts = String::new();
    for run in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        let log = run.path().join("app2/api.log");
        texts.push_str(&std::fs::read_to_string(log).unwrap_or_default());
    }
    assert!(
        texts.contains("with the site's hooks and env: it recorded none before this run"),
        "{texts}"
    );
    assert!(!texts.contains("tok-2"), "{texts}");
}
