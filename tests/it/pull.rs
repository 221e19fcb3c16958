//! Pull mode's agents on a real etcd: `deploy agent` processes, one per host directory of a
//! `local` platform, converge a two-tier site through their services' semaphores (from the
//! hooks' own start/end times: never more than the batch of a service switching at once, web
//! only once db is healthy everywhere; `status` and `verify` agree), read their own secrets,
//! admit no host once a budget is spent (until a fixed snapshot), exclude `apply` and are
//! excluded by it; a SIGKILLed agent's slot frees within its lease's TTL, and restarted, it
//! carries its host on.
#![cfg(feature = "etcd")]

use crate::support;

use std::path::PathBuf;
use std::time::Duration;
use support::pull::{flat, most_at_once, text, timed, Pull, HALF, PREFIX, SITE};

const TWO_TIER: &str = r#"
service "db" {
    start "__DB__"
}
service "web" {
    needs "db"
    start "__WEB__"
}
"#;

fn two_tier_services() -> String {
    let quote = |s: String| s.replace('\\', "\\\\").replace('"', "\\\"");
    TWO_TIER
        .replace("__DB__", &quote(timed("0.3")))
        .replace("__WEB__", &quote(timed("0.4")))
}

#[test]
fn agents_converge_a_two_tier_site_a_batch_at_a_time_and_status_agrees() {
    let hosts = [
        ("db1", "db"),
        ("db2", "db"),
        ("web1", "web"),
        ("web2", "web"),
        ("web3", "web"),
        ("web4", "web"),
        ("web5", "web"),
        ("web6", "web"),
    ];
    let mut pull = Pull::new(&hosts);
    pull.write_site("1.0", &two_tier_services(), HALF);
    let first = pull.publish();
    assert!(first.contains(", 3 new,"), "{first}");
    // The same content again: no new content, the same snapshot.
    let again = pull.publish();
    assert!(again.contains(", 0 new,"), "{again}");
    assert!(again.contains("already the desired snapshot"), "{again}");
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait_every(&hosts, "1.0", Duration::from_secs(300));

    // A new version, published while the agents run: they converge on it.
    let marks: Vec<usize> = hosts.iter().map(|(h, _)| pull.intervals(h).len()).collect();
    pull.write_site("2.0", &two_tier_services(), HALF);
    pull.publish();
    pull.wait_every(&hosts, "2.0", Duration::from_secs(300));
    let logs = pull.agent_logs();
    for round in 0..2 {
        let mut by_service: std::collections::BTreeMap<String, Vec<(u128, u128)>> =
            Default::default();
        for ((h, _), mark) in hosts.iter().zip(&marks) {
            let ran = pull.intervals(h);
            let ran = if round == 0 {
                &ran[..*mark]
            } else {
                &ran[*mark..]
            };
            assert_eq!(ran.len(), 1, "{h}, round {round}: {ran:?}\n{logs}");
            for (s, start, end) in ran {
                assert!(*end != u128::MAX, "{h}: a hook never ended\n{logs}");
                by_service
                    .entry(s.clone())
                    .or_default()
                    .push((*start, *end));
            }
        }
        // batch "50%": 1 of 2 db hosts, 3 of 6 web hosts.
        let db = most_at_once(&by_service["db"]);
        let web = most_at_once(&by_service["web"]);
        assert_eq!(db, 1, "round {round}: {by_service:?}\n{logs}");
        assert!(
            (1..=3).contains(&web),
            "round {round}: {web} at once\n{logs}"
        );
        // web needs db on every host: no web hook before the last db hook ended.
        let db_done = by_service["db"].iter().map(|i| i.1).max().unwrap_or(0);
        let web_first = by_service["web"].iter().map(|i| i.0).min().unwrap_or(0);
        assert!(
            web_first > db_done,
            "round {round}: web started before db ended"
        );
    }
    // Every slot given back (after the step's record is published).
    pull.wait("every slot is given back", Duration::from_secs(10), || {
        pull.keys("slots/").is_empty()
    });

    // `deploy status` (from the store) agrees with every host's own state file.
    let out = pull.deploy(&["status", "site.kdl", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let listed = status["hosts"].as_array().expect("hosts");
    assert_eq!(listed.len(), hosts.len());
    for h in listed {
        let name = h["host"].as_str().unwrap_or_default();
        for s in h["services"].as_array().expect("services") {
            let service = s["service"].as_str().unwrap_or_default();
            assert_eq!(s["running"], "2.0", "{name} {service}: {s}");
            assert_eq!(s["desired"], "2.0", "{name} {service}: {s}");
            assert_eq!(s["ok"], true, "{name} {service}: {s}");
            assert_eq!(
                pull.recorded(name, service).as_deref(),
                s["running"].as_str(),
                "{name}"
            );
        }
    }
    // And `verify`, which reads the hosts themselves.
    let out = pull.deploy(&["verify", "site.kdl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn secrets_are_read_by_each_agent_on_its_host_and_never_published() {
    let mut pull = Pull::new(&[("db1", "db"), ("web1", "web")]);
    let services = r##"
service "db" {
    secret "DBPASS" env="DBPASS"
    install #"printf %s "$DBPASS" >pass.out"#
}
service "web" {
    secret "TOKEN" file="secrets/token"
    install #"printf %s "$TOKEN" >token.out"#
}
"##;
    pull.write_site("1.0", services, HALF);
    // The publishing machine has neither secret.
    pull.publish();
    // Each host has only its own service's: a file under the agent's secrets directory at
    // its path from the site file, a variable in the agent's environment.
    let token = pull.path("agents/web1/secrets/secrets/token");
    std::fs::create_dir_all(token.parent().expect("a directory")).expect("secrets directory");
    std::fs::write(&token, "web1-token-4a7f").expect("token");
    pull.start_agent_with("db1", &[("DBPASS", "db1-password-9c2e")]);
    pull.start_agent("web1");
    pull.wait("both hosts run 1.0", Duration::from_secs(180), || {
        pull.recorded("db1", "db").as_deref() == Some("1.0")
            && pull.recorded("web1", "web").as_deref() == Some("1.0")
    });
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    assert_eq!(
        read(pull.host_dir("db1").join("pass.out")),
        "db1-password-9c2e"
    );
    assert_eq!(
        read(pull.host_dir("web1").join("token.out")),
        "web1-token-4a7f"
    );
    for (key, value) in pull.etcd.keys(PREFIX) {
        for secret in ["db1-password-9c2e", "web1-token-4a7f"] {
            assert!(!value.contains(secret), "{key} holds a secret");
        }
    }
}

#[test]
fn once_the_failure_budget_is_spent_no_host_is_admitted_anywhere() {
    let hosts = [
        ("web1", "web"),
        ("web2", "web"),
        ("web3", "web"),
        ("web4", "web"),
    ];
    let mut pull = Pull::new(&hosts);
    let one = "policy \"one\" {\n    batch 1\n    max-failed 0\n}\n";
    // Every host's check fails: the first host admitted fails, and spends the budget.
    let services = format!(
        "service \"web\" {{\n    start \"{}\"\n    check \"false\" timeout=\"1s\"\n}}\n",
        timed("0.2").replace('"', "\\\"")
    );
    pull.write_site("1.0", &services, one);
    pull.publish();
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    let failed = |pull: &Pull| {
        pull.etcd
            .keys(&format!("{PREFIX}/{SITE}/status/web/"))
            .into_iter()
            .filter(|(k, v)| k.ends_with("/validated") && v.contains("\"failure\""))
            .count()
    };
    pull.wait("a host failed", Duration::from_secs(180), || {
        failed(&pull) >= 1
    });
    // The others keep their slots, waiting, and none starts: the budget is fleet-wide.
    pull.wait(
        "another agent waits on the budget",
        Duration::from_secs(60),
        || {
            pull.agent_logs()
                .contains("waiting: 1 hosts failed at 1.0, more than the budget of 0")
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    let started: Vec<&str> = hosts
        .iter()
        .filter(|(h, _)| !pull.intervals(h).is_empty())
        .map(|(h, _)| *h)
        .collect();
    let logs = pull.agent_logs();
    assert_eq!(started.len(), 1, "{started:?}\n{logs}");
    assert_eq!(failed(&pull), 1, "{logs}");
    assert!(
        logs.contains("waiting: 1 hosts failed at 1.0, more than the budget of 0"),
        "{logs}"
    );

    // A fixed snapshot: the waiting agents give their slots back and take it up.
    let fixed = format!(
        "service \"web\" {{\n    start \"{}\"\n    check \"true\"\n}}\n",
        timed("0.2").replace('"', "\\\"")
    );
    pull.write_site("1.1", &fixed, one);
    pull.publish();
    pull.wait_every(&hosts, "1.1", Duration::from_secs(180));
    assert!(
        pull.agent_logs()
            .contains("web: a newer snapshot was published: the slot is given back"),
        "{}",
        pull.agent_logs()
    );
}

#[test]
fn push_and_pull_exclude_each_other() {
    let mut pull = Pull::new(&[("web1", "web"), ("web2", "web")]);
    let services = format!(
        "service \"web\" {{\n    start \"{}\"\n}}\n",
        timed("0.1").replace('"', "\\\"")
    );
    pull.write_site("1.0", &services, HALF);
    pull.publish();
    // An apply from another machine holds the site's lock (on a long lease, revoked below):
    // the agent admits no step.
    let lease = support::etcd::grant(&pull.etcd, 60);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"pull"}"#;
    support::etcd::put(
        &pull.etcd,
        &format!("{PREFIX}/{SITE}/lock"),
        holder,
        lease.clone(),
    );
    pull.start_agent("web1");
    pull.wait(
        "the agent waits on the lock",
        Duration::from_secs(60),
        || {
            pull.agent_logs()
                .contains("waiting: the site's lock is held by ops on elsewhere (pid 4242")
        },
    );
    assert!(pull.intervals("web1").is_empty(), "{}", pull.agent_logs());
    // Once it is given back, the agent goes on.
    support::etcd::revoke(&pull.etcd, &lease);
    pull.wait("web1 runs 1.0", Duration::from_secs(120), || {
        pull.recorded("web1", "web").as_deref() == Some("1.0")
    });

    // An agent holds a slot: `deploy apply` is refused, naming it, and changes nothing.
    let lease = support::etcd::grant(&pull.etcd, 60);
    let slot = format!("{PREFIX}/{SITE}/slots/web/web9");
    support::etcd::put(&pull.etcd, &slot, holder, lease.clone());
    let out = pull.deploy(&["apply", "site.kdl", "--yes"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("pull agents are converging site pull"),
        "{err}"
    );
    assert!(err.contains(&slot), "{err}");
    assert!(pull.recorded("web2", "web").is_none(), "nothing ran");
    assert!(pull.keys("lock").is_empty(), "the lock is given back");
    // Once that slot is gone, the same apply goes through.
    support::etcd::revoke(&pull.etcd, &lease);
    pull.wait("the slot is gone", Duration::from_secs(60), || {
        pull.keys("slots/").is_empty()
    });
    let out = pull.deploy(&["apply", "site.kdl", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(pull.recorded("web2", "web").as_deref(), Some("1.0"));
}

#[test]
fn a_killed_agents_slot_frees_within_its_ttl_and_another_host_is_admitted() {
    let hosts = [("web1", "web"), ("web2", "web"), ("web3", "web")];
    let mut pull = Pull::new(&hosts);
    let one = "policy \"one\" {\n    batch 1\n    max-failed 0\n}\n";
    let services = format!(
        "service \"web\" {{\n    start \"{}\"\n}}\n",
        timed("20").replace('"', "\\\"")
    );
    pull.write_site("1.0", &services, one);
    pull.publish();
    // The one test of a short TTL: how soon a killed agent's slot frees.
    pull.agent_ttl = "2s".into();
    // The site's lock is held (on a long lease) until every agent holds its slot, so that all
    // three slots exist while the first host steps, however late an agent starts.
    let lock = support::etcd::grant(&pull.etcd, 60);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"pull"}"#;
    support::etcd::put(
        &pull.etcd,
        &format!("{PREFIX}/{SITE}/lock"),
        holder,
        lock.clone(),
    );
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait("three slots", Duration::from_secs(120), || {
        pull.keys("slots/web/").len() == 3
    });
    support::etcd::revoke(&pull.etcd, &lock);
    let started = |pull: &Pull| -> Vec<String> {
        hosts
            .iter()
            .filter(|(h, _)| !pull.intervals(h).is_empty())
            .map(|(h, _)| h.to_string())
            .collect()
    };
    pull.wait("a host is admitted", Duration::from_secs(180), || {
        !started(&pull).is_empty()
    });
    // Every agent holds a slot: one admitted, two waiting behind it.
    assert_eq!(pull.keys("slots/web/").len(), 3, "{}", pull.agent_logs());
    let first = started(&pull);
    assert_eq!(first.len(), 1, "batch 1: {first:?}\n{}", pull.agent_logs());
    let victim = first[0].clone();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        started(&pull),
        first,
        "no second host while the first steps"
    );
    let (_, child) = pull
        .agents
        .iter_mut()
        .find(|(h, _)| *h == victim)
        .expect("the admitted host's agent");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let slot = format!("slots/web/{victim}");
    // Nothing but the lease's end can free it (its agent is dead, its hook sleeps 20 s): a
    // slot never freed fails the wait.
    let freed = pull.wait(
        "the killed agent's slot is gone",
        Duration::from_secs(12),
        || pull.keys(&slot).is_empty(),
    );
    // The lease's TTL (2 s), etcd's own lease checking, and a generous margin for a loaded
    // machine; below the killed step's 20 s.
    assert!(freed <= Duration::from_secs(12), "freed after {freed:?}");
    pull.wait("another host is admitted", Duration::from_secs(60), || {
        started(&pull).len() == 2
    });
    // The killed host's hook did not end before the other was admitted: the slot was freed
    // by the lease, not by the step's end.
    let killed = pull.intervals(&victim);
    let other = started(&pull)
        .into_iter()
        .find(|h| *h != victim)
        .expect("the second host");
    let second = pull.intervals(&other)[0].1;
    assert!(
        killed[0].2 == u128::MAX || killed[0].2 > second,
        "{killed:?} vs {second}\n{}",
        pull.agent_logs()
    );
    // The killed agent's intent is left in etcd: a push after it reads the host.
    assert_eq!(pull.keys(&format!("busy/{victim}")).len(), 1);

    // Restarted, the killed agent carries its host on: every host converges.
    pull.agents.retain(|(h, _)| *h != victim);
    pull.start_agent(&victim);
    pull.wait_every(&hosts, "1.0", Duration::from_secs(240));
    pull.wait(
        "every slot and intent is gone",
        Duration::from_secs(10),
        || pull.keys("slots/").is_empty() && pull.keys("busy/").is_empty(),
    );
    // Its last line (said once the step's records are out and its slot given back) may come
    // a moment after the keys are gone.
    let log_of =
        || std::fs::read_to_string(pull.path(&format!("agent-{victim}.log"))).unwrap_or_default();
    pull.wait(
        "the restarted agent says how it ended",
        Duration::from_secs(10),
        || log_of().contains("snapshot ") && log_of().lines().any(|l| l.contains("converged (")),
    );
    let log = log_of();
    // It stopped the hook its killed run left running, and carried that run on.
    assert!(log.contains("stopped 1 hook that run"), "{log}");
    assert!(log.contains("carrying on: run"), "{log}");
    assert!(
        log.contains("converged (1 services stepped, 0 failed)"),
        "{log}"
    );
}

#[test]
fn an_agent_reaches_etcd_over_tls_with_the_sites_ca() {
    let etcd = support::etcd::Etcd::start_tls();
    let ca = etcd.ca.clone().expect("the test CA");
    let mut pull = Pull::on(etcd, &[("web1", "web")]);
    let services = "service \"web\" {\n    start \"true\"\n}\n";
    pull.write_site("1.0", services, HALF);
    pull.publish();
    pull.agent_args = vec!["--tls-ca".into(), ca.display().to_string()];
    pull.start_agent("web1");
    let started = std::time::Instant::now();
    while pull.recorded("web1", "web").as_deref() != Some("1.0") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "web1 does not run 1.0\n{}",
            pull.agent_logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Without the CA, the agent does not get in.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args([
            "agent",
            "--store",
            &pull.etcd.endpoints(),
            "--prefix",
            PREFIX,
        ])
        .args(["--site", SITE, "--host", "web1"])
        .arg("--state-dir")
        .arg(pull.path("agents/other"))
        .arg("--root")
        .arg(pull.host_dir("web1"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run an agent");
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
}
