//! A revert whose service hands its addresses to dependents (`needs … addressable=`, or
//! `drain=#true`) goes by batches, so that no dependent points where a host does not serve while
//! it is switched back: `batch` hosts at a time (the next ones to switch back), each
//! dependent's host that lists one of them elsewhere than it will serve once back (its record
//! before the run says where), or lists it at all under `drain=#true` (a revert stops the
//! service), drops it first; the batch's reverts start once those reconfigures ended; once they
//! are over, the hosts are listed again where their records say they serve. These are the
//! reconfigures of [`super::draining`], keyed by batch past the plan's waves.
//!
//! A dependent's host that could not drop a host leaves that host as it is (not reverted,
//! said in the service's end); a dependent's host not read by the run is not reconfigured.

use super::draining::recorded_member;
use super::reverting::Switched;
use super::Scheduler;
use crate::site::OnFailure;
use crate::state::member_of;
use crate::transport::Transport;
use std::sync::Arc;

/// A revert's batch under way.
pub(super) struct Batch {
    /// Its key among the dependents' reconfigures: past the plan's waves of the service.
    key: usize,
    /// Its hosts, and those whose revert has not started, the next one first.
    hosts: Vec<usize>,
    waiting: Vec<Switched>,
}

impl Batch {
    /// Its hosts.
    pub(super) fn hosts(&self) -> &[usize] {
        &self.hosts
    }

    /// How many of its hosts have not started their revert.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// The hosts of a revert's batch that a dependent's host whose `needs:` entry is `entry` must
/// drop before they are switched back: those it lists elsewhere than they will serve (`back`:
/// each host with where it served before the run, `None` if its record did not say), and with
/// `drain`, every one it lists.
fn to_drop_back(back: &[(Arc<str>, Option<String>)], entry: &str, drain: bool) -> Vec<Arc<str>> {
    back.iter()
        .filter(|(host, then)| {
            member_of(entry, host).is_some_and(|listed| drain || then.as_deref() != Some(listed))
        })
        .map(|(host, _)| host.clone())
        .collect()
}

impl<T: Transport> Scheduler<T> {
    /// Whether a revert of `x` may have to reconfigure its dependents: one drains it, or a
    /// step of it may move its host to another port or address. Asked before the run, while
    /// the hosts' records are those the run found ([`Self::hold_for_reverts`]).
    fn revert_repoints(&self, x: usize) -> bool {
        self.dependents[x].iter().any(|(_, drain)| *drain)
            || (!self.dependents[x].is_empty()
                && self.r.plan.services[x]
                    .each_step()
                    .any(|st| self.may_move(x, st)))
    }

    /// Before the run: the services under `on-failure "revert"` whose revert may reconfigure
    /// their dependents are switched back by batches, and their dependents' hosts keep their
    /// lock to the run's end, as the service's own hosts do.
    pub(super) fn hold_for_reverts(&mut self) {
        let plan = self.r.plan.clone();
        for (x, xs) in plan.services.iter().enumerate() {
            if xs.policy.on_failure != OnFailure::Revert || !self.revert_repoints(x) {
                continue;
            }
            self.reverts.batched.insert(x);
            for &(d, _) in &self.dependents[x] {
                let ds = &plan.services[d];
                let hosts = plan
                    .hosts
                    .iter()
                    .enumerate()
                    .filter(|(_, ph)| ds.runs_on(ph));
                self.reverts.hosts.extend(hosts.map(|(h, _)| h));
            }
        }
    }

    /// Moves the revert of `s` on by batches, each once the dependents' reconfigures before it
    /// ended: opens the next one (its hosts dropped), starts its reverts once the drops ended,
    /// and has every dependent's host list the service's hosts where they serve once its
    /// reverts are over. With none to switch back, the dependents are given where the hosts
    /// serve all the same (a wave may have left them dropped).
    pub(super) fn batch_reverts(&mut self, s: usize) {
        let size = self.r.plan.services[s].policy.batch_hosts.max(1);
        loop {
            let stopping = self.r.cancel.stopping();
            let holding = self.repoints.holds(s);
            let busy: Vec<bool> = self.hosts.iter().map(|h| h.busy).collect();
            let Some(rv) = self.svcs[s].reverting.as_mut() else {
                return;
            };
            if let Some(b) = rv.batch.as_mut() {
                if stopping {
                    // Those not started never start: counted as not reverted.
                    rv.queue.append(&mut b.waiting);
                }
                let mut start = Vec::new();
                if !holding {
                    let (free, taken): (Vec<Switched>, Vec<Switched>) =
                        std::mem::take(&mut b.waiting)
                            .into_iter()
                            .partition(|sw| !busy[sw.host]);
                    b.waiting = taken;
                    start = free;
                }
                rv.running += start.len();
                if !b.waiting.is_empty() || rv.running > 0 {
                    for sw in start {
                        self.spawn_revert(s, sw);
                    }
                    return;
                }
                let (key, hosts) = (b.key, std::mem::take(&mut b.hosts));
                rv.batch = None;
                self.list_after_batch(s, key, &hosts);
                continue;
            }
            if stopping || holding || (rv.queue.is_empty() && rv.batches > 0) {
                return;
            }
            let n = size.min(rv.queue.len());
            let mut waiting = rv.queue.split_off(rv.queue.len() - n);
            waiting.reverse();
            let key = self.r.plan.services[s].waves.len() + rv.batches;
            rv.batches += 1;
            let hosts: Vec<usize> = waiting.iter().map(|sw| sw.host).collect();
            self.drop_for_revert(s, key, &waiting);
            if let Some(rv) = self.svcs[s].reverting.as_mut() {
                rv.batch = Some(Batch {
                    key,
                    hosts,
                    waiting,
                });
            }
        }
    }

    /// The batch's hosts are left out of every pool of `x` a dependent is given until its
    /// reverts are over; each dependent's host (read by the run, still held) that lists one
    /// where it will not serve once switched back, or drains them, drops it first.
    fn drop_for_revert(&mut self, x: usize, key: usize, batch: &[Switched]) {
        let plan = self.r.plan.clone();
        let back: Vec<(Arc<str>, Option<String>)> = batch
            .iter()
            .map(|sw| {
                let ph = &plan.hosts[sw.host];
                let then = sw
                    .before
                    .as_ref()
                    .and_then(|r| r.inputs.as_ref())
                    .map(|i| recorded_member(&ph.name, &ph.address, i).entry());
                (ph.name.clone(), then)
            })
            .collect();
        self.repoints
            .dropped
            .extend(batch.iter().map(|sw| (x, sw.host)));
        for &(d, drain) in &self.dependents[x].clone() {
            for (h, entry) in self.listing(x, d) {
                let hosts = to_drop_back(&back, &entry, drain);
                self.queue_drop(x, key, d, h, hosts);
            }
        }
    }

    /// A batch's reverts are over: every dependent's host lists the hosts of `x` where their
    /// records say they serve (a reconfigure only where that changes what it lists).
    fn list_after_batch(&mut self, x: usize, key: usize, hosts: &[usize]) {
        self.repoints.forget_wave(x, key);
        for &h in hosts {
            self.repoints.dropped.remove(&(x, h));
        }
        let names: Vec<Arc<str>> = hosts
            .iter()
            .map(|&h| self.r.plan.hosts[h].name.clone())
            .collect();
        for &(d, _) in &self.dependents[x].clone() {
            for (h, _) in self.listing(x, d) {
                self.queue_list(x, key, d, h, names.clone());
            }
        }
    }

    /// A dependent's host could not drop `hosts` of `s` before their revert: they are left as
    /// they are.
    pub(super) fn keep_unreverted(&mut self, s: usize, key: usize, hosts: &[Arc<str>]) {
        let plan = self.r.plan.clone();
        let Some(rv) = self.svcs[s].reverting.as_mut() else {
            return;
        };
        let Some(b) = rv.batch.as_mut().filter(|b| b.key == key) else {
            return;
        };
        let before = b.waiting.len();
        b.waiting
            .retain(|sw| !hosts.contains(&plan.hosts[sw.host].name));
        rv.kept += before - b.waiting.len();
    }
}

#[cfg(test)]
mod tests {
    use super::to_drop_back;
    use std::sync::Arc;

    #[test]
    fn a_host_listed_where_it_will_not_serve_once_back_is_dropped_first() {
        let back = [
            (Arc::from("app1"), Some("app1=10.0.0.1:8080".to_string())),
            (Arc::from("app2"), Some("app2=10.0.0.2:8080".to_string())),
            (Arc::from("app3"), None),
        ];
        let entry = "app1=10.0.0.1:8081 app2=10.0.0.2:8080 app3=10.0.0.3:8081 app4=10.0.0.4:8081";
        // app1 moves back to 8080; app2 serves where listed; app3's record did not say.
        assert_eq!(
            to_drop_back(&back, entry, false),
            ["app1".into(), "app3".into()] as [Arc<str>; 2]
        );
        // Under `drain=#true` every listed one: a revert stops the service.
        assert_eq!(to_drop_back(&back, entry, true).len(), 3);
        // Not listed: nothing to drop.
        assert!(to_drop_back(&back, "app4=10.0.0.4:8081", true).is_empty());
    }
}
