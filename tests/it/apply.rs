//! `deploy apply` on a real sshd fleet: fresh install, dependency order, batch bounds,
//! data dependencies, idempotence, and an upgrade through every switch-over hook.

use crate::support;

use support::shop::{max_in_flight, Shop, Spec};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn fresh_install_then_upgrade_one_service() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let out = shop.deploy(&["apply", site.to_str().unwrap(), "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "apply failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );

    for host in shop.fleet.names() {
        let service = if host.starts_with("db") {
            "db"
        } else if host.starts_with("app") {
            "api"
        } else {
            "lb"
        };
        let state = shop.state(host);
        let rec = &state["services"][service];
        assert_eq!(rec["version"], "1.0", "{host}");
        assert_eq!(rec["configured"]["outcome"], "success", "{host}");
        assert_eq!(rec["validated"]["outcome"], "success", "{host}");
        assert_eq!(
            shop.serving(host, service),
            "1.0",
            "{host} serves its version"
        );
        let whats: Vec<String> = shop.events(host).into_iter().map(|e| e.what).collect();
        assert_eq!(
            whats,
            ["install", "start", "checked"],
            "a fresh host skips stop and migrate: {host}"
        );
    }

    let all = shop.all_events();
    let last_db_check = all
        .iter()
        .filter(|(_, e)| e.service == "db" && e.what == "checked")
        .map(|(_, e)| e.ns)
        .max()
        .unwrap();
    let first_api = all
        .iter()
        .filter(|(_, e)| e.service == "api")
        .map(|(_, e)| e.ns)
        .min()
        .unwrap();
    assert!(
        first_api > last_db_check,
        "no api host may start before every db host is healthy"
    );
    let mut api_checks: Vec<u128> = all
        .iter()
        .filter(|(_, e)| e.service == "api" && e.what == "checked")
        .map(|(_, e)| e.ns)
        .collect();
    api_checks.sort();
    let first_lb = all
        .iter()
        .filter(|(_, e)| e.service == "lb")
        .map(|(_, e)| e.ns)
        .min()
        .unwrap();
    assert!(
        first_lb > api_checks[2],
        "lb waits for 50% (3 of 6) api hosts healthy"
    );
    assert!(
        first_lb < *api_checks.last().unwrap(),
        "lb does not wait for all api hosts: the plan is a graph"
    );
    assert_eq!(max_in_flight(&all, "db"), 1);
    assert_eq!(
        max_in_flight(&all, "api"),
        2,
        "api's batch is 2 and the rollout uses it"
    );
    assert_eq!(max_in_flight(&all, "lb"), 1);

    // Data dependencies: every address of the needed service, with its port.
    let env = std::fs::read_to_string(shop.fleet.host_root("app1").join("srv/api/env")).unwrap();
    let lbs: Vec<String> = ["lb1", "lb2", "lb3"]
        .iter()
        .map(|h| format!("{}:18000", shop.fleet.address(h)))
        .collect();
    assert!(
        env.contains(&format!("DEPLOY_NEEDS_LB={}", lbs.join(" "))),
        "{env}"
    );
    assert!(
        env.contains("DEPLOY_NEEDS_DB="),
        "runtime needs get addresses too: {env}"
    );
    assert!(env.contains(&format!("DEPLOY_ADDRESS={}", shop.fleet.address("app1"))));
    assert!(
        env.contains("DEPLOY_CLASS=app")
            && env.contains("DEPLOY_SITE=shop")
            && env.contains("DEPLOY_PORT=18080")
    );
    assert!(
        env.contains("DEPLOY_OLD_VERSION=\n"),
        "fresh install has an empty old version: {env}"
    );

    // Converged: a second apply changes nothing.
    let before = shop.all_events().len();
    let again = shop.deploy(&["apply", site.to_str().unwrap(), "--yes"]);
    assert_eq!(again.status.code(), Some(0));
    assert!(
        stdout(&again).contains("Nothing to change"),
        "{}",
        stdout(&again)
    );
    assert_eq!(
        shop.all_events().len(),
        before,
        "no hook ran on a converged site"
    );

    // Upgrade api only: every switch-over hook, in order, seeing both versions.
    let site = shop.write(&Spec {
        api: "2.0",
        ..Spec::default()
    });
    let out = shop.deploy(&["apply", site.to_str().unwrap(), "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "upgrade failed:\n{}",
        stderr(&out)
    );
    for host in shop.hosts_of("app") {
        let new: Vec<(String, String, String)> = shop
            .events(&host)
            .into_iter()
            .skip(3)
            .map(|e| (e.what, e.old, e.new))
            .collect();
        let want: Vec<(String, String, String)> =
            ["stop", "install", "migrate", "start", "checked"]
                .iter()
                .map(|w| (w.to_string(), "1.0".into(), "2.0".into()))
                .collect();
        assert_eq!(new, want, "{host}");
        assert_eq!(shop.version(&host, "api"), "2.0");
        assert_eq!(shop.serving(&host, "api"), "2.0");
    }
    for host in shop.hosts_of("db").into_iter().chain(shop.hosts_of("lb")) {
        assert_eq!(
            shop.events(&host).len(),
            3,
            "{host} was not touched by the api upgrade"
        );
    }
    assert_eq!(
        max_in_flight(&shop.all_events(), "api"),
        2,
        "never more than the batch between stop and a passing check"
    );
}

#[test]
fn apply_refuses_without_yes_when_not_a_terminal() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let out = shop.deploy(&["apply", site.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert!(shop.all_events().is_empty(), "nothing ran");
}

#[test]
fn ndjson_events_follow_the_schema() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let out = shop.deploy(&[
        "apply",
        site.to_str().unwrap(),
        "--yes",
        "--json",
        "--only",
        "db",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(events.first().unwrap()["event"], "run-started");
    assert_eq!(events.first().unwrap()["schema"], 2);
    assert_eq!(events.last().unwrap()["event"], "run-finished");
    assert_eq!(
        events.last().unwrap()["converged"],
        true,
        "everything selected was done"
    );
    assert!(
        events.iter().all(|e| e["service"] != "api"),
        "api was not selected"
    );
    let finished: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "step-finished")
        .collect();
    assert_eq!(finished.len(), 3);
    assert!(finished
        .iter()
        .all(|e| e["ok"] == true && e["service"] == "db"));
    assert!(events
        .iter()
        .all(|e| e["time"].as_str().is_some_and(|t| t.ends_with('Z'))));
}

#[test]
fn a_saved_plan_runs_as_saved_and_is_refused_once_the_fleet_drifted() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let site = site.to_str().unwrap();
    let out = shop.deploy(&["plan", site, "--out", "old.plan"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = shop.deploy(&["apply", site, "--yes", "--only", "db"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let refused = shop.deploy(&["apply", "old.plan", "--yes"]);
    assert_eq!(refused.status.code(), Some(4), "{}", stderr(&refused));
    for h in ["db1", "db2", "db3"] {
        assert!(
            stderr(&refused).contains(&format!(
                "host {h} had no state when planned, and now has state"
            )),
            "{}",
            stderr(&refused)
        );
    }
    assert!(
        !stderr(&refused).contains("app1"),
        "hosts that did not change are not listed"
    );
    let events = shop.all_events().len();

    let out = shop.deploy(&["plan", site, "--out", "new.plan"]);
    assert_eq!(out.status.code(), Some(0));
    let applied = shop.deploy(&["apply", "new.plan", "--yes"]);
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    assert!(shop.all_events().len() > events);
    for h in shop.hosts_of("app") {
        assert_eq!(shop.version(&h, "api"), "1.0");
    }
    let again = shop.deploy(&["apply", "new.plan", "--yes"]);
    assert_eq!(
        again.status.code(),
        Some(4),
        "a plan is carried out once: the fleet has moved on since"
    );
}

#[test]
fn a_saved_plan_edited_by_hand_is_refused_before_any_host_is_locked() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let out = shop.deploy(&["plan", site.to_str().unwrap(), "--out", "good.plan"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // A db step moved to a host the plan does not list, as a hand edit might.
    let text = std::fs::read_to_string(shop.fleet.dir.join("good.plan")).expect("read plan");
    let mut plan: serde_json::Value = serde_json::from_str(&text).expect("plan is JSON");
    let db = plan["services"]
        .as_array_mut()
        .and_then(|s| s.iter_mut().find(|s| s["name"] == "db"))
        .expect("db is planned");
    db["waves"][0]["steps"][0]["host"] = "ghost".into();
    let bad = shop.fleet.dir.join("bad.plan");
    std::fs::write(&bad, serde_json::to_string(&plan).expect("JSON")).expect("write plan");

    let out = shop.deploy(&["apply", "bad.plan", "--yes"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the saved plan bad.plan does not hold together"),
        "{err}"
    );
    assert!(
        err.contains("the step of db on ghost: no such host in the plan"),
        "{err}"
    );
    assert!(err.contains("deploy plan --out"), "{err}");

    // Another version for db, in the service and each of its steps: the plan holds together,
    // but it is not the site's.
    let mut plan: serde_json::Value = serde_json::from_str(&text).expect("plan is JSON");
    let db = plan["services"]
        .as_array_mut()
        .and_then(|s| s.iter_mut().find(|s| s["name"] == "db"))
        .expect("db is planned");
    db["version"] = "6.6".into();
    for wave in db["waves"].as_array_mut().expect("waves") {
        for step in wave["steps"].as_array_mut().expect("steps") {
            step["to"] = "6.6".into();
        }
    }
    std::fs::write(&bad, serde_json::to_string(&plan).expect("JSON")).expect("write plan");
    let out = shop.deploy(&["apply", "bad.plan", "--yes"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("service db goes to version 6.6, the site's is"),
        "{}",
        stderr(&out)
    );

    // Neither reached the hosts: not even the lock, which makes the state directory (an
    // apply locks every host; a plan only reads).
    for h in shop.fleet.names() {
        assert!(
            !shop.fleet.host_root(h).join("var-lib/drover").exists(),
            "{h} was locked"
        );
    }
    // The plan as made is carried out.
    let out = shop.deploy(&["apply", "good.plan", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
