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
use crate::state::member_of;
use crate::transport::Transport;
use std::sync::Arc;

/// A revert's batch under way.
pub(super) struct Batch {
    /// Its key among the dependents' reconfigures: past the plan's waves of the service.
    key: usize,
    /// Its hosts whose revert has not started, the next one first.
    waiting: Vec<Switched>,
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
    /// Moves the revert of `s` on by batches: opens the next one (its dependents' drops
    /// queued), starts its reverts once the drops ended, and lists its hosts again once they
    /// are over.
    pub(super) fn batch_reverts(&mut self, s: usize) {
        let size = self.r.plan.services[s].policy.batch_hosts.max(1);
        loop {
            let stopping = self.r.cancel.stopping();
            let dropping = self.repoints.holds(s);
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
                if !dropping {
                    let (free, taken): (Vec<Switched>, Vec<Switched>) =
                        std::mem::take(&mut b.waiting)
                            .into_iter()
                            .partition(|sw| !busy[sw.host]);
                    b.waiting = taken;
                    start = free;
                }
                rv.running += start.len();
                let over = b.waiting.is_empty() && rv.running == 0;
                let key = b.key;
                if over {
                    rv.batch = None;
                }
                for sw in start {
                    self.spawn_revert(s, sw);
                }
                if !over {
                    return;
                }
                // Its hosts are back: the dependents that dropped them list them again.
                self.list_after(s, key);
                continue;
            }
            if stopping || rv.queue.is_empty() {
                return;
            }
            let n = size.min(rv.queue.len());
            let mut waiting = rv.queue.split_off(rv.queue.len() - n);
            waiting.reverse();
            let key = self.r.plan.services[s].waves.len() + rv.batches;
            rv.batches += 1;
            self.drop_for_revert(s, key, &waiting);
            if let Some(rv) = self.svcs[s].reverting.as_mut() {
                rv.batch = Some(Batch { key, waiting });
            }
        }
    }

    /// Each dependent's host (read by the run, still held) that lists hosts of `batch` where
    /// they will not serve once switched back drops them first.
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
        for &(d, drain) in &self.dependents[x].clone() {
            for (h, entry) in self.listing(x, d) {
                let hosts = to_drop_back(&back, &entry, drain);
                self.queue_drop(x, key, d, h, hosts);
            }
        }
    }

    /// A dependent's host could not drop `hosts` of `s` before their revert: they are left as
    /// they are.
    pub(super) fn keep_unreverted(&mut self, s: usize, hosts: &[Arc<str>]) {
        let plan = self.r.plan.clone();
        let Some(rv) = self.svcs[s].reverting.as_mut() else {
            return;
        };
        let Some(b) = rv.batch.as_mut() else {
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
