//! One `deploy apply` per site at a time.
//!
//! A lock is held by a [`Holder`]: who, on which controller, which process, since when, for
//! which run. Every place a lock can live implements [`Lock`]:
//!
//! - [`FileLock`], on the controller: `.drover/locks/<site>.lock`, created with `O_EXCL`,
//!   holding the holder as JSON. Cheap, and it says at once who holds it, but it only
//!   protects runs started from the same directory of the same machine.
//! - [`FleetLock`], on the hosts: a directory `<state-dir>/lock` on every host of the site,
//!   made with `mkdir` (atomic) over the transport, with `holder.json` inside. Two operators
//!   on two laptops meet there. The first host in name order is taken alone, before the
//!   others (then at most `max_connections` at once, the hosts whose links are kept last):
//!   every contender must pass it, so two runs never each take half of the fleet and both
//!   refuse.
//!
//! A shared store (etcd) would be a third implementation: a key with the same JSON, created
//! only if absent, bound to a lease whose keep-alive is the heartbeat.
//!
//! Stale locks: a lock whose holder is a process of this very machine (same host name, same
//! boot) that no longer runs, or whose pid now belongs to a process started later, is taken
//! over, and the caller is told whose it was. A lock held from another machine is never judged
//! by its age (a run may pause for a confirmation for hours): it is broken only when asked
//! (`deploy apply --break-lock`).

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use thiserror::Error;

mod fleet;
mod host_scripts;
mod in_flight;
pub use fleet::FleetLock;
pub use host_scripts::{
    guard_script, hooks_dir, GUARDED, GUARD_MARK, UNLOCKED_MARK, UNMARKED, UNMARKED_MARK,
};
pub use in_flight::{group_runs, NOT_ENDED};

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub user: String,
    /// The controller's host name.
    pub controller: String,
    /// The controller's boot id (Linux): a pid is only meaningful within one boot.
    #[serde(default)]
    pub boot: String,
    /// The controller's machine id (`/etc/machine-id`): two machines may share a host name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    pub pid: u32,
    /// When the process started, in clock ticks after boot (Linux): tells a reused pid apart.
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// What its hooks' pid and stop files on a host are named by ([`hooks_tag`]); empty in a
    /// lock written by an older `deploy`, whose files are known by its pid alone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hooks: String,
    /// RFC 3339, UTC.
    pub since: String,
    pub run: String,
    pub site: String,
}

/// Whether a holder still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Certainly gone: a process of this machine that no longer runs.
    Dead,
    /// Another machine's process: nothing can be told from here.
    Unknown,
}

impl Holder {
    /// This process, about to run `run` on `site`.
    pub fn me(site: &str, run: &str) -> Holder {
        let pid = std::process::id();
        Holder {
            user: user(),
            controller: host_name(),
            boot: boot_id(),
            machine: machine_id(),
            pid,
            pid_start: pid_start(pid),
            hooks: hooks_tag().to_string(),
            since: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            run: run.to_string(),
            site: site.to_string(),
        }
    }

    /// Only a holder known to be of this machine is judged: its boot id is this boot's (boot
    /// ids are random per boot), or its machine id is this machine's and it was another boot.
    /// A holder of the same host name is not enough: two machines may share one (`ubuntu`,
    /// `localhost`), and a pid means nothing on another machine. Where there is no boot id
    /// (not Linux), nothing is judged: such a lock is broken with `--break-lock`.
    pub fn liveness(&self) -> Liveness {
        if self.controller != host_name() {
            return Liveness::Unknown;
        }
        let (boot, machine) = (boot_id(), machine_id());
        if !boot.is_empty() && self.boot == boot {
            return match pid_start(self.pid) {
                None => Liveness::Dead,
                Some(start) if self.pid_start.is_some_and(|s| s != start) => Liveness::Dead,
                Some(_) => Liveness::Alive,
            };
        }
        let this_machine = !machine.is_empty() && self.machine == machine;
        if this_machine && !boot.is_empty() && !self.boot.is_empty() {
            // This machine, booted since: every process of that boot is gone.
            return Liveness::Dead;
        }
        Liveness::Unknown
    }

    /// `root on ctl1 (pid 4242, run 2026-…-4242) since 2026-11-22T03:15:51Z`
    pub fn describe(&self) -> String {
        format!(
            "{} on {} (pid {}, run {}) since {}",
            self.user, self.controller, self.pid, self.run, self.since
        )
    }

    /// The exact text written into a lock.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Shell glob patterns, under the hooks directory, of this holder's hook files: its pid
    /// file(s), and its stop files (the run's and its chains'). Safe to put in shell text
    /// unquoted: made of digits, `-`, `.` and `*` only (a tag read from a host that is
    /// anything else is not used: the pid is).
    pub fn hook_files(&self) -> HookFiles {
        let safe =
            !self.hooks.is_empty() && self.hooks.bytes().all(|b| b.is_ascii_digit() || b == b'-');
        match safe {
            true => HookFiles {
                pids: format!("{}.pid", self.hooks),
                stops: vec![
                    format!("{}.stop", self.hooks),
                    format!("{}.*.stop", self.hooks),
                ],
            },
            false => HookFiles {
                pids: format!("{}-*.pid", self.pid),
                stops: vec![format!("{}-*.stop", self.pid)],
            },
        }
    }
}

/// A holder's hook files on a host, as shell glob patterns under the hooks directory
/// ([`Holder::hook_files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookFiles {
    pub pids: String,
    pub stops: Vec<String>,
}

/// This process's name for its hooks' files on every host: `<pid>-<start>` (the start in
/// nanoseconds since the epoch, when first asked): `<tag>.pid` records the hook running, and
/// `<tag>.stop`, `<tag>.<n>.stop` keep hooks from starting (`rollout::processes`). Unique per
/// run whatever the machine, so that a run ends or cleans up no other run's hooks.
pub fn hooks_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let start = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{start}", std::process::id())
    })
}

/// A lock that was in the way and was removed: stale, or broken on request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// Where: the lock file, or `host NAME`.
    pub place: String,
    /// `None` when its holder could not be read.
    pub holder: Option<Holder>,
    /// Taken over because its holder is certainly gone (rather than broken on request).
    pub stale: bool,
    /// On a host: the hooks its holder still ran there, ended as the lock was taken.
    pub hooks_ended: usize,
}

/// What taking a lock did besides taking it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    pub broken: Vec<Broken>,
    /// Hosts that could not be reached, and so are not locked: `(host, reason)`.
    pub unreachable: Vec<(String, String)>,
    /// Hosts locked where processes of another run could not be ended: left alone.
    pub not_ended: Vec<NotEnded>,
}

/// Processes of another run that taking a host's lock could not end (still running after
/// `TERM` and `KILL`: another user's, or unkillable): its hooks, or commands it had in flight.
/// The host is locked, but the run leaves it alone, neither read nor changed: those processes
/// may still change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotEnded {
    pub host: String,
    /// Their process group ids on the host.
    pub groups: Vec<String>,
    /// The run whose lock was broken or taken over, if it was.
    pub run: Option<String>,
}

impl NotEnded {
    fn whose(&self) -> String {
        self.run
            .as_ref()
            .map_or("another run".into(), |r| format!("run {r}"))
    }

    /// Why the host is left alone, as its state says.
    pub fn reason(&self) -> String {
        format!(
            "processes of {} could not be ended there (process groups {})",
            self.whose(),
            self.groups.join(", ")
        )
    }

    /// The warning the operator is given.
    pub fn warning(&self) -> String {
        let first = self.groups.first().map_or("PGID", String::as_str);
        format!(
            "warning: {host}: process group{s} {groups} of {whose} could not be ended (still \
             running after TERM and KILL: another user's, or stuck in the kernel): {host} is \
             left alone in this run, neither read nor changed; end them on the host, as their \
             owner or root (`kill -KILL -- -{first}`), then run `deploy apply` again",
            host = self.host,
            s = if self.groups.len() == 1 { "" } else { "s" },
            groups = self.groups.join(", "),
            whose = self.whose(),
        )
    }
}

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LockError {
    /// Someone else holds it.
    #[error("{place} is locked by {}", holder.as_ref().map_or("a holder that cannot be read (a lock being taken, or a damaged one)".to_string(), |h| h.describe()))]
    Held {
        place: String,
        holder: Option<Box<Holder>>,
    },
    /// The lock could not be taken or read at all.
    #[error("cannot take the lock {place}: {reason}")]
    Failed { place: String, reason: String },
}

/// A place that holds a site's lock.
pub trait Lock {
    /// Takes the lock for `me`. A lock whose holder is certainly gone is taken over; with
    /// `force`, any lock is broken. Either way the result says whose it was.
    fn acquire(
        &self,
        me: &Holder,
        force: bool,
    ) -> impl Future<Output = Result<Taken, LockError>> + Send;
    /// Gives the lock back, if `me` still holds it.
    fn release(&self, me: &Holder) -> impl Future<Output = Result<(), LockError>> + Send;
}

// ---------------------------------------------------------------------------------------------
// On the controller

/// `.drover/locks/<site>.lock`.
pub struct FileLock {
    pub path: PathBuf,
}

impl FileLock {
    /// The lock of `site` under `root` (`.drover`).
    pub fn new(root: &Path, site: &str) -> FileLock {
        FileLock {
            path: root.join("locks").join(format!("{}.lock", file_name(site))),
        }
    }

    fn place(&self) -> String {
        self.path.display().to_string()
    }

    fn failed(&self, e: impl std::fmt::Display) -> LockError {
        LockError::Failed {
            place: self.place(),
            reason: e.to_string(),
        }
    }

    fn take(&self, me: &Holder, force: bool) -> Result<Taken, LockError> {
        if let Some(dir) = self.path.parent() {
            create_dirs(dir).map_err(|e| self.failed(e))?;
        }
        let mut taken = Taken::default();
        // The holder is written (and synced) beside the lock first, then linked into place: the
        // lock appears whole or not at all, and a full disk or a crash leaves no empty lock
        // that nobody could read, and so nobody would ever take over.
        // A name of this process's own (its pid and the time: two containers sharing the
        // directory may both be pid 1), made only if absent.
        let nanos = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let new = self
            .path
            .with_extension(format!("new.{}.{nanos}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&new)
            .and_then(|mut f| {
                f.write_all(me.json().as_bytes())?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&new);
            return Err(self.failed(e));
        }
        let placed = self.place_new(&new, me, force, &mut taken);
        let _ = std::fs::remove_file(&new);
        placed.map(|()| taken)
    }

    /// Links `new` (the holder, written) into the lock's place, taking over a stale holder
    /// (or any, with `force`) that is in the way. Where the file system has no hard links (a
    /// VM's shared folder, FAT), the lock is made in place instead, as before.
    fn place_new(
        &self,
        new: &Path,
        me: &Holder,
        force: bool,
        taken: &mut Taken,
    ) -> Result<(), LockError> {
        for _ in 0..5 {
            match std::fs::hard_link(new, &self.path) {
                Ok(()) => return sync_dir(self.path.parent()).map_err(|e| self.failed(e)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(_) => match self.create_in_place(me) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => return Err(e),
                },
            }
            let seen = match std::fs::read_to_string(&self.path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.failed(e)),
            };
            let holder: Option<Holder> = serde_json::from_str(&seen).ok();
            // Ours already (a link that took though its answer said otherwise, on NFS).
            if holder.as_ref() == Some(me) {
                return Ok(());
            }
            let stale = holder
                .as_ref()
                .is_some_and(|h| h.liveness() == Liveness::Dead);
            if !stale && !force {
                return Err(LockError::Held {
                    place: self.place(),
                    holder: holder.map(Box::new),
                });
            }
            // Set it aside, then make sure it is the lock judged above, not a new one.
            let aside = self
                .path
                .with_extension(format!("broken.{}", std::process::id()));
            match std::fs::rename(&self.path, &aside) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.failed(e)),
            }
            let moved = std::fs::read_to_string(&aside).unwrap_or_default();
            if moved != seen {
                // Someone took it meanwhile: give it back, and refuse.
                let _ = std::fs::hard_link(&aside, &self.path);
                let _ = std::fs::remove_file(&aside);
                return Err(LockError::Held {
                    place: self.place(),
                    holder: serde_json::from_str(&moved).ok().map(Box::new),
                });
            }
            let _ = std::fs::remove_file(&aside);
            taken.broken.push(Broken {
                place: self.place(),
                holder,
                stale,
                hooks_ended: 0,
            });
        }
        Err(self.failed("it keeps changing hands"))
    }

    /// The lock made in its place, only if absent (`O_EXCL`): `false` when it is there. A
    /// failed write removes what it made, so no empty lock is left.
    fn create_in_place(&self, me: &Holder) -> Result<bool, LockError> {
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(self.failed(e)),
        };
        let written = f
            .write_all(me.json().as_bytes())
            .and_then(|_| f.sync_all())
            .and_then(|_| sync_dir(self.path.parent()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&self.path);
            return Err(self.failed(e));
        }
        Ok(true)
    }
}

impl Lock for FileLock {
    async fn acquire(&self, me: &Holder, force: bool) -> Result<Taken, LockError> {
        self.take(me, force)
    }

    async fn release(&self, me: &Holder) -> Result<(), LockError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) if text == me.json() => {
                std::fs::remove_file(&self.path).map_err(|e| self.failed(e))?;
                sync_dir(self.path.parent()).map_err(|e| self.failed(e))
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.failed(e)),
        }
    }
}

/// The lock's holder, if the file holds one (for `deploy status`).
pub fn read_file_lock(lock: &FileLock) -> Option<Holder> {
    serde_json::from_str(&std::fs::read_to_string(&lock.path).ok()?).ok()
}

// ---------------------------------------------------------------------------------------------
// This machine and this process

/// A site's name as one safe file name.
pub fn file_name(site: &str) -> String {
    site.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| {
            std::process::Command::new("hostname")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The machine id systemd and D-Bus keep (`/etc/machine-id`); empty where there is none.
fn machine_id() -> String {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            std::process::Command::new("id")
                .arg("-un")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Field 22 of `/proc/PID/stat`: when the process started; `None` if there is no such process.
fn pid_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// `create_dir_all` (new directories `0700`), syncing the parent of every directory it creates.
pub fn create_dirs(dir: &Path) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(parent)?;
    }
    // The operator's alone, as the run logs beside them.
    let made =
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(dir);
    match made {
        Ok(()) => sync_dir(dir.parent()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// fsync of a directory, so that a file created or removed in it stays so.
pub fn sync_dir(dir: Option<&Path>) -> std::io::Result<()> {
    let dir = match dir {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
