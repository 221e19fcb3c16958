//! Waits that would go round, found as the run goes ([`crate::plan::go_round`]): the plan's
//! own are dropped from the start; those that only show once hosts are read during the run
//! (an unread step's waits, a service planned then) are dropped when they show, and said.

use super::super::event::EventKind;
use super::{Scheduler, Svc};
use crate::plan::{Progress, StepKind, WaitKey};
use crate::transport::Transport;
use std::collections::{HashMap, HashSet};

/// Where the run stands, for what may still wait.
struct Now<'a> {
    svcs: &'a [Svc],
    /// Per service, the steps of its newest open wave not launched yet.
    pending: Vec<HashSet<usize>>,
    /// The waits of unread steps on hosts read: `(service, host)` → `(service, host)`.
    more: HashMap<(usize, usize), Vec<(usize, usize)>>,
}

impl Progress for Now<'_> {
    fn to_start(&self, s: usize, w: usize, i: usize) -> bool {
        let svc = &self.svcs[s];
        svc.finished.is_none()
            && (w >= svc.next_wave || (w + 1 == svc.next_wave && self.pending[s].contains(&i)))
    }

    fn to_open(&self, s: usize, w: usize) -> bool {
        let svc = &self.svcs[s];
        svc.finished.is_none() && w >= svc.next_wave
    }

    fn start_waits_for(&self, s: usize, t: usize, count: usize) -> bool {
        !self.svcs[s].started && self.svcs[t].healthy < count && self.svcs[t].finished.is_none()
    }

    fn more_waits(&self, s: usize, h: usize) -> &[(usize, usize)] {
        self.more.get(&(s, h)).map_or(&[], Vec::as_slice)
    }

    fn has_more_waits(&self) -> bool {
        !self.more.is_empty()
    }
}

impl<T: Transport> Scheduler<T> {
    /// The plan's dropped waits, by index, each with the services of its round: none of them
    /// is waited for.
    pub(super) fn plan_drops(&self) -> HashMap<WaitKey, Vec<usize>> {
        self.r
            .plan
            .dropped_waits
            .iter()
            .filter_map(|d| Some((self.key_of(d)?, self.round_services(d))))
            .collect()
    }

    /// A dropped wait by the plan's names, by index (`None`: a name not of this run).
    pub(super) fn key_of(&self, d: &crate::plan::DroppedWait) -> Option<WaitKey> {
        let service = |n: &str| self.service_index.get(n).copied();
        let host = |n: &str| self.host_index.get(n).copied();
        Some(WaitKey {
            service: service(&d.service)?,
            host: host(&d.host)?,
            on: service(&d.waits_for.service)?,
            on_host: host(&d.waits_for.host)?,
        })
    }

    /// The services (by index) a dropped wait's round goes through, its two ends among them.
    fn round_services(&self, d: &crate::plan::DroppedWait) -> Vec<usize> {
        let names = [&d.service, &d.waits_for.service]
            .into_iter()
            .chain(d.round.iter().map(|l| &l.service));
        let mut out: Vec<usize> = names
            .filter_map(|n| self.service_index.get(&**n).copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Services `newly` were planned: the waits dropped on a round through one of them, found
    /// with their hosts not read (each counted as changing), are waited for again; the next
    /// look for rounds drops each anew if it still goes round (said once only). The plan's
    /// that are kept are given back. Rounds through the others stand as they were.
    pub(super) fn undrop_rounds_through(&mut self, newly: &[usize]) -> HashSet<WaitKey> {
        let undone: HashSet<WaitKey> = self
            .dropped
            .iter()
            .filter(|(_, services)| services.iter().any(|s| newly.contains(s)))
            .map(|(k, _)| *k)
            .collect();
        for key in &undone {
            self.dropped.remove(key);
        }
        undone
    }

    /// Whether the step of service `s` on host `h` no longer waits for that of `t` on `n`.
    pub(super) fn wait_dropped(&self, s: usize, h: usize, t: usize, n: usize) -> bool {
        self.dropped.contains_key(&WaitKey {
            service: s,
            host: h,
            on: t,
            on_host: n,
        })
    }

    /// Drops the waits that go round as the run now stands, each said once. Run whenever
    /// waits may have come to light: at the start, once a host is read, once a service is
    /// planned.
    pub(super) fn drop_rounds(&mut self) {
        if !std::mem::take(&mut self.rounds_due) {
            return;
        }
        let plan = self.r.plan.clone();
        // The unread steps on hosts read: their waits, found once.
        let mut unread = Vec::new();
        for (s, sp) in plan.services.iter().enumerate() {
            if self.svcs[s].finished.is_some() {
                continue;
            }
            for st in sp.each_step().filter(|st| st.kind == StepKind::Unread) {
                if let Some(&h) = self.host_index.get(&st.host) {
                    if self.hosts[h].read {
                        unread.push((s, h));
                    }
                }
            }
        }
        for &(s, h) in &unread {
            if !self.unread_waits.contains_key(&(s, h)) {
                let waits = self.waits_of_unread(s, h);
                self.unread_waits.insert((s, h), waits);
            }
        }
        let more = unread
            .iter()
            .filter_map(|k| Some((*k, self.unread_waits.get(k)?.clone())))
            .filter(|(_, waits)| !waits.is_empty())
            .collect();
        let now = Now {
            svcs: &self.svcs,
            pending: self
                .svcs
                .iter()
                .map(|svc| svc.pending.iter().copied().collect())
                .collect(),
            more,
        };
        let dropped: HashSet<WaitKey> = self.dropped.keys().copied().collect();
        let found = crate::plan::go_round(&plan, &now, &dropped);
        for (key, round) in found {
            let d = crate::plan::said(&plan, key, &round);
            let services = self.round_services(&d);
            self.dropped.insert(key, services);
            if !self.said_drops.insert(key) {
                continue;
            }
            self.emit(EventKind::WaitDropped {
                service: d.service.to_string(),
                host: d.host.to_string(),
                waits_for: d.waits_for.clone(),
                why: d.words(),
            });
        }
    }
}
