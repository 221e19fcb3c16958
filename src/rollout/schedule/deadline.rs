//! A policy's `progress-deadline`: a service with a step running that has started no step and
//! ended none for that long is stopped as failed. Its running steps are aborted (their hooks
//! killed on their hosts, each recorded as interrupted), nothing more of it starts, and it ends
//! `failed` once none of its steps runs, the reason naming the hosts it waited on. Time spent
//! with no step of it running (a pause, a confirmation, a wait for another service) does not
//! count.

use super::super::cancel::Level;
use super::super::event::ServiceOutcome;
use super::Scheduler;
use crate::transport::Transport;
use tokio::time::Instant as TokioInstant;

impl<T: Transport> Scheduler<T> {
    /// Watches service `s`'s progress deadline: when to look again, or `None` when there is
    /// nothing to watch. Stops the service once the deadline has passed; ends it once stopped
    /// and none of its steps runs.
    pub(super) fn deadline(&mut self, s: usize) -> Option<TokioInstant> {
        let svc = &self.svcs[s];
        if let Some(reason) = &svc.missed {
            if svc.running == 0 {
                let reason = reason.clone();
                self.leave(s, ServiceOutcome::Failed, &reason);
            }
            return None;
        }
        let deadline = self.r.plan.services[s].policy.progress_deadline?;
        if svc.running == 0 {
            return None;
        }
        let at = svc.progressed? + deadline;
        if at > TokioInstant::now() {
            return Some(at);
        }
        let sp = &self.r.plan.services[s];
        let mut waited: Vec<&str> = self
            .task_steps
            .values()
            .filter(|(t, ..)| *t == s)
            .filter_map(|&(_, w, i)| sp.waves.get(w)?.steps.get(i))
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
