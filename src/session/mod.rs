//! The apply session, the stage around `rollout`: what keeps `deploy apply` safe to interrupt
//! and to run twice: signal handling, the site's locks, the run journal, and carrying on after
//! an interrupted run. The engine knows none of this: it is told to stop through a [`Cancel`]
//! handle and emits events, which the journal ([`JournalSink`]) records. The session prints
//! nothing itself: what the operator should hear goes to the [`Say`] it is given.
//!
//! Its phases are types, each owning what it holds, so that a call out of order does not
//! compile: [`Session::begin`] (signals) → [`Session::lock`] → [`Locked`] (the site's locks,
//! what each host runs) → [`Locked::journaled`] → [`Journaled`] (the run, its journal) →
//! [`Journaled::finish`]. Whichever phase is dropped gives the locks back.
//!
//! - **Signals**: from the start of `apply`, SIGINT, SIGTERM and SIGHUP no longer kill
//!   `deploy`. The first one stops the run from starting new steps (running ones finish,
//!   everything is recorded, exit 130); the second aborts the running steps (their hooks'
//!   process groups are killed on the hosts, the steps recorded as interrupted); a third exits
//!   at once. SIGHUP is the terminal going away (an SSH session to a jump host that drops):
//!   what `deploy` then prints is dropped (the CLI's `out!`), what it records is not.
//!   Started with SIGHUP ignored (`nohup`), it leaves SIGHUP ignored and carries on.
//! - **Locks**: `.drover/locks/<site>.lock` on the controller, then `<state-dir>/lock` on every
//!   host of the site ([`crate::state::lock`]), both taken before any host's state is read and
//!   released when `apply` ends, however it ends (but a third signal).
//! - **Journal**: `.drover/runs/<run>/journal.ndjson`, and `.drover/unfinished/<site>.json`
//!   naming it until the run ends uninterrupted ([`crate::state::journal`], written through
//!   [`JournalSink`]).
//! - **Carrying on**: an `apply` that finds an unfinished run says so, stops whatever hook that
//!   run left running on its hosts, and then plans from the hosts' state files as always.

mod held;
mod journal_sink;
mod journaled;
mod locked;
mod locking;
mod reading;
mod shared;
mod unread;

pub use journal_sink::{JournalSink, RunContext};
pub use journaled::Journaled;
pub use locked::Locked;
pub use reading::Planner;
use shared::Shared;

use crate::plan::Plan;
use crate::rollout::Cancel;
use crate::state::journal::{self, RunRecord, CONTROLLER_DIR};
use crate::state::store::Fingerprints;
use crate::transport::{AnyTransport, Kept};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The exit status of a process interrupted by a signal (a third signal exits with it at once).
pub const INTERRUPTED: u8 = 130;

/// Where the session's words for the operator go (warnings, what it carried on, why it stopped).
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// What an `apply` session is asked to do.
pub struct Options {
    /// `--break-lock`: take locks whatever holds them.
    pub break_lock: bool,
    pub max_connections: usize,
    /// `--read-hosts`: with a store, read every host anyway (not only those whose recorded
    /// state differs from the site).
    pub read_hosts: bool,
    /// Nothing is confirmed before the run (`--yes`, a site rather than a saved plan): over
    /// `--max-connections`, hosts that may be are left unread until their first step.
    pub stream: bool,
    /// Without a store of the session's own: what hosts run as known elsewhere (the pull
    /// agent: what the other hosts' agents published).
    pub elsewhere: Option<Elsewhere>,
    /// The controller's directory (journal, locks, run logs); `None`: `.drover` of the working
    /// directory. A pull agent names its own (`<state-dir>/.drover`): agents simulated in one
    /// process share one working directory.
    pub controller: Option<PathBuf>,
}

/// What each host runs as known elsewhere than on the host, for a driver that holds no store
/// lock of its own (the pull agent, which steps its own host only: the others are as their
/// agents published them): per host, `Some` for one that is then neither locked nor read,
/// `None` for one to lock and read as always.
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct Elsewhere(
    pub  Arc<
        dyn Fn(
                &crate::site::Site,
                &crate::inventory::Hosts,
                &dyn Fingerprints,
            ) -> Vec<Option<crate::state::Observed>>
            + Send
            + Sync,
    >,
);

impl std::fmt::Debug for Elsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Elsewhere(..)")
    }
}

/// Why the session cannot go on.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SessionError {
    #[error("refused: {reason}")]
    #[diagnostic(code(drover::session::refused), help("{help}"))]
    Refused { reason: String, help: String },
    #[error("cannot start the async runtime: {0}")]
    #[diagnostic(code(drover::session::runtime))]
    Runtime(std::io::Error),
    #[error("cannot write {path}: {source}")]
    #[diagnostic(code(drover::session::write))]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(crate::state::store::StoreError),
}

/// How a run ended when the caller must not go on as usual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A signal stopped it (exit 130).
    Interrupted,
    /// Its journal could not be written: it stopped starting steps.
    JournalFailed,
    /// The site's lock in the shared store was lost (etcd unreachable for longer than the
    /// lease): it stopped starting steps.
    LockLost,
}

/// The async runtime of a command: a worker thread per core. None of them syncs the run
/// journal (its writer is a thread of its own); one that waits for it, or for etcd to take a
/// step's intent, hands its other tasks to another thread meanwhile (`block_in_place`) and
/// joins the runtime's pool of blocking threads. That pool keeps its idle threads while the
/// runtime lasts: a transfer's `ssh` is told to end with the thread that started it
/// ([`crate::transport`]'s direct connections). Each thread has an 8 MiB stack (tokio's
/// default is 2): a step's future nests the link's, and an unoptimised build copies such
/// futures up the stack as it polls them.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_stack_size(8 << 20)
        .thread_keep_alive(Duration::MAX)
        .enable_all()
        .build()
}

/// The process's interrupt handle, once `apply` has taken signals over.
static INTERRUPTS: OnceLock<Cancel> = OnceLock::new();

/// The transport of one `apply`: its links outlive each stage (lock, observation, rollout).
pub type RunTransport = Arc<Kept<AnyTransport>>;

/// What every phase of a session keeps: its runtime, its signals, its run's id, what it was
/// asked, and where its words go.
struct Core {
    runtime: tokio::runtime::Runtime,
    cancel: Cancel,
    run_id: String,
    /// The controller's directory (`.drover`).
    root: PathBuf,
    options: Options,
    say: Say,
}

impl Core {
    fn say(&self, text: &str) {
        (self.say)(text)
    }
}

/// One `deploy apply`, begun: signals taken over, nothing locked yet ([`Session::lock`]).
pub struct Session {
    core: Core,
}

/// Whether this process was started with SIGHUP ignored (`nohup deploy apply …`): the
/// `SigIgn` mask of `/proc/self/status`, whose lowest bit is SIGHUP. Where there is no `/proc`
/// (macOS), `false`: a hangup then stops the run.
fn hangup_ignored() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & 1 == 1)
}

impl Session {
    /// Takes SIGINT, SIGTERM and SIGHUP over; nothing is locked yet.
    pub fn begin(options: Options, say: Say) -> Result<Session, SessionError> {
        let runtime = runtime().map_err(SessionError::Runtime)?;
        let cancel = INTERRUPTS.get_or_init(Cancel::new).clone();
        let signals = cancel.clone();
        // Registered before returning: from here on a signal does not kill the process.
        let (mut int, mut term, mut hup) = runtime
            .block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                // Under `nohup` a hangup stays ignored: the run goes on after the terminal.
                let hup = if hangup_ignored() {
                    None
                } else {
                    Some(signal(SignalKind::hangup())?)
                };
                Ok::<_, std::io::Error>((
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::terminate())?,
                    hup,
                ))
            })
            .map_err(SessionError::Runtime)?;
        let said = say.clone();
        runtime.spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                    Some(_) = async { hup.as_mut()?.recv().await } => "SIGHUP",
                };
                if signals.aborting() {
                    said(&format!(
                        "{name} a third time: exiting now, without recording anything more"
                    ));
                    std::process::exit(i32::from(INTERRUPTED));
                }
                signals.escalate(name);
            }
        });
        Ok(Session {
            core: Core {
                runtime,
                cancel,
                run_id: run_id(std::time::SystemTime::now(), next_run()),
                root: options
                    .controller
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(CONTROLLER_DIR)),
                options,
                say,
            },
        })
    }

    /// Says `text` to the operator.
    pub fn say(&self, text: &str) {
        self.core.say(text)
    }

    /// The run's id: `.drover/runs/<run>`.
    pub fn run_id(&self) -> &str {
        &self.core.run_id
    }
}

/// `deploy status`: the site's unfinished run, if any (or why it cannot be read).
pub fn unfinished(site: &str) -> Result<Option<RunRecord>, String> {
    journal::unfinished(Path::new(CONTROLLER_DIR), site)
}

/// `deploy status` and `deploy plan`: the run whose writes to the store did not all reach it,
/// when one did not (`.drover/unpublished/<site>`): until an apply reads every host again,
/// the store is stale. Its run id, or the mark's path when it cannot be read.
pub fn unpublished(site: &str) -> Option<String> {
    let mark = Path::new(CONTROLLER_DIR)
        .join(locking::UNPUBLISHED)
        .join(crate::state::lock::file_name(site));
    match std::fs::read_to_string(&mark) {
        Ok(run) if !run.trim().is_empty() => Some(format!("run {}", run.trim())),
        Ok(_) => Some(format!("a run ({})", mark.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => Some(format!("a run ({})", mark.display())),
    }
}

/// `deploy status`: the site's lock on this controller, if a run holds it.
pub fn site_lock(site: &str) -> Option<crate::state::SiteLock> {
    let lock = crate::state::lock::FileLock::new(Path::new(CONTROLLER_DIR), site);
    lock.path.exists().then(|| crate::state::SiteLock {
        path: lock.path.display().to_string(),
        holder: crate::state::lock::read_file_lock(&lock),
    })
}

/// The plan's digest, as the journal records it: sha256 of its JSON.
pub fn plan_digest(plan: &Plan) -> String {
    let json = serde_json::to_vec(plan).unwrap_or_default();
    Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How many sessions this process began before this one.
fn next_run() -> u64 {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A run's id (`.drover/runs/<run>`): its start to the second and this process's id, then,
/// for the process's second session and later, their number. A long-lived process (a pull
/// agent) begins a run per step, two of them sometimes within one second: each has a
/// directory, and a journal, of its own.
fn run_id(at: std::time::SystemTime, earlier: u64) -> String {
    let at = humantime::format_rfc3339_seconds(at)
        .to_string()
        .replace(':', "");
    match earlier {
        0 => format!("{at}-{}", std::process::id()),
        n => format!("{at}-{}-{}", std::process::id(), n + 1),
    }
}

/// A line from the terminal; empty if a signal comes first (the question then counts as
/// not answered: the caller ends its prompt's line).
pub fn read_answer() -> String {
    let Some(cancel) = INTERRUPTS.get() else {
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        return answer;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        let _ = tx.send(answer);
    });
    loop {
        if cancel.stopping() {
            return String::new();
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(answer) => return answer,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => return String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_runs_of_one_process_within_one_second_have_two_ids() {
        // A pull agent stepping twice within one second: the second run's directory was the
        // first's ("File exists" creating its journal), and the step failed.
        let at = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_765_000_000);
        let pid = std::process::id();
        let first = super::run_id(at, 0);
        let second = super::run_id(at, 1);
        assert_eq!(first, format!("2025-12-06T054640Z-{pid}"));
        assert_eq!(second, format!("2025-12-06T054640Z-{pid}-2"));
        assert!(first < second, "runs of one second sort in their order");
        for id in [&first, &second] {
            assert!(crate::history::RunId::parse(id).is_some(), "{id}");
        }
    }
}
