//! Failing hosts on a real sshd fleet: rollback, failure budgets, and what a plan shows after.

use crate::support;

use support::shop::{Shop, Spec};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn whats(shop: &Shop, host: &str, skip: usize) -> Vec<String> {
    shop.events(host)
        .into_iter()
        .skip(skip)
        .map(|e| e.what)
        .collect()
}

/// Installs everything at 1.0 and returns the shop.
fn installed(spec: &Spec) -> (Shop, String) {
    let shop = Shop::start();
    let site = shop.write(spec).display().to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "install failed: {}",
        stderr(&out)
    );
    (shop, site)
}

#[test]
fn failed_check_rolls_back_and_stops_new_waves() {
    let spec = Spec {
        // Lock-step waves, today's rule kept as a choice (the default, `flow "slots"`, would
        // give app4's slot to app5 while app3's check still fails: tests/rollout).
        api_policy: "batch 2; max-failed 0; on-failure \"rollback\"; flow \"budget\"",
        ..Spec::default()
    };
    let (shop, _) = installed(&spec);
    std::fs::write(shop.fleet.host_root("app3").join("srv/fail-api"), "").unwrap();
    let site = shop
        .write(&Spec { api: "2.0", ..spec })
        .display()
        .to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed host makes the run fail: {}",
        stderr(&out)
    );

    // Waves [app1 app2] [app3 app4] [app5 app6]: app3 fails its check and is rolled back.
    assert_eq!(
        whats(&shop, "app3", 3),
        ["stop", "install", "migrate", "start", "rollback"]
    );
    let app3 = &shop.state("app3")["services"]["api"];
    assert_eq!(app3["version"], "1.0", "rolled back to the old version");
    assert_eq!(app3["validated"]["outcome"], "failure");
    assert_eq!(app3["validated"]["hook"], "check");
    let log = app3["validated"]["log"].as_str().unwrap();
    let log_text = std::fs::read_to_string(shop.fleet.dir.join(log))
        .expect("the failure points at a log on the controller");
    assert!(
        log_text.contains("== check: exit 1") && log_text.contains("== rollback: exit 0"),
        "{log_text}"
    );
    assert!(
        stderr(&out).contains(log),
        "the failure message points at its log"
    );
    assert_eq!(
        shop.serving("app3", "api"),
        "1.0",
        "rollback brought the old version back"
    );

    // Its wave-mate finished; the budget (0) was exceeded, so wave 3 never started.
    for h in ["app1", "app2", "app4"] {
        assert_eq!(shop.version(h, "api"), "2.0", "{h}");
    }
    for h in ["app5", "app6"] {
        assert_eq!(
            whats(&shop, h, 3),
            Vec::<String>::new(),
            "{h} was never touched"
        );
        assert_eq!(shop.version(h, "api"), "1.0", "{h}");
    }

    // The plan now lists exactly the hosts that remain.
    let plan = shop.deploy(&["plan", &site, "--json"]);
    assert_eq!(plan.status.code(), Some(0), "{}", stderr(&plan));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let api = plan["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "api")
        .unwrap();
    let mut left: Vec<&str> = api["waves"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["steps"].as_array().unwrap())
        .map(|s| s["host"].as_str().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["app3", "app5", "app6"]);
    let others: usize = plan["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] != "api")
        .map(|s| s["waves"].as_array().unwrap().len())
        .sum();
    assert_eq!(others, 0, "db and lb are converged");
}

#[test]
fn max_failed_budget_counts_failures_across_waves() {
    let spec = Spec {
        api_policy: "batch 1; max-failed 1; on-failure \"rollback\"",
        ..Spec::default()
    };
    let (shop, _) = installed(&spec);
    for h in ["app2", "app4"] {
        std::fs::write(shop.fleet.host_root(h).join("srv/fail-api"), "").unwrap();
    }
    let site = shop
        .write(&Spec { api: "2.0", ..spec })
        .display()
        .to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    // app2 fails (1 failed: within the budget of 1), app3 goes on, app4 fails (2 > 1): stop.
    assert_eq!(shop.version("app1", "api"), "2.0");
    assert_eq!(shop.version("app3", "api"), "2.0");
    for h in ["app2", "app4"] {
        assert_eq!(
            shop.state(h)["services"]["api"]["validated"]["outcome"],
            "failure",
            "{h}"
        );
    }
    for h in ["app5", "app6"] {
        assert_eq!(
            whats(&shop, h, 3),
            Vec::<String>::new(),
            "{h}: no wave starts once the budget is exceeded"
        );
    }
    assert!(stderr(&out).contains("HALTED"), "{}", stderr(&out));
}

#[test]
fn on_failure_stop_leaves_the_host_as_it_failed() {
    let spec = Spec {
        api_policy: "batch 1; max-failed 5; on-failure \"stop\"",
        ..Spec::default()
    };
    let (shop, _) = installed(&spec);
    std::fs::write(shop.fleet.host_root("app2").join("srv/fail-api"), "").unwrap();
    let site = shop
        .write(&Spec { api: "2.0", ..spec })
        .display()
        .to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        whats(&shop, "app2", 3),
        ["stop", "install", "migrate", "start"],
        "no rollback under on-failure stop"
    );
    assert_eq!(
        shop.version("app2", "api"),
        "2.0",
        "recorded as installed, not validated"
    );
    assert_eq!(
        shop.state("app2")["services"]["api"]["validated"]["outcome"],
        "failure"
    );
    assert_eq!(
        whats(&shop, "app3", 3),
        Vec::<String>::new(),
        "the first failure stops the service, whatever the budget"
    );
}

#[test]
fn a_dependency_that_fails_blocks_its_dependents() {
    let spec = Spec {
        policy: "batch 1; max-failed 0",
        ..Spec::default()
    };
    let shop = Shop::start();
    std::fs::write(shop.fleet.host_root("db2").join("srv/fail-db"), "").unwrap();
    let site = shop.write(&spec).display().to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("BLOCKED"), "{}", stderr(&out));
    for h in shop.hosts_of("app").into_iter().chain(shop.hosts_of("lb")) {
        assert!(
            shop.events(&h).is_empty(),
            "{h}: api needs every db host healthy, so nothing past db runs"
        );
    }
}

#[test]
fn a_hook_that_fails_mid_chain_runs_none_after_it_and_the_host_is_rolled_back() {
    let spec = Spec {
        api_policy: "batch 1; max-failed 0; on-failure \"rollback\"",
        ..Spec::default()
    };
    let (shop, _) = installed(&spec);
    // app1's `install` cannot write its version file: a directory stands in its place.
    let version = shop.fleet.host_root("app1").join("srv/api/version");
    std::fs::remove_file(&version).unwrap();
    std::fs::create_dir(&version).unwrap();
    let site = shop
        .write(&Spec { api: "2.0", ..spec })
        .display()
        .to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // `stop`, `install` and `migrate` went to the host as one chain: `install` failed, so the
    // host never ran `migrate` (nor `start`), and `rollback` ran over the same connection.
    assert_eq!(
        whats(&shop, "app1", 3),
        ["stop", "install", "rollback"],
        "{}",
        stderr(&out)
    );
    let app1 = &shop.state("app1")["services"]["api"];
    assert_eq!(app1["version"], "1.0", "rolled back: {app1}");
    assert_eq!(app1["configured"]["outcome"], "failure", "{app1}");
    assert_eq!(app1["configured"]["hook"], "install", "{app1}");
    let log = app1["configured"]["log"].as_str().unwrap();
    let log_text = std::fs::read_to_string(shop.fleet.dir.join(log)).expect("the step's log");
    assert!(
        log_text.contains("== stop: exit 0")
            && log_text.contains("== install: exit 2")
            && !log_text.contains("== migrate")
            && log_text.contains("== rollback: exit 0"),
        "{log_text}"
    );
}
