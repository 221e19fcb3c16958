//! The ideal schedule of a plan: how long its rollout takes with zero overhead, every step
//! exactly its host's work, under the same rules the scheduler follows (runtime conditions,
//! one step per host, same-host order, waves and `flow`, pauses). Nothing fails. A yardstick
//! for benchmarks: a real run is compared with the ideal of its own policy.

use super::budget::{flowing, Flowing};
use crate::plan::{Plan, StepKind};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

/// The makespan of `plan` when the step of `service` on `host` takes `work(service, host)`
/// and nothing else takes any time.
pub fn makespan(plan: &Plan, work: impl Fn(&str, &str) -> Duration) -> Duration {
    Sim::new(plan).run(&work)
}

struct Svc {
    started: bool,
    finished: bool,
    next_wave: usize,
    pending: Vec<usize>,
    running: usize,
    healthy: usize,
    not_before: Duration,
}

struct Sim<'p> {
    plan: &'p Plan,
    svcs: Vec<Svc>,
    busy: Vec<bool>,
    done: Vec<HashSet<usize>>,
    host_index: HashMap<&'p str, usize>,
    service_index: HashMap<&'p str, usize>,
    /// Steps running: (end, service, wave, step).
    running: BTreeSet<(Duration, usize, usize, usize)>,
    now: Duration,
}

impl<'p> Sim<'p> {
    fn new(plan: &'p Plan) -> Self {
        let svcs = plan
            .services
            .iter()
            .map(|s| Svc {
                started: false,
                finished: false,
                next_wave: 0,
                pending: Vec::new(),
                running: 0,
                // As the scheduler counts: hosts already at the version and healthy.
                healthy: plan.healthy_before(s),
                not_before: Duration::ZERO,
            })
            .collect();
        Sim {
            plan,
            svcs,
            busy: vec![false; plan.hosts.len()],
            done: vec![HashSet::new(); plan.hosts.len()],
            host_index: plan
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (&*h.name, i))
                .collect(),
            service_index: plan
                .services
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.as_str(), i))
                .collect(),
            running: BTreeSet::new(),
            now: Duration::ZERO,
        }
    }

    fn run(mut self, work: &impl Fn(&str, &str) -> Duration) -> Duration {
        loop {
            let wake = self.advance(work);
            let next_end = self.running.first().map(|r| r.0);
            let Some(at) = [next_end, wake].into_iter().flatten().min() else {
                return self.now;
            };
            self.now = self.now.max(at);
            while let Some(&first) = self.running.first() {
                if first.0 > self.now {
                    break;
                }
                self.running.remove(&first);
                self.finish(first.1, first.2, first.3);
            }
        }
    }

    /// Starts what may start now; when to look again for a pause that has not run out.
    fn advance(&mut self, work: &impl Fn(&str, &str) -> Duration) -> Option<Duration> {
        let mut wake: Option<Duration> = None;
        let mut changed = true;
        while changed {
            changed = false;
            for s in 0..self.svcs.len() {
                if self.svcs[s].finished {
                    continue;
                }
                if !self.svcs[s].started {
                    if !self.may_start(s) {
                        continue;
                    }
                    self.svcs[s].started = true;
                    changed = true;
                }
                let svc = &self.svcs[s];
                if svc.pending.is_empty() && (svc.running == 0 || self.flows(s)) {
                    if svc.not_before > self.now {
                        wake = Some(wake.map_or(svc.not_before, |w| w.min(svc.not_before)));
                        continue;
                    }
                    changed |= self.open_wave(s);
                }
                changed |= self.launch(s, work);
            }
        }
        wake
    }

    fn may_start(&self, s: usize) -> bool {
        self.plan.services[s].waits_for.iter().all(|c| {
            self.service_index
                .get(c.service.as_str())
                .is_none_or(|&t| self.svcs[t].healthy >= c.count)
        })
    }

    fn flows(&self, s: usize) -> bool {
        let sp = &self.plan.services[s];
        let svc = &self.svcs[s];
        let Some(newest) = svc.next_wave.checked_sub(1) else {
            return false;
        };
        let open = svc.next_wave < sp.waves.len()
            && svc.running < sp.policy.batch_hosts
            && !sp.waves[newest].canary;
        open && match flowing(&sp.policy) {
            Some(Flowing::Slots { .. }) => true,
            Some(Flowing::Budget { limit }) => svc.running <= limit,
            None => false,
        }
    }

    fn open_wave(&mut self, s: usize) -> bool {
        let sp = &self.plan.services[s];
        let svc = &mut self.svcs[s];
        if svc.next_wave >= sp.waves.len() {
            svc.finished = svc.running == 0;
            return svc.finished;
        }
        svc.pending = (0..sp.waves[svc.next_wave].steps.len()).collect();
        svc.next_wave += 1;
        true
    }

    fn launch(&mut self, s: usize, work: &impl Fn(&str, &str) -> Duration) -> bool {
        let Some(w) = self.svcs[s].next_wave.checked_sub(1) else {
            return false;
        };
        let sp = &self.plan.services[s];
        let size = sp.waves[w].steps.len();
        let slots = sp.policy.batch_hosts.max(size);
        let mut launched = false;
        let mut still = Vec::new();
        for i in std::mem::take(&mut self.svcs[s].pending) {
            let st = &sp.waves[w].steps[i];
            let Some(&h) = self.host_index.get(&*st.host) else {
                continue;
            };
            let after_done = st.after.iter().all(|a| {
                self.service_index
                    .get(&**a)
                    .is_none_or(|t| self.done[h].contains(t))
            });
            // But for the waits the plan drops as they would go round.
            let dropped = |x: &crate::plan::HostStep| {
                self.plan
                    .dropped_waits
                    .iter()
                    .any(|d| *d.service == *sp.name && d.host == st.host && d.waits_for == *x)
            };
            let waited = st.waits.iter().all(|x| {
                dropped(x)
                    || match (
                        self.service_index.get(&*x.service),
                        self.host_index.get(&*x.host),
                    ) {
                        (Some(t), Some(&n)) => self.done[n].contains(t),
                        _ => true,
                    }
            });
            if self.busy[h] || !after_done || !waited || self.svcs[s].running >= slots {
                still.push(i);
                continue;
            }
            self.busy[h] = true;
            self.svcs[s].running += 1;
            let end = self.now + work(&sp.name, &st.host);
            self.running.insert((end, s, w, i));
            launched = true;
        }
        self.svcs[s].pending = still;
        launched
    }

    fn finish(&mut self, s: usize, w: usize, i: usize) {
        let sp = &self.plan.services[s];
        let st = &sp.waves[w].steps[i];
        if let Some(&h) = self.host_index.get(&*st.host) {
            self.busy[h] = false;
            self.done[h].insert(s);
        }
        let svc = &mut self.svcs[s];
        svc.running -= 1;
        if st.kind != StepKind::Reconfigure {
            svc.healthy += 1;
        }
        // A wave that has ended, with another to come: its pause runs from now.
        let wave_over = svc.running == 0 && svc.pending.is_empty();
        if wave_over && svc.next_wave < sp.waves.len() {
            let pause = match sp.policy.pause {
                crate::site::Pause::Wait(d) => d,
                crate::site::Pause::Confirm => std::time::Duration::ZERO,
            };
            svc.not_before = self.now + pause;
        }
    }
}
