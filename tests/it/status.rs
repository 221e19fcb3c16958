//! `deploy status` and `deploy verify` on a real sshd fleet.

use crate::support;

use support::shop::{Shop, Spec};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn status_and_verify_follow_the_fleet() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default()).display().to_string();

    // Nothing deployed: every host is unaccounted for, and verify fails.
    let status = shop.deploy(&["status", &site, "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["unaccounted"].as_array().unwrap().len(), 12);
    assert_eq!(json["converged"], 0);
    assert_eq!(shop.deploy(&["verify", &site]).status.code(), Some(1));

    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let verify = shop.deploy(&["verify", &site]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stdout));
    assert!(
        text(&verify.stdout).contains("12 checks passed"),
        "{}",
        text(&verify.stdout)
    );

    // A service that dies after the rollout: state still says 2.0, but verify runs the check now.
    let pid = std::fs::read_to_string(shop.fleet.host_root("app4").join("srv/api/pid")).unwrap();
    assert!(shop
        .fleet
        .ssh("app4", &format!("kill {}", pid.trim()))
        .status
        .success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let verify = shop.deploy(&["verify", &site]);
    assert_eq!(verify.status.code(), Some(1));
    assert!(
        text(&verify.stdout).contains("app4 api"),
        "{}",
        text(&verify.stdout)
    );

    // A host that does not answer is unaccounted for in status, and fails verify.
    shop.fleet.kill_host("lb2");
    let status = shop.deploy(&["status", &site]);
    assert_eq!(status.status.code(), Some(0));
    let table = text(&status.stdout);
    assert!(
        table.contains("unaccounted:") && table.contains("lb2: does not answer"),
        "{table}"
    );
    assert!(
        table.contains("11 of 12 host services") || table.contains("of 12 host services"),
        "{table}"
    );
    let plan = shop.deploy(&["plan", &site]);
    assert!(
        text(&plan.stdout).contains("skipped, unreachable: lb2"),
        "{}",
        text(&plan.stdout)
    );
    let apply = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(
        apply.status.code(),
        Some(1),
        "an unreachable host means not converged"
    );
}

#[test]
fn status_table_names_failures_and_their_logs() {
    let shop = Shop::start();
    std::fs::write(shop.fleet.host_root("db3").join("srv/fail-db"), "").unwrap();
    let site = shop
        .write(&Spec {
            policy: "batch 1; max-failed 5; on-failure \"continue\"",
            ..Spec::default()
        })
        .display()
        .to_string();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    let status = shop.deploy(&["status", &site]);
    let table = text(&status.stdout);
    let row = table.lines().find(|l| l.starts_with("db3")).unwrap();
    assert!(row.contains("FAILED"), "{table}");
    assert!(
        table.contains("failed:") && table.contains("db3 db: see .drover/runs/"),
        "{table}"
    );
}
