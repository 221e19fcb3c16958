//! A run's guarded commands in flight as another run breaks its lock, with real `/bin/sh`
//! on the local transport: no write of the run whose lock was broken lands after the read of
//! the run that broke it, one that outlives its wait is ended, and one that cannot be ended
//! is said, its host left alone.

use super::*;
use crate::transport::quote;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// The state directory of each host, relative to its directory.
const STATE: &str = "var/lib/drover";

/// Two runs of this process, told apart by their tags (as two controllers would be).
fn runs() -> (Holder, Holder) {
    let a = Holder {
        hooks: "1111-1".into(),
        ..Holder::me("shop", "run-a")
    };
    let b = Holder {
        hooks: "2222-2".into(),
        ..Holder::me("shop", "run-b")
    };
    (a, b)
}

/// The lines of the host's `events` file.
fn events(host: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(host.join(STATE).join("events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `script` run by `/bin/sh` in `host`'s directory, in a process group of its own, as a link
/// runs it; not waited for.
fn spawn(host: &std::path::Path, script: &str) -> std::process::Child {
    std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .current_dir(host)
        .process_group(0)
        .spawn()
        .expect("sh")
}

/// Whether the process `pid` runs (not a zombie).
fn runs_now(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// Run A holds the host and sends a command that changes it (its guard, a moment's work, then
/// a line `write N` in the host's `events`), while run B breaks A's lock and reads the host in
/// the same command (a line `read N`), each after a delay of its own, 60 times. Whatever the
/// order, A's write is refused (its guard sees B's lock) or lands before B's read: never after.
/// Without the mark and B's wait for it, A's guard passes just before B breaks the lock and
/// its write lands after B's read.
#[test]
fn a_write_in_flight_never_lands_after_the_read_of_the_run_that_broke_its_lock() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let host = dir.path().join("h1");
    let (a, b) = runs();
    let (mut written, mut refused) = (0, 0);
    for round in 0..60u64 {
        let la = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8);
        block_on(la.acquire(&a, false)).expect("A locks the host");
        let write = format!(
            "{}sleep 0.05; echo 'write {round}' >>{STATE}/events",
            la.guard_text(&a)
        );
        let lb = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8)
            .reading(format!("echo 'read {round}' >>{STATE}/events"));
        // Delays that put B's break before A's guard, between it and A's write, and after.
        let wait_a = Duration::from_millis((round * 7) % 23);
        let wait_b = Duration::from_millis((round * 13) % 71);
        let (out, taken) = block_on(async {
            let link = transport.connect(&hosts[0]).await.unwrap();
            tokio::join!(
                async {
                    tokio::time::sleep(wait_a).await;
                    link.run(&write).await
                },
                async {
                    tokio::time::sleep(wait_b).await;
                    lb.acquire(&b, true).await
                }
            )
        });
        let taken = taken.expect("B breaks A's lock");
        assert_eq!(taken.broken.len(), 1, "round {round}");
        assert!(taken.not_ended.is_empty(), "round {round}");
        let out = out.expect("A's command ran");
        let lines = events(&host);
        let at = |what: &str| lines.iter().position(|l| *l == format!("{what} {round}"));
        match out.code {
            Some(0) => {
                written += 1;
                let (w, r) = (at("write"), at("read"));
                assert!(
                    w.is_some() && w < r,
                    "round {round}: A's write landed after B's read: {lines:?}"
                );
            }
            Some(GUARDED) => {
                refused += 1;
                assert_eq!(at("write"), None, "round {round}");
            }
            other => panic!("round {round}: {other:?} {out:?}"),
        }
        block_on(lb.release(&b)).expect("B gives the host back");
    }
    eprintln!("{written} written before the read, {refused} refused");
    assert!(
        written > 0,
        "no write of A passed its guard: the race was not run"
    );
    // B's release left nothing of its own, and B's lock took A's marks away (A's shells
    // ended).
    let left: Vec<String> = std::fs::read_dir(host.join(STATE).join("hooks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.len() <= 1, "{left:?}");
}

/// A's command still runs its work when B breaks A's lock: B waits for it a few seconds, then
/// ends its process group, and only then reads the host: A's line never lands. Without the
/// wait, B reads at once and A's line lands after it.
#[test]
fn a_command_in_flight_too_long_is_ended_before_the_host_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let host = dir.path().join("h1");
    let (a, b) = runs();
    let la = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8);
    block_on(la.acquire(&a, false)).expect("A locks the host");
    let mut command = spawn(
        &host,
        &format!("{}sleep 8; echo late >>{STATE}/events", la.guard_text(&a)),
    );
    // Its mark is there: it passed its guard.
    let marked = host
        .join(STATE)
        .join(format!("hooks/acting.1111-1.{}", command.id()));
    let t0 = Instant::now();
    while !marked.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "no mark");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let lb = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8)
        .reading(format!("echo read >>{STATE}/events"));
    let t0 = Instant::now();
    let taken = block_on(lb.acquire(&b, true)).expect("B breaks A's lock");
    let took = t0.elapsed();
    assert!(taken.not_ended.is_empty(), "{taken:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(7),
        "B read the host after {took:?}"
    );
    let status = command.wait().unwrap();
    assert!(status.code().is_none(), "A's command was ended: {status:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(events(&host), ["read"]);
    assert!(!marked.exists(), "its mark was taken away");
    block_on(lb.release(&b)).unwrap();
}

/// A transport whose commands run as `nobody` (uid 65534), on the local transport.
struct AsNobody(Local);

struct AsNobodyLink(<Local as Transport>::Link);

impl Transport for AsNobody {
    type Link = AsNobodyLink;
    async fn connect(
        &self,
        target: &Target,
    ) -> Result<AsNobodyLink, crate::transport::TransportError> {
        Ok(AsNobodyLink(self.0.connect(target).await?))
    }
}

impl Link for AsNobodyLink {
    async fn run(&self, script: &str) -> Result<Output, crate::transport::TransportError> {
        let script = format!(
            "exec setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sh -c {}",
            quote(script)
        );
        self.0.run(&script).await
    }
    async fn close(self) {
        self.0.close().await
    }
}

/// Whether this test runs as root (it can then run commands as another user).
fn root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Run B logs in as another user than run A (`nobody`, A root) and breaks A's lock while a
/// command of A's is in flight: B may not end it. B's lock says so (the host, A's run, the
/// command's process group), and A's command runs on. Without the report, B's lock looked
/// clean and B would read and change the host beside A's command.
#[test]
fn a_command_in_flight_that_cannot_be_ended_is_said_with_its_group() {
    if !root() {
        eprintln!("skipped: needs root, to run commands as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("h1");
    let state = host.join(STATE);
    std::fs::create_dir_all(state.join("hooks")).unwrap();
    let open = |p: &std::path::Path| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap()
    };
    for p in [dir.path(), &host, &host.join("var"), &host.join("var/lib")] {
        open(p);
    }
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let (a, b) = runs();
    let la = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8);
    block_on(la.acquire(&a, false)).expect("A locks the host");
    // Everything of A's on the host may be read and moved by B, as between two accounts
    // sharing a state directory; A's processes are A's own.
    for p in [
        state.clone(),
        state.join("hooks"),
        state.join("lock"),
        state.join("lock/holder.json"),
    ] {
        open(&p);
    }
    let mut command = spawn(
        &host,
        &format!("{}sleep 60; echo late >>{STATE}/events", la.guard_text(&a)),
    );
    let pid = command.id();
    let marked = state.join(format!("hooks/acting.1111-1.{pid}"));
    let t0 = Instant::now();
    while !marked.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "no mark");
        std::thread::sleep(Duration::from_millis(10));
    }
    let lb = FleetLock::new(
        Arc::new(AsNobody(Local::new(dir.path().to_path_buf()))),
        hosts.clone(),
        STATE,
        8,
    );
    let taken = block_on(lb.acquire(&b, true));
    let still = runs_now(pid);
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
    let _ = command.wait();
    let taken = taken.expect("B breaks A's lock");
    assert!(still, "A's command runs on");
    assert_eq!(
        taken.not_ended,
        [NotEnded {
            host: "h1".into(),
            groups: vec![pid.to_string()],
            run: Some("run-a".into()),
        }]
    );
    let warning = taken.not_ended[0].warning();
    assert!(
        warning.contains(&format!(
            "h1: process group {pid} of run run-a could not be ended"
        )) && warning.contains("left alone in this run")
            && warning.contains(&format!("kill -KILL -- -{pid}")),
        "{warning}"
    );
}

/// What ends a broken holder's hooks here: says it ended one group and could not end two.
fn ends_one_of_three(_state_dir: &str, _holder: &Holder) -> String {
    "echo 'drover: not ended: 4242 4243'; echo 1".into()
}

/// The hooks of a holder whose lock is taken over that could not be ended (what the hooks'
/// kill script prints) are said with the host, the holder's run and their groups, the hooks
/// it did end counted apart.
#[test]
fn hooks_of_a_broken_holder_that_could_not_be_ended_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let (a, b) = runs();
    let la = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8);
    block_on(la.acquire(&a, false)).expect("A locks the host");
    let lb = FleetLock::new(transport.clone(), hosts.clone(), STATE, 8)
        .reading(crate::state::read_script(STATE))
        .ending_hooks(ends_one_of_three);
    let taken = block_on(lb.acquire(&b, true)).expect("B breaks A's lock");
    assert_eq!(taken.broken.len(), 1);
    assert_eq!(taken.broken[0].hooks_ended, 1);
    assert_eq!(
        taken.not_ended,
        [NotEnded {
            host: "h1".into(),
            groups: vec!["4242".into(), "4243".into()],
            run: Some("run-a".into()),
        }]
    );
    assert!(lb.take_reads().contains_key("h1"), "the read still ran");
}

/// A command that cannot write its mark (here the hooks directory is a file; on a host, a full
/// or read-only file system) changes nothing and fails as a hook does: it is not taken for a
/// command fenced by another run, which would stop the whole run.
#[test]
fn a_command_that_cannot_mark_itself_in_flight_changes_nothing_and_is_not_fenced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    std::fs::write(state.join("hooks"), "").expect("a file where the hooks directory goes");
    let written = dir.path().join("written");
    let guard = guard_script(state.to_str().expect("utf-8"), "me", "1111-1", None);
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "{guard}echo x >{}",
            quote(written.to_str().expect("utf-8"))
        ))
        .output()
        .expect("sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(UNMARKED), "{stderr}");
    assert!(stderr.contains(UNMARKED_MARK), "{stderr}");
    assert!(!stderr.contains(GUARD_MARK), "{stderr}");
    assert!(!written.exists(), "the command went on");
}
