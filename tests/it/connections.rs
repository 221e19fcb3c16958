//! One SSH connection per host for a whole `deploy apply` (lock, observation, rollout, lock
//! release), counted in each host's sshd log, which also removes the hooks' pid files; the
//! state read goes with the lock's command, and every command (the lock, each hook, the
//! lock's release) goes to one shell kept open on the host: one session per host, however
//! many hooks (counted in the sshd log), one per command with `keep-shell=#false`; and a
//! fleet larger than `--max-connections` still converges, reconnecting between stages but
//! for the hosts stepped first, whose lock's connection is kept for their steps.

use crate::support;

use support::shop::{Shop, Spec};

/// Connections each host's sshd accepted so far.
fn accepted(shop: &Shop) -> Vec<(String, usize)> {
    counted(shop, "Accepted publickey")
}

/// Sessions each host's sshd started so far (one per command not sent to a kept shell).
fn commands(shop: &Shop) -> Vec<(String, usize)> {
    counted(shop, "Starting session: command")
}

/// Lines of each host's sshd log that contain `what`.
fn counted(shop: &Shop, what: &str) -> Vec<(String, usize)> {
    shop.fleet
        .names()
        .into_iter()
        .map(|h| {
            let log = std::fs::read_to_string(shop.fleet.host_root(h).join("sshd.log"))
                .expect("read sshd.log");
            (h.to_string(), log.matches(what).count())
        })
        .collect()
}

/// Hooks `deploy` ran on each host in its last run, from the run's step logs (a line
/// `== <hook>: …` per hook, every attempt of a check included).
fn hooks_run(shop: &Shop) -> Vec<(String, usize)> {
    let runs = shop.fleet.dir.join(".drover/runs");
    let last = std::fs::read_dir(&runs)
        .expect("runs")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("a run");
    shop.fleet
        .names()
        .into_iter()
        .map(|h| {
            let n = std::fs::read_dir(last.join(h))
                .map(|d| {
                    d.flatten()
                        .map(|f| std::fs::read_to_string(f.path()).unwrap_or_default())
                        .map(|t| t.lines().filter(|l| l.starts_with("== ")).count())
                        .sum()
                })
                .unwrap_or(0);
            (h.to_string(), n)
        })
        .collect()
}

fn apply(shop: &Shop, site: &std::path::Path, extra: &[&str]) {
    let mut args = vec!["apply", site.to_str().expect("utf-8 path"), "--yes"];
    args.extend_from_slice(extra);
    let out = shop.deploy(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "apply failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// New connections per host since `before`.
fn since(shop: &Shop, before: &[(String, usize)]) -> Vec<(String, usize)> {
    since_in(accepted(shop), before)
}

/// Per host, `now` less `before`.
fn since_in(now: Vec<(String, usize)>, before: &[(String, usize)]) -> Vec<(String, usize)> {
    now.into_iter()
        .zip(before)
        .map(|((h, n), (_, b))| (h, n - b))
        .collect()
}

#[test]
fn an_apply_connects_to_each_host_once() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let ones = |v: &[(String, usize)]| v.iter().all(|(_, n)| *n == 1);

    // A fresh install: lock and read state, then every hook of three services' steps, the
    // last of which gives the lock back, all in the one shell kept on the host.
    let before = accepted(&shop);
    let sent = commands(&shop);
    apply(&shop, &site, &[]);
    let fresh = since(&shop, &before);
    assert!(ones(&fresh), "one connection per host: {fresh:?}");
    let sent = since_in(commands(&shop), &sent);
    let hooks = hooks_run(&shop);
    for ((host, n), (_, hooks)) in sent.iter().zip(&hooks) {
        assert!(*hooks >= 3, "{host} ran its steps: {hooks}");
        assert_eq!(
            *n, 1,
            "{host}: one session (the kept shell) for the lock and its {hooks} hooks"
        );
    }
    // The hooks' pid files went with the lock, over that same connection.
    for host in shop.fleet.names() {
        let hooks = shop.fleet.host_root(host).join("var-lib/drover/hooks");
        let left: Vec<_> = std::fs::read_dir(&hooks)
            .expect("the hooks' directory was made")
            .flatten()
            .map(|f| f.file_name())
            .collect();
        assert!(
            left.is_empty(),
            "{host}: {left:?} left in {}",
            hooks.display()
        );
    }

    // Nothing to change: lock and read state in one command, unlock, in the kept shell.
    let before = accepted(&shop);
    let sent = commands(&shop);
    apply(&shop, &site, &[]);
    let idle = since(&shop, &before);
    assert!(ones(&idle), "one connection per host: {idle:?}");
    let sent = since_in(commands(&shop), &sent);
    assert!(
        sent.iter().all(|(_, n)| *n == 1),
        "one session per host: {sent:?}"
    );

    // An upgrade of one service through every hook.
    let before = accepted(&shop);
    let site = shop.write(&Spec {
        api: "2.0",
        ..Spec::default()
    });
    let sent = commands(&shop);
    apply(&shop, &site, &[]);
    let upgrade = since(&shop, &before);
    assert!(ones(&upgrade), "one connection per host: {upgrade:?}");
    let sent = since_in(commands(&shop), &sent);
    assert!(
        sent.iter().all(|(_, n)| *n == 1),
        "one session per host, every hook in the kept shell: {sent:?}"
    );
    for host in shop.hosts_of("app") {
        assert_eq!(shop.version(&host, "api"), "2.0", "{host}");
    }
}

#[test]
fn without_the_kept_shell_each_command_has_a_session_and_the_lock_goes_with_the_last_hook() {
    let shop = Shop::start();
    with_transport_options(&shop, "keep-shell=#false");
    let site = shop.write(&Spec::default());
    let sent = commands(&shop);
    apply(&shop, &site, &[]);
    let sent = since_in(commands(&shop), &sent);
    let hooks = hooks_run(&shop);
    for ((host, n), (_, hooks)) in sent.iter().zip(&hooks) {
        assert!(*hooks >= 3, "{host} ran its steps: {hooks}");
        // The lock with the state read, then one per hook; no command of their own for
        // reading state or unlocking, but on app1: the first host by name, which a run that
        // reads hosts as it goes holds to its end (`tests/it/plan_as_read.rs`).
        let release = usize::from(host == "app1");
        assert_eq!(
            *n,
            hooks + 1 + release,
            "{host}: the lock (with the read) and the hooks"
        );
    }
}

#[test]
fn a_fleet_over_the_connection_cap_still_converges() {
    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let before = accepted(&shop);
    apply(&shop, &site, &["--max-connections", "4"]);
    let counts = since(&shop, &before);
    // Over the cap, the links the lock opened are kept for the hosts stepped first (the db
    // tier, then the first api hosts): those are connected once; every other host twice
    // (for its lock with the state's read, then for its steps). A kept link may still be
    // closed to make room for a host stepped earlier than expected (and the rollout may
    // connect a host ahead of its step, then close that link for another's).
    let once: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| *n == 1)
        .map(|(h, _)| h.as_str())
        .collect();
    assert!(
        ["db1", "db2", "db3"].iter().all(|h| once.contains(h)) && once.len() <= 4,
        "the db hosts, stepped first, are connected once, at most 4 hosts so: {counts:?}"
    );
    assert!(counts.iter().all(|(_, n)| *n >= 1), "{counts:?}");
    for host in shop.fleet.names() {
        let state = shop.state(host);
        let services = state["services"].as_object().expect("services");
        assert!(
            services
                .values()
                .all(|s| s["validated"]["outcome"] == "success"),
            "{host}: {state}"
        );
    }
}

/// Writes the shop's platform again with `options` (`persist="60s"` …) on its transport.
fn with_transport_options(shop: &Shop, options: &str) {
    shop.fleet
        .write_platform_with(support::shop::STATE_DIR, options);
}

/// Runs `deploy` with its persisted masters in `masters`; it must exit 0.
fn deploy_ok(shop: &Shop, masters: &std::path::Path, args: &[&str]) {
    let out = support::cli::deploy_in(&shop.fleet.dir)
        .args(args)
        .env("DROVER_SSH_DIR", masters)
        .output()
        .expect("run deploy");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn with_persist_plan_then_applies_log_in_once() {
    let shop = Shop::start();
    with_transport_options(&shop, "persist=\"60s\"");
    let site = shop.write(&Spec::default());
    let site = site.to_str().expect("utf-8 path");
    let masters = tempfile::tempdir().expect("masters' directory");
    let run = |args: &[&str]| deploy_ok(&shop, masters.path(), args);
    let before = accepted(&shop);
    run(&["plan", site]);
    run(&["apply", site, "--yes"]);
    run(&["apply", site, "--yes"]);
    run(&["verify", site]);
    let counts = since(&shop, &before);
    assert!(
        counts.iter().all(|(_, n)| *n == 1),
        "plan, two applies and verify log in once per host: {counts:?}"
    );
    // One master kept per host, in a directory only this user may enter.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(masters.path())
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let records: Vec<std::path::PathBuf> = std::fs::read_dir(masters.path())
        .expect("read masters")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "master"))
        .collect();
    assert_eq!(records.len(), shop.fleet.names().len(), "{records:?}");
    // Stop them, as `ssh -O exit` does for a ControlPersist master.
    for r in records {
        let ctl = std::fs::read_to_string(&r).expect("record");
        let _ = std::process::Command::new("ssh")
            .args(["-S", ctl.trim(), "-O", "exit", "x"])
            .output();
    }
}

#[test]
fn a_host_that_does_not_answer_the_lock_is_neither_read_nor_changed() {
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let shop = Shop::start();
    let site = shop.write(&Spec::default());
    let gone = shop.hosts_of("app")[1].clone();
    // The host's sshd is gone; in its place, something that takes each connection and drops it
    // (an sshd that failed), counting them.
    shop.fleet.kill_host(&gone);
    let listener =
        TcpListener::bind((shop.fleet.address(&gone).as_str(), support::fleet::SSH_PORT))
            .expect("bind the host's ssh port");
    listener.set_nonblocking(true).expect("nonblocking");
    let (taken, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let counter = {
        let (taken, done) = (taken.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        taken.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(50)));
                        let _ = stream.read(&mut [0u8; 64]);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        })
    };
    // Every host locked before the run (`--read-first`), as an apply that asks first does.
    let out = shop.deploy(&[
        "apply",
        site.to_str().expect("utf-8 path"),
        "--yes",
        "--read-first",
    ]);
    done.store(true, Ordering::SeqCst);
    counter.join().expect("the counter");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stderr.contains(&format!("not locked, since they do not answer: {gone}")),
        "{stderr}"
    );
    // Tried once, for its lock; not again to read it.
    assert_eq!(taken.load(Ordering::SeqCst), 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("not locked"),
        "the plan says why it is left: {stdout}"
    );
    // Every other host converged; the run is not, with a host left out.
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for host in shop.hosts_of("app").iter().filter(|h| **h != gone) {
        assert_eq!(shop.version(host, "api"), "1.0", "{host}");
    }
}

#[test]
fn with_persist_a_master_that_idled_out_while_held_is_connected_anew() {
    // `persist="3s"` and no kept shell: a master the run holds with no command on it exits
    // after three seconds, as OpenSSH's ControlPersist does. Waves 4 s apart leave the hosts
    // of later waves (locked and read at the start) idle for longer than that.
    let shop = Shop::start();
    with_transport_options(&shop, "persist=\"3s\" keep-shell=#false");
    let site = shop.write(&Spec {
        policy: r#"batch 2; max-failed 0; pause "4s""#,
        ..Spec::default()
    });
    let masters = tempfile::tempdir().expect("masters' directory");
    let site = site.to_str().expect("utf-8 path");
    deploy_ok(&shop, masters.path(), &["apply", site, "--yes"]);
    for host in shop.hosts_of("app") {
        assert_eq!(shop.version(&host, "api"), "1.0", "{host}");
    }
}
