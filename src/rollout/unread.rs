//! Unread steps ([`StepKind::Unread`]): a host not read before the run is locked and read in
//! the command before its first step, over the link the step then runs on, and the step is
//! decided from what was read ([`crate::plan::decide`]), the same decision the plan makes for
//! a host read before the run. A host found at the desired state ends its step at once.

use super::hook::step_env;
use super::step::{StepJob, StepResult};
use crate::desired::Desired;
use crate::inventory::HostId;
use crate::plan::{Plan, SkipReason};
use crate::site::{ServiceId, Site};
use crate::state::{HostRecord, Observed};
use crate::transport::{Link, Target};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Takes the run's lock on a host and reads its state, in one command over `link`: the
/// session's host lock, handed to the rollout for the hosts it did not read.
pub trait LockAtStep<L>: Send + Sync {
    /// The host's state as read once locked (`Observed::Unreachable` if the link failed), or
    /// why the lock was refused (another run holds it, a newer fencing token, …).
    fn lock_and_read<'a>(
        &'a self,
        link: &'a L,
        host: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observed, String>> + Send + 'a>>;
}

/// What an unread step needs to be decided in its task.
pub(super) struct Unread<L> {
    pub site: Arc<Site>,
    pub desired: Arc<Desired>,
    pub plan: Arc<Plan>,
    /// `None`: not a service of the site (a plan edited by hand): the step fails.
    pub service: Option<ServiceId>,
    pub host: usize,
    /// The host was read already in this run (by an earlier step of another service): its
    /// record is the job's.
    pub read: bool,
    /// The run's host lock; without one, a host not read cannot be stepped.
    pub lock: Option<Arc<dyn LockAtStep<L>>>,
}

impl<L: Link> Unread<L> {
    /// Locks and reads the host (unless read already) and decides the step: `Ok` the job to
    /// run, `Err` the step's end without a hook (nothing to do, the host unreachable or its
    /// lock refused). A host left with nothing to run gives its lock back here when this was
    /// its last step.
    pub async fn settle(
        self,
        mut job: StepJob,
        link: &L,
        target: &Target,
    ) -> Result<StepJob, StepResult> {
        let refused = |job: StepJob, reason: String| {
            super::step::log_line(&job.log, &format!("== lock: {reason}"));
            Err(ended(job.record, Some(("lock", reason)), None, false))
        };
        let Some(service) = self.service else {
            return refused(job, "its service is not in the site".into());
        };
        let observed = match (&self.lock, self.read) {
            (_, true) => Observed::Running {
                services: job.record.services.clone(),
            },
            (Some(lock), false) => match lock.lock_and_read(link, target).await {
                Ok(observed) => observed,
                Err(reason) => return refused(job, reason),
            },
            (None, false) => {
                return refused(
                    job,
                    "its host was not read and the run has no lock to take".into(),
                )
            }
        };
        if let Observed::Running { services } = &observed {
            job.record = HostRecord {
                schema: HostRecord::SCHEMA,
                services: services.clone(),
            };
        }
        let decided = crate::plan::decide(
            &self.site,
            &self.desired,
            service,
            HostId::new(self.host),
            &observed,
        );
        match decided {
            Ok(Some(d)) => {
                let host = &self.plan.hosts[self.host];
                job.env = step_env(&job.service.env, host, d.from.as_deref(), &job.to);
                job.from = d.from.map(|f| f.to_string());
                job.kind = d.kind;
                job.reasons = d.reasons;
                job.path = d.path;
                job.restarts = d.restarts;
                Ok(job)
            }
            Ok(None) => {
                let released = release(&job, link).await;
                Err(ended(
                    job.record,
                    None,
                    Some((SkipReason::AtVersion, None)),
                    released,
                ))
            }
            Err(reason) => {
                super::step::log_line(&job.log, &format!("== read: {reason}"));
                // Locked, but nothing known of what it runs: left alone, as a host whose
                // state cannot be read before a run is.
                let released = release(&job, link).await;
                Err(ended(
                    job.record,
                    None,
                    Some((SkipReason::Unreachable, Some(reason))),
                    released,
                ))
            }
        }
    }
}

/// The step of a host that could not be connected: left alone, as a host that does not
/// answer before a run is (it was never locked).
pub(super) fn unreachable(record: HostRecord, reason: String) -> StepResult {
    ended(
        record,
        None,
        Some((SkipReason::Unreachable, Some(reason))),
        false,
    )
}

/// Gives the lock back when the step was the host's last and runs nothing more.
async fn release<L: Link>(job: &StepJob, link: &L) -> bool {
    let Some(text) = &job.release else {
        return false;
    };
    matches!(link.run(text).await, Ok(out) if out.success())
}

fn ended(
    record: HostRecord,
    failed: Option<(&str, String)>,
    skipped: Option<(SkipReason, Option<String>)>,
    released: bool,
) -> StepResult {
    let (failed_hook, reason) = match failed {
        Some((hook, reason)) => (Some(hook.to_string()), Some(reason)),
        None => (None, None),
    };
    StepResult {
        record,
        failed_hook,
        reason,
        rolled_back: false,
        released,
        skipped,
        not_started: false,
        ran: None,
    }
}
