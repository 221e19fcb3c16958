//! One host's removals: per service, the `stop` and `remove` hooks the host recorded for it
//! (not the site's: the site may no longer have them), one after the other, the last followed
//! in the same command by the host's record without the service. Behind the run's guard like
//! every command that changes a host; the first that fails ends the host's removals.

use super::log::{exit_reason, log_line};
use crate::plan::Removal;
use crate::rollout::event::{Event, EventKind, HookEnd, HookStart, Sink};
use crate::rollout::hook_run::{self, Ran};
use crate::secrets::Secrets;
use crate::state::{write_script, HostRecord, RecordedHook};
use crate::transport::{Link, Output, TransportError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// One host's removals, and what they need.
pub struct RemovalJob {
    pub host: String,
    /// In the plan's order.
    pub removals: Vec<Removal>,
    /// The host's record as the run left it.
    pub record: HostRecord,
    pub state_dir: String,
    /// [`super::ServiceJob::guard`].
    pub guard: Option<Arc<str>>,
    pub secrets: Arc<Secrets>,
    /// Gives the host's lock back once its last removal's record is written.
    pub release: Option<Arc<str>>,
    /// `.drover/runs/<run>`: a removal logs to `<host>/<service>.log`.
    pub log_dir: PathBuf,
}

/// How a host's removals went.
pub struct RemovalResult {
    /// The host's record as now written.
    pub record: HostRecord,
    pub removed: usize,
    /// The removal that failed.
    pub failure: Option<crate::rollout::Failure>,
    /// Its removals not tried, after one failed.
    pub not_started: usize,
    /// [`RemovalJob::release`] ran.
    pub released: bool,
}

/// Carries out `job` over `link`.
pub async fn remove<L: Link>(job: RemovalJob, link: &L, sink: &dyn Sink) -> RemovalResult {
    let mut result = RemovalResult {
        record: job.record.clone(),
        removed: 0,
        failure: None,
        not_started: 0,
        released: false,
    };
    let count = job.removals.len();
    for (i, removal) in job.removals.iter().enumerate() {
        if result.failure.is_some() {
            result.not_started += 1;
            continue;
        }
        let log = job
            .log_dir
            .join(&job.host)
            .join(format!("{}.log", removal.service));
        let last = i + 1 == count;
        let ended = one(&job, removal, &mut result, link, sink, &log, last).await;
        sink.emit(Event::now(EventKind::RemovalFinished {
            service: removal.service.clone(),
            host: job.host.clone(),
            why: removal.why,
            ok: ended.is_ok(),
            failed_hook: ended.as_ref().err().map(|(h, _)| h.to_string()),
            reason: ended.as_ref().err().map(|(_, r)| r.clone()),
            log: log.display().to_string(),
            emptied: ended.is_ok() && result.record.services.is_empty(),
        }));
        match ended {
            Ok(()) => result.removed += 1,
            Err(_) => {
                result.failure = Some(crate::rollout::Failure {
                    host: job.host.clone(),
                    service: removal.service.clone(),
                    log: log.display().to_string(),
                })
            }
        }
    }
    result
}

/// One removal: its recorded hooks, then the record without it; `(hook, why)` when it fails.
async fn one<L: Link>(
    job: &RemovalJob,
    removal: &Removal,
    result: &mut RemovalResult,
    link: &L,
    sink: &dyn Sink,
    log: &std::path::Path,
    last: bool,
) -> Result<(), (&'static str, String)> {
    let Some(entry) = result.record.services.get(&removal.service) else {
        // Gone since the plan was made: nothing is left to do.
        log_line(log, "== remove: the host no longer records it");
        return Ok(());
    };
    let recorded = entry.removal.clone();
    let version = entry.version.clone();
    let mut after = result.record.clone();
    after.services.remove(&removal.service);
    after.schema = HostRecord::SCHEMA;
    let mut write = write_script(&job.state_dir, &after);
    if let (true, Some(release)) = (last, &job.release) {
        // As a step's last command: the hook wrapper's exit trap would empty the pid file the
        // release removes.
        write = format!("{write} && {{ trap - EXIT; {release}; }}");
    }
    let write = match &job.guard {
        Some(guard) => format!("{guard}{write}"),
        None => write,
    };
    sink.emit(Event::now(EventKind::RemovalStarted {
        service: removal.service.clone(),
        host: job.host.clone(),
        version: version.clone(),
        why: removal.why,
    }));
    let Some(recorded) = recorded else {
        log_line(
            log,
            "== remove: the host recorded no hooks for it (an older deploy): none runs, its \
             record is deleted",
        );
        return written(job, link, &write, result, after, last).await;
    };
    let hooks: Vec<(&'static str, &RecordedHook)> = recorded.hooks().collect();
    if hooks.is_empty() {
        return written(job, link, &write, result, after, last).await;
    }
    let mut env = recorded.env.clone();
    env.push(("DEPLOY_OLD_VERSION".into(), version));
    env.push(("DEPLOY_NEW_VERSION".into(), String::new()));
    for (i, (name, hook)) in hooks.iter().enumerate() {
        let then = (i + 1 == hooks.len()).then_some(write.as_str());
        sink.emit(Event::now(EventKind::HookStarted(HookStart {
            service: removal.service.clone(),
            host: job.host.clone(),
            hook: (*name).into(),
        })));
        let started = Instant::now();
        let ran = hook_run::run(
            link,
            &hook_run::Call {
                guard: job.guard.as_deref(),
                env: &env,
                command: &hook.command,
                state_dir: &job.state_dir,
                service: &removal.service,
                secrets: &job.secrets,
                timeout: hook.timeout,
                then,
                stop: None,
                after: false,
            },
        )
        .await;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (outcome, code) = ended(name, ran, log, ms);
        sink.emit(Event::now(EventKind::HookFinished(HookEnd {
            service: removal.service.clone(),
            host: job.host.clone(),
            hook: (*name).into(),
            ok: outcome.is_ok(),
            code,
            ms,
        })));
        outcome?;
    }
    result.record = after;
    result.released = last && job.release.is_some();
    Ok(())
}

/// Writes the record without the service, no hook before it.
async fn written<L: Link>(
    job: &RemovalJob,
    link: &L,
    script: &str,
    result: &mut RemovalResult,
    after: HostRecord,
    last: bool,
) -> Result<(), (&'static str, String)> {
    match link.run(script).await {
        Ok(out) if out.success() => {
            result.record = after;
            result.released = last && job.release.is_some();
            Ok(())
        }
        Ok(out) => Err(("state", exit_reason("state", &out))),
        Err(e) => Err(("state", e.to_string())),
    }
}

/// What a removal hook's end means, its output logged; its exit code.
fn ended(
    name: &'static str,
    ran: Ran,
    log: &std::path::Path,
    ms: u64,
) -> (Result<(), (&'static str, String)>, Option<i32>) {
    let result: Result<Output, TransportError> = match ran {
        Ran::Done(result) => result,
        Ran::TimedOut { after, killed } => {
            let reason = Ran::timeout_reason(name, after, &killed);
            log_line(log, &format!("== {name}: {reason}"));
            return (Err((name, reason)), None);
        }
    };
    match result {
        Err(e) => {
            log_line(log, &format!("== {name}: {e}"));
            (Err((name, e.to_string())), None)
        }
        Ok(out) => {
            let (out, state) = match crate::rollout::processes::then_failed(&out) {
                Some(hook_out) => (hook_out, Some(exit_reason("state", &out))),
                None => (out, None),
            };
            let code = out.code.map_or("signal".to_string(), |c| c.to_string());
            let mut text = format!("== {name}: exit {code} after {ms} ms\n");
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            log_line(log, text.trim_end());
            if let Some(reason) = state {
                log_line(log, &format!("== state: {reason}"));
                return (Err(("state", reason)), Some(0));
            }
            if out.success() {
                (Ok(()), out.code)
            } else {
                (Err((name, exit_reason(name, &out))), out.code)
            }
        }
    }
}
