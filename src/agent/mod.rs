//! The pull agent (`deploy agent`): a long-lived process on one host that converges that host,
//! and only it, on the snapshot `deploy publish` named at `desired/current`. One prefix watch
//! on `desired/`; on each new digest the snapshot is loaded ([`load`]) and converged with the
//! stages push uses ([`converge`]: the apply stage through the `local` transport, a slot of the
//! service's semaphore ([`slot`]) held around each step). Above [`crate::publish`] (whose
//! manifest it reads) and [`crate::apply`]; nothing here prints: what it has to say goes to
//! its [`Say`].

mod converge;
mod load;
mod simulate;
mod slot;
mod unit;

pub use converge::Converged;
pub use simulate::simulate;
pub use unit::unit;

use crate::apply::{ApplyError, Say};
use crate::history::HistoryError;
use crate::site::StoreSpec;
use crate::state::store::{Etcd, Keys, StoreError, Write};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an agent is asked to do (the flags of `deploy agent`).
#[derive(Debug, Clone)]
pub struct Request {
    /// etcd's endpoints.
    pub endpoints: Vec<String>,
    /// The platform's `prefix`.
    pub prefix: String,
    pub site: String,
    /// The host this agent converges, by its inventory name.
    pub host: String,
    /// Where the agent keeps its journal, contents and the snapshot it works on.
    pub state_dir: PathBuf,
    /// The host's root: hooks run there, and the platform's state-dir is under it.
    pub root: PathBuf,
    /// The TTL of each slot's lease: a dead agent's slot frees within it.
    pub ttl: Duration,
    /// Where a secret kept in a file is read (`None`: `<state-dir>/secrets`).
    pub secrets: Option<PathBuf>,
    /// etcd's TLS and users, as a platform's `store` names them.
    pub tls: Option<crate::site::StoreTls>,
    pub auth: Option<crate::site::StoreAuth>,
}

impl Request {
    /// The store the agent talks to, as a platform's `store "etcd"` would name it.
    fn spec(&self) -> StoreSpec {
        StoreSpec {
            endpoints: self.endpoints.clone(),
            prefix: self.prefix.clone(),
            lock_ttl: self.ttl,
            tls: self.tls.clone(),
            auth: self.auth.clone(),
        }
    }
}

/// Why the agent cannot go on.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum AgentError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Site(#[from] crate::site::SiteErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    History(#[from] HistoryError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    #[error("snapshot {digest} cannot be read: {reason}")]
    #[diagnostic(
        code(drover::agent::snapshot),
        help("publish the site again with `deploy publish SITE`")
    )]
    Snapshot { digest: String, reason: String },
    #[error("host {host} is not in snapshot {digest}'s inventory")]
    #[diagnostic(
        code(drover::agent::not_in_snapshot),
        help("give --host the host's name as the platform's inventory has it")
    )]
    NotInSnapshot { host: String, digest: String },
    #[error("pull mode cannot honour the published site yet:\n  {lines}")]
    #[diagnostic(
        code(drover::agent::unsupported),
        help("nothing was changed on this host; roll it out with `deploy apply`")
    )]
    Unsupported { lines: String },
    #[error("{place} is held by {holder}: another agent converges this host")]
    #[diagnostic(
        code(drover::agent::slot_held),
        help("run one agent per host; a dead agent's slot goes with its lease")
    )]
    SlotHeld { place: String, holder: String },
    #[error("{reason}")]
    #[diagnostic(code(drover::agent::usage), help("{help}"))]
    Usage { reason: String, help: String },
    #[error("cannot use {path}: {source}")]
    #[diagnostic(code(drover::agent::io))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl AgentError {
    fn io(path: &Path, source: std::io::Error) -> AgentError {
        AgentError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// One agent, connected.
pub struct Agent {
    /// Shared by the agents of one process (`--simulate`), each on a thread of its own.
    runtime: Arc<tokio::runtime::Runtime>,
    etcd: Arc<Etcd>,
    keys: Keys,
    host: String,
    /// Absolute.
    state_dir: PathBuf,
    /// Where secrets kept in files are read; absolute.
    secrets: PathBuf,
    ttl: Duration,
    say: Say,
    stop: Arc<AtomicBool>,
    /// A step's records refused because a newer snapshot was published meanwhile (the
    /// snapshot they were of, and the writes): the host records that step, so they are
    /// published again under the snapshot the agent takes up next, before anything else.
    unpublished: Mutex<Option<(String, Vec<Write>)>>,
    /// Per (service, wave): when this agent first saw every wave before it ended, on its own
    /// clock (a timed pause is counted from then; see [`crate::publish::Rollout::held`]).
    waves_seen: std::sync::Mutex<std::collections::HashMap<(String, usize), std::time::Instant>>,
}

impl Agent {
    fn keep_unpublished(&self, digest: &str, writes: Vec<Write>) {
        let mut kept = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
        match kept.as_mut() {
            // Records of an earlier refused step too: both go, the later last.
            Some((_, earlier)) => earlier.extend(writes),
            None => *kept = Some((digest.to_string(), writes)),
        }
    }

    fn say(&self, text: &str) {
        (self.say)(text)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Waits `d` (the timer made inside the runtime: the agent's thread is not one of its
    /// workers, and a timer made outside any runtime panics).
    fn sleep(&self, d: Duration) {
        sleep_on(&self.runtime, d)
    }

    /// The local transport's root: the host's own directory is `<state-dir>/hosts/<host>`, a
    /// link to `--root` (the other hosts' are empty directories of the agent's own, never
    /// stepped).
    fn hosts_dir(&self) -> PathBuf {
        self.state_dir.join("hosts")
    }

    /// The apply stage's controller directory (journal, locks, run logs): `.drover` under the
    /// state directory.
    fn controller(&self) -> PathBuf {
        self.state_dir.join(crate::state::journal::CONTROLLER_DIR)
    }
}

/// Connects, then converges the host on every snapshot published, until SIGINT or SIGTERM.
pub fn run(request: &Request, say: Say) -> Result<(), AgentError> {
    // Joined into paths under the state directory (a link replaced there): checked before
    // any file is touched.
    check_host(&request.host)?;
    let runtime =
        Arc::new(crate::session::runtime().map_err(|e| AgentError::io(&request.state_dir, e))?);
    let stop = Arc::new(AtomicBool::new(false));
    runtime.block_on(signals(stop.clone()))?;
    let at = Place {
        host: request.host.clone(),
        state_dir: request.state_dir.clone(),
        root: request.root.clone(),
    };
    let agent = start(request, &at, runtime, stop, say)?;
    watch(&agent)
}

/// Where one agent works: its host, state directory and the host's root.
struct Place {
    host: String,
    state_dir: PathBuf,
    root: PathBuf,
}

/// One agent for `at`, connected (a connection of its own), its state directory made and its
/// host linked, not yet watching.
fn start(
    request: &Request,
    at: &Place,
    runtime: Arc<tokio::runtime::Runtime>,
    stop: Arc<AtomicBool>,
    say: Say,
) -> Result<Agent, AgentError> {
    let state_dir =
        std::path::absolute(&at.state_dir).map_err(|e| AgentError::io(&at.state_dir, e))?;
    let root = std::path::absolute(&at.root).map_err(|e| AgentError::io(&at.root, e))?;
    if !root.is_dir() {
        return Err(AgentError::Usage {
            reason: format!("--root {}: not a directory", root.display()),
            help: "give the host's root directory (/ on a real host)".into(),
        });
    }
    let secrets = match &request.secrets {
        Some(dir) => std::path::absolute(dir).map_err(|e| AgentError::io(dir, e))?,
        None => state_dir.join("secrets"),
    };
    load::private_dir(&state_dir)?;
    let etcd = runtime.block_on(Etcd::connect(&request.spec(), "agent"))?;
    let agent = Agent {
        etcd: Arc::new(etcd),
        keys: Keys::new(&request.prefix, &request.site),
        host: at.host.clone(),
        state_dir,
        secrets,
        ttl: request.ttl,
        say,
        stop,
        runtime,
        unpublished: Mutex::new(None),
        waves_seen: Default::default(),
    };
    link_host(&agent, &root)?;
    Ok(agent)
}

/// A host name that is one plain path component: not empty, not `.` or `..`, no `/` (nor
/// NUL). An inventory's host names are such names; another could point the agent's files
/// (the host's link, removed and made again) outside its state directory.
fn check_host(host: &str) -> Result<(), AgentError> {
    if host.is_empty() || host == "." || host == ".." || host.contains(['/', '\0']) {
        return Err(AgentError::Usage {
            reason: format!(
                "--host {host:?}: not a host name (a name with no `/`, not `.` or `..`)"
            ),
            help: "give --host the host's name as the platform's inventory has it".into(),
        });
    }
    Ok(())
}

/// `<state-dir>/hosts/<host>` → `root`.
fn link_host(agent: &Agent, root: &Path) -> Result<(), AgentError> {
    let dir = agent.hosts_dir();
    load::private_dir(&dir)?;
    let link = dir.join(&agent.host);
    if std::fs::read_link(&link).is_ok_and(|to| to == root) {
        return Ok(());
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(root, &link).map_err(|e| AgentError::io(&link, e))
}

/// SIGINT and SIGTERM raise `stop`: no new step starts (a running one is stopped by the apply
/// stage's own handling of the same signal), and the agent exits.
async fn signals(stop: Arc<AtomicBool>) -> Result<(), AgentError> {
    use tokio::signal::unix::{signal, SignalKind};
    let io = |e| AgentError::io(Path::new("signals"), e);
    let mut int = signal(SignalKind::interrupt()).map_err(io)?;
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        stop.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// The loop: one watch on `desired/`; each digest not converged yet is converged once (a failed
/// host waits for the next snapshot, or a restart of the agent, as push waits for the next
/// apply).
fn watch(agent: &Agent) -> Result<(), AgentError> {
    let mut done: Option<String> = None;
    let mut watching = None;
    // Snapshots that etcd failed in a row: each waits longer before the next try.
    let mut failed = 0u32;
    while !agent.stopping() {
        if watching.is_none() {
            match agent.block_on(agent.etcd.watch(&agent.keys.desired_prefix())) {
                Ok(w) => watching = Some(w),
                Err(e) => {
                    agent.say(&format!("warning: cannot watch etcd: {e}"));
                    agent.sleep(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let current = match agent.block_on(agent.etcd.value_at(&agent.keys.current())) {
            Ok(v) => v.map(|(v, rev)| (String::from_utf8_lossy(&v).trim().to_string(), rev)),
            Err(e) => {
                agent.say(&format!(
                    "warning: cannot read {}: {e}",
                    agent.keys.current()
                ));
                watching = None;
                continue;
            }
        };
        if let Some((digest, revision)) = &current {
            if !publish_again(agent, digest, *revision) {
                // A newer snapshot again, or etcd did not answer: read it again.
                agent.sleep(Duration::from_millis(200));
                continue;
            }
        }
        if let Some((digest, revision)) = current.filter(|(d, _)| done.as_ref() != Some(d)) {
            if once(agent, &digest, revision) && !agent.stopping() {
                done = Some(digest);
                failed = 0;
            } else if !agent.stopping() {
                // etcd did not answer: the same snapshot again, later each time, and not all
                // agents at once (a thousand loading a snapshot together is what failed).
                let wait = backoff(failed);
                agent.block_on(async {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = until(agent) => {}
                    }
                });
                failed = failed.saturating_add(1);
            }
            continue;
        }
        let Some(w) = watching.as_mut() else {
            continue;
        };
        let changed = agent.block_on(async {
            tokio::select! {
                changed = w.changed() => changed,
                () = until(agent) => true,
            }
        });
        if !changed {
            watching = None;
        }
    }
    Ok(())
}

/// How long to wait before loading a snapshot again after `failed` tries etcd failed in a
/// row: 2 s, doubled each time up to 32 s, each drawn between half and one and a half of
/// that, so that agents failed together do not come back together.
fn backoff(failed: u32) -> Duration {
    spread(Duration::from_secs(2).saturating_mul(1 << failed.min(4)))
}

/// `d` drawn between half and one and a half of it.
fn spread(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A random draw: std's hasher keys are random per process and per call.
    let draw = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    d.mul_f64(0.5 + (draw % 1000) as f64 / 1000.0)
}

/// Waits `d` on `runtime` from a thread that need not be in its context: the timer is made
/// inside the future (`tokio::time::sleep` made outside any runtime panics).
fn sleep_on(runtime: &tokio::runtime::Runtime, d: Duration) {
    runtime.block_on(async move { tokio::time::sleep(d).await })
}

/// Whether `e` is etcd failing (to be tried again), whichever stage met it: loading the
/// snapshot's contents reports it through the history's error.
fn from_etcd(e: &AgentError) -> bool {
    matches!(
        e,
        AgentError::Store(_) | AgentError::History(HistoryError::Store(_))
    )
}

/// Resolves once the agent is told to stop.
async fn until(agent: &Agent) {
    while !agent.stopping() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes the records of a step that a newer snapshot's fence refused, if any, under the
/// snapshot `digest` at `revision` (the one the agent is about to act on): they are what the
/// host records, and the store says nothing the host does not. `false` when they could not be
/// (a newer snapshot again, or etcd did not answer): kept for the next.
fn publish_again(agent: &Agent, digest: &str, revision: i64) -> bool {
    let kept = agent
        .unpublished
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let Some((of, writes)) = kept else {
        return true;
    };
    let key = agent.keys.current();
    match agent.block_on(agent.etcd.write_if_unchanged(&key, revision, &writes)) {
        Ok(()) => {
            agent.say(&format!(
                "snapshot {digest}: published what this host recorded of its step on snapshot {of}"
            ));
            true
        }
        Err(e) => {
            if !matches!(e, StoreError::Superseded { .. }) {
                agent.say(&format!(
                    "warning: this host's records of its step on snapshot {of} are not in etcd yet: {e}"
                ));
            }
            agent.keep_unpublished(&of, writes);
            false
        }
    }
}

/// Converges on snapshot `digest` (named by `desired/current` at `revision`), saying how it
/// went; `false` when etcd failed it (to be tried again), `true` once the host went as far as
/// it goes with it, or a newer snapshot was published.
fn once(agent: &Agent, digest: &str, revision: i64) -> bool {
    agent.say(&format!("snapshot {digest}: converging {}", agent.host));
    let result = agent
        .block_on(load::snapshot(agent, digest, revision))
        .and_then(|loaded| converge::converge(agent, &loaded));
    match result {
        Ok(c) if c.stopped => agent.say(&format!("snapshot {digest}: stopped")),
        Ok(c) if c.superseded => agent.say(&format!(
            "snapshot {digest}: left for the newer one ({} services stepped, {} failed)",
            c.stepped, c.failed
        )),
        Ok(c) => agent.say(&format!(
            "snapshot {digest}: converged ({} services stepped, {} failed)",
            c.stepped, c.failed
        )),
        Err(e) => {
            agent.say(&format!("error: snapshot {digest}: {e}"));
            return !from_etcd(&e);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn etcd_failing_while_the_contents_load_is_tried_again() {
        use super::{from_etcd, AgentError, HistoryError, StoreError};
        let gone = || StoreError::Unavailable {
            waited: "10.0 s".into(),
            tried: String::new(),
        };
        // Loading the contents (history's blobs) met etcd not answering: the snapshot is
        // tried again, not taken as converged (the agent then waited for the next publish).
        assert!(from_etcd(&AgentError::History(HistoryError::Store(gone()))));
        assert!(from_etcd(&AgentError::Store(gone())));
        let damaged = AgentError::Snapshot {
            digest: "d".into(),
            reason: "nothing under it".into(),
        };
        assert!(!from_etcd(&damaged));
    }

    #[test]
    fn a_wait_on_a_thread_outside_the_runtime_does_not_panic() {
        // A simulated agent's thread (`--simulate`) before it ever ran a step: no runtime's
        // context. `block_on(tokio::time::sleep(d))` panicked there ("no reactor running").
        let runtime = crate::session::runtime().expect("a runtime");
        let waited = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            super::sleep_on(&runtime, std::time::Duration::from_millis(20));
            started.elapsed()
        })
        .join()
        .expect("the wait did not panic");
        assert!(waited >= std::time::Duration::from_millis(20));
    }

    #[test]
    fn a_snapshot_etcd_failed_is_tried_again_later_each_time_and_spread() {
        use std::time::Duration;
        for failed in 0..10 {
            let base = Duration::from_secs(2 << failed.min(4));
            let draws: Vec<Duration> = (0..50).map(|_| super::backoff(failed)).collect();
            assert!(
                draws
                    .iter()
                    .all(|d| *d >= base / 2 && *d <= base.mul_f64(1.5)),
                "{failed}: {draws:?}"
            );
            // Agents failed together come back apart.
            let mut distinct = draws.clone();
            distinct.sort();
            distinct.dedup();
            assert!(distinct.len() > 25, "{failed}: {draws:?}");
        }
    }

    #[test]
    fn a_host_name_that_is_not_one_path_component_is_refused() {
        for bad in ["", ".", "..", "../etc", "a/b", "/", "a\0b"] {
            let err = super::check_host(bad).expect_err(bad);
            assert!(err.to_string().contains("not a host name"), "{bad}: {err}");
        }
        for good in ["web1", "db.example.com", "a..b", ".hidden"] {
            assert!(super::check_host(good).is_ok(), "{good}");
        }
    }
}
