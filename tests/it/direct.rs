//! Large files over a connection of their own (`direct-above`), on the sshd fleet: a content at
//! least that large costs its host one more login (counted in the host's sshd log) and arrives
//! whole; a smaller one goes through the host's master; `direct-above=#false` sends every file
//! through the master, and so does one that would take the run past `--max-connections`;
//! and when the connection of its own cannot be made, or is cut off
//! half-way, the content still arrives whole, over the master, and the host keeps nothing of
//! the attempt; a `deploy` killed outright leaves no such connection running.

use crate::support;

use std::path::Path;
use std::process::Output;
use support::fleet::{Fleet, FleetHost};
use support::process::dead;

/// Logins each host's sshd accepted since `seen`, which becomes the count so far.
fn logins_since(fleet: &Fleet, seen: &mut Vec<usize>) -> Vec<usize> {
    let now: Vec<usize> = fleet
        .names()
        .into_iter()
        .map(|h| {
            std::fs::read_to_string(fleet.host_root(h).join("sshd.log"))
                .expect("read sshd.log")
                .matches("Accepted publickey")
                .count()
        })
        .collect();
    let added = now.iter().zip(seen.iter()).map(|(a, b)| a - b).collect();
    *seen = now;
    added
}

/// Writes the platform with `direct` as the transport's `direct-above=`, and the big file's
/// content (8 KiB, its first bytes `mark`).
fn prepare(fleet: &Fleet, direct: &str, mark: &str) -> Vec<u8> {
    fleet.write_platform_with("/var/lib/drover", &format!("direct-above={direct}"));
    let mut big = mark.as_bytes().to_vec();
    big.resize(8 << 10, b'x');
    std::fs::write(fleet.dir.join("big.bin"), &big).expect("big");
    big
}

/// `deploy apply site.kdl --yes EXTRA…` in the fleet's directory, with `path` (a wrapper's
/// directory) first on its PATH.
fn apply_command(fleet: &Fleet, path: Option<&Path>, extra: &[&str]) -> std::process::Command {
    let mut command = support::cli::deploy_in(&fleet.dir);
    command.args(["apply", "site.kdl", "--yes"]).args(extra);
    if let Some(dir) = path {
        let old = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{old}", dir.display()));
    }
    command
}

fn apply(fleet: &Fleet, path: Option<&Path>, extra: &[&str]) -> Output {
    let out = apply_command(fleet, path, extra)
        .output()
        .expect("run deploy");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The step logs' lines (every run's, every host's) saying a content went over the master
/// instead of a connection of its own.
fn fell_back(fleet: &Fleet) -> Vec<String> {
    let mut lines = Vec::new();
    let runs = std::fs::read_dir(fleet.dir.join(".drover/runs")).expect("runs");
    for run in runs.flatten() {
        for h in fleet.names() {
            let log = std::fs::read_to_string(run.path().join(h).join("art.log"));
            lines.extend(
                log.unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("over the master"))
                    .map(|l| format!("{h}: {l}")),
            );
        }
    }
    lines.sort();
    lines
}

/// A fleet of `n` hosts `h1`… of class `box`, and a site whose service `art` delivers each of
/// `files` (beside the site) to `/opt/art/`.
fn fleet_with_site(n: usize, files: &[&str]) -> Fleet {
    let hosts: Vec<FleetHost> = (1..=n)
        .map(|i| FleetHost::new(&format!("h{i}"), "box"))
        .collect();
    let fleet = Fleet::start(&hosts);
    let mut site = String::from(
        "site \"direct\" { version \"1.0\"; platform \"platform.kdl\" }\nclass \"box\" { service \"art\" }\nservice \"art\" {\n",
    );
    for f in files {
        site.push_str(&format!("    file \"{f}\" to=\"/opt/art/{f}\"\n"));
    }
    site.push_str("    reload \"true\"\n}\n");
    std::fs::write(fleet.dir.join("site.kdl"), site).expect("site");
    fleet
}

/// What each host has at `path` (under its root).
fn contents(fleet: &Fleet, path: &str) -> Vec<Vec<u8>> {
    fleet
        .names()
        .into_iter()
        .map(|h| std::fs::read(fleet.host_root(h).join(path)).unwrap_or_default())
        .collect()
}

#[test]
fn a_large_file_has_a_connection_of_its_own_and_falls_back_to_the_master() {
    let fleet = fleet_with_site(3, &["small.txt", "big.bin"]);
    std::fs::write(fleet.dir.join("small.txt"), "small\n").expect("small");

    // The big file (8 KiB) over a connection of its own, the small one through the master.
    let big = prepare(&fleet, "\"4KiB\"", "first");
    apply(&fleet, None, &[]);
    assert_eq!(contents(&fleet, "opt/art/big.bin"), vec![big; 3]);
    assert_eq!(
        contents(&fleet, "opt/art/small.txt"),
        vec![b"small\n".to_vec(); 3]
    );
    let mut seen = vec![0; 3];
    assert_eq!(
        logins_since(&fleet, &mut seen),
        vec![2; 3],
        "one login for the master, one for the big file"
    );

    // Off: the next content goes through the master, one login per host.
    let big = prepare(&fleet, "#false", "second");
    apply(&fleet, None, &[]);
    assert_eq!(contents(&fleet, "opt/art/big.bin"), vec![big; 3]);
    assert_eq!(
        logins_since(&fleet, &mut seen),
        vec![1; 3],
        "`direct-above=#false`: the master only"
    );

    // On, but every connection the cap allows is a host's master (3 hosts, 3 connections):
    // the content goes through the masters, one login per host.
    let big = prepare(&fleet, "\"4KiB\"", "capped");
    apply(&fleet, None, &["--max-connections", "3"]);
    assert_eq!(contents(&fleet, "opt/art/big.bin"), vec![big; 3]);
    assert_eq!(
        logins_since(&fleet, &mut seen),
        vec![1; 3],
        "`--max-connections 3`: no room for a second connection"
    );
    // As the book says it goes: nothing for the step logs.
    assert_eq!(fell_back(&fleet), Vec::<String>::new());

    // On, but the connection of its own cannot be made (an `ssh` that refuses it, as a host
    // refusing a second login would): the content still arrives, over the master.
    let refusing = wrapper(
        &fleet,
        "refusing",
        "echo 'refused by the test' >&2; exit 255",
    );
    let big = prepare(&fleet, "\"4KiB\"", "third");
    apply(&fleet, Some(&refusing), &[]);
    assert_eq!(contents(&fleet, "opt/art/big.bin"), vec![big; 3]);
    assert_eq!(
        logins_since(&fleet, &mut seen),
        vec![1; 3],
        "refused: the master carried the content"
    );
    // Each host's step log says why, with ssh's last words.
    let said = fell_back(&fleet);
    assert_eq!(said.len(), 3, "{said:?}");
    for (line, h) in said.iter().zip(fleet.names()) {
        assert!(line.starts_with(&format!("{h}: ")), "{line}");
        assert!(
            line.contains("big.bin failed: refused by the test; sent over the master instead"),
            "{line}"
        );
    }

    // Lost half-way (the first 4 KiB went, then the connection died): sent again, whole, over
    // the master; the host keeps nothing of the cut-off attempt.
    let cut = wrapper(
        &fleet,
        "cut",
        &format!("head -c 4096 | {} \"$@\"; exit 255", real_ssh()),
    );
    let big = prepare(&fleet, "\"4KiB\"", "fourth");
    apply(&fleet, Some(&cut), &[]);
    assert_eq!(contents(&fleet, "opt/art/big.bin"), vec![big; 3]);
    assert_eq!(
        logins_since(&fleet, &mut seen),
        vec![2; 3],
        "the cut-off connection, then the master"
    );
    for h in fleet.names() {
        let left: Vec<String> = std::fs::read_dir(fleet.host_root(h).join("opt/art/.drover"))
            .expect(".drover")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".new"))
            .collect();
        assert!(left.is_empty(), "{h} keeps {left:?}");
    }
}

/// The `ssh` on this machine's PATH.
fn real_ssh() -> String {
    let out = std::process::Command::new("/bin/sh")
        .args(["-c", "command -v ssh"])
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A directory `name` holding an `ssh` that runs `body` when asked for a connection of its own
/// (`ControlPath=none`), else the real `ssh`: put first on `deploy`'s PATH.
fn wrapper(fleet: &Fleet, name: &str, body: &str) -> std::path::PathBuf {
    let bin = fleet.dir.join(name);
    std::fs::create_dir_all(&bin).expect("bin");
    let ssh = bin.join("ssh");
    std::fs::write(
        &ssh,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = ControlPath=none ] && {{ {body}; }}; done\nexec {} \"$@\"\n",
            real_ssh()
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

#[test]
fn a_connection_of_its_own_ends_with_a_deploy_killed_outright() {
    let fleet = fleet_with_site(2, &["big.bin"]);
    prepare(&fleet, "\"4KiB\"", "killed");
    // A transfer that takes its time: the connection of its own says who it is and waits
    // (exec: the same process, as a real transfer's ssh).
    let pids = fleet.dir.join("direct.pids");
    let slow = wrapper(
        &fleet,
        "slow",
        &format!("echo $$ >>{}; exec sleep 60", pids.display()),
    );
    let mut deploy = apply_command(&fleet, Some(&slow), &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run deploy");
    let started: Vec<u32> = wait_for(|| {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        let lines: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        // One host switches at a time (the default batch): its transfer.
        (!lines.is_empty()).then_some(lines)
    });
    assert!(started.iter().all(|p| !dead(*p)), "{started:?}");
    deploy.kill().expect("SIGKILL");
    let _ = deploy.wait();
    // The transfer ends with it (it would run on for its minute otherwise).
    wait_for(|| started.iter().all(|p| dead(*p)).then_some(()));
}

/// Polls `found` every 20 ms for at most 20 s.
fn wait_for<T>(mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(t) = found() {
            return t;
        }
        assert!(std::time::Instant::now() < deadline, "timed out");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
