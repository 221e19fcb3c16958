//! When a service's next wave may open while its open ones still run, and when no new host
//! may start: the policy's `flow` and the failure budgets, as the scheduler applies them.

use super::super::budget::Flowing;
use super::Scheduler;
use crate::transport::Transport;

impl<T: Transport> Scheduler<T> {
    /// Whether `s` may open its next wave while steps of its open ones still run: a wave's
    /// free slot goes to the next wave's hosts at once (at most `batch` hosts switching), when
    /// nothing asks for a whole wave to end first (no pause or confirmation between waves, no
    /// `spread`, the open wave is not the canary) and the failure budgets would hold even if
    /// every step still running failed. So opening early changes when hosts start, never
    /// which: waiting for the whole wave would have opened the next one too.
    pub(super) fn flows(&self, s: usize) -> bool {
        let sp = &self.r.plan.services[s];
        let svc = &self.svcs[s];
        let Some(newest) = svc.next_wave.checked_sub(1) else {
            return false;
        };
        let Some(rule) = super::super::budget::flowing(&sp.policy) else {
            return false;
        };
        // Under `budget`, every step running in the run counts as a failure to come, when the
        // site has a run budget (and last: it walks every service).
        let run_holds = |count_running: bool| {
            self.r.plan.max_failed_hosts.is_none_or(|limit| {
                let running: usize = if count_running {
                    self.svcs.iter().map(|v| v.running).sum()
                } else {
                    0
                };
                self.failed_hosts + running <= limit
            })
        };
        let open = svc.next_wave < sp.waves.len()
            && svc.running < sp.policy.batch_hosts
            && !sp.waves[newest].canary;
        open && match rule {
            Flowing::Slots { limit } => svc.failed <= limit && run_holds(false),
            Flowing::Budget { limit } => {
                svc.failed.saturating_add(svc.running) <= limit && run_holds(true)
            }
        }
    }

    /// Under `flow "slots"`, why no new host of `s` may start now: the service's or the run's
    /// failure budget is spent. Checked before each new host starts.
    pub(super) fn slots_spent(&self, s: usize) -> Option<String> {
        let sp = &self.r.plan.services[s];
        let Some(Flowing::Slots { .. }) = super::super::budget::flowing(&sp.policy) else {
            return None;
        };
        // The same checks, in the same order, as before a new wave opens.
        super::super::budget::run_exceeded(&self.r.plan, self.failed_hosts)
            .or_else(|| super::super::budget::service_exceeded(&sp.policy, self.svcs[s].failed))
    }
}
