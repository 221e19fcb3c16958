//! The fleet's state on a real etcd (Debian's etcd-server) and a real sshd fleet: the site's
//! lease lock (two controllers refuse each other; a killed one frees it; a lease that lapses
//! frees it), fencing (etcd gone mid-run: no new step, exit 6, host state exact), published
//! state (`status` from the store equals the hosts', a host that stopped answering is not
//! reporting, a converged site plans without SSH), a three-member cluster losing a member, TLS,
//! etcd's `auth` with tokens that lapse mid-run.
#![cfg(feature = "etcd")]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

const PREFIX: &str = "/drover-test";

struct Site {
    fleet: Fleet,
    etcd: Etcd,
    ttl: &'static str,
}

impl Site {
    fn start(apps: usize, etcd: Etcd, ttl: &'static str) -> Site {
        let hosts: Vec<FleetHost> = (1..=apps)
            .map(|i| FleetHost::new(&format!("app{i}"), "app"))
            .collect();
        Site {
            fleet: Fleet::start(&hosts),
            etcd,
            ttl,
        }
    }

    /// The site at `version`, each `start` sleeping `sleep` seconds; `check` fails on a host
    /// that has /srv/fail-check.
    fn write(&self, version: &str, sleep: &str) -> PathBuf {
        let site = format!(
            r####"site "shared" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    port 18080
    stop #"{EV}ev stop"#
    install #"{EV}ev install; mkdir -p /srv/api && printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    start #"{EV}ev start; sleep {sleep}"#
    check #"{EV}ev checked; [ ! -e /srv/fail-check ]"# timeout="2s" interval="100ms"
}}
"####
        );
        self.write_site(&site)
    }

    /// `site.kdl` with this text, on the fleet's platform with the store, policy batch 1.
    fn write_site(&self, site: &str) -> PathBuf {
        let platform = self.fleet.write_platform("/var/lib/drover");
        let text = std::fs::read_to_string(&platform).expect("platform");
        let store = self.etcd.store_node(PREFIX, self.ttl);
        let text = text.replacen(
            "platform \"fleet\" {\n",
            &format!("platform \"fleet\" {{\n    {store}\n"),
            1,
        );
        std::fs::write(&platform, text).expect("platform");
        let dir = &self.fleet.dir;
        std::fs::write(
            dir.join("policy.kdl"),
            "policy \"default\" { batch 1; max-failed 10; }\n",
        )
        .expect("policy");
        let path = dir.join("site.kdl");
        std::fs::write(&path, site).expect("site");
        path
    }

    fn deploy_in(&self, dir: &Path, args: &[&str]) -> Output {
        support::cli::deploy_in(dir)
            .env(support::etcd::PASSWORD_ENV, support::etcd::PASSWORD)
            .args(args)
            .output()
            .expect("run deploy")
    }

    fn deploy(&self, args: &[&str]) -> Output {
        self.deploy_in(&self.fleet.dir, args)
    }

    /// `deploy ARGS` in the background, its stderr in a file.
    fn spawn(&self, args: &[&str]) -> (Child, PathBuf) {
        let err = self.fleet.dir.join(format!("spawned-{}.err", args.len()));
        let file = std::fs::File::create(&err).expect("stderr file");
        let child = support::cli::deploy_in(&self.fleet.dir)
            .env(support::etcd::PASSWORD_ENV, support::etcd::PASSWORD)
            .args(args)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start deploy");
        (child, err)
    }

    /// `(what, service)` of the hooks that ran on `host`, in order.
    fn whats(&self, host: &str) -> Vec<String> {
        support::hooks::events(&self.fleet)
            .into_iter()
            .filter(|e| e.1 == host)
            .map(|e| e.2)
            .collect()
    }

    /// The version `host` records for api, if any.
    fn recorded(&self, host: &str) -> Option<String> {
        let path = self.fleet.host_root(host).join("var-lib/drover/state.json");
        let text = std::fs::read_to_string(path).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["services"]["api"]["version"].as_str().map(str::to_string)
    }

    /// What etcd says `host` runs (`running/api/<host>`).
    fn published(&self, host: &str) -> Option<serde_json::Value> {
        let key = format!("{PREFIX}/shared/running/api/{host}");
        self.etcd
            .keys(&key)
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| serde_json::from_str(&v).expect("JSON value"))
    }

    fn lock_holder(&self) -> Option<serde_json::Value> {
        let key = format!("{PREFIX}/shared/lock");
        self.etcd
            .keys(&key)
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| serde_json::from_str(&v).expect("holder JSON"))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An apply that ended well, every write of it in etcd.
fn applied_and_published(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("did not reach etcd"),
        "{}",
        text(&out.stderr)
    );
}

fn status_json(site: &Site, path: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["status", path.to_str().unwrap(), "--json"];
    args.extend(extra);
    let out = site.deploy(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

// ---------------------------------------------------------------------------------------------
// The lease lock

#[test]
fn two_controllers_refuse_each_other_and_a_killed_one_is_carried_on_without_break_lock() {
    let site = Site::start(4, Etcd::start(), "3s");
    let path = site.write("1.0", "0");
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(site.lock_holder().is_none(), "the lock is given back");

    let path = site.write("2.0", "1.5");
    let (mut a, a_err) = site.spawn(&["apply", path.to_str().unwrap(), "--yes"]);
    wait_until("app1 is upgraded", Duration::from_secs(30), || {
        site.recorded("app1").as_deref() == Some("2.0")
            && site
                .published("app1")
                .is_some_and(|v| v["version"] == "2.0")
    });
    let holder = site
        .lock_holder()
        .expect("the running apply holds the lock");
    assert_eq!(holder["pid"], a.id());

    // A second controller, in a working directory of its own (its own file lock).
    let other = tempfile::tempdir().expect("other controller");
    let out = site.deploy_in(other.path(), &["apply", path.to_str().unwrap(), "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&format!("pid {}", a.id())) && err.contains("/drover-test/shared/lock"),
        "{err}"
    );

    // The first dies mid-run.
    assert!(Command::new("kill")
        .args(["-KILL", &a.id().to_string()])
        .status()
        .unwrap()
        .success());
    let _ = a.wait();
    let first_err = std::fs::read_to_string(&a_err).unwrap_or_default();
    let done: Vec<String> = ["app1", "app2", "app3", "app4"]
        .into_iter()
        .filter(|h| site.recorded(h).as_deref() == Some("2.0"))
        .map(str::to_string)
        .collect();
    assert!(
        done.len() < 4,
        "killed before the end: {done:?}\n{first_err}"
    );

    // Again, from the same directory: no --break-lock, it takes over the dead holder's lock
    // (at most the lease's TTL later) and carries the run on.
    let started = Instant::now();
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("carrying on: run"), "{err}");
    assert!(err.contains("its process is gone"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    for h in ["app1", "app2", "app3", "app4"] {
        assert_eq!(site.recorded(h).as_deref(), Some("2.0"), "{h}");
        let installs = site.whats(h).iter().filter(|w| *w == "install").count();
        // 1.0 once, 2.0 once: a host finished before the kill is not redone.
        if done.contains(&h.to_string()) {
            assert_eq!(installs, 2, "{h}: {:?}", site.whats(h));
        } else {
            assert!((2..=3).contains(&installs), "{h}: {:?}", site.whats(h));
        }
        assert_eq!(site.published(h).expect("published")["version"], "2.0");
    }
    assert!(site.lock_holder().is_none());
}

#[test]
fn a_lock_whose_holder_cannot_be_told_dead_refuses_until_its_lease_lapses() {
    let site = Site::start(2, Etcd::start(), "2s");
    let path = site.write("1.0", "0");
    // Another machine's controller took the lock and vanished: its lease has 3 s to live.
    let lease = support::etcd::grant(&site.etcd, 3);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"shared"}"#;
    support::etcd::put(&site.etcd, &format!("{PREFIX}/shared/lock"), holder, lease);
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("ops on elsewhere (pid 4242, run r-elsewhere)"),
        "{err}"
    );
    assert!(site.recorded("app1").is_none(), "nothing ran");
    std::thread::sleep(Duration::from_secs(4));
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(site.recorded("app1").as_deref(), Some("1.0"));
}

// ---------------------------------------------------------------------------------------------
// Fencing: etcd gone mid-run

#[test]
fn etcd_gone_mid_run_starts_no_new_step_exits_6_and_leaves_host_state_exact() {
    let site = Site::start(6, Etcd::start(), "2s");
    let path = site.write("1.0", "0");
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let path = site.write("2.0", "1");
    let (mut run, err_file) = site.spawn(&["apply", path.to_str().unwrap(), "--yes"]);
    wait_until("app1 is upgraded", Duration::from_secs(30), || {
        site.recorded("app1").as_deref() == Some("2.0")
    });
    site.etcd.stop();
    let stopped = Instant::now();
    let status = run.wait().expect("wait");
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(status.code(), Some(6), "{err}");
    assert!(err.contains("the site's lock in etcd is lost"), "{err}");
    assert!(stopped.elapsed() < Duration::from_secs(20), "{err}");
    // Every host is exactly what its hooks did: upgraded hosts ran the whole switch-over.
    let mut upgraded = 0;
    for h in site.fleet.names() {
        let whats = site.whats(h);
        let starts = whats.iter().filter(|w| *w == "start").count();
        match site.recorded(h).as_deref() {
            Some("2.0") => {
                upgraded += 1;
                assert_eq!(starts, 2, "{h}: {whats:?}");
            }
            Some("1.0") => assert_eq!(starts, 1, "{h} never started 2.0: {whats:?}"),
            other => panic!("{h}: {other:?}"),
        }
    }
    assert!(
        (1..6).contains(&upgraded),
        "{upgraded} of 6 upgraded\n{err}"
    );

    // etcd back: the next apply reads every host (some writes never reached etcd) and ends it.
    site.etcd.restart();
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for h in site.fleet.names() {
        assert_eq!(site.recorded(h).as_deref(), Some("2.0"), "{h}");
        assert_eq!(
            site.published(h).expect("published")["version"],
            "2.0",
            "{h}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Published state and reads

#[test]
fn a_site_of_several_services_reaches_etcd_whole() {
    // Every service's `desired` write carries the store's `schema` key: with two services one
    // batch named `schema` twice, and etcd refused that transaction on every retry.
    let site = Site::start(2, Etcd::start(), "3s");
    let path = site.write_site(&format!(
        r####"site "shared" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api"; service "worker" }}
service "api" {{
    install #"{EV}ev install"#
}}
service "worker" {{
    needs "api"
    install #"{EV}ev install"#
}}
"####
    ));
    let p = path.to_str().unwrap();
    for args in [
        vec!["apply", p, "--yes"],
        vec!["apply", p, "--yes", "--read-hosts"],
    ] {
        let started = Instant::now();
        applied_and_published(&site.deploy(&args));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{args:?} waited for its writes: {:?}",
            started.elapsed()
        );
    }
    let out = site.deploy(&["status", p]);
    assert!(
        text(&out.stdout).contains("4 of 4 host services converged")
            && text(&out.stdout).contains("(as the store says)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn status_from_the_store_equals_the_hosts_and_a_converged_site_plans_without_ssh() {
    let site = Site::start(4, Etcd::start(), "3s");
    let path = site.write("1.0", "0");
    let p = path.to_str().unwrap();
    assert_eq!(site.deploy(&["apply", p, "--yes"]).status.code(), Some(0));
    // A partial rollout: app3's check fails.
    site.fleet.ssh("app3", "touch /srv/fail-check");
    let path = site.write("2.0", "0");
    let out = site.deploy(&["apply", p, "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    let store = status_json(&site, &path, &[]);
    let hosts = status_json(&site, &path, &["--hosts"]);
    assert_eq!(store["source"], "store");
    assert_eq!(hosts["source"], "hosts");
    assert_eq!(store["hosts"], hosts["hosts"]);
    assert_eq!(store["converged"], 3);
    assert_eq!(hosts["disagreements"], serde_json::json!([]));
    // --failures: only app3, with its log.
    let out = site.deploy(&["status", p, "--failures"]);
    let failures = text(&out.stdout);
    assert_eq!(failures.lines().count(), 1, "{failures}");
    assert!(
        failures.starts_with("app3 api ")
            && failures.contains("validated: failed in check")
            && failures.contains("log: .drover/runs/"),
        "{failures}"
    );
    // A host whose record changed behind the store's back: `--hosts` says so.
    let state = site
        .fleet
        .host_root("app2")
        .join("var-lib/drover/state.json");
    let edited = std::fs::read_to_string(&state)
        .unwrap()
        .replace("\"2.0\"", "\"9.9\"");
    std::fs::write(&state, edited).unwrap();
    let hosts = status_json(&site, &path, &["--hosts"]);
    let d = &hosts["disagreements"];
    assert_eq!(d.as_array().map(Vec::len), Some(1), "{d}");
    assert_eq!(d[0]["host"], "app2");
    assert!(d[0]["recorded"].as_str().unwrap().starts_with("9.9"), "{d}");

    // Converge (app3 fixed, app2 back), then stop app4's sshd: the next apply publishes
    // it as not reporting, and `status` from the store says so without SSH.
    site.fleet.ssh("app3", "rm /srv/fail-check");
    applied_and_published(&site.deploy(&["apply", p, "--yes", "--read-hosts"]));
    // Nothing to change, every host read: what was read reaches etcd (a batch naming a key
    // twice once made etcd refuse the whole transaction, every retry, for `lock-ttl`).
    applied_and_published(&site.deploy(&["apply", p, "--yes", "--read-hosts"]));
    let out = site.deploy(&["status", p]);
    assert!(text(&out.stdout).contains("4 of 4 host services converged (desired version and inputs, healthy) (as the store says)"), "{}", text(&out.stdout));
    // A converged site plans from the store alone: with every sshd gone, nothing to change.
    for h in site.fleet.names() {
        site.fleet.kill_host(h);
    }
    let out = site.deploy(&["plan", p]);
    let plan = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !plan.contains("does not answer") && !plan.contains("unreachable"),
        "{plan}"
    );
    assert!(
        plan.contains("skipped, converged: app1, app2, app3, app4") && plan.contains("0 steps"),
        "{plan}"
    );
    // `apply` connects no host either, and finds nothing to do.
    let out = site.deploy(&["apply", p, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("did not reach etcd"),
        "{}",
        text(&out.stderr)
    );
    // Now a change: every host must be read, none answers, and the store learns it.
    let path = site.write("3.0", "0");
    let out = site.deploy(&["apply", path.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let store = status_json(&site, &path, &[]);
    let unaccounted = store["unaccounted"].as_array().expect("unaccounted");
    assert_eq!(unaccounted.len(), 4, "{store}");
    assert!(
        unaccounted[0]["reason"]
            .as_str()
            .unwrap()
            .contains("not reporting since"),
        "{store}"
    );
}

/// What `status --json` says `host` runs of api.
fn running_in(status: &serde_json::Value, host: &str) -> serde_json::Value {
    status["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|h| h["host"] == host))
        .map(|h| h["services"][0]["running"].clone())
        .unwrap_or(serde_json::Value::Null)
}

/// `platform.kdl` as written, with the inventory edited: `app3` (a spare fleet host) left out,
/// or, with `app2_at_spare`, standing in for app2: app2's name at app3's address.
fn inventory(site: &Site, app2_at_spare: bool) {
    let platform = site.fleet.dir.join("platform.kdl");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let (old, spare) = (site.fleet.address("app2"), site.fleet.address("app3"));
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.contains("host \"app3\""))
        .map(|l| match app2_at_spare && l.contains("host \"app2\"") {
            true => l.replace(&format!("\"{old}\""), &format!("\"{spare}\"")),
            false => l.to_string(),
        })
        .collect();
    std::fs::write(&platform, lines.join("\n") + "\n").expect("platform");
}

#[test]
fn a_host_rebuilt_under_its_name_at_another_address_is_read_not_taken_from_the_store() {
    let site = Site::start(3, Etcd::start(), "3s");
    let path = site.write("1.0", "0");
    let p = path.to_str().unwrap();
    inventory(&site, false);
    applied_and_published(&site.deploy(&["apply", p, "--yes"]));
    assert_eq!(site.recorded("app2").as_deref(), Some("1.0"));
    assert!(
        site.whats("app3").is_empty(),
        "the spare is not in the site"
    );
    let store = status_json(&site, &path, &[]);
    assert_eq!(
        (store["source"].as_str(), store["converged"].as_u64()),
        (Some("store"), Some(2))
    );

    // app2 is rebuilt: it comes back under its name at another address, its disk empty (the
    // spare fleet host).
    inventory(&site, true);
    let out = site.deploy(&["plan", p]);
    let plan = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        plan.contains("fresh → 1.0: app2") && plan.contains("skipped, converged: app1\n"),
        "the rebuilt host is read and installed:\n{plan}"
    );
    let out = site.deploy(&["status", p]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        said.contains("1 of 2 host services converged")
            && said.contains(&format!(
                "app2: the store has it at {}, the inventory at {}",
                site.fleet.address("app2"),
                site.fleet.address("app3")
            )),
        "{said}"
    );
    let store = status_json(&site, &path, &[]);
    assert_eq!(store["source"], "store");
    assert_eq!(running_in(&store, "app2"), serde_json::Value::Null);
    assert_eq!(store["unaccounted"][0]["host"], "app2", "{store}");
    assert_eq!(store["read"][0]["host"], "app2", "{store}");

    // The apply installs the host at the new address and publishes it there.
    applied_and_published(&site.deploy(&["apply", p, "--yes"]));
    assert_eq!(site.whats("app3"), ["install", "start", "checked"]);
    assert_eq!(site.recorded("app3").as_deref(), Some("1.0"));
    assert_eq!(
        site.whats("app2")
            .iter()
            .filter(|w| *w == "install")
            .count(),
        1,
        "the old app2 is left alone"
    );
    let store = status_json(&site, &path, &[]);
    assert_eq!(store["converged"], 2, "{store}");
    assert_eq!(store["read"], serde_json::json!([]), "{store}");
}

/// A secret this controller cannot read: the store keeps only the fingerprint of each host's
/// inputs, which cannot be worked out here; `status` reads the hosts and compares their own
/// records (the secret taken as they record it), and finds the site converged.
#[test]
fn status_from_the_store_with_a_secret_not_readable_here_reads_the_hosts_and_finds_them_converged()
{
    let site = Site::start(2, Etcd::start(), "3s");
    let path = site.write_site(&format!(
        r####"site "shared" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    secret "TOKEN" env="STORE_TOKEN"
    install #"{EV}ev install; [ -n "$TOKEN" ]"#
    check #"{EV}ev checked"#
}}
"####
    ));
    let p = path.to_str().unwrap();
    let deploy = |args: &[&str], token: Option<&str>| {
        let mut cmd = support::cli::deploy_in(&site.fleet.dir);
        match token {
            Some(t) => cmd.env("STORE_TOKEN", t),
            None => cmd.env_remove("STORE_TOKEN"),
        };
        cmd.env(
            "DROVER_FINGERPRINT_KEY",
            "a key of this fleet's controllers",
        )
        .args(args)
        .output()
        .expect("run deploy")
    };
    applied_and_published(&deploy(&["apply", p, "--yes"], Some("s3cret")));
    let out = deploy(&["status", p, "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["converged"], 2, "{status}");
    assert_eq!(status["source"], "store", "{status}");
    let read = status["read"].as_array().expect("read");
    assert_eq!(read.len(), 2, "{status}");
    assert!(
        read[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cannot be known here")),
        "{status}"
    );
    assert_eq!(
        text(&out.stderr).matches("STORE_TOKEN").count(),
        1,
        "the secret is named once:\n{}",
        text(&out.stderr)
    );
    let out = deploy(&["plan", p], None);
    assert!(
        text(&out.stdout).contains("skipped, converged: app1, app2"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn status_after_a_run_that_could_not_publish_reads_the_hosts_and_answers_with_etcd_down() {
    let site = Site::start(2, Etcd::start(), "2s");
    let path = site.write("1.0", "0");
    let p = path.to_str().unwrap();
    applied_and_published(&site.deploy(&["apply", p, "--yes"]));
    // etcd goes while app1 starts 2.0: its step ends on the host, never in the store.
    let path = site.write("2.0", "2");
    let (mut run, err_file) = site.spawn(&["apply", p, "--yes"]);
    wait_until("app1 starts 2.0", Duration::from_secs(30), || {
        site.whats("app1").iter().filter(|w| *w == "start").count() == 2
    });
    site.etcd.stop();
    let code = run.wait().expect("wait").code();
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(code, Some(6), "{err}");
    assert!(err.contains("did not reach etcd"), "{err}");
    assert_eq!(site.recorded("app1").as_deref(), Some("2.0"), "{err}");
    site.etcd.restart();
    assert_eq!(
        site.published("app1").expect("published")["version"],
        "1.0",
        "the store is stale"
    );

    // `status` says the store is stale, reads the hosts, and tells what they record.
    let out = site.deploy(&["status", p]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        said.contains("the store is stale") && !said.contains("(as the store says)"),
        "{said}"
    );
    let status = status_json(&site, &path, &[]);
    assert_eq!(status["source"], "hosts", "{status}");
    assert!(status["stale"]
        .as_str()
        .is_some_and(|s| s.contains("could not publish")));
    assert_eq!(running_in(&status, "app1"), "2.0", "{status}");
    assert_eq!(running_in(&status, "app2"), "1.0", "{status}");
    assert_eq!(status["converged"], 1, "{status}");
    // `plan` does not skip a host on the stale store's word either.
    let out = site.deploy(&["plan", p]);
    assert!(
        text(&out.stderr).contains("the store is stale"),
        "{}",
        text(&out.stderr)
    );

    // etcd down: `status --hosts` answers from the hosts; `status` says to ask them.
    site.etcd.stop();
    let status = status_json(&site, &path, &["--hosts"]);
    assert_eq!(status["source"], "hosts", "{status}");
    assert_eq!(running_in(&status, "app1"), "2.0", "{status}");
    assert!(
        status["stale"]
            .as_str()
            .is_some_and(|s| s.contains("etcd does not answer")),
        "{status}"
    );
    let out = site.deploy(&["status", p]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("deploy status --hosts"),
        "{}",
        text(&out.stderr)
    );

    // etcd back: the next apply reads every host, publishes, and the store speaks again.
    site.etcd.restart();
    applied_and_published(&site.deploy(&["apply", p, "--yes"]));
    let status = status_json(&site, &path, &[]);
    assert_eq!(status["source"], "store", "{status}");
    assert_eq!(status["stale"], serde_json::Value::Null, "{status}");
    assert_eq!(status["converged"], 2, "{status}");
}

// ---------------------------------------------------------------------------------------------
// A cluster, and TLS

#[test]
fn a_three_member_cluster_losing_its_leader_mid_apply_completes_the_run() {
    // The default `lock-ttl` (10 s): a renewal that fails while the two left elect a leader
    // (1 to 2 s with etcd's default election timeout, more on a loaded machine) leaves 7 s for
    // the next. With `3s`, the election can outlast what is left, and the run stops with exit
    // 6 instead (`tests/it/store_cluster.rs` asserts that it then stops cleanly).
    let site = Site::start(4, Etcd::cluster(), "10s");
    let path = site.write("1.0", "0.7");
    let (mut run, err_file) = site.spawn(&["apply", path.to_str().unwrap(), "--yes"]);
    wait_until("app1 is installed", Duration::from_secs(30), || {
        site.recorded("app1").is_some()
    });
    // The leader: the others must elect a new one before any write or renewal is answered.
    site.etcd.kill(site.etcd.leader());
    let status = run.wait().expect("wait");
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{err}");
    for h in site.fleet.names() {
        assert_eq!(site.recorded(h).as_deref(), Some("1.0"), "{h}");
        assert_eq!(
            site.published(h).expect("published")["version"],
            "1.0",
            "{h}"
        );
    }
}

#[test]
fn a_tls_endpoint_with_the_sites_ca_works_and_without_it_fails_clearly() {
    let site = Site::start(2, Etcd::start_tls(), "3s");
    let path = site.write("1.0", "0");
    let p = path.to_str().unwrap();
    let out = site.deploy(&["apply", p, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let store = status_json(&site, &path, &[]);
    assert_eq!(store["source"], "store");
    assert_eq!(store["converged"], 2);
    // The same endpoint without the CA: the server's certificate is not trusted.
    let platform = site.fleet.dir.join("platform.kdl");
    let text_now = std::fs::read_to_string(&platform).unwrap();
    let start = text_now.find(" { tls ca=").expect("tls node");
    let end = text_now[start..].find('}').unwrap() + start + 1;
    std::fs::write(
        &platform,
        format!("{}{}", &text_now[..start], &text_now[end..]),
    )
    .unwrap();
    let out = site.deploy(&["status", p]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("etcd does not answer"), "{err}");
}

#[test]
fn with_etcd_auth_tokens_that_lapse_mid_run_are_renewed_and_the_run_keeps_its_lock() {
    // etcd's simple tokens lapse after 2 s unused; each step sleeps 4 s, so every step's
    // publish (and the lease revoke at the end) is sent with a token etcd no longer knows.
    let site = Site::start(7, Etcd::start_auth(2, PREFIX), "3s");
    let path = site.write("1.0", "4");
    let p = path.to_str().unwrap();
    let started = Instant::now();
    let out = site.deploy(&["apply", p, "--yes"]);
    let err = text(&out.stderr);
    assert!(started.elapsed() > Duration::from_secs(25), "{err}");
    applied_and_published(&out);
    assert!(!err.contains("lock in etcd"), "{err}");
    assert!(!err.contains("warning"), "{err}");
    for h in site.fleet.names() {
        assert_eq!(site.recorded(h).as_deref(), Some("1.0"), "{h}");
        assert_eq!(site.whats(h), ["install", "start", "checked"], "{h}");
        assert_eq!(
            site.published(h).expect("published")["version"],
            "1.0",
            "{h}"
        );
    }
    // The store and every host's state file agree, category by category.
    let hosts = status_json(&site, &path, &["--hosts"]);
    assert_eq!(hosts["disagreements"], serde_json::json!([]), "{hosts}");
    assert_eq!(hosts["converged"], 7, "{hosts}");
    // The lease went with the run: the lock is free, and the store answers a new command.
    assert!(site.lock_holder().is_none());
    let store = status_json(&site, &path, &[]);
    assert_eq!(store["source"], "store", "{store}");
    assert_eq!(store["converged"], 7, "{store}");
    // A password etcd refuses is not a lapsed token: the command fails at once, saying why.
    let started = Instant::now();
    let out = support::cli::deploy_in(&site.fleet.dir)
        .env(support::etcd::PASSWORD_ENV, "not-the-password")
        .args(["status", p])
        .output()
        .expect("run deploy");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
}
