//! The history stage: what each run that changed hosts applied, and going back to it. Above
//! [`crate::apply`] (which never imports it): [`apply`] drives one apply and records it,
//! [`undo`] loads an earlier run's snapshot as a site and applies that.
//!
//! On the controller, beside the run journals: `.drover/history/runs/<run>.json` (an
//! [`Entry`]: when, who, what changed per service, how it ended, and the run's [`Snapshot`])
//! and `.drover/history/blobs/<sha256>` (every content a snapshot names, once). With a store,
//! the same under the site's keys in etcd ([`shared`]), so that another checkout sees them.

pub mod blobs;
pub mod shared;
pub mod show;
pub mod snapshot;
mod tally;
pub mod undo;

pub use blobs::{Blobs, Digest};
pub use snapshot::Snapshot;

use crate::apply::{ApplyError, Operator, Outcome, Prepared, Say};
use crate::rollout::Sink;
use crate::session::Ended;
use crate::state::journal::CONTROLLER_DIR;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Version of an entry's layout.
pub const HISTORY_SCHEMA: u32 = 1;

/// A run's id, as its journal's directory is named (`.drover/runs/<run>`): letters, digits,
/// `-`, `_`, `.`, never `/`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    pub fn parse(text: &str) -> Option<RunId> {
        let ok = !text.is_empty()
            && !text.starts_with('.')
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        ok.then(|| RunId(text.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        RunId::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("{text:?} is not a run id")))
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunResult {
    /// Every step it planned was done.
    Converged,
    /// Some hosts failed or did not answer.
    Failed,
    /// A service's failure budget was spent under `on-failure "revert"`: the hosts the run
    /// had switched were switched back.
    Reverted,
    /// Stopped by a signal.
    Interrupted,
    /// The site's lock in etcd was lost.
    LockLost,
    /// Its journal could not be written.
    JournalFailed,
}

impl RunResult {
    pub fn of(outcome: &Outcome) -> RunResult {
        if let Outcome::Ran { summary, .. } = outcome {
            if summary.reverted + summary.not_reverted > 0 {
                return RunResult::Reverted;
            }
        }
        match outcome.verdict() {
            crate::apply::Verdict::Converged => RunResult::Converged,
            crate::apply::Verdict::Failed => RunResult::Failed,
            crate::apply::Verdict::Stopped(Ended::Interrupted) => RunResult::Interrupted,
            crate::apply::Verdict::Stopped(Ended::LockLost) => RunResult::LockLost,
            crate::apply::Verdict::Stopped(Ended::JournalFailed) => RunResult::JournalFailed,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            RunResult::Converged => "converged",
            RunResult::Failed => "failed",
            RunResult::Reverted => "reverted",
            RunResult::Interrupted => "interrupted",
            RunResult::LockLost => "lock lost",
            RunResult::JournalFailed => "journal failed",
        }
    }
}

/// Who ran it: `user@machine`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Who {
    pub user: String,
    pub machine: String,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.user, self.machine)
    }
}

/// What one run did to one service, from its events. (The fields after `failed` came later:
/// an entry written without them reads as none.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub service: String,
    /// Hosts a step of it began on.
    pub hosts: usize,
    /// The versions those hosts ran before (`None`: a fresh install), each once, sorted.
    pub from: Vec<Option<String>>,
    /// The versions it went to, each once, sorted (one but for a run planned in parts).
    pub to: Vec<String>,
    /// Of those steps (and removals), the ones that failed.
    pub failed: usize,
    /// What the steps did: how many hosts each kind of step was begun on, in the order the
    /// run first began each kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<Kinded>,
    /// Why its reconfigures and repairs (as the plan says them: `env: MODE`), each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Hosts it was taken off (`--prune`), and the versions they ran.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_versions: Vec<String>,
    /// Hosts switched back by `on-failure "revert"`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reverted: usize,
}

/// How many hosts a kind of step was begun on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kinded {
    pub kind: crate::plan::StepKind,
    pub hosts: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One run that changed hosts, as `deploy history` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub schema: u32,
    pub run: RunId,
    pub site: String,
    /// RFC 3339, UTC, milliseconds.
    pub started: String,
    pub finished: String,
    pub who: Who,
    pub result: RunResult,
    /// In the order the journal first names each service.
    pub changes: Vec<Change>,
    /// For `deploy undo`: the run whose snapshot it applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undone_to: Option<RunId>,
    pub snapshot: Snapshot,
}

/// What went wrong keeping or reading the history.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum HistoryError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Site(#[from] crate::site::SiteErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] crate::state::store::StoreError),
    #[error("cannot read {path}: {source}")]
    #[diagnostic(
        code(drover::history::read),
        help("the run's snapshot reads every file of the site again; check that it is there and readable")
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    #[diagnostic(
        code(drover::history::write),
        help("the history is kept under .drover/history/ where deploy runs: check its space and permissions")
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(
        code(drover::history::blob),
        help("a damaged blob can be removed from .drover/history/blobs/: with a store, it is fetched from etcd again")
    )]
    Blob(blobs::BlobError),
    #[error("{site}'s files changed while deploy read them: the snapshot would not be what runs")]
    #[diagnostic(
        code(drover::history::changed),
        help("nothing was changed; run the command again once the files are written")
    )]
    Changed { site: PathBuf },
    #[error("{path} cannot be named from the site file's directory")]
    #[diagnostic(
        code(drover::history::unnamed),
        help("a snapshot names each file by its path from the site file's directory; use UTF-8 file names")
    )]
    Unnamed { path: PathBuf },
    #[error("{path}: not an entry of this deploy's history: {reason}")]
    #[diagnostic(
        code(drover::history::entry),
        help("it was written by another version of deploy, or damaged; move it out of .drover/history/runs/")
    )]
    Entry { path: String, reason: String },
    #[error(
        "the snapshot's {path} ({digest}) is neither in .drover/history/blobs nor in the store"
    )]
    #[diagnostic(
        code(drover::history::missing),
        help("that run's snapshot cannot be put back: undo to another run (`deploy history SITE` lists them)")
    )]
    Missing { path: String, digest: Digest },
    #[error("{reason}")]
    #[diagnostic(code(drover::history::no_run), help("{help}"))]
    NoRun { reason: String, help: String },
}

/// The history kept on this controller: `.drover/history/`.
#[derive(Debug, Clone)]
pub struct History {
    dir: PathBuf,
}

impl Default for History {
    fn default() -> Self {
        History::at(Path::new(CONTROLLER_DIR))
    }
}

impl History {
    /// The history under the controller directory `root` (`.drover`).
    pub fn at(root: &Path) -> History {
        History {
            dir: root.join("history"),
        }
    }

    pub fn blobs(&self) -> Blobs {
        Blobs::new(self.dir.join("blobs"))
    }

    fn runs(&self) -> PathBuf {
        self.dir.join("runs")
    }

    /// Where a run's snapshot is put back for `deploy undo`.
    pub fn work(&self, run: &RunId) -> PathBuf {
        self.dir.join("work").join(run.as_str())
    }

    /// Writes `entry` (whole: a new file renamed into place).
    pub fn record(&self, entry: &Entry) -> Result<(), HistoryError> {
        let dir = self.runs();
        let path = dir.join(format!("{}.json", entry.run));
        let tmp = dir.join(format!(".{}.json.{}", entry.run, std::process::id()));
        let text = serde_json::to_vec_pretty(entry).map_err(|e| HistoryError::Entry {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| HistoryError::Write { path, source })
    }

    /// Every entry of `site` kept here, oldest first ([`in_order`]).
    pub fn entries(&self, site: &str) -> Result<Vec<Entry>, HistoryError> {
        let dir = self.runs();
        let listing = match std::fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(HistoryError::Read { path: dir, source }),
        };
        let mut entries = Vec::new();
        for item in listing {
            let path = item
                .map_err(|source| HistoryError::Read {
                    path: dir.clone(),
                    source,
                })?
                .path();
            let named = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if named.starts_with('.') || !named.ends_with(".json") {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|source| HistoryError::Read {
                path: path.clone(),
                source,
            })?;
            let entry = parse_entry(&path.display().to_string(), &bytes)?;
            if entry.site == site {
                entries.push(entry);
            }
        }
        in_order(&mut entries);
        Ok(entries)
    }
}

/// An entry as written, checked.
pub fn parse_entry(path: &str, bytes: &[u8]) -> Result<Entry, HistoryError> {
    let bad = |reason: String| HistoryError::Entry {
        path: path.to_string(),
        reason,
    };
    let entry: Entry = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if entry.schema != HISTORY_SCHEMA {
        return Err(bad(format!(
            "schema {}, this deploy reads {HISTORY_SCHEMA}",
            entry.schema
        )));
    }
    Ok(entry)
}

/// Now, RFC 3339, UTC, milliseconds.
fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Oldest first: by the time each started (runs of a site never overlap: each holds the
/// site's lock), then by id. Not by id alone: an id is the second it started and its
/// process id, and two runs in one second are not in pid order.
pub fn in_order(entries: &mut [Entry]) {
    entries.sort_by(|a, b| (&a.started, &a.run).cmp(&(&b.started, &b.run)));
}

/// Carries out `prepared` (as [`Prepared::run`]) and, when the run changed hosts (began a step
/// on one: it may have stopped partway), records it: its snapshot (taken before anything changes),
/// when, who, what changed per service, how it ended; `undone_to` for `deploy undo`, whose
/// snapshot is the run's it goes back to. The record is kept here and, with a store, in etcd;
/// one that cannot be written is said (`say`), and does not change the outcome.
pub fn apply<O: Operator + 'static>(
    prepared: Prepared,
    sink: Arc<dyn Sink>,
    operator: Arc<O>,
    undone_to: Option<&Entry>,
    say: &Say,
) -> Result<Outcome, HistoryError> {
    let history = History::default();
    let site = prepared.site().clone();
    let run = RunId::parse(prepared.run_id()).ok_or_else(|| HistoryError::Entry {
        path: prepared.run_id().to_string(),
        reason: "not a run id".into(),
    })?;
    let snapshot = match undone_to {
        Some(entry) => entry.snapshot.clone(),
        None => Snapshot::take(&site, &history.blobs())?,
    };
    let started = now();
    let tally = Arc::new(tally::Tally::new(sink));
    let outcome = prepared.run(tally.clone(), operator);
    if let Some(entry) = undone_to {
        // Put back for this run only; the next undo puts it back again.
        let _ = std::fs::remove_dir_all(history.work(&entry.run));
    }
    let outcome = outcome?;
    let holder = crate::state::lock::Holder::me(&site.name, run.as_str());
    // A step is said before its first command, a removal too: a run with neither changed
    // nothing (one stopped before its first step, or that found nothing to do).
    let changes = tally.changes();
    if changes.is_empty() {
        return Ok(outcome);
    }
    let entry = Entry {
        schema: HISTORY_SCHEMA,
        run,
        site: site.name.clone(),
        started,
        finished: now(),
        who: Who {
            user: holder.user,
            machine: holder.controller,
        },
        result: RunResult::of(&outcome),
        changes,
        undone_to: undone_to.map(|e| e.run.clone()),
        snapshot,
    };
    if let Err(e) = history.record(&entry) {
        say(&format!("warning: the run is not in the history: {e}"));
    }
    if site.platform.store.is_none() {
        return Ok(outcome);
    }
    let kept_here = "is kept in .drover/history/ on this machine; the next run that reaches the \
                     store writes it there";
    if matches!(outcome, Outcome::Ended(Ended::LockLost)) {
        // etcd did not answer: said once already, not waited for again.
        say(&format!("note: this run's history {kept_here}"));
        return Ok(outcome);
    }
    // This run's entry, and any an earlier run could not write there.
    let result = history
        .entries(&site.name)
        .and_then(|local| shared::publish(&site, &history.blobs(), &local));
    if let Err(e) = result {
        say(&format!(
            "warning: the run's history could not be written to the store ({e}): it {kept_here}"
        ));
    }
    Ok(outcome)
}

/// Every entry of `site`: this controller's and, with a store, the store's (a run in both is
/// one), oldest first.
pub fn entries(site: &crate::site::Site) -> Result<Vec<Entry>, HistoryError> {
    let mut all = History::default().entries(&site.name)?;
    for entry in shared::entries(site)? {
        if !all.iter().any(|e| e.run == entry.run) {
            all.push(entry);
        }
    }
    in_order(&mut all);
    Ok(all)
}

/// For `deploy status`: the run the fleet was last undone to, from the history of the site at
/// `file`; a history that cannot be read is said (`say`), and taken as none.
pub fn undone(file: &Path, say: &Say) -> Option<crate::state::Undone> {
    let site = crate::site::load(file).ok()?;
    match entries(&site) {
        Ok(entries) => undone_to(&entries).map(|(to, by)| crate::state::Undone {
            to: to.to_string(),
            by: by.run.to_string(),
            at: by.finished.clone(),
            result: by.result.word().to_string(),
        }),
        Err(e) => {
            say(&format!("warning: the site's history cannot be read: {e}"));
            None
        }
    }
}

/// The run the fleet was last undone to: the latest entry, when it is an undo's.
pub fn undone_to(entries: &[Entry]) -> Option<(&RunId, &Entry)> {
    let last = entries.last()?;
    last.undone_to.as_ref().map(|to| (to, last))
}

#[cfg(test)]
mod tests;
