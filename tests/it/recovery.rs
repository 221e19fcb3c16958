//! Interrupted and concurrent runs on a real sshd fleet: Ctrl-C once and twice, carrying on
//! after an interruption, two applies of one site, stale and foreign locks, and hosts that die
//! or go silent in the middle of a wave. Each test checks the exact state of every host after.

use crate::support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::shop::{Shop, Spec};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A `deploy` running in the background, its output going to files.
struct Running {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    started: Instant,
}

impl Running {
    fn start(shop: &Shop, args: &[&str]) -> Running {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = shop.fleet.dir.join(format!("deploy-{n}.out"));
        let err = shop.fleet.dir.join(format!("deploy-{n}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_deploy"))
            .args(args)
            .current_dir(&shop.fleet.dir)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("run deploy");
        Running {
            child,
            out,
            err,
            started: Instant::now(),
        }
    }

    /// Started as from a terminal that then goes away: its output goes to pipes whose reading
    /// ends are closed at once, so every write fails (`EPIPE`), as writes to a hung-up
    /// terminal fail (`EIO`). With `nohup`, started by `nohup` (SIGHUP ignored).
    fn start_hung_up(shop: &Shop, args: &[&str], nohup: bool) -> Running {
        let deploy = env!("CARGO_BIN_EXE_deploy");
        let mut command = match nohup {
            true => Command::new("nohup"),
            false => Command::new(deploy),
        };
        if nohup {
            command.arg(deploy);
        }
        let mut child = command
            .args(args)
            .current_dir(&shop.fleet.dir)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run deploy");
        drop(child.stdout.take());
        drop(child.stderr.take());
        let nowhere = shop.fleet.dir.join("nowhere");
        Running {
            child,
            out: nowhere.clone(),
            err: nowhere,
            started: Instant::now(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -<signal> PID`.
    fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal}");
    }

    /// `kill -INT PID`, as an operator's Ctrl-C reaches `deploy`.
    fn interrupt(&self) {
        self.signal("INT");
    }

    /// Waits for the exit (at most `limit`); returns its code and how long the run took.
    fn wait(mut self, limit: Duration) -> (i32, Duration, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let code = status.code().expect("deploy exited by a signal");
                return (code, self.started.elapsed(), self.stderr());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("deploy did not end within {limit:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
            + &std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// Waits until `cond` holds, for at most `limit`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A rendered diagnostic on one line: wrapped lines joined, box drawing and indents dropped.
fn flat(rendered: &str) -> String {
    rendered
        .lines()
        .map(|l| l.trim().trim_start_matches('│').trim())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes the site for `spec`, with hooks that pause where a marker file says:
/// `/srv/slow-<service>-<hook>` holds how many seconds `<hook>` sleeps on that host.
/// The shop's policies with whole waves (`flow "waves"`): these tests stop a wave midway and
/// name which hosts ran, which the default `flow "slots"` would change with its timing.
fn lockstep() -> Spec {
    Spec {
        policy: r#"batch 1; max-failed 0; flow "waves""#,
        api_policy: r#"batch 2; max-failed 0; flow "waves""#,
        ..Spec::default()
    }
}

fn site_with_pauses(shop: &Shop, spec: &Spec) -> String {
    let path = shop.write(spec);
    let site = std::fs::read_to_string(&path).unwrap();
    let mut patched = site.clone();
    for hook in ["stop", "install", "migrate", "start"] {
        let wait = format!(
            "ev {hook}; p=/srv/slow-$DEPLOY_SERVICE-{hook}; if [ -e $p ]; then sleep $(cat $p); fi"
        );
        // `ev migrate` ends its hook; the others go on after a `;`.
        patched = patched
            .replace(&format!("ev {hook};"), &format!("{wait};"))
            .replace(&format!("ev {hook}\"#"), &format!("{wait}\"#"));
    }
    for hook in ["stop", "install", "migrate", "start"] {
        assert!(
            patched.contains(&format!("slow-$DEPLOY_SERVICE-{hook}")),
            "{hook}"
        );
    }
    assert_ne!(patched, site);
    std::fs::write(&path, patched).unwrap();
    path.display().to_string()
}

fn pause(shop: &Shop, host: &str, service: &str, hook: &str, seconds: &str) {
    std::fs::write(
        shop.fleet
            .host_root(host)
            .join(format!("srv/slow-{service}-{hook}")),
        seconds,
    )
    .unwrap();
}

fn unpause(shop: &Shop, host: &str, service: &str, hook: &str) {
    let _ = std::fs::remove_file(
        shop.fleet
            .host_root(host)
            .join(format!("srv/slow-{service}-{hook}")),
    );
}

fn service_of(host: &str) -> &'static str {
    if host.starts_with("db") {
        "db"
    } else if host.starts_with("app") {
        "api"
    } else {
        "lb"
    }
}

/// The hooks `service` ran on `host`, in order.
fn whats(shop: &Shop, host: &str) -> Vec<String> {
    shop.events(host).into_iter().map(|e| e.what).collect()
}

fn has_state(shop: &Shop, host: &str) -> bool {
    shop.fleet
        .host_root(host)
        .join("var-lib/drover/state.json")
        .exists()
}

/// The host's record of its service: `(version, configured, validated, failed hook)`.
fn record(shop: &Shop, host: &str) -> (String, String, String, String) {
    let rec = &shop.state(host)["services"][service_of(host)];
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let hook = [&rec["configured"]["hook"], &rec["validated"]["hook"]]
        .into_iter()
        .find_map(|h| h.as_str())
        .unwrap_or("-")
        .to_string();
    (
        s(&rec["version"]),
        s(&rec["configured"]["outcome"]),
        s(&rec["validated"]["outcome"]),
        hook,
    )
}

fn ok_at(version: &str) -> (String, String, String, String) {
    (
        version.into(),
        "success".into(),
        "success".into(),
        "-".into(),
    )
}

fn status_json(shop: &Shop, site: &str) -> Value {
    let out = shop.deploy(&["status", site, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The journal of a run, one JSON value per line.
fn journal(shop: &Shop, run: &str) -> Vec<Value> {
    let path = shop
        .fleet
        .dir
        .join(".drover/runs")
        .join(run)
        .join("journal.ndjson");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a journal line is JSON"))
        .collect()
}

fn entries<'a>(journal: &'a [Value], entry: &str) -> Vec<&'a Value> {
    journal.iter().filter(|e| e["entry"] == entry).collect()
}

/// The run id `deploy apply` announced: `HH:MM:SS.mmm run <id>: site …`.
fn run_id(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| {
            let rest = l.get(13..)?.strip_prefix("run ")?;
            let (id, more) = rest.split_once(": site ")?;
            (!more.is_empty()).then(|| id.to_string())
        })
        .unwrap_or_else(|| panic!("no run id in:\n{stderr}"))
}

/// Installs everything at 1.0 with `spec` and returns the site's path.
fn installed(shop: &Shop, spec: &Spec) -> String {
    let site = site_with_pauses(shop, spec);
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    site
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// A fleet and its site (the path) where api's first wave (app1, app2) takes 1.5 s to install.
fn apis_first_wave_paused() -> (Shop, String) {
    let shop = Shop::start();
    let site = site_with_pauses(&shop, &lockstep());
    for h in ["app1", "app2"] {
        pause(&shop, h, "api", "install", "1.5");
    }
    (shop, site)
}

/// Waits until api's first wave (app1, app2, paused in `install`) is installing.
fn wait_for_apis_first_wave(shop: &Shop) {
    wait_until("app1 and app2 install api", Duration::from_secs(60), || {
        ["app1", "app2"]
            .iter()
            .all(|h| whats(shop, h).contains(&"install".to_string()))
    });
}

/// After a stop during api's first wave: the steps in flight (db's, api's first wave) finished
/// and were recorded at 1.0; nothing else started.
fn assert_stopped_after_apis_first_wave(shop: &Shop) {
    for h in ["db1", "db2", "db3", "app1", "app2"] {
        assert_eq!(whats(shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(shop, h), ok_at("1.0"), "{h}");
    }
    for h in ["app3", "app4", "app5", "app6", "lb1", "lb2", "lb3"] {
        assert!(whats(shop, h).is_empty(), "{h} was started");
        assert!(!has_state(shop, h), "{h} has a state file");
    }
}

// ---------------------------------------------------------------------------------------------
// (a) Ctrl-C once, then carry on

#[test]
fn ctrl_c_lets_running_steps_finish_and_apply_carries_on_without_redoing_anything() {
    let (shop, site) = apis_first_wave_paused();
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_for_apis_first_wave(&shop);
    run.interrupt();
    let (code, _, stderr) = run.wait(Duration::from_secs(60));
    assert_eq!(code, 130, "{stderr}");
    assert!(
        stderr.contains("INTERRUPTED (SIGINT): no new step starts; waiting for 2 running steps"),
        "{stderr}"
    );
    let first = run_id(&stderr);

    // The steps in flight finished; nothing else started.
    assert_stopped_after_apis_first_wave(&shop);

    // The journal and the status tell where it stopped.
    let j = journal(&shop, &first);
    let started = entries(&j, "run-started");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["plan_digest"].as_str().unwrap().len(), 64);
    assert_eq!(started[0]["site_digest"].as_str().unwrap().len(), 64);
    assert_eq!(started[0]["holder"]["pid"], u64::from(run_id_pid(&first)));
    let mut intents: Vec<&str> = entries(&j, "step-intent")
        .iter()
        .map(|e| e["host"].as_str().unwrap())
        .collect();
    // db's waves of one host one after another; api's first wave's two steps in any order.
    intents[3..].sort();
    assert_eq!(intents, ["db1", "db2", "db3", "app1", "app2"]);
    assert_eq!(entries(&j, "step-result").len(), 5);
    assert!(entries(&j, "step-result").iter().all(|e| e["ok"] == true));
    assert_eq!(entries(&j, "interrupted").len(), 1);
    let finished = entries(&j, "run-finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["interrupted"], true);
    // Every hook is journaled before and after it runs.
    assert_eq!(
        entries(&j, "hook-started").len(),
        entries(&j, "hook-finished").len()
    );
    let status = status_json(&shop, &site);
    let un = &status["unfinished_run"];
    assert_eq!(un["run"], first.as_str());
    assert_eq!(un["state"], "interrupted");
    assert_eq!(un["succeeded"], 5);
    assert_eq!(un["steps"], 12);
    assert_eq!(un["in_flight"].as_array().unwrap().len(), 0);
    let table = text(&shop.deploy(&["status", &site]).stdout);
    assert!(
        table.contains(&format!("unfinished run:\n  {first} (started "))
            && table.contains("interrupted at")
            && table.contains("5 of 12 steps done"),
        "{table}"
    );

    // Carry on: nothing is done twice, everything converges.
    for h in ["app1", "app2"] {
        unpause(&shop, h, "api", "install");
    }
    let out = shop.deploy(&["apply", &site, "--yes"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("carrying on: run {first}")),
        "{stderr}"
    );
    for h in shop.fleet.names() {
        let installs = whats(&shop, h).iter().filter(|w| *w == "install").count();
        assert_eq!(installs, 1, "{h}: install ran once across both runs");
        assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
    }
    let second = run_id(&stderr);
    let j2 = journal(&shop, &second);
    assert_eq!(entries(&j2, "run-started")[0]["resumes"], first.as_str());
    assert_eq!(entries(&j2, "step-intent").len(), 7);
    let status = status_json(&shop, &site);
    assert!(status["unfinished_run"].is_null(), "{status}");
    assert_eq!(status["converged"], 12);
}

/// The runs journaled under `.drover/runs`, oldest first.
fn runs(shop: &Shop) -> Vec<String> {
    let mut runs: Vec<String> = std::fs::read_dir(shop.fleet.dir.join(".drover/runs"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    runs.sort();
    runs
}

#[test]
fn a_hangup_stops_the_run_as_ctrl_c_does_and_a_dead_terminal_loses_nothing() {
    let (shop, site) = apis_first_wave_paused();
    // Every line it prints (the plan, progress, the summary) fails to be written.
    let run = Running::start_hung_up(&shop, &["apply", &site, "--yes"], false);
    wait_for_apis_first_wave(&shop);
    run.signal("HUP");
    // Not killed by the signal, not a panic on a failed write (101): stopped, exit 130.
    let (code, _, _) = run.wait(Duration::from_secs(60));
    assert_eq!(code, 130);

    // As after one Ctrl-C.
    assert_stopped_after_apis_first_wave(&shop);
    let first = runs(&shop).pop().expect("a journaled run");
    let j = journal(&shop, &first);
    let stopped = entries(&j, "interrupted");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0]["reason"], "SIGHUP");
    assert_eq!(stopped[0]["abort"], false);
    assert_eq!(entries(&j, "run-finished")[0]["interrupted"], true);
    // Every lock was given back: no host and no controller lock is left.
    for h in shop.fleet.names() {
        let lock = shop.fleet.host_root(h).join("var-lib/drover/lock");
        assert!(!lock.exists(), "{h} is still locked");
    }

    // The next apply carries on from there. Started under `nohup`, a hangup leaves it going.
    for h in ["app1", "app2"] {
        unpause(&shop, h, "api", "install");
    }
    pause(&shop, "app3", "api", "install", "1.5");
    let run = Running::start_hung_up(&shop, &["apply", &site, "--yes"], true);
    wait_until("app3 installs api", Duration::from_secs(60), || {
        whats(&shop, "app3").contains(&"install".to_string())
    });
    run.signal("HUP");
    let (code, _, _) = run.wait(Duration::from_secs(60));
    assert_eq!(code, 0);
    for h in shop.fleet.names() {
        assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
    }
    let second = runs(&shop).pop().expect("a second run");
    assert_ne!(second, first);
    assert_eq!(
        entries(&journal(&shop, &second), "run-started")[0]["resumes"],
        first.as_str()
    );
}

/// The pid at the end of a run id (`<time>-<pid>`).
fn run_id_pid(run: &str) -> u32 {
    run.rsplit('-').next().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// (b) Ctrl-C twice

#[test]
fn ctrl_c_twice_kills_the_running_hook_records_it_and_a_later_apply_redoes_the_host() {
    let shop = Shop::start();
    let site = site_with_pauses(&shop, &lockstep());
    pause(&shop, "app1", "api", "install", "30");
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_until("app1 installs api", Duration::from_secs(60), || {
        whats(&shop, "app1").contains(&"install".to_string())
    });
    // app2, in the same wave, finishes on its own.
    wait_until("app2 is checked", Duration::from_secs(30), || {
        whats(&shop, "app2").contains(&"checked".to_string())
    });
    let sleeping = shop.fleet.ssh("app1", "pgrep -f 'sleep 30'");
    assert!(sleeping.status.success(), "the hook sleeps on app1");
    let signalled = Instant::now();
    run.interrupt();
    std::thread::sleep(Duration::from_millis(300));
    run.interrupt();
    let (code, _, stderr) = run.wait(Duration::from_secs(60));
    let took = signalled.elapsed();
    eprintln!("measured: two SIGINTs to exit took {took:?}");
    assert_eq!(code, 130, "{stderr}");
    assert!(
        took < Duration::from_secs(15),
        "aborting took {took:?}:\n{stderr}"
    );
    assert!(stderr.contains("ABORTING (SIGINT)"), "{stderr}");
    assert!(
        stderr.contains("api: app1 FAILED: install interrupted"),
        "{stderr}"
    );

    // The hook's process group is gone from the host.
    let left = shop.fleet.ssh("app1", "pgrep -f 'sleep 30'");
    assert!(
        !left.status.success(),
        "a sleep is left on app1: {}",
        text(&left.stdout)
    );
    // Exact state of every host: app1 interrupted in install, app2 done, the rest untouched.
    assert_eq!(whats(&shop, "app1"), ["install"]);
    assert_eq!(
        record(&shop, "app1"),
        (
            "1.0".to_string(),
            "failure".to_string(),
            "-".to_string(),
            "interrupted".to_string()
        )
    );
    for h in ["db1", "db2", "db3", "app2"] {
        assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
    }
    for h in ["app3", "app4", "app5", "app6", "lb1", "lb2", "lb3"] {
        assert!(whats(&shop, h).is_empty(), "{h}");
        assert!(!has_state(&shop, h), "{h}");
    }
    let first = run_id(&stderr);
    let j = journal(&shop, &first);
    let interrupted: Vec<bool> = entries(&j, "interrupted")
        .iter()
        .map(|e| e["abort"].as_bool().unwrap())
        .collect();
    assert_eq!(interrupted, [false, true]);
    let app1 = entries(&j, "step-result")
        .into_iter()
        .find(|e| e["host"] == "app1")
        .expect("app1's result is journaled");
    assert_eq!(app1["failed_hook"], "interrupted");
    assert_eq!(
        status_json(&shop, &site)["unfinished_run"]["state"],
        "interrupted"
    );

    // A later apply redoes app1 from the start of its switch-over, and converges.
    unpause(&shop, "app1", "api", "install");
    let out = shop.deploy(&["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        whats(&shop, "app1"),
        ["install", "stop", "install", "migrate", "start", "checked"]
    );
    for h in shop.fleet.names() {
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
        if h != "app1" {
            assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        }
    }
    assert_eq!(shop.serving("app1", "api"), "1.0");
    assert!(status_json(&shop, &site)["unfinished_run"].is_null());
}

#[test]
fn ctrl_c_twice_while_a_chain_runs_stops_the_hooks_sent_after_the_running_one() {
    let shop = Shop::start();
    installed(&shop, &lockstep());
    // app1's `install` leaves a process holding its output for 3 s: its shell has ended (the
    // abort's kill passes leave its group alone) but its command has not. `migrate`, sent to
    // the host in the same chain, starts there as soon as `install` is over, after the abort:
    // the controller must stop it (it would mark /srv/late-api 2 s in).
    let path = upgrade(&shop);
    let site = std::fs::read_to_string(&path).unwrap();
    let hold = "[ -e /srv/hold-$DEPLOY_SERVICE ]";
    let patched = site
        .replace(
            "ev install;",
            &format!("ev install; if {hold}; then (sleep 3) & fi;"),
        )
        .replace(
            "ev migrate;",
            &format!("ev migrate; if {hold}; then sleep 2; : >/srv/late-$DEPLOY_SERVICE; fi;"),
        );
    assert!(patched.contains("(sleep 3) &") && patched.contains("late-$DEPLOY_SERVICE"));
    std::fs::write(&path, patched).unwrap();
    let root = shop.fleet.host_root("app1");
    std::fs::write(root.join("srv/hold-api"), "").unwrap();
    let run = Running::start(&shop, &["apply", &path, "--yes"]);
    wait_until("app1 installs api 2.0", Duration::from_secs(60), || {
        whats(&shop, "app1")
            .iter()
            .filter(|w| *w == "install")
            .count()
            == 2
    });
    std::thread::sleep(Duration::from_millis(500));
    run.interrupt();
    std::thread::sleep(Duration::from_millis(300));
    run.interrupt();
    let (code, _, stderr) = run.wait(Duration::from_secs(60));
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("api: app1 FAILED"), "{stderr}");
    // Long enough for `migrate` to have marked the host, had it gone on.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !root.join("srv/late-api").exists(),
        "a hook sent in the chain ran on after the abort: {:?}\n{stderr}",
        whats(&shop, "app1")
    );
    // It did not even start: the abort's first kill pass made the run's stop file.
    assert_eq!(
        whats(&shop, "app1"),
        ["install", "start", "checked", "stop", "install"],
        "{stderr}"
    );
    let (_, configured, _, hook) = record(&shop, "app1");
    assert_eq!(
        (configured.as_str(), hook.as_str()),
        ("failure", "interrupted")
    );
}

// ---------------------------------------------------------------------------------------------
// A controller that dies (kill -9): its locks are stale, its hook is stopped, the host redone

#[test]
fn after_the_controller_dies_apply_stops_its_leftover_hook_and_redoes_the_host() {
    let shop = Shop::start();
    let site = site_with_pauses(&shop, &lockstep());
    pause(&shop, "app1", "api", "install", "30");
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_until("app1 installs api", Duration::from_secs(60), || {
        whats(&shop, "app1").contains(&"install".to_string())
    });
    // app2, in the same wave, is done and recorded (else it too would be cut off mid-step):
    // on the host, and in the run's journal (its result is synced there after the host's
    // command returns, and takes app1's `hook-started` line, queued before, with it).
    wait_until("app2 records its check", Duration::from_secs(30), || {
        has_state(&shop, "app2") && record(&shop, "app2") == ok_at("1.0")
    });
    let journal_file = || {
        let err = std::fs::read_to_string(&run.err).unwrap_or_default();
        let run = run_id(&err);
        shop.fleet
            .dir
            .join(".drover/runs")
            .join(run)
            .join("journal.ndjson")
    };
    wait_until(
        "app2's result is journaled",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(journal_file())
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("\"step-result\"") && l.contains("\"app2\""))
        },
    );
    let pid = run.pid();
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let (code, _, stderr) = {
        let mut child = run.child;
        let status = child.wait().unwrap();
        (
            status.code(),
            (),
            std::fs::read_to_string(&run.err).unwrap(),
        )
    };
    assert_eq!(code, None, "killed");
    let first = run_id(&stderr);
    // The hook runs on: nothing on the controller stopped it.
    assert!(shop
        .fleet
        .ssh("app1", "pgrep -f 'sleep 30'")
        .status
        .success());
    let status = status_json(&shop, &site);
    let un = &status["unfinished_run"];
    assert_eq!(un["run"], first.as_str());
    assert_eq!(un["state"], "died");
    let in_flight: Vec<(String, String, String)> = un["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["service"].as_str().unwrap().to_string(),
                s["host"].as_str().unwrap().to_string(),
                s["hook"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect();
    assert!(
        in_flight.contains(&("api".into(), "app1".into(), "install".into())),
        "{in_flight:?}"
    );

    unpause(&shop, "app1", "api", "install");
    let out = shop.deploy(&["apply", &site, "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("carrying on: run {first}"))
            && err.contains("stopped without finishing")
            && err.contains(&format!(
                "stopped 1 hook that run {first} left running on app1"
            ))
            && err.contains(&format!("(pid {pid}, run {first})"))
            && err.contains("its process is gone"),
        "{err}"
    );
    assert!(!shop
        .fleet
        .ssh("app1", "pgrep -f 'sleep 30'")
        .status
        .success());
    // app1 recorded nothing before it was cut off: it is installed afresh.
    assert_eq!(
        whats(&shop, "app1"),
        ["install", "install", "start", "checked"]
    );
    for h in shop.fleet.names() {
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
        if h != "app1" {
            assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        }
    }
    assert!(status_json(&shop, &site)["unfinished_run"].is_null());
}

// ---------------------------------------------------------------------------------------------
// (c) Two applies of one site; stale and foreign locks

#[test]
fn a_second_apply_refuses_naming_the_holder_and_locks_can_be_broken() {
    let shop = Shop::start();
    let site = site_with_pauses(&shop, &lockstep());
    pause(&shop, "db1", "db", "install", "2");
    let first = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_until("db1 installs", Duration::from_secs(60), || {
        whats(&shop, "db1").contains(&"install".to_string())
    });
    let second = shop.deploy(&["apply", &site, "--yes"]);
    let err = flat(&text(&second.stderr));
    assert_eq!(second.status.code(), Some(4), "{err}");
    let holder = format!("root on {} (pid {}, run ", hostname(), first.pid());
    assert!(
        err.contains("another `deploy apply` of site shop is running")
            && err.contains(&holder)
            && err.contains(") since 20"),
        "{err}"
    );
    let (code, _, stderr) = first.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "the first apply goes on: {stderr}");
    for h in shop.fleet.names() {
        assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
    }
    let lock = shop.fleet.dir.join(".drover/locks/shop.lock");
    assert!(!lock.exists(), "released");
    // What the locks cost: a plan reads every host; an apply with nothing to do also locks and
    // unlocks every host.
    let t = Instant::now();
    assert_eq!(shop.deploy(&["plan", &site]).status.code(), Some(0));
    let plan_took = t.elapsed();
    let t = Instant::now();
    assert_eq!(
        shop.deploy(&["apply", &site, "--yes"]).status.code(),
        Some(0)
    );
    eprintln!(
        "measured: plan {plan_took:?}, apply with nothing to change (locks included) {:?}",
        t.elapsed()
    );
    for h in shop.fleet.names() {
        assert!(
            !shop.fleet.host_root(h).join("var-lib/drover/lock").exists(),
            "{h}: released"
        );
    }

    // A lock left by a dead process of this machine is taken over, saying whose it was.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let dead = serde_json::json!({
        "user": "root", "controller": hostname(), "boot": boot.trim(), "pid": 4194311,
        "pid_start": 1, "since": "2026-01-01T00:00:00Z", "run": "r-dead", "site": "shop"
    });
    std::fs::write(&lock, dead.to_string()).unwrap();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "took over the lock of root on {} (pid 4194311, run r-dead) since 2026-01-01T00:00:00Z: its process is gone",
            hostname()
        )),
        "{err}"
    );
    assert!(!lock.exists());

    // Another controller's locks, on the controller and on a host: refused, then broken.
    let foreign = serde_json::json!({
        "user": "alice", "controller": "laptop-2", "pid": 4242,
        "since": "2026-01-02T00:00:00Z", "run": "r-alice", "site": "shop"
    });
    std::fs::write(&lock, foreign.to_string()).unwrap();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(
            "is locked by alice on laptop-2 (pid 4242, run r-alice) since 2026-01-02T00:00:00Z"
        ) && err.contains("--break-lock"),
        "{err}"
    );
    // The refusal points at `deploy status`, which names the holder.
    assert!(
        err.contains("(`deploy status` names it, under `site lock:`)"),
        "{err}"
    );
    let table = text(&shop.deploy(&["status", &site]).stdout);
    assert!(
        table.contains(
            "site lock:\n  .drover/locks/shop.lock is held by alice on laptop-2 (pid 4242, run \
             r-alice) since 2026-01-02T00:00:00Z"
        ),
        "{table}"
    );
    assert_eq!(
        status_json(&shop, &site)["site_lock"]["holder"]["run"],
        "r-alice"
    );
    std::fs::remove_file(&lock).unwrap();
    let on_db2 = shop.fleet.host_root("db2").join("var-lib/drover/lock");
    std::fs::create_dir_all(&on_db2).unwrap();
    std::fs::write(on_db2.join("holder.json"), foreign.to_string() + "\n").unwrap();
    let out = shop.deploy(&["apply", &site, "--yes"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("host db2 is locked by alice on laptop-2"),
        "{err}"
    );
    // A host's lock is not the site's: `deploy status` shows no such line, nor is it pointed at.
    assert!(!err.contains("deploy status"), "{err}");
    assert!(status_json(&shop, &site)["site_lock"].is_null());
    for h in shop.fleet.names() {
        let held = shop.fleet.host_root(h).join("var-lib/drover/lock").exists();
        assert_eq!(
            held,
            h == "db2",
            "{h}: a refused apply leaves no lock behind"
        );
    }
    std::fs::write(&lock, foreign.to_string()).unwrap();
    let out = shop.deploy(&["apply", &site, "--yes", "--break-lock"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--break-lock: broke the lock of alice on laptop-2 (pid 4242, run r-alice) since 2026-01-02T00:00:00Z (.drover/locks/shop.lock)")
            && err.contains("--break-lock: broke the lock of alice on laptop-2 (pid 4242, run r-alice) since 2026-01-02T00:00:00Z (host db2)"),
        "{err}"
    );
    assert!(!lock.exists() && !on_db2.exists());
    // Nothing was run twice along the way.
    for h in shop.fleet.names() {
        assert_eq!(whats(&shop, h), ["install", "start", "checked"], "{h}");
        assert_eq!(record(&shop, h), ok_at("1.0"), "{h}");
    }
}

// ---------------------------------------------------------------------------------------------
// (d) A host dies mid-wave

/// The upgrade of api to 2.0 in waves [app1 app2] [app3 app4] [app5 app6], max-failed 0.
fn upgrade(shop: &Shop) -> String {
    site_with_pauses(
        shop,
        &Spec {
            api: "2.0",
            ..lockstep()
        },
    )
}

/// Checks every host but `lost` after the upgrade was halted by `lost`'s failure in wave 2.
fn after_halt(shop: &Shop, site: &str, lost: &str) {
    let upgraded = [
        "install", "start", "checked", "stop", "install", "migrate", "start", "checked",
    ];
    let untouched = ["install", "start", "checked"];
    for h in ["app1", "app2", "app3", "app4"]
        .into_iter()
        .filter(|h| *h != lost)
    {
        assert_eq!(whats(shop, h), upgraded, "{h}");
        assert_eq!(record(shop, h), ok_at("2.0"), "{h}");
        assert_eq!(shop.serving(h, "api"), "2.0", "{h}");
    }
    for h in ["app5", "app6", "db1", "db2", "db3", "lb1", "lb2", "lb3"] {
        assert_eq!(whats(shop, h), untouched, "{h}: the budget stops new waves");
        assert_eq!(record(shop, h), ok_at("1.0"), "{h}");
    }
    let status = status_json(shop, site);
    let unaccounted: Vec<(String, String)> = status["unaccounted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["host"].as_str().unwrap().to_string(),
                u["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(unaccounted.len(), 1, "{unaccounted:?}");
    assert_eq!(unaccounted[0].0, lost);
    assert!(
        unaccounted[0].1.starts_with("does not answer"),
        "{unaccounted:?}"
    );
    assert!(
        status["unfinished_run"].is_null(),
        "the run ended: {status}"
    );
}

#[test]
fn a_host_whose_sshd_dies_mid_wave_fails_only_its_own_step_and_quickly() {
    let shop = Shop::start();
    installed(&shop, &lockstep());
    let site = upgrade(&shop);
    pause(&shop, "app3", "api", "migrate", "30");
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_until("app3 migrates", Duration::from_secs(60), || {
        whats(&shop, "app3").contains(&"migrate".to_string())
    });
    let killed = Instant::now();
    shop.fleet.kill_host("app3");
    let (code, _, stderr) = run.wait(Duration::from_secs(60));
    let took = killed.elapsed();
    eprintln!("measured: from the host's death to the end of the run {took:?}");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} after the kill:\n{stderr}"
    );
    assert!(stderr.contains("api: app3 FAILED"), "{stderr}");
    assert!(
        stderr.contains("api: HALTED: 1 host failed, more than max-failed 0 allows"),
        "{stderr}"
    );
    // app3 got as far as migrate; the host is gone, so its record is the one from before.
    assert_eq!(
        whats(&shop, "app3"),
        ["install", "start", "checked", "stop", "install", "migrate"]
    );
    assert_eq!(record(&shop, "app3"), ok_at("1.0"));
    after_halt(&shop, &site, "app3");
}

/// Every process of a fleet host (its PID namespace), found from its sshd's command line.
fn host_processes(shop: &Shop, host: &str) -> Vec<String> {
    let config = shop.fleet.host_root(host).join("sshd_config");
    let config = config.to_str().unwrap();
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let pids: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|p| p.chars().all(|c| c.is_ascii_digit()))
        .collect();
    // sshd, PID 1 of the host: the process naming its config in another PID namespace.
    let ours = ns("self");
    let sshd = pids
        .iter()
        .find(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            text(&cmdline).contains(config) && ns(p) != ours
        })
        .unwrap_or_else(|| panic!("no sshd of {host}"))
        .clone();
    let target = ns(&sshd);
    pids.into_iter().filter(|p| ns(p) == target).collect()
}

fn signal_all(pids: &[String], signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids)
        .stderr(Stdio::null())
        .status();
}

#[test]
fn a_host_that_goes_silent_mid_wave_is_given_up_after_about_a_connect_timeout() {
    let shop = Shop::start();
    // A short connect-timeout: a silent host is given up after about this long.
    let platform = shop.fleet.dir.join("platform.kdl");
    let text_before = std::fs::read_to_string(&platform).unwrap();
    std::fs::write(
        &platform,
        text_before.replacen(
            "transport \"ssh\"",
            "transport \"ssh\" connect-timeout=\"3s\"",
            1,
        ),
    )
    .unwrap();
    installed(&shop, &lockstep());
    let site = upgrade(&shop);
    pause(&shop, "app3", "api", "migrate", "30");
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_until("app3 migrates", Duration::from_secs(60), || {
        whats(&shop, "app3").contains(&"migrate".to_string())
    });
    // Freeze the whole host: its TCP connections stay open, nothing answers on them.
    let frozen = host_processes(&shop, "app3");
    signal_all(&frozen, "STOP");
    let stopped = Instant::now();
    let (code, _, stderr) = run.wait(Duration::from_secs(90));
    let took = stopped.elapsed();
    signal_all(&frozen, "CONT");
    eprintln!("measured: from the host's freeze to the end of the run {took:?}");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        took < Duration::from_secs(25),
        "a silent host held the run for {took:?}:\n{stderr}"
    );
    assert!(stderr.contains("api: app3 FAILED"), "{stderr}");
    shop.fleet.kill_host("app3");
    after_halt(&shop, &site, "app3");
}

// ---------------------------------------------------------------------------------------------
// A controller killed outright

/// The `-S` control paths of the ssh masters of the `deploy` with `pid` (in `run-<pid>-…`).
fn masters_of(pid: u32) -> Vec<String> {
    let out = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let mark = format!("/run-{pid}-");
    text(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("ssh ") && l.contains(" -M ") && l.contains(&mark))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let s = words.iter().position(|w| *w == "-S")?;
            words.get(s + 1).map(|p| p.to_string())
        })
        .collect()
}

#[test]
fn a_controller_killed_outright_leaves_no_ssh_master_running() {
    let (shop, site) = apis_first_wave_paused();
    for h in ["app1", "app2"] {
        pause(&shop, h, "api", "install", "20");
    }
    let run = Running::start(&shop, &["apply", &site, "--yes"]);
    wait_for_apis_first_wave(&shop);
    // One master per host, in a directory of the run's own.
    let masters = masters_of(run.pid());
    assert_eq!(masters.len(), 12, "{masters:?}");
    let dir = PathBuf::from(&masters[0][..masters[0].find("/.ssh-connection").unwrap()]);
    assert!(dir.is_dir(), "{}", dir.display());
    let pid = run.pid();
    run.signal("KILL");
    // Its watcher stops them (OpenSSH's ControlPersist would keep them forever) and removes
    // the directory; the hosts stay up all along.
    wait_until(
        "no master of the killed run is left",
        Duration::from_secs(20),
        || masters_of(pid).is_empty(),
    );
    wait_until("its directory is removed", Duration::from_secs(20), || {
        !dir.exists()
    });
    // The next apply carries on from the hosts' records, as after any interruption.
    for h in ["app1", "app2"] {
        unpause(&shop, h, "api", "install");
    }
    let out = shop.deploy(&["apply", &site, "--yes", "--break-lock"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
