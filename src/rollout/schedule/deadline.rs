//! A policy's `progress-deadline`: a service with a step running that has started no step and
//! ended none for that long is stopped as failed. Its running steps are aborted (their hooks
//! killed on their hosts, each recorded as interrupted), nothing more of it starts, and it ends
//! `failed` once none of its steps runs, the reason naming the hosts it waited on. Time spent
//! with no step of it running (a pause, a confirmation, a wait for another service) does not
//! count, and its check's `stable=` window is added to the deadline (a step holds its check
//! that long without starting or ending). Only the service's own hooks are killed: the run's
//! other services' steps on those hosts go on. Under `on-failure "revert"`, the hosts it
//! switched are then switched back (`reverting.rs`).

use super::super::cancel::Level;
use super::super::event::ServiceOutcome;
use super::Scheduler;
use crate::site::OnFailure;
use crate::transport::Transport;
use tokio::time::Instant as TokioInstant;

impl<T: Transport> Scheduler<T> {
    /// Watches service `s`'s progress deadline: when to look again, or `None` when there is
    /// nothing to watch. Stops the service once the deadline has passed; ends it once stopped
    /// and none of its steps runs.
    pub(super) fn deadline(&mut self, s: usize) -> Option<TokioInstant> {
        let svc = &self.svcs[s];
        if let Some(reason) = &svc.missed {
            if svc.running == 0 && svc.reverting.is_none() {
                let reason = reason.clone();
                // Under `on-failure "revert"`, the hosts it switched are switched back.
                if self.r.plan.services[s].policy.on_failure == OnFailure::Revert {
                    self.revert(s, reason);
                } else {
                    self.leave(s, ServiceOutcome::Failed, &reason);
                }
            }
            return None;
        }
        let sp = &self.r.plan.services[s];
        let stable = self
            .r
            .site
            .service(&sp.name)
            .and_then(|id| self.r.site.services[id].hooks.check.as_ref())
            .map_or(std::time::Duration::ZERO, |c| c.stable);
        let deadline = sp.policy.progress_deadline?;
        if svc.running == 0 {
            return None;
        }
        let at = svc.progressed? + deadline + stable;
        if at > TokioInstant::now() {
            return Some(at);
        }
        let sp = &self.r.plan.services[s];
        let mut waited: Vec<&str> = self
            .task_steps
            .values()
            .filter(|at| at.service == s)
            .filter_map(|at| sp.waves.get(at.wave)?.steps.get(at.step))
            .map(|st| &*st.host)
            .collect();
        waited.sort_unstable();
        let reason = format!(
            "no host started or ended its step for {} (its policy's progress-deadline); \
             stopped while it waited on {}",
            crate::site::format_duration(deadline),
            waited.join(", ")
        );
        self.svcs[s].job.cancel.raise(Level::Abort, &reason);
        self.svcs[s].missed = Some(reason);
        None
    }
}
