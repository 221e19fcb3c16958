//! Services planned during the run ([`Planning`](super::super::Planning)): a new plan takes
//! the place of the placeholders of the services it plans, and the hosts read for it start
//! from what was read; a refused lock stops everything not started.

use super::super::event::EventKind;
use super::super::{record_of, Planned};
use super::{job_of, Scheduler};
use crate::plan::Plan;
use crate::state::Observed;
use crate::transport::Transport;
use std::sync::Arc;

impl<T: Transport> Scheduler<T> {
    /// What the caller sent (`None`: it has nothing more to send).
    pub(super) fn planned(&mut self, update: Option<Planned>) {
        match update {
            None => {
                self.updates = None;
                // Left unplanned: their hosts were not all read (the run stopped, or a lock
                // was refused first).
                for s in 0..self.svcs.len() {
                    if !self.svcs[s].planned && self.svcs[s].finished.is_none() {
                        self.block(s, "not planned: its hosts were not all read".into());
                    }
                }
            }
            Some(Planned::Refused { host, reason }) => {
                self.emit(EventKind::Refused {
                    host: host.clone(),
                    reason: reason.clone(),
                });
                self.refused.push((host, reason));
            }
            Some(Planned::Plan { plan, ready }) => self.replan(&plan, &ready),
        }
    }

    /// Plans the services of `ready` from `new`. The services planned already keep the plan
    /// they run under (the same: a service's part of the plan is made from its own hosts and
    /// its needs' alone, read before it was planned).
    fn replan(&mut self, new: &Plan, ready: &[usize]) {
        let old = self.r.plan.clone();
        let same = new.services.len() == old.services.len()
            && new.hosts.len() == old.hosts.len()
            && new
                .services
                .iter()
                .zip(&old.services)
                .all(|(a, b)| a.name == b.name)
            && new
                .hosts
                .iter()
                .zip(&old.hosts)
                .all(|(a, b)| a.name == b.name);
        if !same {
            // Not a plan of this run's site and hosts: nothing in it can be trusted.
            return;
        }
        let newly: Vec<usize> = ready
            .iter()
            .copied()
            .filter(|&s| {
                s < self.svcs.len() && !self.svcs[s].planned && self.svcs[s].finished.is_none()
            })
            .collect();
        let mut merged = new.clone();
        for (s, sp) in merged.services.iter_mut().enumerate() {
            if !newly.contains(&s) {
                *sp = old.services[s].clone();
            }
        }
        // A host read since: no step ran there (none was planned), so it starts from what was
        // read. Hosts read before keep what their steps made of their record.
        for (h, host) in merged.hosts.iter_mut().enumerate() {
            if old.hosts[h].observed != Observed::Unread {
                host.observed = old.hosts[h].observed.clone();
            } else if host.observed != Observed::Unread {
                self.hosts[h].read =
                    matches!(host.observed, Observed::Running { .. } | Observed::Fresh);
                self.hosts[h].record = record_of(&host.observed);
            }
        }
        let state_dir = self.r.site.platform.host_state_dir();
        for &s in &newly {
            // Its placeholders give way to its steps, host by host.
            for st in old.services[s].waves.iter().flat_map(|w| &w.steps) {
                if let Some(&h) = self.host_index.get(&st.host) {
                    self.hosts[h].steps_left = self.hosts[h].steps_left.saturating_sub(1);
                }
            }
            let sp = &merged.services[s];
            for st in sp.waves.iter().flat_map(|w| &w.steps) {
                if let Some(&h) = self.host_index.get(&st.host) {
                    self.hosts[h].steps_left += 1;
                }
            }
            let svc = &mut self.svcs[s];
            svc.job = job_of(&self.r, &merged, sp, &state_dir);
            svc.healthy = merged.healthy_before(sp);
            svc.planned = true;
        }
        let merged = Arc::new(merged);
        self.r.plan = merged.clone();
        for &s in &newly {
            let sp = &merged.services[s];
            let steps = sp.steps();
            // As a service planned before the run, one with nothing to do says nothing.
            if steps == 0 {
                continue;
            }
            self.emit(EventKind::ServicePlanned {
                service: sp.name.clone(),
                waves: sp.waves.len(),
                steps,
                skipped: sp.skipped.len(),
            });
            if !sp.waits_for.is_empty() {
                self.emit(EventKind::ServiceWaiting {
                    service: sp.name.clone(),
                    waits_for: sp.waits_for.clone(),
                });
            }
        }
    }
}
