//! The locks on the controller and on the hosts, with real files and the local transport's
//! /bin/sh.
use super::host_scripts::{after_taken, release_script, TAKEN};
use super::*;
use crate::transport::Local;
use crate::transport::{Link, Output, Target, Transport};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

mod in_flight;
mod release;

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Loopback targets of these names, in this order.
fn targets<S: AsRef<str>>(names: &[S]) -> Vec<Target> {
    names
        .iter()
        .map(|n| Target {
            name: n.as_ref().to_string(),
            address: "127.0.0.1".into(),
        })
        .collect()
}

fn dead_here(run: &str) -> Holder {
    // A pid that does not run: past the kernel's limit.
    Holder {
        pid: 4_194_304 + 7,
        pid_start: Some(1),
        ..Holder::me("shop", run)
    }
}

#[test]
fn this_process_is_alive_and_a_gone_one_is_dead() {
    assert_eq!(Holder::me("s", "r").liveness(), Liveness::Alive);
    assert_eq!(dead_here("old").liveness(), Liveness::Dead);
    let elsewhere = Holder {
        controller: "laptop-2".into(),
        ..dead_here("old")
    };
    assert_eq!(elsewhere.liveness(), Liveness::Unknown);
}

#[test]
fn a_holder_of_the_same_name_is_judged_only_when_known_to_be_of_this_machine() {
    let here = Holder::me("s", "r");
    // Another boot: of another machine that shares this one's name, or of this one (rebooted).
    let other_boot = |machine: &str| Holder {
        boot: "0f5c2d6e-9a41-4d0b-8a53-3c1e7b2f9d10".into(),
        machine: machine.into(),
        ..dead_here("old")
    };
    assert_eq!(other_boot("").liveness(), Liveness::Unknown);
    assert_eq!(
        other_boot("0123456789abcdef0123456789abcdef").liveness(),
        Liveness::Unknown,
        "another machine with the same host name: its pid means nothing here"
    );
    // With no boot id (not Linux), nothing can be told.
    let no_boot = Holder {
        boot: String::new(),
        ..dead_here("old")
    };
    assert_eq!(no_boot.liveness(), Liveness::Unknown);
    // Linux keeps a boot id: this very process, the same boot, a pid that is gone.
    if !here.boot.is_empty() {
        assert_eq!(here.liveness(), Liveness::Alive);
        assert_eq!(dead_here("old").liveness(), Liveness::Dead);
    }
    // This machine, another boot: gone.
    if !here.machine.is_empty() && !here.boot.is_empty() {
        assert_eq!(other_boot(&here.machine).liveness(), Liveness::Dead);
    }
}

#[test]
fn file_lock_refuses_then_takes_over_a_dead_holder_and_breaks_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(".drover");
    let a = Holder::me("shop", "run-a");
    let lock = FileLock::new(&root, "shop");
    assert_eq!(block_on(lock.acquire(&a, false)), Ok(Taken::default()));
    let b = Holder {
        run: "run-b".into(),
        ..Holder::me("shop", "run-b")
    };
    let refused = block_on(lock.acquire(&b, false)).unwrap_err();
    assert_eq!(
        refused,
        LockError::Held {
            place: lock.path.display().to_string(),
            holder: Some(Box::new(a.clone()))
        }
    );
    assert!(refused.to_string().contains("(pid "));
    // Broken on request: says whose it was.
    let taken = block_on(lock.acquire(&b, true)).unwrap();
    assert_eq!(taken.broken.len(), 1);
    assert_eq!(taken.broken[0].holder.as_ref(), Some(&a));
    assert!(!taken.broken[0].stale);
    // Releasing someone else's lock does nothing; one's own removes it.
    block_on(lock.release(&a)).unwrap();
    assert_eq!(read_file_lock(&lock), Some(b.clone()));
    block_on(lock.release(&b)).unwrap();
    assert_eq!(read_file_lock(&lock), None);
    // A dead holder of this machine: taken over without asking.
    let dead = dead_here("run-dead");
    std::fs::write(&lock.path, dead.json()).unwrap();
    let taken = block_on(lock.acquire(&a, false)).unwrap();
    assert_eq!(taken.broken[0].holder.as_ref(), Some(&dead));
    assert!(taken.broken[0].stale);
    assert_eq!(read_file_lock(&lock), Some(a));
}

#[test]
fn release_removes_only_its_own_lock_and_always_its_hook_files() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("st ate");
    let lock = state.join("lock");
    let hooks = state.join("hooks");
    let files = [
        "42-7.pid",
        "42-7.stop",
        "42-7.3.stop",
        "42-8.pid",
        "43-7.pid",
    ];
    let run = |me: &Holder| {
        std::fs::create_dir_all(&hooks).unwrap();
        for f in files {
            std::fs::write(hooks.join(f), "").unwrap();
        }
        let script = release_script(
            &state.display().to_string(),
            &lock.display().to_string(),
            me,
        );
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success());
    };
    let left = || -> Vec<&str> {
        files
            .into_iter()
            .filter(|f| hooks.join(f).exists())
            .collect()
    };
    let mine = Holder {
        user: "a b".into(),
        run: "$(touch pwned)'".into(),
        pid: 42,
        hooks: "42-7".into(),
        ..Holder::me("s", "r")
    };
    std::fs::create_dir_all(&lock).unwrap();
    std::fs::write(lock.join("holder.json"), "{\"someone\":\"else\"}\n").unwrap();
    run(&mine);
    assert!(lock.join("holder.json").exists(), "another's lock stays");
    // Its own files go; another run's stay, one of the same pid (another machine's) too.
    assert_eq!(left(), ["42-8.pid", "43-7.pid"]);
    std::fs::write(lock.join("holder.json"), format!("{}\n", mine.json())).unwrap();
    run(&mine);
    assert!(!lock.exists(), "its own lock goes");
    assert!(!dir.path().join("pwned").exists());
    // No lock at all: nothing to release, and no error.
    run(&mine);
    // A lock of an older deploy names no tag: its files are known by its pid; a tag that is
    // not digits and dashes is not put in the shell's text.
    for hooks in ["", "42-7; touch pwned", "*"] {
        run(&Holder {
            hooks: hooks.into(),
            ..mine.clone()
        });
        assert_eq!(left(), ["43-7.pid"], "{hooks:?}");
        assert!(!dir.path().join("pwned").exists());
    }
}

#[test]
fn fleet_lock_takes_every_host_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h3", "h1", "h2"]);
    let fleet = |_: ()| FleetLock::new(transport.clone(), hosts.clone(), "var/lib/drover", 8);
    let holder_file = |h: &str| dir.path().join(h).join("var/lib/drover/lock/holder.json");
    let a = Holder::me("shop", "run-a");
    let lock_a = fleet(());
    block_on(lock_a.acquire(&a, false)).unwrap();
    for h in ["h1", "h2", "h3"] {
        assert_eq!(
            std::fs::read_to_string(holder_file(h)).unwrap().trim(),
            a.json()
        );
        // The hooks' directory is made with the lock, private (the first hook's `mkdir`).
        let hooks = dir.path().join(h).join("var/lib/drover/hooks");
        let mode = std::fs::metadata(&hooks).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o700), "{h}");
    }
    // Another laptop: refused, naming the holder, and nothing of it is left behind.
    let b = Holder {
        controller: "laptop-2".into(),
        ..Holder::me("shop", "run-b")
    };
    let lock_b = fleet(());
    let err = block_on(lock_b.acquire(&b, false)).unwrap_err();
    assert_eq!(
        err,
        LockError::Held {
            place: "host h1".into(),
            holder: Some(Box::new(a.clone()))
        }
    );
    // A half-taken fleet (h2 held by a third party) is given back whole.
    block_on(lock_a.release(&a)).unwrap();
    assert!(!holder_file("h1").exists());
    let c = Holder {
        controller: "laptop-3".into(),
        ..Holder::me("shop", "run-c")
    };
    std::fs::create_dir_all(holder_file("h2").parent().unwrap()).unwrap();
    std::fs::write(holder_file("h2"), c.json() + "\n").unwrap();
    let err = block_on(lock_b.acquire(&b, false)).unwrap_err();
    assert_eq!(
        err,
        LockError::Held {
            place: "host h2".into(),
            holder: Some(Box::new(c.clone()))
        }
    );
    assert!(!holder_file("h1").exists() && !holder_file("h3").exists());
    // --break-lock: broken on h2 only, and it says whose.
    let taken = block_on(lock_b.acquire(&b, true)).unwrap();
    assert_eq!(taken.broken.len(), 1);
    assert_eq!(taken.broken[0].place, "host h2");
    assert_eq!(taken.broken[0].holder.as_ref(), Some(&c));
    for h in ["h1", "h2", "h3"] {
        assert_eq!(
            std::fs::read_to_string(holder_file(h)).unwrap().trim(),
            b.json()
        );
    }
    block_on(lock_b.release(&b)).unwrap();
    for h in ["h1", "h2", "h3"] {
        assert!(!holder_file(h).exists(), "{h}");
    }
    // A dead process of this machine: taken over without asking.
    let dead = dead_here("run-dead");
    std::fs::create_dir_all(holder_file("h3").parent().unwrap()).unwrap();
    std::fs::write(holder_file("h3"), dead.json() + "\n").unwrap();
    let taken = block_on(lock_a.acquire(&a, false)).unwrap();
    assert_eq!(taken.broken.len(), 1);
    assert!(taken.broken[0].stale);
    block_on(lock_a.release(&a)).unwrap();
}

#[test]
fn a_taken_lock_is_told_after_whatever_a_login_shell_printed_first() {
    let out = format!("Welcome to host\n{TAKEN}{{\"schema\":1}}\n");
    assert_eq!(after_taken(out.as_bytes()), Some(&b"{\"schema\":1}\n"[..]));
    assert_eq!(after_taken(TAKEN.as_bytes()), Some(&b""[..]));
    // Only a whole line counts, and a holder printed on refusal has none.
    let inside = format!("x{TAKEN}");
    assert_eq!(after_taken(inside.as_bytes()), None);
    assert_eq!(after_taken(b"{\"user\":\"a\"}\n"), None);
}

#[test]
fn the_lock_command_also_reads_once_taken_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1", "h2"]);
    let state = |h: &str| dir.path().join(h).join("var/lib/drover");
    std::fs::create_dir_all(state("h2")).unwrap();
    std::fs::write(state("h2").join("state.json"), "{\"on\":\"h2\"}\n").unwrap();
    let read = crate::state::read_script("var/lib/drover");
    let fleet = |_: ()| {
        FleetLock::new(transport.clone(), hosts.clone(), "var/lib/drover", 8).reading(read.clone())
    };
    let a = Holder::me("shop", "run-a");
    let lock_a = fleet(());
    block_on(lock_a.acquire(&a, false)).unwrap();
    let reads = lock_a.take_reads();
    assert_eq!(reads["h1"].code, Some(crate::state::record::NO_STATE));
    assert_eq!(reads["h2"].code, Some(0));
    assert_eq!(reads["h2"].stdout, b"{\"on\":\"h2\"}\n");
    assert!(state("h1").join("lock/holder.json").exists());
    // Held by another: refused, and nothing read.
    let b = Holder {
        controller: "laptop-2".into(),
        ..Holder::me("shop", "run-b")
    };
    let lock_b = fleet(());
    assert!(block_on(lock_b.acquire(&b, false)).is_err());
    assert!(lock_b.take_reads().is_empty());
    // Given back by a host's last command, in a hook's wrapper shell: the lock and the
    // run's pid file go, and the wrapper's exit trap does not bring the pid file back.
    let pid = state("h1").join(format!("hooks/{}.pid", a.hooks));
    std::fs::create_dir_all(pid.parent().unwrap()).unwrap();
    std::fs::write(&pid, "").unwrap();
    let script = format!(
        "trap ': >{}' EXIT; true && {{ trap - EXIT; {}; }}",
        pid.display(),
        lock_a.release_text(&a)
    );
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir.path().join("h1"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!state("h1").join("lock").exists());
    assert!(!pid.exists());
    lock_a.released(&["h1".to_string()]);
    assert_eq!(lock_a.lock_taken().len(), 1, "only h2 is left to release");
    block_on(lock_a.release(&a)).unwrap();
    assert!(!state("h2").join("lock").exists());
}

#[test]
fn a_host_refuses_a_lower_fencing_token_and_keeps_the_highest() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let fence = dir.path().join("h1/var/lib/drover/fence");
    let lock = |token: i64| {
        FleetLock::new(transport.clone(), hosts.clone(), "var/lib/drover", 8).fenced(Some(token))
    };
    let a = Holder::me("shop", "run-a");
    let first = lock(40);
    block_on(first.acquire(&a, false)).unwrap();
    assert_eq!(std::fs::read_to_string(&fence).unwrap(), "40\n");
    block_on(first.release(&a)).unwrap();
    // A later run (token 52) took the site; a run still holding 40 is refused.
    let b = Holder::me("shop", "run-b");
    let later = lock(52);
    block_on(later.acquire(&b, false)).unwrap();
    block_on(later.release(&b)).unwrap();
    match block_on(lock(40).acquire(&a, false)) {
        Err(LockError::Failed { reason, .. }) => {
            assert!(
                reason.contains("fencing token 52, newer than this run's 40"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_to_string(&fence).unwrap(), "52\n");
    assert!(!dir.path().join("h1/var/lib/drover/lock").exists());
    // A damaged token is taken as none.
    std::fs::write(&fence, "x; rm -rf /\n").unwrap();
    block_on(lock(41).acquire(&a, false)).unwrap();
    assert_eq!(std::fs::read_to_string(&fence).unwrap(), "41\n");
}

/// Two runs lock one host at once, 200 times, with tokens growing from one round to the next
/// (the higher of each round started first or second at random): the host's fence is only
/// ever the token of the run that took its lock, and never goes back.
#[test]
fn fences_racing_on_one_host_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Local::new(dir.path().to_path_buf()));
    let hosts = targets(&["h1"]);
    let fence = dir.path().join("h1/var/lib/drover/fence");
    let lock = |token: i64| {
        FleetLock::new(transport.clone(), hosts.clone(), "var/lib/drover", 8).fenced(Some(token))
    };
    let (a, b) = (Holder::me("shop", "run-a"), Holder::me("shop", "run-b"));
    let mut last = 0;
    for round in 0..200i64 {
        let (low, high) = (10 + 2 * round, 11 + 2 * round);
        let (ta, tb) = if round % 3 == 1 {
            (high, low)
        } else {
            (low, high)
        };
        let (la, lb) = (lock(ta), lock(tb));
        let (ra, rb) =
            block_on(async { tokio::join!(la.acquire(&a, false), lb.acquire(&b, false)) });
        let won: Vec<i64> = [(ra.is_ok(), ta), (rb.is_ok(), tb)]
            .iter()
            .filter(|(ok, _)| *ok)
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: one run takes the lock");
        let now: i64 = std::fs::read_to_string(&fence)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            now, won[0],
            "round {round}: the fence is the lock holder's token"
        );
        assert!(
            now >= last,
            "round {round}: the fence went back from {last} to {now}"
        );
        last = now;
        if ra.is_ok() {
            block_on(la.release(&a)).unwrap();
        } else {
            block_on(lb.release(&b)).unwrap();
        }
        // Nothing left beside the fence: no temporary file of either.
        let left: Vec<_> = std::fs::read_dir(dir.path().join("h1/var/lib/drover"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("fence."))
            .collect();
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
}

/// Links of a [`Local`] transport, counted while open; commands on hosts not `fast` take
/// 50 ms more.
struct Open {
    inner: Local,
    now: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
    fast: Vec<String>,
}

struct OpenLink {
    inner: <Local as Transport>::Link,
    now: Arc<std::sync::atomic::AtomicUsize>,
    slow: bool,
}

impl Transport for Open {
    type Link = OpenLink;
    async fn connect(&self, target: &Target) -> Result<OpenLink, crate::transport::TransportError> {
        use std::sync::atomic::Ordering::SeqCst;
        let inner = self.inner.connect(target).await?;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        // Connecting takes a moment: the others run meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        Ok(OpenLink {
            inner,
            now: self.now.clone(),
            slow: !self.fast.contains(&target.name),
        })
    }
}

impl Link for OpenLink {
    async fn run(&self, script: &str) -> Result<Output, crate::transport::TransportError> {
        if self.slow {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.inner.run(script).await
    }
    async fn close(self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn links_kept_for_the_steps_and_those_in_use_never_exceed_the_cap() {
    use crate::transport::Kept;
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (now, peak) = (Arc::default(), Arc::default());
    // Three hosts kept under a cap of three, the first in name order (taken alone) among
    // them; their locks are quick to take, the others' slow: a kept host is done while
    // others still hold connections.
    let keep = ["h01", "h07", "h12"].map(String::from);
    let open = Open {
        inner: Local::new(dir.path().to_path_buf()),
        now: Arc::clone(&now),
        peak: Arc::clone(&peak),
        fast: keep.to_vec(),
    };
    let names: Vec<String> = (1..=12).map(|i| format!("h{i:02}")).collect();
    let hosts = targets(&names);
    let transport = Arc::new(Kept::new(open, hosts.len(), 3));
    transport.keep_for_steps(keep.clone());
    let fleet = FleetLock::new(transport.clone(), hosts, "var/lib/drover", 3).keeping(keep);
    let me = Holder::me("shop", "run-a");
    block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            fleet.acquire(&me, false),
        )
        .await
        .expect("no deadlock")
    })
    .expect("locked");
    assert!(peak.load(SeqCst) <= 3, "{} open at once", peak.load(SeqCst));
    assert_eq!((transport.parked(), now.load(SeqCst)), (3, 3));
    // Releasing every host, the kept links included, still stays under the cap.
    block_on(fleet.release(&me)).expect("released");
    assert!(peak.load(SeqCst) <= 3, "{} open at once", peak.load(SeqCst));
    assert_eq!(transport.parked(), 0, "used once, then closed");
    for n in &names {
        assert!(
            !dir.path().join(n).join("var/lib/drover/lock").exists(),
            "{n}"
        );
    }
}

#[test]
fn a_file_lock_appears_whole_and_leaves_nothing_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(".drover");
    let lock = FileLock::new(&root, "shop");
    let a = Holder::me("shop", "run-a");
    block_on(lock.acquire(&a, false)).unwrap();
    assert_eq!(read_file_lock(&lock), Some(a.clone()), "the holder, whole");
    // Refused: what it wrote for itself is gone.
    let b = Holder::me("shop", "run-b");
    assert!(block_on(lock.acquire(&b, false)).is_err());
    let beside = |want: usize| {
        let names: Vec<_> = std::fs::read_dir(lock.path.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), want, "{names:?}");
    };
    beside(1);
    block_on(lock.release(&a)).unwrap();
    beside(0);
    // A lock dir it cannot write to: refused with the reason, and no lock left behind.
    let locks = lock.path.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o500)).unwrap();
    let writable = std::fs::File::create(locks.join("probe")).is_ok();
    let refused = block_on(lock.acquire(&a, false));
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o700)).unwrap();
    if !writable {
        assert!(
            matches!(refused, Err(LockError::Failed { .. })),
            "{refused:?}"
        );
        beside(0);
    }
}

/// A [`Local`] transport whose first command on `host` runs, and then its answer is lost (the
/// connection dropped as it ended).
struct LosesAnswer {
    inner: Local,
    host: String,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

struct LosesAnswerLink {
    inner: <Local as Transport>::Link,
    lose: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Transport for LosesAnswer {
    type Link = LosesAnswerLink;
    async fn connect(
        &self,
        target: &Target,
    ) -> Result<LosesAnswerLink, crate::transport::TransportError> {
        Ok(LosesAnswerLink {
            inner: self.inner.connect(target).await?,
            lose: (target.name == self.host).then(|| self.lost.clone()),
        })
    }
}

impl Link for LosesAnswerLink {
    async fn run(&self, script: &str) -> Result<Output, crate::transport::TransportError> {
        let out = self.inner.run(script).await;
        let lose = self
            .lose
            .as_ref()
            .is_some_and(|l| !l.swap(true, std::sync::atomic::Ordering::SeqCst));
        if lose {
            return Err(crate::transport::TransportError::Command {
                host: "h2".into(),
                reason: "the connection was terminated".into(),
            });
        }
        out
    }
    async fn close(self) {}
}

#[test]
fn a_lock_whose_answer_was_lost_is_given_back_too() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(LosesAnswer {
        inner: Local::new(dir.path().to_path_buf()),
        host: "h2".into(),
        lost: Arc::default(),
    });
    let hosts = targets(&["h1", "h2", "h3"]);
    let fleet = FleetLock::new(transport, hosts, "var/lib/drover", 8);
    let me = Holder::me("shop", "run-a");
    let taken = block_on(fleet.acquire(&me, false)).unwrap();
    assert_eq!(taken.unreachable.len(), 1, "{taken:?}");
    let lock = |h: &str| dir.path().join(h).join("var/lib/drover/lock");
    // The command ran on h2: its lock is there, though the run never heard so.
    assert!(lock("h2").exists());
    block_on(fleet.release(&me)).expect("released, h2 quietly");
    for h in ["h1", "h2", "h3"] {
        assert!(!lock(h).exists(), "{h}: given back");
    }
}

/// A [`Local`] transport whose hosts' shells print a line before every command's own output
/// (a start-up file's `echo`).
struct Chatty(Local);

struct ChattyLink(<Local as Transport>::Link);

impl Transport for Chatty {
    type Link = ChattyLink;
    async fn connect(
        &self,
        target: &Target,
    ) -> Result<ChattyLink, crate::transport::TransportError> {
        Ok(ChattyLink(self.0.connect(target).await?))
    }
}

impl Link for ChattyLink {
    async fn run(&self, script: &str) -> Result<Output, crate::transport::TransportError> {
        let mut out = self.0.run(script).await?;
        let mut stdout = b"Welcome to h1!\n".to_vec();
        stdout.extend_from_slice(&out.stdout);
        out.stdout = stdout;
        Ok(out)
    }
    async fn close(self) {}
}

#[test]
fn a_stale_host_lock_is_taken_over_though_the_shell_prints_first() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(Chatty(Local::new(dir.path().to_path_buf())));
    let hosts = targets(&["h1"]);
    let lock = dir.path().join("h1/var/lib/drover/lock");
    std::fs::create_dir_all(&lock).unwrap();
    let dead = dead_here("old");
    std::fs::write(lock.join("holder.json"), format!("{}\n", dead.json())).unwrap();
    let fleet = FleetLock::new(transport, hosts, "var/lib/drover", 8);
    let me = Holder::me("shop", "run-a");
    let taken = block_on(fleet.acquire(&me, false)).expect("a dead holder is taken over");
    assert_eq!(taken.broken.len(), 1);
    assert_eq!(taken.broken[0].holder, Some(dead));
    assert_eq!(
        std::fs::read_to_string(lock.join("holder.json"))
            .unwrap()
            .trim(),
        me.json()
    );
}
