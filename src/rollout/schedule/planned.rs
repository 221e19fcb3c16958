//! Services planned during the run ([`Planning`](super::super::Planning)): a new plan takes
//! the place of the placeholders of the services it plans, and the hosts read for it start
//! from what was read; a service whose needs hold first starts under its placeholders, each
//! stepped once its host is read; a refused lock stops everything not started.

use super::super::event::EventKind;
use super::super::{record_of, Planned};
use super::{job_of, Scheduler};
use crate::plan::{Plan, StepKind};
use crate::state::Observed;
use crate::transport::Transport;
use std::collections::{HashMap, HashSet};
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
                // Steps of services started before they were planned, on hosts never read:
                // they end at once, their hosts left alone.
                for host in self.hosts.iter_mut().filter(|h| h.awaiting) {
                    host.awaiting = false;
                    host.unread_reason = Some("not read: the run stopped reading hosts".into());
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
            Some(Planned::Read { host, observed }) => {
                if let Some(&h) = self.host_index.get(&host) {
                    self.host_read(h, &observed);
                }
            }
        }
    }

    /// Host `h`, left for the caller to read, was read: its unread steps may start, from what
    /// it runs, and where it runs a service started before it was planned healthy with no
    /// step of it (not selected), it counts for what needs that service. Said once: a host
    /// read before, or stepped already, keeps its record.
    fn host_read(&mut self, h: usize, observed: &Observed) {
        let host = &mut self.hosts[h];
        if !host.awaiting {
            return;
        }
        match observed {
            Observed::Unread => return,
            Observed::Running { .. } | Observed::Fresh => {
                host.read = true;
                host.record = record_of(observed);
                // Its unread steps' waits are known now.
                self.rounds_due = true;
            }
            Observed::Unreachable { reason } => {
                host.unread_reason = Some(format!("does not answer: {reason}"));
            }
            Observed::Unreadable { reason } => {
                host.unread_reason = Some(format!("state unreadable: {reason}"));
            }
        }
        host.awaiting = false;
        if self.may_repoint(h) {
            self.hosts[h].steps_left += 1;
        }
        for s in 0..self.svcs.len() {
            if self.svcs[s].early && self.healthy_here(s, h) {
                self.svcs[s].healthy += 1;
            }
        }
    }

    /// Whether service `s`, not planned yet, may start under its placeholders once its needs
    /// hold: its hosts are still being read (a caller that cannot read them closes the
    /// channel at once: nothing may run then), and its policy and needs allow it
    /// ([`crate::plan::may_start_early`]: not when its steps may wait for a service that may
    /// wait for it in turn, since its placeholders' waves are not ordered by what they wait
    /// for, which is only known once read).
    /// Once none of its own hosts is left to read, its plan is on its way (or waits only for
    /// the hosts of what it needs): it waits for that plan.
    pub(super) fn may_start_unplanned(&self, s: usize) -> bool {
        self.updates.as_ref().is_some_and(|u| !u.is_closed())
            && self.early[s]
            && self.awaiting_steps(s).next().is_some()
    }

    /// Service `s`'s steps that are placeholders on hosts the caller still reads.
    fn awaiting_steps(&self, s: usize) -> impl Iterator<Item = &crate::plan::Step> {
        self.r.plan.services[s].each_step().filter(|st| {
            st.kind == StepKind::Unread
                && self
                    .host_index
                    .get(&st.host)
                    .is_some_and(|&h| self.hosts[h].awaiting)
        })
    }

    /// Service `s` starts before it is planned: its placeholders are its steps, each decided
    /// once its host is read; said as a plan is.
    pub(super) fn start_unplanned(&mut self, s: usize) {
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let unread = self.awaiting_steps(s).count();
        // Its hosts read since the plan was made, with no step of it (not selected): counted
        // from what they were read to run, as a plan made now would.
        let read_since = (0..self.hosts.len())
            .filter(|&h| plan.hosts[h].observed == Observed::Unread && self.healthy_here(s, h))
            .count();
        let svc = &mut self.svcs[s];
        svc.planned = true;
        svc.early = true;
        svc.healthy = plan.healthy_before(sp) + read_since;
        let steps = sp.steps();
        if steps > 0 {
            self.emit(EventKind::ServicePlanned {
                service: sp.name.clone(),
                waves: sp.waves.len(),
                steps,
                skipped: sp.skipped.len(),
                unread: Some(unread),
            });
        }
    }

    /// Whether host `h`, read, runs service `s` healthy at its version with no step of it
    /// this run: one more healthy host for what needs `s`.
    fn healthy_here(&self, s: usize, h: usize) -> bool {
        let sp = &self.r.plan.services[s];
        self.hosts[h].read
            && !self.stepping.contains(&(s, h))
            && sp.runs_on(&self.r.plan.hosts[h])
            && sp.healthy_in(self.hosts[h].record.services.get(&sp.name))
    }

    /// Whether the unread step of service `s` on host `h` may start: once its host is read,
    /// the needed services' steps on the hosts its pools add to the host have ended, as a
    /// step planned from a host read before the run waits for them ([`crate::plan::Step::waits`]).
    /// A host not read yet (read at its step) has nothing known to wait for.
    pub(super) fn unread_waited(&mut self, s: usize, h: usize) -> bool {
        if !self.hosts[h].read {
            return true;
        }
        if !self.unread_waits.contains_key(&(s, h)) {
            let waits = self.waits_of_unread(s, h);
            self.unread_waits.insert((s, h), waits);
        }
        self.unread_waits.get(&(s, h)).is_none_or(|waits| {
            waits
                .iter()
                .all(|&(t, n)| self.step_ended(t, n) || self.wait_dropped(s, h, t, n))
        })
    }

    pub(super) fn waits_of_unread(&self, s: usize, h: usize) -> Vec<(usize, usize)> {
        let site = &self.r.site;
        let name = &self.r.plan.services[s].name;
        let Some(sid) = site.service(name) else {
            return Vec::new();
        };
        let record = self.hosts[h].record.services.get(name);
        let mut out = Vec::new();
        for (x, added) in
            crate::plan::unread_waits(site, &self.r.desired, &self.closure, sid, record)
        {
            let Some(&t) = self.service_index.get(&site.services[x].name) else {
                continue;
            };
            for n in added.iter().filter_map(|a| self.host_index.get(a.as_str())) {
                if self.stepping.contains(&(t, *n)) {
                    out.push((t, *n));
                }
            }
        }
        out
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
        // Not a service started under its placeholders meanwhile: its steps run as they are.
        let newly: Vec<usize> = ready
            .iter()
            .copied()
            .filter(|&s| {
                s < self.svcs.len() && !self.svcs[s].planned && self.svcs[s].finished.is_none()
            })
            .collect();
        let mut merged = new.clone();
        // Whether the run carries out removals is the run's, not the new plan's.
        merged.prune = old.prune;
        for (s, sp) in merged.services.iter_mut().enumerate() {
            if !newly.contains(&s) {
                *sp = old.services[s].clone();
            }
        }
        // A host read since starts from what was read, unless its read was said already
        // ([`Planned::Read`]: its steps may have run since). Hosts read before keep what their
        // steps made of their record.
        for (h, host) in merged.hosts.iter_mut().enumerate() {
            if old.hosts[h].observed != Observed::Unread {
                host.observed = old.hosts[h].observed.clone();
            } else {
                self.host_read(h, &host.observed);
            }
        }
        let state_dir = self.r.site.platform.host_state_dir();
        for &s in &newly {
            // Its placeholders give way to its steps, host by host.
            for st in old.services[s].each_step() {
                if let Some(&h) = self.host_index.get(&st.host) {
                    self.hosts[h].steps_left = self.hosts[h].steps_left.saturating_sub(1);
                }
            }
            let sp = &merged.services[s];
            for st in sp.each_step() {
                if let Some(&h) = self.host_index.get(&st.host) {
                    self.hosts[h].steps_left += 1;
                }
            }
            let svc = &mut self.svcs[s];
            let cancel = svc.job.cancel.clone();
            svc.job = job_of(&self.r, &merged, sp, &state_dir, cancel);
            svc.healthy = merged.healthy_before(sp);
            svc.planned = true;
        }
        self.stepping = stepping(&merged, &self.host_index);
        // Dropped waits are the engine's own from here: those of the new plan are about
        // services this run does not take from it. Those on a round through a service planned
        // now were found with its hosts not read, which count as changing (a round through a
        // need's `healthy=` that a host read healthy dissolves): they are waited for again,
        // and dropped anew by the next look for rounds only if they still go round.
        let undone = self.undrop_rounds_through(&newly);
        merged.dropped_waits = old
            .dropped_waits
            .iter()
            .filter(|d| self.key_of(d).is_none_or(|k| !undone.contains(&k)))
            .cloned()
            .collect();
        self.rounds_due = true;
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
                unread: None,
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

impl<T: Transport> Scheduler<T> {
    /// Whether service `t`'s step on host `n` has ended, however it ended, or there is none.
    pub(super) fn step_ended(&self, t: usize, n: usize) -> bool {
        self.hosts[n].done.contains(&t) || self.hosts[n].broken.contains(&t) || self.no_step(t, n)
    }

    /// Whether service `t`, started before it was planned, has a host still being read by the
    /// caller with no step of it there: found healthy, it would count ([`Self::host_read`]).
    pub(super) fn being_read(&self, t: usize) -> bool {
        let sp = &self.r.plan.services[t];
        self.svcs[t].early
            && self
                .hosts
                .iter()
                .zip(&self.r.plan.hosts)
                .enumerate()
                .any(|(n, (h, p))| h.awaiting && !self.stepping.contains(&(t, n)) && sp.runs_on(p))
    }

    /// Whether service `t` is planned with no step on host `n`: a step planned before the run
    /// may name a placeholder of `t` there (a host not read counts as changing), which the
    /// plan made once the host was read dropped (the host needed nothing).
    pub(super) fn no_step(&self, t: usize, n: usize) -> bool {
        self.svcs[t].planned && !self.stepping.contains(&(t, n))
    }
}

/// Which service (by index) has a step on which host (by index) in `plan`.
pub(super) fn stepping(
    plan: &crate::plan::Plan,
    host_index: &HashMap<Arc<str>, usize>,
) -> HashSet<(usize, usize)> {
    let mut out = HashSet::new();
    for (s, sp) in plan.services.iter().enumerate() {
        for st in sp.each_step() {
            if let Some(&h) = host_index.get(&st.host) {
                out.insert((s, h));
            }
        }
    }
    out
}
