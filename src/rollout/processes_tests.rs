//! The on-host process protocol run by real shells: chained hooks kept from starting, what
//! follows a hook told apart, and a run's hooks killed, another run's left alone.

use super::*;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

/// The kill script for the hooks of a run of controller pid `pid` whose lock names no tag
/// (its files are known by the pid).
fn kill_of(state: &str, pid: u32) -> String {
    kill_script(
        state,
        &Holder {
            pid,
            hooks: String::new(),
            ..Holder::me("s", "r")
        },
    )
}

/// `/bin/sh -c script` in a process group of its own, as a link runs it.
fn sh(script: &str) -> Command {
    shell("/bin/sh", script)
}

/// `program -c script` in a process group of its own (any shell that may be `/bin/sh`).
fn shell(program: &str, script: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.arg("-c").arg(script).process_group(0);
    cmd
}

/// [`sh`] with its output to `/dev/null`: a process left behind by a failed test does not
/// hold the test's output open.
fn quiet(script: &str) -> Command {
    let mut cmd = sh(script);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").starts_with(" Z"))
}

#[test]
fn kills_the_groups_of_one_controller_and_no_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("st ate");
    std::fs::create_dir_all(state.join("hooks")).unwrap();
    let state = state.display().to_string();
    // Hooks as hook_run.rs runs them: pid file of the group (its id, the hook's number), a
    // child, then a wait.
    let spawn = |file: &str, mark: &str| {
        let script = format!(
            "echo \"$$ 7{mark}\" > '{state}/hooks/{file}'; sleep 300 & echo $! > '{state}/{file}.child'; sleep 300"
        );
        sh(&script).spawn().expect("sh")
    };
    let mut mine = spawn("4242-1-0.pid", "");
    let mut other = spawn("4243-1-0.pid", "");
    // Marked ended (its shell gone, as far as the file says): left alone, not counted.
    let ended = spawn("4242-2-0.pid", " ended");
    let t0 = Instant::now();
    let child = |file: &str| loop {
        if let Ok(p) = std::fs::read_to_string(format!("{state}/{file}.child")) {
            if !p.trim().is_empty() {
                break p.trim().to_string();
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    };
    let (mine_child, other_child) = (child("4242-1-0.pid"), child("4243-1-0.pid"));
    let ended_child = child("4242-2-0.pid");
    let out = sh(&kill_of(&state, 4242)).output().expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    assert_eq!(mine.wait().unwrap().signal(), Some(15));
    let t0 = Instant::now();
    while alive(&mine_child) && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(&mine_child), "the hook's child went with its group");
    assert!(!std::path::Path::new(&format!("{state}/hooks/4242-1-0.pid")).exists());
    assert!(
        alive(&other_child),
        "another controller's hook is left alone"
    );
    assert!(other.try_wait().unwrap().is_none());
    assert!(alive(&ended_child), "a group marked ended is left alone");
    let out = sh(&kill_of(&state, 4242)).output().expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    let _ = sh(&kill_of(&state, 4243)).output();
    let _ = other.wait();
    end(ended);
}

#[test]
fn a_run_named_by_its_tag_leaves_another_run_of_the_same_pid_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
    let state = dir.path().display().to_string();
    let spawn = |file: &str| {
        let script = format!("echo \"$$ 7\" > '{state}/hooks/{file}'; sleep 300");
        sh(&script).spawn().expect("sh")
    };
    // Two runs of pid 4242 (two machines): each its own tag.
    let (mut mine, mut other) = (spawn("4242-1.pid"), spawn("4242-2.pid"));
    let recorded = |f: &str| {
        std::fs::read_to_string(format!("{state}/hooks/{f}")).is_ok_and(|t| !t.is_empty())
    };
    let t0 = Instant::now();
    while !(recorded("4242-1.pid") && recorded("4242-2.pid")) {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let holder = |tag: &str| Holder {
        pid: 4242,
        hooks: tag.into(),
        ..Holder::me("s", "r")
    };
    let out = sh(&kill_script(&state, &holder("4242-1")))
        .output()
        .expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    assert_eq!(mine.wait().unwrap().signal(), Some(15));
    assert!(
        other.try_wait().unwrap().is_none(),
        "the other run's hook runs on"
    );
    let out = sh(&kill_script(&state, &holder("4242-2")))
        .output()
        .expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let _ = other.wait();
}

/// Waits until `path` holds a line, and returns it.
fn line_of(path: &std::path::Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(p) = std::fs::read_to_string(path) {
            if p.ends_with('\n') {
                break p.trim().to_string();
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The 22nd field of `/proc/<pid>/stat`: when the process started.
fn start_of(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = stat.rsplit_once(") ").expect("comm").1;
    rest.split_whitespace()
        .nth(19)
        .expect("field 22")
        .to_string()
}

/// Kills what is left of the group led by `child` (a test's own), and reaps it.
fn end(mut child: std::process::Child) {
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}

/// Starts the kill script of controller 4242's hooks under `program`; [`said`] reads what
/// it printed once it ends.
fn start_kill(program: &str, state: &str) -> std::process::Child {
    shell(program, &kill_of(state, 4242))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("shell")
}

fn said(kill: std::process::Child) -> String {
    let out = kill.wait_with_output().expect("the kill script ends");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_group_id_taken_again_or_of_another_boot_is_left_alone() {
    for program in ["/bin/sh", "bash"] {
        taken_again_or_of_another_boot(program);
    }
}

fn taken_again_or_of_another_boot(program: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
    let pid_file = |name: &str| format!("{state}/hooks/{name}");
    let boot = std::fs::read_to_string(BOOT_ID).expect("boot id");
    let boot = boot.trim().to_string();
    // Left alone: a group whose leader started at another time than the one recorded (the
    // id was taken again), and one recorded on another boot.
    let taken = quiet("sleep 300").spawn().expect("sh");
    let other_boot = quiet("sleep 300").spawn().expect("sh");
    let later = start_of(taken.id()).parse::<u64>().expect("a number") + 1;
    let files = [
        (
            "4242-1-0.pid",
            format!("{} 7\n{boot} {later}\n", taken.id()),
        ),
        (
            "4242-2-0.pid",
            format!(
                "{} 7\nan-old-boot {}\n",
                other_boot.id(),
                start_of(other_boot.id())
            ),
        ),
    ];
    for (name, text) in &files {
        std::fs::write(pid_file(name), text).unwrap();
    }
    let out = said(start_kill(program, &state));
    let (mut taken, mut other_boot) = (taken, other_boot);
    let (taken_lives, other_lives) = (
        taken.try_wait().unwrap().is_none(),
        other_boot.try_wait().unwrap().is_none(),
    );
    end(taken);
    end(other_boot);
    assert_eq!(out, "0", "{program}");
    assert!(taken_lives, "{program}: a group taken again was killed");
    assert!(other_lives, "{program}: a group of another boot was killed");
    assert!(
        !std::path::Path::new(&pid_file("4242-2-0.pid")).exists(),
        "files cleared"
    );

    // Killed: the group as recorded on this boot, a file with nothing known (`-`), and a
    // file of an older deploy (one line).
    for (name, second) in [
        ("4242-3-0.pid", Some(boot.clone())),
        ("4242-4-0.pid", Some("- -".to_string())),
        ("4242-5-0.pid", None),
    ] {
        let mut hook = quiet("sleep 300; :").spawn().expect("sh");
        let second = match second {
            Some(b) if b.starts_with('-') => format!("{b}\n"),
            Some(b) => format!("{b} {}\n", start_of(hook.id())),
            None => String::new(),
        };
        std::fs::write(pid_file(name), format!("{} 7\n{second}", hook.id())).unwrap();
        let kill = start_kill(program, &state);
        // Reaped as soon as it dies (as the host's shell would), or its group looks alive.
        assert_eq!(hook.wait().unwrap().signal(), Some(15), "{program}: {name}");
        assert_eq!(said(kill), "1", "{program}: {name}");
    }

    // Killed: a group whose leader ended while what it started goes on, the leader a
    // zombie (not reaped yet: its start time is still there) or gone (reaped).
    for reaped in [false, true] {
        let child_file = dir.path().join(format!("child-{reaped}"));
        let mut leader = quiet(&format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > '{}'",
            child_file.display()
        ))
        .spawn()
        .expect("sh");
        let recorded = start_of(leader.id());
        let child = line_of(&child_file);
        if reaped {
            leader.wait().expect("reaped");
        } else {
            let t0 = Instant::now();
            while alive(&leader.id().to_string()) {
                assert!(t0.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::fs::write(
            pid_file("4242-6-0.pid"),
            format!("{} 7\n{boot} {recorded}\n", leader.id()),
        )
        .unwrap();
        let kill = start_kill(program, &state);
        let t0 = Instant::now();
        while alive(&child) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let killed = !alive(&child);
        let _ = leader.wait();
        if !killed {
            let _ = Command::new("kill").args(["-KILL", &child]).status();
        }
        assert!(
            killed,
            "{program}: the leaderless group was killed (reaped: {reaped})"
        );
        assert_eq!(said(kill), "1", "{program}: reaped: {reaped}");
    }
}

#[test]
fn a_hooks_pid_file_names_its_group_its_start_and_this_boot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
    let file = pid_file(&state);
    let pid = Recorded {
        file: &file,
        number: 3,
        stop: None,
    };
    let said = dir.path().join("said");
    let hook = format!("echo running > '{}'; sleep 300", said.display());
    let mut wrapper = quiet(&script(&[], &hook, &state, &pid, false, None))
        .spawn()
        .expect("sh");
    line_of(&said);
    let boot = std::fs::read_to_string(BOOT_ID).expect("boot id");
    assert_eq!(
        std::fs::read_to_string(&file).expect("pid file"),
        format!(
            "{} 3\n{} {}\n",
            wrapper.id(),
            boot.trim(),
            start_of(wrapper.id())
        )
    );
    // And the kill of this process's hooks finds it.
    let out = sh(&kill_script(&state, &Holder::me("s", "r")))
        .output()
        .expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    assert_eq!(wrapper.wait().unwrap().signal(), Some(15));
}

/// The script of a hook `hook`, followed by `then`, run by the real `/bin/sh`.
fn run(hook: &str, then: &str) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().display().to_string();
    let file = pid_file(&state);
    let pid = Recorded {
        file: &file,
        number: 1,
        stop: None,
    };
    let mut text = script(&[], hook, &state, &pid, false, None);
    text.push_str(&followed_by(then));
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&text)
        .current_dir(dir.path())
        .output()
        .expect("sh runs");
    Output {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

#[test]
fn a_chained_hook_does_not_start_once_its_chain_is_stopped_and_is_killed_if_it_had() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("hooks")).expect("hooks dir");
    let file = pid_file(&state);
    let stop = chain_stop_file(&state);
    assert!(stop.starts_with(&format!("{state}/hooks/")) && stop.ends_with(".stop"));
    assert_ne!(stop, chain_stop_file(&state), "each chain its own");
    let ran = dir.path().join("ran");
    let hook = format!("touch {}", quote(&ran.display().to_string()));
    let chained = |n| {
        let pid = Recorded {
            file: &file,
            number: n,
            stop: Some(&stop),
        };
        script(&[], &hook, &state, &pid, false, None)
    };
    let sh = |text: &str| {
        std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(text)
            .output()
            .expect("sh runs")
    };
    // Before the chain is left, the hook runs.
    assert!(sh(&chained(1)).status.success());
    assert!(ran.exists());
    std::fs::remove_file(&ran).expect("rm");
    // Left: the stop file is made, and a hook that starts after it does not run.
    let abandon = sh(&abandon_script(&state, &stop));
    assert!(abandon.status.success(), "{abandon:?}");
    let stopped = sh(&chained(2));
    assert_eq!(stopped.status.code(), Some(STOPPED));
    assert!(!ran.exists(), "a hook ran after its chain was left");
    // One that started before: its group is killed by the same script.
    std::fs::remove_file(&stop).expect("rm");
    let slow = Recorded {
        file: &file,
        number: 3,
        stop: Some(&stop),
    };
    let text = script(&[], &format!("sleep 5; {hook}"), &state, &slow, false, None);
    let mut child = std::process::Command::new("setsid")
        .args(["/bin/sh", "-c", &text])
        .spawn()
        .expect("setsid runs");
    // Once it has recorded its group (the pid file names hook 3).
    let recorded = || std::fs::read_to_string(&file).is_ok_and(|t| t.contains(" 3"));
    let mut waited = 0;
    while !recorded() && waited < 250 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        waited += 1;
    }
    assert!(recorded(), "the hook recorded its group");
    // Reaped as soon as it dies (as the host's shell would), or its group looks alive.
    let waiter = std::thread::spawn(move || child.wait());
    let abandon = sh(&abandon_script(&state, &stop));
    assert_eq!(String::from_utf8_lossy(&abandon.stdout).trim(), "1");
    let status = waiter.join().expect("joins").expect("waits");
    assert!(!status.success(), "killed");
    assert!(!ran.exists(), "the hook went on after its chain was left");
    // The run's stop file (an abort's kill passes make it) stops every chained hook too.
    std::fs::remove_file(&stop).expect("rm");
    assert!(sh(&chained(4)).status.success(), "runs again");
    std::fs::remove_file(&ran).expect("rm");
    std::fs::write(run_stop_file(&state), "").expect("run stop");
    assert_eq!(sh(&chained(5)).status.code(), Some(STOPPED));
    assert!(!ran.exists(), "a chained hook ran after the run's abort");
}

#[test]
fn then_runs_only_after_a_hook_that_passed_and_its_failure_is_told_apart() {
    let passed = run("echo hook", "echo then");
    assert_eq!(passed.code, Some(0));
    assert_eq!(passed.stdout, b"hook\nthen\n");
    assert!(then_failed(&passed).is_none());

    let failed = run("echo hook; exit 3", "echo then");
    assert_eq!(
        (failed.code, failed.stdout.as_slice()),
        (Some(3), &b"hook\n"[..])
    );
    assert!(then_failed(&failed).is_none());

    let then_failed_out = run("echo hook >&2", "echo nope >&2; false");
    let hook = then_failed(&then_failed_out).expect("told apart");
    assert_eq!(hook.code, Some(0));
    assert_eq!(hook.stderr, b"hook\nnope\n");

    // A hook that itself exits 86 is the hook's failure.
    let own = run("exit 86", "true");
    assert_eq!(own.code, Some(THEN_FAILED));
    assert!(then_failed(&own).is_none());
}

/// A hook of another user's (root's), the kill script run as `nobody` (a run that logged in
/// as another user than the one whose lock it breaks): it may not signal the hook's group, and
/// says so, with the group's id, counting it as not ended. Without it, the hook ran on
/// and the script said `0`, as if there was nothing to end.
#[test]
fn a_hook_the_kill_script_may_not_end_is_said_with_its_group() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        eprintln!("skipped: needs root, to run the kill script as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let hooks = dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(dir.path(), open.clone()).unwrap();
    std::fs::set_permissions(&hooks, open.clone()).unwrap();
    let state = dir.path().display().to_string();
    let pid_file = hooks.join("4242-1.pid");
    let mut hook = sh(&format!(
        "echo \"$$ 7\" > '{}'; exec sleep 300",
        pid_file.display()
    ))
    .spawn()
    .expect("sh");
    let t0 = Instant::now();
    while std::fs::read_to_string(&pid_file).map_or(true, |t| t.is_empty()) {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::set_permissions(&pid_file, open).unwrap();
    let holder = Holder {
        pid: 4242,
        hooks: "4242-1".into(),
        ..Holder::me("s", "r")
    };
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/bin/sh", "-c", &kill_script(&state, &holder)])
        .output()
        .expect("setpriv");
    let running = hook.try_wait().unwrap().is_none();
    let _ = hook.kill();
    let _ = hook.wait();
    assert!(running, "the hook runs on");
    let pid = hook.id().to_string();
    assert_eq!(
        kill_outcome(&out.stdout),
        (Some(0), vec![pid.clone()]),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{NOT_ENDED} {pid}\n0\n")
    );
}
