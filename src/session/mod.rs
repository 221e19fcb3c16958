//! The apply session, the stage around `rollout`: what keeps `deploy apply` safe to interrupt
//! and to run twice: signal handling, the site's locks, the run journal, and carrying on after
//! an interrupted run. The engine knows none of this: it is told to stop through a [`Cancel`]
//! handle and emits events, which the journal ([`Journaled`]) records. The session prints
//! nothing itself: what the operator should hear goes to the [`Say`] it is given.
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
//!   [`Journaled`]).
//! - **Carrying on**: an `apply` that finds an unfinished run says so, stops whatever hook that
//!   run left running on its hosts, and then plans from the hosts' state files as always.

mod journaled;
mod locking;
mod reading;
mod shared;
mod unread;

pub use journaled::{Journaled, RunContext};
pub use reading::Planner;
use shared::Shared;

use crate::plan::Plan;
use crate::rollout::{Cancel, Level, Sink, Summary};
use crate::site::Site;
use crate::state::journal::{self, Journal, RunRecord, CONTROLLER_DIR};
use crate::state::lock::{FileLock, FleetLock, Holder, Lock, LockError};
use crate::state::Observed;
use crate::transport::{AnyTransport, Kept};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
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

/// The async runtime of a command: at least four worker threads, whatever the cores: the run
/// journal's sync blocks the worker that emits an event for a few milliseconds, and on a
/// 2-core controller that would leave nothing to start the next steps. Each worker has an 8 MiB
/// stack (tokio's default is 2): a step's future nests the link's, and an unoptimised build
/// copies such futures up the stack as it polls them.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.max(4))
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
}

/// The process's interrupt handle, once `apply` has taken signals over.
static INTERRUPTS: OnceLock<Cancel> = OnceLock::new();

/// The locks this `apply` holds.
struct Held {
    holder: Holder,
    file: Option<FileLock>,
    fleet: Option<Arc<FleetLock<Kept<AnyTransport>>>>,
}

/// The transport of one `apply`: its links outlive each stage (lock, observation, rollout).
pub type RunTransport = Arc<Kept<AnyTransport>>;

/// One `deploy apply`: its signals, locks, journal and the run it carries on.
pub struct Session {
    runtime: tokio::runtime::Runtime,
    pub cancel: Cancel,
    pub run_id: String,
    root: PathBuf,
    break_lock: bool,
    max_connections: usize,
    read_hosts: bool,
    stream: bool,
    /// Hosts left unread until their first step (see [`Options::stream`]).
    unread: std::sync::atomic::AtomicUsize,
    /// Hosts were left unread for the run to read as it goes, planning each service once its
    /// hosts are read ([`Session::plan_as_read`]), rather than at their steps.
    plans_as_read: std::sync::atomic::AtomicBool,
    /// What reads them ([`Session::plan_as_read`]); waited for before the locks go back.
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When streaming: the hosts whose services stand alone (`plan::deferrable`).
    alone: Mutex<std::collections::HashSet<String>>,
    held: Mutex<Held>,
    /// The shared store, when the platform names one (its lease lock taken).
    shared: OnceLock<Arc<Shared>>,
    /// Per host: what the store says it runs, for hosts not read (`None`: read it).
    known: Mutex<Vec<Option<Observed>>>,
    /// The run's writes to the store were waited for (once, by `finish` or on drop).
    shared_done: std::sync::atomic::AtomicBool,
    /// The unfinished run found when the locks were taken.
    resumed: Mutex<Option<RunRecord>>,
    journal: Mutex<Option<Arc<Journaled>>>,
    site: Mutex<String>,
    /// Closed once the locks are given back.
    transport: OnceLock<RunTransport>,
    say: Say,
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
        let holder = Holder::me("", "");
        Ok(Session {
            runtime,
            cancel,
            run_id: format!(
                "{}-{}",
                humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                    .to_string()
                    .replace(':', ""),
                std::process::id()
            ),
            root: PathBuf::from(CONTROLLER_DIR),
            break_lock: options.break_lock,
            max_connections: options.max_connections,
            read_hosts: options.read_hosts,
            stream: options.stream,
            unread: std::sync::atomic::AtomicUsize::new(0),
            plans_as_read: std::sync::atomic::AtomicBool::new(false),
            reader: Mutex::new(None),
            alone: Mutex::default(),
            shared: OnceLock::new(),
            known: Mutex::new(Vec::new()),
            shared_done: std::sync::atomic::AtomicBool::new(false),
            held: Mutex::new(Held {
                holder,
                file: None,
                fleet: None,
            }),
            resumed: Mutex::new(None),
            journal: Mutex::new(None),
            site: Mutex::new(String::new()),
            transport: OnceLock::new(),
            say,
        })
    }

    /// Says `text` to the operator.
    pub fn say(&self, text: &str) {
        (self.say)(text)
    }

    /// A signal came: stop.
    pub fn stopping(&self) -> bool {
        self.cancel.stopping()
    }

    /// `Some(Interrupted)` if a signal came before the rollout started (nothing was changed).
    pub fn interrupted(&self) -> Option<Ended> {
        self.stopping().then(|| {
            if self.shared.get().and_then(|s| s.lost()).is_some() {
                self.say("stopped before anything was changed");
                return Ended::LockLost;
            }
            self.say("interrupted before anything was changed");
            Ended::Interrupted
        })
    }

    /// For a saved plan that drifted: a line saying when the drift is this plan's own,
    /// half-done by an interrupted run.
    pub fn own_drift(&self, plan: &Plan) -> Option<String> {
        let resumed = self.resumed.lock().unwrap_or_else(|p| p.into_inner());
        let rec = resumed.as_ref()?;
        (rec.plan_digest.as_deref() == Some(&plan_digest(plan))).then(|| {
            format!(
                "run {} carried out part of this plan and was interrupted; to finish it, apply \
                 the site ({}): its plan starts from where the hosts are now",
                rec.run, plan.site_file
            )
        })
    }

    /// Nothing to change: an unfinished run has nothing left either (when every host answered).
    pub fn nothing_to_do(&self, every_host_answered: bool) {
        let resumed = self
            .resumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let (Some(rec), true) = (resumed, every_host_answered) {
            let site = self.site.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if journal::clear_unfinished(&self.root, &site).is_ok() {
                self.say(&format!(
                    "run {} has nothing left to do: it is finished",
                    rec.run
                ));
            }
        }
    }

    /// Wraps `sink` with the run's journal, and records the run as the site's unfinished one
    /// until it ends.
    pub fn journaled(
        &self,
        sink: Arc<dyn Sink>,
        site: &Site,
        plan: &Plan,
        log_dir: &Path,
    ) -> Result<Arc<dyn Sink>, SessionError> {
        let write = |source| SessionError::Write {
            path: log_dir.join(journal::JOURNAL_FILE),
            source,
        };
        let journal = Journal::create(log_dir).map_err(write)?;
        journal::set_unfinished(&self.root, &site.name, &self.run_id, journal.path())
            .map_err(write)?;
        let resumes = self
            .resumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| r.run.clone());
        let holder = self.held().holder.clone();
        let journaled = Arc::new(Journaled::new(
            journal,
            sink,
            self.cancel.clone(),
            RunContext {
                site_file: plan.site_file.clone(),
                site_digest: plan.site_digest.clone(),
                plan_digest: plan_digest(plan),
                holder,
                resumes,
            },
        ));
        *self.journal.lock().unwrap_or_else(|p| p.into_inner()) = Some(journaled.clone());
        Ok(match self.shared.get() {
            Some(shared) => shared.publishing(journaled, plan),
            None => journaled,
        })
    }

    /// After the rollout: `Some` when it was interrupted or its journal failed; otherwise the
    /// run is finished and no longer the site's unfinished one.
    pub fn finish(&self, summary: &Summary) -> Option<Ended> {
        self.reader_done();
        if let Some(fleet) = &self.held().fleet {
            fleet.released(&summary.released);
        }
        let journaled = self
            .journal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(ended) = self.finish_shared() {
            return Some(ended);
        }
        if let Some(error) = journaled.as_ref().and_then(|j| j.error()) {
            self.say(&format!("error: {error}; the run stopped starting steps"));
            return Some(Ended::JournalFailed);
        }
        let site = self.site.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if self.cancel.level() == Level::Running {
            if let Err(e) = journal::clear_unfinished(&self.root, &site) {
                self.say(&format!("warning: cannot mark the run finished: {e}"));
            }
            return None;
        }
        let journal = journaled.map(|j| j.path().display().to_string());
        self.say(&format!(
            "interrupted: {} ok, {} failed, {} not started; journal {}. Run `deploy apply` \
             again to carry on; `deploy status` shows where it stopped.",
            summary.succeeded,
            summary.failed,
            summary.not_started,
            journal.unwrap_or_default()
        ));
        Some(Ended::Interrupted)
    }

    /// Runs `work` on the session's runtime.
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.runtime.block_on(work)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Session {
    /// Gives the locks back: the hosts' first, then the controller's.
    fn drop(&mut self) {
        self.reader_done();
        let held = std::mem::replace(
            &mut *self.held(),
            Held {
                holder: Holder::me("", ""),
                file: None,
                fleet: None,
            },
        );
        if let Some(fleet) = held.fleet {
            if let Err(LockError::Failed { reason, .. } | LockError::Held { place: reason, .. }) =
                self.runtime.block_on(fleet.release(&held.holder))
            {
                self.say(&format!(
                    "warning: the site's lock is left behind: {reason}; the next `deploy apply` \
                     from this machine takes it over"
                ));
            }
        }
        if let Some(shared) = self.shared.get() {
            // What was queued for the store (a run with nothing to do publishes what it read).
            self.finish_shared();
            if let Err(LockError::Failed { reason, .. } | LockError::Held { place: reason, .. }) =
                self.runtime.block_on(shared.release(&held.holder))
            {
                self.say(&format!(
                    "warning: the site's lock in etcd was not given back, its lease frees it \
                     within the platform's lock-ttl; {reason}"
                ));
            }
        }
        if let Some(transport) = self.transport.get() {
            self.runtime.block_on(transport.close_all());
        }
        if let Some(file) = held.file {
            if let Err(e) = self.runtime.block_on(file.release(&held.holder)) {
                self.say(&format!("warning: {e}"));
            }
        }
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
