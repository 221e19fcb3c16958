//! How waves, services and the run end: a wave settled, cut short by its budget or paused
//! after; a service halted, blocked or finished; the run's summary.

use super::super::event::{EventKind, ServiceOutcome, StepBlocked};
use super::super::{Failure, Summary};
use super::Scheduler;
use crate::plan::SkipReason;
use crate::site::Pause;
use crate::transport::Transport;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::time::Instant as TokioInstant;

impl<T: Transport> Scheduler<T> {
    /// Ends wave `w` of `s` if it is open and has nothing left: no step running, and none
    /// pending if it is the newest.
    pub(super) fn settle(&mut self, s: usize, w: usize) {
        let svc = &self.svcs[s];
        let newest = svc.next_wave.checked_sub(1) == Some(w);
        let Some(at) = svc.open.iter().position(|o| o.wave == w) else {
            return;
        };
        if svc.open[at].running == 0 && (!newest || svc.pending.is_empty()) {
            self.svcs[s].open.remove(at);
            self.wave_over(s, w);
        }
    }

    fn wave_over(&mut self, s: usize, w: usize) {
        // Its hosts' steps ended: the dependents that dropped them list them again.
        self.list_after(s, w);
        let sp = &self.r.plan.services[s];
        let failed = self.svcs[s].failed;
        self.emit(EventKind::WaveFinished {
            service: sp.name.clone(),
            wave: w + 1,
            failed,
        });
        let pause = sp.policy.pause;
        // The pause is between waves: none after the last one.
        let another = w + 1 < sp.waves.len();
        if let (Pause::Wait(d), true) = (pause, another) {
            self.svcs[s].not_before = Some(TokioInstant::now() + d);
        }
    }

    /// The open wave `w` of `s` exceeded its budget: none of its pending steps starts.
    pub(super) fn cut_wave(&mut self, s: usize, w: usize, reason: &str) {
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        for i in std::mem::take(&mut self.svcs[s].pending) {
            let st = &sp.waves[w].steps[i];
            self.emit(EventKind::StepBlocked(StepBlocked {
                service: sp.name.clone(),
                host: st.host.to_string(),
                reason: reason.to_string(),
            }));
            self.svcs[s].not_started += 1;
            if let Some(&h) = self.host_index.get(&st.host) {
                self.hosts[h].broken.insert(s);
                self.host_step_over(h);
            }
        }
        self.settle(s, w);
    }

    /// Stops `s`: its unopened waves never start.
    pub(super) fn halt(&mut self, s: usize, reason: String) {
        let sp = &self.r.plan.services[s];
        let left: Vec<Arc<str>> = sp.waves[self.svcs[s].next_wave..]
            .iter()
            .flat_map(|w| &w.steps)
            .map(|st| st.host.clone())
            .collect();
        self.give_up(s, &left);
        self.end_service(s, ServiceOutcome::Halted, Some(reason));
    }

    /// `s` can never start: every step is left undone.
    pub(super) fn block(&mut self, s: usize, reason: String) {
        let sp = &self.r.plan.services[s];
        let left: Vec<Arc<str>> = sp.each_step().map(|st| st.host.clone()).collect();
        self.give_up(s, &left);
        self.svcs[s].started = true;
        self.end_service(s, ServiceOutcome::Blocked, Some(reason));
    }

    pub(super) fn give_up(&mut self, s: usize, hosts: &[Arc<str>]) {
        for name in hosts {
            if let Some(&h) = self.host_index.get(name) {
                self.hosts[h].broken.insert(s);
                self.host_step_over(h);
            }
        }
        self.svcs[s].not_started += hosts.len();
    }

    pub(super) fn end_service(
        &mut self,
        s: usize,
        outcome: ServiceOutcome,
        reason: Option<String>,
    ) {
        self.list_left(s);
        self.let_go_kept(s);
        let svc = &mut self.svcs[s];
        svc.finished = Some(outcome);
        let (succeeded, failed, not_started) = (svc.succeeded, svc.failed, svc.not_started);
        let has_steps = self.r.plan.services[s]
            .waves
            .iter()
            .any(|w| !w.steps.is_empty());
        if has_steps {
            self.emit(EventKind::ServiceFinished {
                service: self.r.plan.services[s].name.clone(),
                outcome,
                reason,
                succeeded,
                failed,
                not_started,
            });
        }
    }

    pub(super) fn summary(&self) -> Summary {
        let plan = &self.r.plan;
        let mut sum = Summary {
            released: self.released.clone(),
            refused: self.refused.clone(),
            ..Summary::default()
        };
        for (s, svc) in self.svcs.iter().enumerate() {
            sum.succeeded += svc.succeeded;
            sum.failed += svc.failed;
            sum.not_started += svc.not_started;
            sum.skipped += svc.skipped;
            sum.kinds.add_all(&svc.kinds);
            // Hosts left alone: those its plan skipped (made before the run, or during it once
            // its hosts were read), then its unread steps that ended without a hook.
            for k in &plan.services[s].skipped {
                let unreadable = self.host_index.get(&k.host).is_some_and(|&h| {
                    matches!(
                        plan.hosts[h].observed,
                        crate::state::Observed::Unreadable { .. }
                    )
                });
                sum.skips.add(k.reason, unreadable);
            }
            sum.skips.converged += svc.skipped;
            sum.skips.unreadable += svc.unreadable;
            sum.skips.unreachable += svc.unreachable.saturating_sub(svc.unreadable);
            if svc.finished.is_none() {
                // Its steps not counted yet (each step is counted once, whatever ended it).
                sum.not_started += plan.services[s].steps().saturating_sub(
                    svc.succeeded + svc.failed + svc.not_started + svc.skipped + svc.unreachable,
                );
            }
        }
        let mut unreachable = plan
            .services
            .iter()
            .flat_map(|s| &s.skipped)
            .filter(|k| k.reason == SkipReason::Unreachable)
            .map(|k| k.host.clone())
            .collect::<HashSet<_>>();
        unreachable.extend(
            self.unreachable_hosts
                .iter()
                .map(|&h| plan.hosts[h].name.clone()),
        );
        sum.unreachable = unreachable.len();
        sum.unreadable = plan
            .hosts
            .iter()
            .enumerate()
            .filter(|(h, ph)| {
                self.unreadable_hosts.contains(h)
                    || (matches!(ph.observed, crate::state::Observed::Unreadable { .. })
                        && unreachable.contains(&ph.name))
            })
            .count();
        // A dependent's reconfigure while a needed service's wave ran that failed.
        sum.failed += self.repoints.failures.len();
        sum.failures = self
            .hosts
            .iter()
            .enumerate()
            .flat_map(|(h, st)| st.failed.iter().map(move |s| (h, *s)))
            .map(|(h, s)| Failure {
                host: plan.hosts[h].name.to_string(),
                service: plan.services[s].name.clone(),
                log: self
                    .r
                    .log_dir
                    .join(&*plan.hosts[h].name)
                    .join(format!("{}.log", plan.services[s].name))
                    .display()
                    .to_string(),
            })
            .collect();
        sum.failures.extend(self.repoints.failures.iter().cloned());
        // The removals: one that failed counts as a failed step, one not tried as not started.
        sum.removed = self.removals.removed;
        sum.failed += self.removals.failures.len();
        sum.not_started += self.removals.not_started;
        sum.failures.extend(self.removals.failures.iter().cloned());
        sum.removals_left = self.removals.left.clone();
        sum.failures.extend(self.reverts.failures.iter().cloned());
        sum.reverted = self.reverts.reverted;
        sum.not_reverted = self.reverts.not_reverted;
        sum.failures.sort();
        sum.kinds.skipped = sum.skips.total();
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.emit(EventKind::RunFinished {
            converged: sum.converged(),
            succeeded: sum.succeeded,
            failed: sum.failed,
            not_started: sum.not_started,
            skipped: sum.skipped,
            unreachable: sum.unreachable,
            unreadable: sum.unreadable,
            refused: sum.refused.len(),
            reverted: sum.reverted,
            not_reverted: sum.not_reverted,
            kinds: sum.kinds,
            skips: sum.skips,
            ms,
        });
        sum
    }
}
