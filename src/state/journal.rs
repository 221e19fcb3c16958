//! The run journal: what a `deploy apply` set out to do and what became of it, written on the
//! controller as it happens, so that an interrupted run can be told apart from a finished one,
//! shown (`deploy status`) and carried on (`deploy apply`).
//!
//! - One journal per run: `.drover/runs/<run-id>/journal.ndjson`, beside the run's step logs.
//!   One JSON object per line; each line but `hook-started` and `hook-finished` is written and
//!   the file synced (`fsync`) before the rollout goes on, and the directories it creates are
//!   synced too. A step's intent is on disk before its first command is sent; its result once
//!   its last state write is done. The hook lines (which hook a step is in) reach the disk
//!   with the next synced line: a run that dies may lose the last of them, never an intent
//!   or a result. One thread of its own writes and syncs the file ([`writer`]); whoever
//!   appends waits for its answer that the line is on disk.
//! - One pointer per site to the run that is not finished: `.drover/unfinished/<site>.json`
//!   (`{"run", "journal"}`), written (atomically) when a run starts and removed when one ends
//!   without being interrupted. A pointer left behind means the run was interrupted, or its
//!   process died; the journal it names says how far it got.
//!
//! Entries (`entry`): `run-started` (the plan's and the site's digests, who ran it, the run it
//! resumes), `step-intent`, `hook-started`, `hook-finished`, `step-result`, `step-blocked`,
//! `revert-intent`, `revert-result` (`on-failure "revert"`), `service-finished`, `interrupted`,
//! `run-finished`. Every line also has `time`.

use super::lock::{create_dirs, file_name, sync_dir, Holder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

mod payload;
mod writer;
pub use payload::{
    HookEnd, HookStart, Interruption, RevertEnd, RevertIntent, StepBlocked, StepEnd, StepIntent,
};
use writer::{Order, Writer};

/// Where `deploy` keeps its own files on the controller, relative to where it runs.
pub const CONTROLLER_DIR: &str = ".drover";

/// The journal's file name in its run's directory.
pub const JOURNAL_FILE: &str = "journal.ndjson";

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    #[serde(flatten)]
    pub entry: Entry,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "kebab-case")]
pub enum Entry {
    RunStarted {
        run: String,
        site: String,
        site_file: String,
        site_digest: String,
        /// sha256 of the plan as saved by `deploy plan --out`.
        plan_digest: String,
        steps: usize,
        hosts: usize,
        holder: Box<Holder>,
        /// The unfinished run this one carries on, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumes: Option<String>,
    },
    StepIntent(StepIntent),
    HookStarted(HookStart),
    HookFinished(HookEnd),
    StepResult(StepEnd),
    StepBlocked(StepBlocked),
    /// `on-failure "revert"`: a host is switched back; until its result, it is in flight.
    RevertIntent(RevertIntent),
    RevertResult(RevertEnd),
    /// A service planned during the run, once its hosts were read: its steps join the run's.
    ServicePlanned {
        service: String,
        steps: usize,
    },
    /// An unread step that ran nothing once its host was read (`skip`: `at-version` or
    /// `unreachable`).
    StepSkipped {
        service: String,
        host: String,
        skip: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    ServiceFinished {
        service: String,
        outcome: String,
        reason: Option<String>,
    },
    Interrupted(Interruption),
    RunFinished {
        converged: bool,
        interrupted: bool,
        succeeded: usize,
        failed: usize,
        not_started: usize,
    },
}

/// An open journal, appended to and synced line by line by its writer ([`writer`]), a thread
/// of its own: appends from many steps at once share their syncs (group commit), and each
/// `append` returns only once its line is on disk.
pub struct Journal {
    path: PathBuf,
    /// To the writer; `None` once the journal is dropped (the writer then ends).
    orders: Option<mpsc::Sender<Order>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Journal {
    /// For tests: the journal's file is swapped for one opened read-only, so that every write
    /// fails as on a full or failing disk.
    #[cfg(test)]
    pub(crate) fn refuse_writes(&self) {
        if let Ok(f) = std::fs::File::open(&self.path) {
            let _ = self.send(Order::Swap(f));
        }
    }

    /// For tests: writes go to the journal's file again (after [`Journal::refuse_writes`]).
    #[cfg(test)]
    pub(crate) fn accept_writes(&self) {
        if let Ok(f) = std::fs::OpenOptions::new().append(true).open(&self.path) {
            let _ = self.send(Order::Swap(f));
        }
    }
}

impl Journal {
    /// Creates `dir/journal.ndjson` (and `dir`), syncing every directory it creates, and
    /// starts its writer.
    pub fn create(dir: &Path) -> std::io::Result<Journal> {
        create_dirs(dir)?;
        let path = dir.join(JOURNAL_FILE);
        // The operator's alone, as the run's logs (`0600`).
        let file = std::os::unix::fs::OpenOptionsExt::mode(
            std::fs::OpenOptions::new().append(true).create_new(true),
            0o600,
        )
        .open(&path)?;
        sync_dir(Some(dir))?;
        let (orders, received) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || Writer::new(file).run(received))?;
        Ok(Journal {
            path,
            orders: Some(orders),
            writer: Some(writer),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, order: Order) -> std::io::Result<()> {
        self.orders
            .as_ref()
            .and_then(|o| o.send(order).ok())
            .ok_or_else(|| std::io::Error::other("the journal is closed"))
    }

    /// Queues one line that only informs (which hook runs): it is not waited for, and reaches
    /// the disk with the next line that is synced.
    pub fn note(&self, time: &str, entry: Entry) -> std::io::Result<()> {
        self.send(Order::Note(Self::text(time, entry)?))
    }

    fn text(time: &str, entry: Entry) -> std::io::Result<Vec<u8>> {
        let line = Line {
            time: time.to_string(),
            entry,
        };
        let mut text = serde_json::to_vec(&line).map_err(std::io::Error::other)?;
        text.push(b'\n');
        Ok(text)
    }

    /// Appends one line; returns once it (and every line queued before it) is synced to disk.
    pub fn append(&self, time: &str, entry: Entry) -> std::io::Result<()> {
        let (ack, synced) = mpsc::channel();
        self.send(Order::Append(Self::text(time, entry)?, ack))?;
        match synced.recv() {
            Ok(result) => result.map_err(std::io::Error::other),
            Err(_) => Err(std::io::Error::other("the journal is closed")),
        }
    }
}

impl Drop for Journal {
    /// The writer ends once it has written what was sent before (noted lines that no synced
    /// one followed are not written, as when the process dies).
    fn drop(&mut self) {
        self.orders = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// `.drover/unfinished/<site>.json`.
pub fn pointer_path(root: &Path, site: &str) -> PathBuf {
    root.join("unfinished")
        .join(format!("{}.json", file_name(site)))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Pointer {
    run: String,
    journal: String,
}

/// Records that `run`, journaled in `journal`, is the site's unfinished run (atomically).
pub fn set_unfinished(root: &Path, site: &str, run: &str, journal: &Path) -> std::io::Result<()> {
    let path = pointer_path(root, site);
    let dir = path.parent().unwrap_or(root);
    create_dirs(dir)?;
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string(&Pointer {
        run: run.into(),
        journal: journal.display().to_string(),
    })
    .map_err(std::io::Error::other)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    sync_dir(Some(dir))
}

/// The site has no unfinished run (any more).
pub fn clear_unfinished(root: &Path, site: &str) -> std::io::Result<()> {
    let path = pointer_path(root, site);
    match std::fs::remove_file(&path) {
        Ok(()) => sync_dir(path.parent()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// How an unfinished run stands, from its journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    pub run: String,
    /// The journal, relative to where `deploy` runs.
    pub journal: String,
    /// When it started, who ran it, what it resumed.
    pub started: Option<String>,
    pub holder: Option<Holder>,
    pub resumes: Option<String>,
    pub site_digest: Option<String>,
    pub plan_digest: Option<String>,
    /// `"interrupted"` (it stopped on a signal and recorded it), `"running"` (its process still
    /// runs), `"died"` (it stopped without recording an end: killed, or its machine went down).
    pub state: String,
    /// When it was interrupted, or the time of its last entry.
    pub last: Option<String>,
    /// Steps planned, done, failed (interrupted ones included), blocked.
    pub steps: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub blocked: usize,
    /// Steps of hosts read during the run that found nothing to do (`at-version`), and that
    /// left their host alone (`unreachable`: it did not answer, its state could not be read,
    /// or the run stopped before reading it).
    pub skipped: usize,
    pub unreachable: usize,
    /// Steps begun and never ended, in the order they began.
    pub in_flight: Vec<InFlight>,
    /// Lines that are not entries, but for a last line cut short (`line N: why`): the journal
    /// was damaged, and what this record says may miss what they said.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damaged: Vec<String>,
}

impl RunRecord {
    /// One line: which run, since when, how far, what was in flight.
    pub fn describe(&self) -> String {
        let who = self
            .holder
            .as_ref()
            .map(|h| format!(" by {} on {} (pid {})", h.user, h.controller, h.pid))
            .unwrap_or_default();
        let state = match self.state.as_str() {
            "interrupted" => "interrupted",
            "running" => "still running",
            _ => "stopped without finishing (its process is gone)",
        };
        // A step that found its host at the desired state is done as much as one that ran.
        let mut text = format!(
            "{} (started {}{who}), {state} at {}: {} of {} steps done, {} failed",
            self.run,
            self.started.as_deref().unwrap_or("?"),
            self.last.as_deref().unwrap_or("?"),
            self.succeeded + self.skipped,
            self.steps,
            self.failed
        );
        if self.unreachable > 0 {
            text.push_str(&format!(", {} left alone (unreachable)", self.unreachable));
        }
        if self.in_flight.is_empty() {
            text.push_str(", none in flight");
        } else {
            let steps: Vec<String> = self
                .in_flight
                .iter()
                .map(|s| {
                    let hook = s
                        .hook
                        .as_ref()
                        .map(|h| format!(", in {h}"))
                        .unwrap_or_default();
                    let from = s.from.as_deref().unwrap_or("fresh");
                    format!("{} on {} ({from} → {}{hook})", s.service, s.host, s.to)
                })
                .collect();
            text.push_str(&format!("; in flight: {}", steps.join(", ")));
        }
        if !self.damaged.is_empty() {
            text.push_str(&format!(
                "; its journal {} has {} damaged line(s), whose entries are not counted: {}",
                self.journal,
                self.damaged.len(),
                self.damaged.join("; ")
            ));
        }
        text
    }
}

/// A step whose intent is in the journal but not its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InFlight {
    pub service: String,
    pub host: String,
    pub from: Option<String>,
    pub to: String,
    /// The hook that had started and not ended, if one had.
    pub hook: Option<String>,
}

/// The site's unfinished run, if one is recorded; `Err` when its journal cannot be read.
pub fn unfinished(root: &Path, site: &str) -> Result<Option<RunRecord>, String> {
    let text = match std::fs::read_to_string(pointer_path(root, site)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let pointer: Pointer = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let journal = std::fs::read_to_string(&pointer.journal)
        .map_err(|e| format!("{}: {e}", pointer.journal))?;
    Ok(Some(read(&pointer.run, &pointer.journal, &journal)))
}

/// Folds a journal's lines into where its run stands. A last line cut short (the process died
/// while writing it: no newline after it) is ignored; any other line that is not an entry is
/// reported in [`RunRecord::damaged`], never passed over in silence. Empty lines are nothing
/// (a write after a failed one starts on a line of its own).
pub fn read(run: &str, path: &str, text: &str) -> RunRecord {
    let mut rec = RunRecord {
        run: run.to_string(),
        journal: path.to_string(),
        started: None,
        holder: None,
        resumes: None,
        site_digest: None,
        plan_digest: None,
        state: "died".into(),
        last: None,
        steps: 0,
        succeeded: 0,
        failed: 0,
        blocked: 0,
        skipped: 0,
        unreachable: 0,
        in_flight: Vec::new(),
        damaged: Vec::new(),
    };
    let mut open: BTreeMap<(String, String), (usize, InFlight)> = BTreeMap::new();
    let mut order = 0;
    let mut ended = false;
    let torn_last = !text.is_empty() && !text.ends_with('\n');
    let count = text.lines().count();
    let mut lines = Vec::with_capacity(count);
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(l) {
            Ok(line) => lines.push(line),
            Err(_) if torn_last && i + 1 == count => {}
            Err(e) => rec.damaged.push(format!("line {}: {e}", i + 1)),
        }
    }
    for line in lines {
        rec.last = Some(line.time.clone());
        match line.entry {
            Entry::RunStarted {
                site_digest,
                plan_digest,
                steps,
                holder,
                resumes,
                ..
            } => {
                rec.started = Some(line.time);
                rec.site_digest = Some(site_digest);
                rec.plan_digest = Some(plan_digest);
                rec.steps = steps;
                rec.holder = Some(*holder);
                rec.resumes = resumes;
            }
            Entry::StepIntent(StepIntent {
                service,
                host,
                from,
                to,
            }) => {
                order += 1;
                let key = (service.clone(), host.clone());
                let step = InFlight {
                    service,
                    host,
                    from,
                    to,
                    hook: None,
                };
                open.insert(key, (order, step));
            }
            Entry::HookStarted(HookStart {
                service,
                host,
                hook,
            }) => {
                if let Some((_, s)) = open.get_mut(&(service, host)) {
                    s.hook = Some(hook);
                }
            }
            Entry::HookFinished(HookEnd { service, host, .. }) => {
                if let Some((_, s)) = open.get_mut(&(service, host)) {
                    s.hook = None;
                }
            }
            Entry::StepResult(StepEnd {
                service, host, ok, ..
            }) => {
                open.remove(&(service, host));
                if ok {
                    rec.succeeded += 1;
                } else {
                    rec.failed += 1;
                }
            }
            Entry::RevertIntent(RevertIntent {
                service,
                host,
                from,
                to,
            }) => {
                order += 1;
                let key = (service.clone(), host.clone());
                let step = InFlight {
                    service,
                    host,
                    from: Some(from),
                    to,
                    hook: None,
                };
                open.insert(key, (order, step));
            }
            Entry::RevertResult(RevertEnd { service, host, .. }) => {
                open.remove(&(service, host));
            }
            Entry::StepBlocked { .. } => rec.blocked += 1,
            Entry::ServicePlanned { steps, .. } => rec.steps += steps,
            Entry::StepSkipped { skip, .. } if skip == "unreachable" => rec.unreachable += 1,
            Entry::StepSkipped { .. } => rec.skipped += 1,
            Entry::Interrupted { .. } => {
                rec.state = "interrupted".into();
            }
            Entry::RunFinished { interrupted, .. } => {
                ended = true;
                if interrupted {
                    rec.state = "interrupted".into();
                }
            }
            Entry::ServiceFinished { .. } => {}
        }
    }
    if !ended {
        let alive = rec
            .holder
            .as_ref()
            .is_some_and(|h| h.liveness() != super::lock::Liveness::Dead);
        rec.state = if alive { "running" } else { "died" }.into();
    }
    let mut in_flight: Vec<(usize, InFlight)> = open.into_values().collect();
    in_flight.sort_by_key(|(o, _)| *o);
    rec.in_flight = in_flight.into_iter().map(|(_, s)| s).collect();
    rec
}

#[cfg(test)]
mod tests;
