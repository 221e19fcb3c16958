//! `deploy agent --simulate N` on a real etcd: N agents as tasks of one process, each on its own
//! host directory of a `local` platform, converge a three-tier site (db → api → web at 30 %)
//! as separate agents do, checked from what every simulated host recorded: its state file and
//! its hooks' own start/end times (never more than a service's batch switching at once, a
//! dependent only once its need's threshold was met), then a second version published while
//! they run.
#![cfg(feature = "etcd")]

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;
use support::pull::{most_at_once, text, timed, Pull};

const THREE_TIER: &str = r#"
service "db" {
    start "__DB__"
}
service "api" {
    needs "db"
    start "__API__"
}
service "web" {
    needs "api" healthy="50%"
    start "__WEB__"
}
"#;

const THIRTY: &str = "policy \"thirty\" {\n    batch \"30%\"\n    max-failed 0\n}\n";

fn three_tier() -> String {
    let quote = |s: String| s.replace('\\', "\\\\").replace('"', "\\\"");
    THREE_TIER
        .replace("__DB__", &quote(timed("0.3")))
        .replace("__API__", &quote(timed("0.2")))
        .replace("__WEB__", &quote(timed("0.2")))
}

#[test]
fn simulated_agents_converge_a_three_tier_site_a_batch_at_a_time() {
    let mut hosts: Vec<(String, &str)> = Vec::new();
    for (class, n) in [("db", 4), ("api", 8), ("web", 8)] {
        hosts.extend((1..=n).map(|i| (format!("{class}{i}"), class)));
    }
    let named: Vec<(&str, &str)> = hosts.iter().map(|(h, c)| (h.as_str(), *c)).collect();
    let mut pull = Pull::new(&named);
    pull.write_site("1.0", &three_tier(), THIRTY);
    pull.publish();
    pull.start_simulated(hosts.len());
    pull.wait_every(&named, "1.0", Duration::from_secs(300));
    let marks: Vec<usize> = hosts.iter().map(|(h, _)| pull.intervals(h).len()).collect();
    pull.write_site("2.0", &three_tier(), THIRTY);
    pull.publish();
    pull.wait_every(&named, "2.0", Duration::from_secs(300));
    let logs = pull.agent_logs();
    // One process ran them all, and said so.
    assert_eq!(pull.agents.len(), 1);
    assert!(logs.contains("simulating 20 agents"), "{logs}");
    let size = |class: &str| hosts.iter().filter(|(_, c)| *c == class).count();
    for round in 0..2 {
        let mut by_service: BTreeMap<String, Vec<(u128, u128)>> = BTreeMap::new();
        for ((h, _), mark) in hosts.iter().zip(&marks) {
            let ran = pull.intervals(h);
            let ran = if round == 0 {
                &ran[..*mark]
            } else {
                &ran[*mark..]
            };
            // One step per host and round: no hook ran twice.
            assert_eq!(ran.len(), 1, "{h}, round {round}: {ran:?}\n{logs}");
            for (s, start, end) in ran {
                assert!(*end != u128::MAX, "{h}: a hook never ended\n{logs}");
                by_service
                    .entry(s.clone())
                    .or_default()
                    .push((*start, *end));
            }
        }
        // batch "30%" of each class, rounded down, at least one: db 1 of 4, api and web 2 of 8.
        for service in ["db", "api", "web"] {
            let batch = (size(service) * 30 / 100).max(1);
            let most = most_at_once(&by_service[service]);
            assert!(
                (1..=batch).contains(&most),
                "round {round}: {most} {service} hosts at once, batch {batch}\n{logs}"
            );
        }
        // api needs db on every host: no api hook before the last db hook ended.
        let db_done = by_service["db"].iter().map(|i| i.1).max().unwrap_or(0);
        let api_first = by_service["api"].iter().map(|i| i.0).min().unwrap_or(0);
        assert!(api_first > db_done, "round {round}: api before db ended");
        // web needs half the api hosts healthy: its first hook after the fourth api ended.
        let mut api_ends: Vec<u128> = by_service["api"].iter().map(|i| i.1).collect();
        api_ends.sort_unstable();
        let web_first = by_service["web"].iter().map(|i| i.0).min().unwrap_or(0);
        assert!(
            web_first > api_ends[size("api") / 2 - 1],
            "round {round}: web before half the api hosts ended\n{logs}"
        );
    }
    // `deploy status` (from the store, as the simulated agents published it) agrees with every
    // host's own state file.
    let out = pull.deploy(&["status", "site.kdl", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let listed = status["hosts"].as_array().expect("hosts");
    assert_eq!(listed.len(), hosts.len());
    for h in listed {
        let name = h["host"].as_str().unwrap_or_default();
        for s in h["services"].as_array().expect("services") {
            let service = s["service"].as_str().unwrap_or_default();
            assert_eq!(
                pull.recorded(name, service).as_deref(),
                s["running"].as_str(),
                "{name}"
            );
        }
    }
}
