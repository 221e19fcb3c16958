//! What an aborted run does in its steps (a second Ctrl-C): a hook that has not started does
//! not, and what an interrupted step records. The hooks themselves are killed as the on-host
//! process protocol says ([`super::processes::kill_running`]).

use super::step::{ServiceJob, StepJob};
use crate::state::Outcome;

/// `Some(failure)` once the run is being aborted: a hook must not start, and one that ends
/// (killed or not) ends as an interruption rather than with its own failure.
pub fn interrupted(job: &ServiceJob, hook: &str, started: bool) -> Option<(&'static str, String)> {
    job.cancel.aborting().then(|| {
        // The service alone was stopped (its progress deadline): said with why.
        let what = match (job.cancel.alone(), started) {
            (Some(why), true) => format!("{hook} stopped: {why}"),
            (Some(why), false) => format!("stopped before {hook}: {why}"),
            (None, true) => format!("{hook} interrupted: the run was aborted"),
            (None, false) => format!("aborted before {hook}"),
        };
        ("interrupted", what)
    })
}

/// What an interrupted step records: `Some((version, configured, validated))`, or `None` when
/// no hook of it ran (nothing on the host changed: nothing is written).
///
/// - Caught before the state write after `start` (in `stop`, `install`, `migrate` or
///   `start`): the switch-over did not complete. The host is recorded at the version the step
///   started from (the new one on a fresh host) with `configured: failure`, so that the next
///   run does the whole switch-over again, from that same old version: `stop` whatever runs,
///   `install`, and `migrate` with the same `DEPLOY_OLD_VERSION` as the first time.
/// - Caught in `check`: `start` had passed and was recorded; the host runs the new version
///   and is recorded so, with `validated: failure`; the next run redoes it from the new
///   version.
pub fn interrupted_record(job: &StepJob) -> Option<(String, Option<Outcome>, Option<Outcome>)> {
    if !job.log.exists() {
        return None;
    }
    let started = job.record.services.get(&job.service.name).is_some_and(|r| {
        r.version == job.to
            && r.configured
                .as_ref()
                .is_some_and(|m| m.outcome == Outcome::Success && m.run == job.service.run)
    });
    Some(if started {
        (job.to.clone(), None, Some(Outcome::Failure))
    } else {
        (
            job.from.clone().unwrap_or_else(|| job.to.clone()),
            Some(Outcome::Failure),
            None,
        )
    })
}
