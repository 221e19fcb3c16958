//! Pull mode's policies between waves on a real etcd, agents as separate `deploy agent`
//! processes on host directories of a `local` platform: a `canary` (its hosts alone, the rest
//! only once they passed, none while a canary failed), `pause "confirm"` (a wave waits for
//! `deploy resume SITE`, recorded in etcd) and a timed `pause`; and `deploy publish --follow`
//! (the agents' progress from the store, as `apply`'s events, to the end, `apply`'s exit
//! code). Checked from the hooks' own start/end times, the hosts' state files and the agents'
//! own words.
#![cfg(feature = "etcd")]

use crate::support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::pull::{text, timed, Pull, PREFIX, SITE};

fn service(start: &str, check: &str) -> String {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "service \"api\" {{\n    start \"{}\"\n    check \"{}\" timeout=\"5s\"\n}}\n",
        quote(start),
        quote(check)
    )
}

/// Now, in nanoseconds since the epoch (as the hooks' `date +%s%N`).
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn log_of(pull: &Pull, host: &str) -> String {
    std::fs::read_to_string(pull.path(&format!("agent-{host}.log"))).unwrap_or_default()
}

/// Waits until `host`'s agent has said `words`.
fn said(pull: &Pull, host: &str, words: &str) {
    pull.wait(
        &format!("{host}'s agent says {words:?}"),
        Duration::from_secs(120),
        || log_of(pull, host).contains(words),
    );
}

#[test]
fn a_canary_goes_alone_and_the_rest_only_once_it_passed() {
    let hosts = [
        ("api1", "api"),
        ("api2", "api"),
        ("api3", "api"),
        ("api4", "api"),
    ];
    let mut pull = Pull::new(&hosts);
    // max-failed 1: a failed canary alone does not spend the budget; the canary holds.
    let policy = "policy \"c\" {\n    batch \"50%\"\n    canary 1\n    max-failed 1\n}\n";
    pull.write_site("1.0", &service(&timed("0.5"), "test ! -e fail"), policy);
    pull.publish();
    // The others first: without the canary they would go before api1 is even started.
    for h in ["api2", "api3", "api4"] {
        pull.start_agent(h);
    }
    for h in ["api2", "api3", "api4"] {
        said(&pull, h, "the canary has not passed at 1.0: api1");
    }
    std::thread::sleep(Duration::from_secs(1));
    for h in ["api2", "api3", "api4"] {
        assert!(pull.intervals(h).is_empty(), "{h} ran before the canary");
    }
    pull.start_agent("api1");
    pull.wait_every(&hosts, "1.0", Duration::from_secs(120));
    let logs = pull.agent_logs();
    let canary = pull.intervals("api1");
    assert_eq!(canary.len(), 1, "{canary:?}\n{logs}");
    let canary_end = canary[0].2;
    let mut rest = Vec::new();
    for h in ["api2", "api3", "api4"] {
        let ran = pull.intervals(h);
        assert_eq!(ran.len(), 1, "{h}: {ran:?}\n{logs}");
        assert!(
            ran[0].1 > canary_end,
            "{h} started before the canary ended\n{logs}"
        );
        rest.push((ran[0].1, ran[0].2));
    }
    // The rest under the batch (2 of 4), a freed slot going on at once.
    let at_once = rest
        .iter()
        .map(|(s, _)| rest.iter().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0);
    assert!((1..=2).contains(&at_once), "{at_once} at once: {rest:?}");

    // 2.0 with a canary whose check fails: no other host goes, though the budget holds.
    std::fs::write(pull.host_dir("api1").join("fail"), "").expect("fail marker");
    let marks: Vec<usize> = hosts.iter().map(|(h, _)| pull.intervals(h).len()).collect();
    pull.write_site("2.0", &service(&timed("0.2"), "test ! -e fail"), policy);
    pull.publish();
    said(&pull, "api1", "1 failed");
    for h in ["api2", "api3", "api4"] {
        said(&pull, h, "the canary has not passed at 2.0: api1");
    }
    std::thread::sleep(Duration::from_secs(2));
    for ((h, _), mark) in hosts.iter().zip(&marks).skip(1) {
        assert_eq!(
            pull.intervals(h).len(),
            *mark,
            "{h} ran 2.0 after a failed canary\n{}",
            pull.agent_logs()
        );
        assert_eq!(pull.recorded(h, "api").as_deref(), Some("1.0"));
    }
}

#[test]
fn a_pause_confirm_waits_for_deploy_resume_wave_by_wave() {
    let hosts = [("api1", "api"), ("api2", "api"), ("api3", "api")];
    let mut pull = Pull::new(&hosts);
    let policy = "policy \"ask\" {\n    batch 1\n    pause \"confirm\"\n}\n";
    pull.write_site("1.0", &service(&timed("0.3"), "true"), policy);
    pull.publish();
    // Nothing waits yet: refused, nothing written.
    let out = pull.deploy(&["resume", "site.kdl"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("waits for `deploy resume`"),
        "{}",
        text(&out.stderr)
    );
    assert!(pull.keys("resume/").is_empty());
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait("api1 runs 1.0", Duration::from_secs(120), || {
        pull.recorded("api1", "api").as_deref() == Some("1.0")
    });
    said(&pull, "api2", "wave 2 waits for `deploy resume`");
    std::thread::sleep(Duration::from_secs(1));
    for h in ["api2", "api3"] {
        assert!(pull.intervals(h).is_empty(), "{h} ran before a resume");
    }
    // No agent holds a slot while its wave waits, but each holds its waiting key: a push is
    // refused all the same, naming one, and changes nothing.
    assert!(pull.keys("slots/").is_empty(), "{:?}", pull.keys("slots/"));
    let out = pull.deploy(&["apply", "site.kdl", "--yes"]);
    let err = text(&out.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("pull agents are converging site"), "{err}");
    assert!(err.contains("waiting/api/api"), "{err}");
    for h in ["api2", "api3"] {
        assert!(pull.intervals(h).is_empty(), "{h} ran on a refused apply");
    }

    let resumed_at = now_ns();
    let out = pull.deploy(&["resume", "site.kdl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("wave 2 of api may start"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(pull.keys("resume/").len(), 1);
    pull.wait("api2 runs 1.0", Duration::from_secs(120), || {
        pull.recorded("api2", "api").as_deref() == Some("1.0")
    });
    let api2 = pull.intervals("api2");
    assert!(api2[0].1 > resumed_at, "api2 started before the resume");
    said(&pull, "api3", "wave 3 waits for `deploy resume`");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        pull.intervals("api3").is_empty(),
        "api3 ran on wave 2's resume"
    );

    // The site file changed since (not published): resume goes by the published snapshot,
    // as the agents do.
    pull.write_site("9.9", &service(&timed("0.3"), "true"), policy);
    // Fenced by the site's lock, as publish is: refused while another run holds it.
    let lease = support::etcd::grant(&pull.etcd, 60);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"pull"}"#;
    support::etcd::put(
        &pull.etcd,
        &format!("{PREFIX}/{SITE}/lock"),
        holder,
        lease.clone(),
    );
    let out = pull.deploy(&["resume", "site.kdl"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("r-elsewhere"), "{err}");
    support::etcd::revoke(&pull.etcd, &lease);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        pull.intervals("api3").is_empty(),
        "api3 ran on a refused resume"
    );

    let resumed_again = now_ns();
    let out = pull.deploy(&["resume", "site.kdl", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["resumed"][0]["service"], "api", "{v}");
    assert_eq!(v["resumed"][0]["wave"], 3, "{v}");
    pull.wait("api3 runs 1.0", Duration::from_secs(120), || {
        pull.recorded("api3", "api").as_deref() == Some("1.0")
    });
    assert!(pull.intervals("api3")[0].1 > resumed_again);
    // Every wave ran: nothing waits any more.
    let out = pull.deploy(&["resume", "site.kdl"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
}

#[test]
fn a_timed_pause_holds_the_next_wave_after_the_one_before_ended() {
    let hosts = [("api1", "api"), ("api2", "api")];
    let mut pull = Pull::new(&hosts);
    let policy = "policy \"slow\" {\n    batch 1\n    pause \"2s\"\n}\n";
    // The check is long and logged too: a pause counted from a stamp taken when the check
    // was sent would end before the check does plus the pause.
    pull.write_site("1.0", &service(&timed("0.2"), &timed("1.5")), policy);
    pull.publish();
    let started = Instant::now();
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait_every(&hosts, "1.0", Duration::from_secs(120));
    // A host records its version before its check runs: its hooks' log is read once both of
    // its hooks have ended (a hook that never runs fails the count below after the wait).
    pull.wait("every check ended", Duration::from_secs(30), || {
        hosts.iter().all(|(h, _)| {
            let ran = pull.intervals(h);
            ran.len() >= 2 && ran.iter().all(|i| i.2 != u128::MAX)
        })
    });
    let logs = pull.agent_logs();
    let first = pull.intervals("api1");
    let second = pull.intervals("api2");
    assert_eq!(
        (first.len(), second.len()),
        (2, 2),
        "start and check\n{logs}"
    );
    // From wave 1's last hook's end to wave 2's first hook's start.
    let ended = first.iter().map(|i| i.2).max().expect("wave 1's hooks");
    let began = second.iter().map(|i| i.1).min().expect("wave 2's hooks");
    let gap = began.saturating_sub(ended);
    assert!(
        gap >= 2_000_000_000,
        "wave 2 started {} ms after wave 1 ended: {first:?} {second:?}\n{logs}",
        gap / 1_000_000
    );
    assert!(
        logs.contains("waits for the pause of 2s after wave 1"),
        "{logs}"
    );
    assert!(started.elapsed() < Duration::from_secs(100));
}

/// `deploy publish site.kdl --follow --json` run to its end (at most `limit`): exit code,
/// publish's own line, and the events.
fn follow(
    pull: &Pull,
    limit: Duration,
) -> (Option<i32>, serde_json::Value, Vec<serde_json::Value>) {
    let mut child = support::cli::deploy_in(pull.dir.path())
        .args(["publish", "site.kdl", "--follow", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("deploy publish --follow");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "publish --follow did not end within {limit:?}\n{}\n{}\n{}",
                text(&out.stdout),
                text(&out.stderr),
                pull.agent_logs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    let mut lines = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .collect::<Vec<_>>()
        .into_iter();
    let published = lines.next().expect("publish's own line");
    (status.code(), published, lines.collect())
}

fn events<'a>(all: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    all.iter().filter(|e| e["event"] == kind).collect()
}

/// An event's time, in nanoseconds since the epoch.
fn ns(event: &serde_json::Value) -> u128 {
    let t = humantime::parse_rfc3339(event["time"].as_str().expect("time")).expect("RFC 3339");
    t.duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos()
}

const TIERS: &str = r#"
service "db" {
    start "__DB__"
}
service "web" {
    needs "db"
    start "__WEB__"
    check "test ! -e fail" timeout="5s"
}
"#;

fn tiers() -> String {
    let quote = |s: String| s.replace('\\', "\\\\").replace('"', "\\\"");
    TIERS
        .replace("__DB__", &quote(timed("0.3")))
        .replace("__WEB__", &quote(timed("0.3")))
}

#[test]
fn publish_follow_shows_the_agents_progress_and_ends_once_every_host_ended() {
    let hosts = [("db1", "db"), ("web1", "web"), ("web2", "web")];
    let mut pull = Pull::new(&hosts);
    // The canary: web1 goes first, whichever agent asks first.
    let policy = "policy \"one\" {\n    batch 1\n    canary 1\n    max-failed 0\n}\n";
    pull.write_site("1.0", &tiers(), policy);
    pull.publish();
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait_every(&hosts, "1.0", Duration::from_secs(120));

    // 2.0, followed to its end.
    let marks: Vec<usize> = hosts.iter().map(|(h, _)| pull.intervals(h).len()).collect();
    pull.write_site("2.0", &tiers(), policy);
    let (code, published, all) = follow(&pull, Duration::from_secs(120));
    let logs = pull.agent_logs();
    assert_eq!(code, Some(0), "{all:?}\n{logs}");
    assert_eq!(published["site"], "pull", "{published}");
    assert_eq!(
        all.first().map(|e| &e["event"]),
        Some(&"run-started".into())
    );
    let finished = events(&all, "step-finished");
    assert_eq!(finished.len(), 3, "{all:?}");
    for ((h, c), mark) in hosts.iter().zip(&marks) {
        // What the host itself records, and when its own hook ended: before the event.
        assert_eq!(pull.recorded(h, c).as_deref(), Some("2.0"), "{h}");
        let ran = pull.intervals(h);
        assert_eq!(ran.len(), mark + 1, "{h}: {ran:?}");
        let e = finished
            .iter()
            .find(|e| e["host"] == *h)
            .unwrap_or_else(|| panic!("no step-finished of {h}: {all:?}"));
        assert_eq!(e["service"], *c);
        assert_eq!(e["ok"], true, "{e}");
        assert!(
            ns(e) >= ran[*mark].2,
            "{h}: said to end before its hook ended"
        );
    }
    let end = events(&all, "run-finished");
    assert_eq!(end.len(), 1, "{all:?}");
    assert_eq!(end[0]["converged"], true, "{}", end[0]);
    assert_eq!(end[0]["succeeded"], 3, "{}", end[0]);
    assert_eq!(end[0]["kinds"]["upgraded"], 3, "{}", end[0]);
    let last_hook = hosts
        .iter()
        .map(|(h, _)| pull.intervals(h).last().map_or(0, |i| i.2))
        .max()
        .unwrap_or(0);
    assert!(ns(end[0]) >= last_hook);
    let services = events(&all, "service-finished");
    assert_eq!(services.len(), 2, "{all:?}");
    assert!(
        services.iter().all(|s| s["outcome"] == "done"),
        "{services:?}"
    );

    // 3.0 with web1's check failing: web's budget (0) is spent, web2 never starts; the
    // follow ends, not converged, exit 1 as apply's.
    std::fs::write(pull.host_dir("web1").join("fail"), "").expect("fail marker");
    pull.write_site("3.0", &tiers(), policy);
    let (code, _, all) = follow(&pull, Duration::from_secs(120));
    let logs = pull.agent_logs();
    assert_eq!(code, Some(1), "{all:?}\n{logs}");
    let web = events(&all, "service-finished")
        .into_iter()
        .find(|e| e["service"] == "web")
        .unwrap_or_else(|| panic!("{all:?}"))
        .clone();
    assert_eq!(web["outcome"], "halted", "{web}");
    assert_eq!(
        (web["failed"].as_u64(), web["not_started"].as_u64()),
        (Some(1), Some(1)),
        "{web}"
    );
    let end = events(&all, "run-finished");
    assert_eq!(end[0]["converged"], false, "{}", end[0]);
    // As the hosts record it: db1 at 3.0, web2 never ran 3.0.
    assert_eq!(pull.recorded("db1", "db").as_deref(), Some("3.0"));
    assert_eq!(pull.recorded("web2", "web").as_deref(), Some("2.0"));
    assert_eq!(pull.intervals("web2").len(), marks[2] + 1, "{logs}");
    let failed = events(&all, "step-finished")
        .into_iter()
        .find(|e| e["host"] == "web1")
        .unwrap_or_else(|| panic!("{all:?}"))
        .clone();
    assert_eq!(failed["ok"], false, "{failed}");
    let web1 = pull.recorded("web1", "web");
    assert_eq!(
        failed["rolled_back"],
        web1.as_deref() != Some("3.0"),
        "{failed}, web1 records {web1:?}"
    );

    // 4.0 fixed, followed as plain lines (not a terminal): apply's lines, exit 0.
    std::fs::remove_file(pull.host_dir("web1").join("fail")).expect("fail marker");
    pull.write_site("4.0", &tiers(), policy);
    let out = support::cli::deploy_in(pull.dir.path())
        .args(["publish", "site.kdl", "--follow"])
        .output()
        .expect("deploy publish --follow");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", pull.agent_logs());
    assert!(err.starts_with("published pull snapshot "), "{err}");
    for line in [
        "db: db1 ok",
        "web: web1 ok",
        "web: web2 ok",
        "web: done (2 ok, 0 failed",
    ] {
        assert!(err.contains(line), "{line:?} in {err}");
    }
    assert!(err.contains("run converged: 3 ok (3 upgraded)"), "{err}");
    for (h, c) in hosts {
        assert_eq!(pull.recorded(h, c).as_deref(), Some("4.0"), "{h}");
    }
}

/// How many snapshots are published (`snapshots/<digest>/<n>`).
fn snapshots(pull: &Pull) -> usize {
    let keys = pull.keys("snapshots/");
    let digests: std::collections::BTreeSet<&str> =
        keys.iter().filter_map(|k| k.rsplit('/').nth(1)).collect();
    digests.len()
}

#[test]
fn publish_follow_ends_when_a_newer_snapshot_is_published_or_on_sigint() {
    let hosts = [("api1", "api")];
    let mut pull = Pull::new(&hosts);
    let policy = "policy \"one\" {\n    batch 1\n}\n";
    pull.write_site("1.0", &service(&timed("3"), "true"), policy);
    pull.publish();
    pull.start_agent("api1");
    said(&pull, "api1", "api: admitted, stepping");

    // 2.0 followed; 3.0 published while the follow runs: it ends, not converged.
    pull.write_site("2.0", &service(&timed("3"), "true"), policy);
    let spawn = || {
        support::cli::deploy_in(pull.dir.path())
            .args(["publish", "site.kdl", "--follow", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("deploy publish --follow")
    };
    let child = spawn();
    pull.wait("2.0 is published", Duration::from_secs(60), || {
        snapshots(&pull) == 2
    });
    std::thread::sleep(Duration::from_secs(1));
    pull.write_site("3.0", &service(&timed("3"), "true"), policy);
    pull.publish();
    let out = child.wait_with_output().expect("follow's end");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was published since"),
        "{}",
        text(&out.stderr)
    );
    let last: serde_json::Value = text(&out.stdout)
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("a last event");
    assert_eq!(last["event"], "run-finished", "{last}");
    assert_eq!(last["converged"], false, "{last}");

    // SIGINT: the follow stops (the agents carry on), exit 130 as apply's.
    pull.write_site("4.0", &service(&timed("3"), "true"), policy);
    let child = spawn();
    pull.wait("4.0 is published", Duration::from_secs(60), || {
        snapshots(&pull) == 4
    });
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("follow's end");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("the agents carry on"));
    assert!(text(&out.stdout).contains("\"event\":\"run-finished\""));
    pull.wait(
        "api1 runs 4.0 all the same",
        Duration::from_secs(60),
        || pull.recorded("api1", "api").as_deref() == Some("4.0"),
    );
}

#[test]
fn publish_follow_ends_a_service_whose_canary_failed_within_its_budget_as_halted() {
    let hosts = [("api1", "api"), ("api2", "api"), ("api3", "api")];
    let mut pull = Pull::new(&hosts);
    // max-failed 1: the failed canary leaves the budget whole, but the agents hold the rest
    // until a canary passes, which never comes at this snapshot.
    let policy = "policy \"c\" {\n    batch 1\n    canary 1\n    max-failed 1\n}\n";
    pull.write_site("1.0", &service(&timed("0.2"), "test ! -e fail"), policy);
    pull.publish();
    for (h, _) in hosts {
        pull.start_agent(h);
    }
    pull.wait_every(&hosts, "1.0", Duration::from_secs(120));

    std::fs::write(pull.host_dir("api1").join("fail"), "").expect("fail marker");
    pull.write_site("2.0", &service(&timed("0.2"), "test ! -e fail"), policy);
    let (code, _, all) = follow(&pull, Duration::from_secs(120));
    let logs = pull.agent_logs();
    assert_eq!(code, Some(1), "{all:?}\n{logs}");
    let api = events(&all, "service-finished");
    assert_eq!(api.len(), 1, "{all:?}");
    assert_eq!(api[0]["outcome"], "halted", "{}", api[0]);
    assert!(
        api[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the canary failed at 2.0: api1")),
        "{}",
        api[0]
    );
    assert_eq!(
        (api[0]["failed"].as_u64(), api[0]["not_started"].as_u64()),
        (Some(1), Some(2)),
        "{}",
        api[0]
    );
    let end = events(&all, "run-finished");
    assert_eq!(end[0]["converged"], false, "{}", end[0]);

    // Followed again, the snapshot unchanged: api1's agent never steps to it again, so its
    // failure is the end of api1's step, counted as such.
    let (code, published, all) = follow(&pull, Duration::from_secs(60));
    assert_eq!(published["unchanged"], true, "{published}");
    assert_eq!(code, Some(1), "{all:?}\n{}", pull.agent_logs());
    let api = events(&all, "service-finished");
    assert_eq!(api[0]["outcome"], "halted", "{}", api[0]);
    assert_eq!(api[0]["failed"].as_u64(), Some(1), "{}", api[0]);
    let end = events(&all, "run-finished");
    assert_eq!(end[0]["failed"].as_u64(), Some(1), "{}", end[0]);
}
