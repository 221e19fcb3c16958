//! Large files over a connection of their own (`direct-above`), on the sshd fleet: a content at
//! least that large costs its host one more login (counted in the host's sshd log) and arrives
//! whole; a smaller one goes through the host's master; `direct-above=#false` sends every file
//! through the master, and so does one that would take the run past `--max-connections`;
//! and when the connection of its own cannot be made, or is cut off
//! half-way, the content still arrives whole, over the master, and the host keeps nothing of
//! the attempt.

mod support;

use std::path::Path;
use std::process::Output;
use support::fleet::{Fleet, FleetHost};

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
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let text = text.replacen(
        "transport \"ssh\" ",
        &format!("transport \"ssh\" direct-above={direct} "),
        1,
    );
    std::fs::write(&platform, text).expect("platform");
    let mut big = mark.as_bytes().to_vec();
    big.resize(8 << 10, b'x');
    std::fs::write(fleet.dir.join("big.bin"), &big).expect("big");
    big
}

fn apply(fleet: &Fleet, path: Option<&Path>, extra: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_deploy"));
    command
        .args(["apply", "site.kdl", "--yes"])
        .args(extra)
        .current_dir(&fleet.dir);
    if let Some(dir) = path {
        let old = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{old}", dir.display()));
    }
    let out = command.output().expect("run deploy");
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
    let hosts: Vec<FleetHost> = (1..=3)
        .map(|i| FleetHost::new(&format!("h{i}"), "box"))
        .collect();
    let fleet = Fleet::start(&hosts);
    std::fs::write(fleet.dir.join("small.txt"), "small\n").expect("small");
    std::fs::write(
        fleet.dir.join("site.kdl"),
        r#"site "direct" { version "1.0"; platform "platform.kdl" }
class "box" { service "art" }
service "art" {
    file "small.txt" to="/opt/art/small.txt"
    file "big.bin" to="/opt/art/big.bin"
    reload "true"
}
"#,
    )
    .expect("site");

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
