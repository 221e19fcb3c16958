//! SIGKILL of the controller at pseudo-random moments of rollouts (issue 38), with one real
//! etcd and one 12-host sshd fleet reused by every kill point. Each point applies a new
//! version (so it has work to do), kills `deploy` with SIGKILL after a delay drawn from a seeded
//! generator (printed; set `DROVER_KILL_SEED` to replay one), then, from a *different*
//! working directory holding only the site's files (no journal, no `.drover/`):
//! - `deploy verify` is truthful: it exits 0 exactly when every host's own `state.json`
//!   records api at the point's version and healthy (its check always passes);
//! - `deploy status --json` says of every host the version its `state.json` records;
//! - `deploy apply` converges (exit 0, every host at the version, no `busy/` intent left);
//! - no hook ran twice where the host's record says it ran once: when the host's `state.json`
//!   records the point's version healthy at the moment of the kill (the completion record),
//!   the recovery apply runs neither its `install` nor its `start` there again; when it does
//!   not, the recovery runs each at most once; and over the whole point each (host, version)
//!   `install` ran at most twice (once by the killed run, once by the recovery).
#![cfg(feature = "etcd")]

use crate::support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

const PREFIX: &str = "/drover-test";
const HOSTS: usize = 12;
const POINTS: usize = 30;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// splitmix64: a small seeded generator, so a failing point can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Writes the site at `version` into `dir`, on the fleet's platform with the store, three
/// hosts a wave. `install` sleeps the host's own delay (`/var/lib/delay`).
fn write_site(fleet: &Fleet, etcd: &Etcd, dir: &Path, version: &str) {
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let store = etcd.store_node(PREFIX, "2s");
    let text = text.replacen(
        "platform \"fleet\" {\n",
        &format!("platform \"fleet\" {{\n    {store}\n"),
        1,
    );
    std::fs::write(dir.join("platform.kdl"), text).expect("platform");
    std::fs::write(
        dir.join("policy.kdl"),
        "policy \"default\" { batch 3; max-failed 12; }\n",
    )
    .expect("policy");
    let site = format!(
        r####"site "shared" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{EV}ev stop"#
    install #"{EV}ev install-{version}; sleep "$(cat /var/lib/delay)"; mkdir -p /srv/api && printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    start #"{EV}ev start-{version}"#
    check #"{EV}ev checked-{version}; sleep 0.05"# timeout="5s"
}}
"####
    );
    std::fs::write(dir.join("site.kdl"), site).expect("site");
}

fn deploy_in(dir: &Path, args: &[&str]) -> Output {
    support::cli::deploy_in(dir)
        .args(args)
        .output()
        .expect("run deploy")
}

/// What `host`'s state file records of api: its version, and whether it is healthy (no
/// failure recorded, and after a switch-over a passed check), by `ServiceRecord::healthy`'s rule.
fn recorded(fleet: &Fleet, host: &str) -> Option<(String, bool)> {
    let path = fleet.host_root(host).join("var-lib/drover/state.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let api = &v["services"]["api"];
    let success = |m: &serde_json::Value| m["outcome"] == "success";
    let healthy = match api.get("configured") {
        None => api.get("validated").is_none_or(success),
        Some(c) => success(c) && api.get("validated").is_some_and(success),
    };
    Some((api["version"].as_str()?.to_string(), healthy))
}

/// How many times `what` is in `host`'s event log.
fn count(fleet: &Fleet, host: &str, what: &str) -> usize {
    let path = fleet.host_root(host).join("var-lib/events");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(what))
        .count()
}

/// Waits until no host's state file or event log has changed for 400 ms (at most 10 s).
fn settle(fleet: &Fleet, names: &[String]) {
    let look = || {
        names
            .iter()
            .map(|h| {
                let root = fleet.host_root(h);
                (
                    std::fs::read(root.join("var-lib/drover/state.json")).unwrap_or_default(),
                    std::fs::read(root.join("var-lib/events")).unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = look();
    loop {
        std::thread::sleep(Duration::from_millis(400));
        let now = look();
        if now == last || Instant::now() > deadline {
            return;
        }
        last = now;
    }
}

#[test]
fn controllers_killed_at_random_moments_leave_a_truthful_store_and_no_hook_run_twice() {
    let seed = std::env::var("DROVER_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(38)
        });
    eprintln!("kill points: seed {seed} (DROVER_KILL_SEED={seed} replays them)");
    let mut rng = Rng(seed);
    let names: Vec<String> = (1..=HOSTS).map(|i| format!("app{i}")).collect();
    let fleet = Fleet::start(
        &names
            .iter()
            .map(|h| FleetHost::new(h, "app"))
            .collect::<Vec<_>>(),
    );
    for h in &names {
        let delay = 0.05 + rng.below(16) as f64 * 0.01;
        std::fs::write(
            fleet.host_root(h).join("var-lib/delay"),
            format!("{delay:.2}"),
        )
        .expect("delay");
    }
    let etcd = Etcd::start();
    write_site(&fleet, &etcd, &fleet.dir, "1");
    let started = Instant::now();
    let out = deploy_in(&fleet.dir, &["apply", "site.kdl", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // A whole rollout's time: kill points are drawn over 1.2 times it, so some fall before
    // the first step, most during steps, some after the run ended.
    let whole = started.elapsed().as_millis() as u64;
    eprintln!("a whole rollout: {whole} ms");

    for point in 0..POINTS {
        let version = (point + 2).to_string();
        let delay = rng.below(whole * 6 / 5);
        let at = format!("point {point} (seed {seed}, version {version}, kill after {delay} ms)");
        write_site(&fleet, &etcd, &fleet.dir, &version);
        let mut run = support::cli::deploy_in(&fleet.dir)
            .args(["apply", "site.kdl", "--yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start deploy");
        std::thread::sleep(Duration::from_millis(delay));
        // SIGKILL to the controller and its ssh clients, as when its machine dies (or to
        // nothing, when the run already ended).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", run.id())])
            .stderr(Stdio::null())
            .status();
        let _ = run.wait();
        // A command already on a host may still finish there (sshd does not stop it): the
        // hosts are judged once their records and logs are still.
        settle(&fleet, &names);

        // What each host's own record says at the kill.
        let at_kill: Vec<Option<(String, bool)>> =
            names.iter().map(|h| recorded(&fleet, h)).collect();
        let done =
            |r: &Option<(String, bool)>| r.as_ref().is_some_and(|(v, ok)| *v == version && *ok);
        let installs: Vec<usize> = names
            .iter()
            .map(|h| count(&fleet, h, &format!("install-{version}")))
            .collect();
        let starts: Vec<usize> = names
            .iter()
            .map(|h| count(&fleet, h, &format!("start-{version}")))
            .collect();
        eprintln!(
            "{at}: {} of {HOSTS} hosts record it done",
            at_kill.iter().filter(|r| done(r)).count()
        );

        // Another controller: a directory with only the site's files.
        let other = tempfile::tempdir().expect("other controller");
        write_site(&fleet, &etcd, other.path(), &version);
        let out = deploy_in(other.path(), &["verify", "site.kdl"]);
        let converged = at_kill.iter().all(done);
        assert_eq!(
            out.status.code() == Some(0),
            converged,
            "{at}: verify exited {:?} where the hosts' records say converged={converged}: \
             {at_kill:?}\n{}",
            out.status.code(),
            text(&out)
        );
        let out = deploy_in(other.path(), &["status", "site.kdl", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{at}: status JSON: {}", text(&out)));
        for (h, on_host) in names.iter().zip(&at_kill) {
            let said = status["hosts"]
                .as_array()
                .and_then(|hs| hs.iter().find(|x| x["host"] == h.as_str()))
                .map(|x| x["services"][0]["running"].clone())
                .unwrap_or(serde_json::Value::Null);
            assert_eq!(
                said.as_str(),
                on_host.as_ref().map(|r| r.0.as_str()),
                "{at}: status says {h} runs {said}, its state file {on_host:?}\n{}",
                serde_json::to_string_pretty(&status).unwrap_or_default()
            );
        }

        let out = deploy_in(other.path(), &["apply", "site.kdl", "--yes"]);
        assert_eq!(out.status.code(), Some(0), "{at}: {}", text(&out));
        for (i, h) in names.iter().enumerate() {
            let now = recorded(&fleet, h);
            assert_eq!(
                now,
                Some((version.clone(), true)),
                "{at}: {h} after the recovery"
            );
            let again = count(&fleet, h, &format!("install-{version}")) - installs[i];
            let restarted = count(&fleet, h, &format!("start-{version}")) - starts[i];
            let most = if done(&at_kill[i]) { 0 } else { 1 };
            assert!(
                again <= most && restarted <= most,
                "{at}: {h} recorded {:?} at the kill, and the recovery ran install {again} \
                 and start {restarted} times (at most {most})",
                at_kill[i]
            );
            assert!(installs[i] <= 1, "{at}: the killed run installed {h} twice");
        }
        let busy = etcd.keys(&format!("{PREFIX}/shared/busy/"));
        assert!(
            busy.is_empty(),
            "{at}: intents left after converging: {busy:?}"
        );
    }
}
