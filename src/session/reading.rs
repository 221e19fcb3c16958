//! Reading, while the run goes on, the hosts left unread before it, and planning each service
//! as soon as every host it is planned from has been read (level 1 of "connecting each host
//! once", book: design decisions): the [`Planning`] the rollout is handed. The services whose
//! hosts were read before the run start at once; the others' connections and locks overlap
//! their switch-overs.

use super::locking::RunLink;
use super::{Locked, RunTransport};
use crate::desired::Desired;
use crate::inventory::{HostId, Hosts};
use crate::plan::{Plan, Selection};
use crate::rollout::{Cancel, LockAtStep, Planned, Planning};
use crate::site::{IdVec, Site};
use crate::state::Observed;
use crate::transport::{Link, Target, Transport};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

/// Hosts locked and read at once during the run: enough that the last host of a tier is read
/// soon (a service started before its plan steps each host once read, and the tier's end
/// waits for its last), few enough that the hosts of the services planned first are read
/// first. 96 against 32 (book: appendix-measurements, "Services started before they are planned"):
/// db switches a little later, the last api host is read 2 s sooner.
const READ_AHEAD: usize = 96;

/// What a [`Planning`]'s plans are made from.
pub struct Planner {
    pub site: Arc<Site>,
    pub hosts: Arc<Hosts>,
    pub desired: Arc<Desired>,
    pub selection: Selection,
}

impl Locked {
    /// Per service of `plan` (by index): not planned yet, since some host it is planned from
    /// was left unread for the run to read as it goes ([`super::Session::lock`] under
    /// `--max-connections` with `--yes`). Empty when every service is planned.
    pub fn not_planned(&self, site: &Site, hosts: &Hosts, plan: &Plan) -> Vec<bool> {
        if !self.plans_as_read {
            return Vec::new();
        }
        // Not this run's hosts: nothing can be planned from them, and no placeholder may run.
        if plan.hosts.len() != hosts.hosts.len() {
            return vec![true; plan.services.len()];
        }
        let pending: Vec<bool> = planned_from(site, hosts, plan)
            .iter()
            .map(|f| {
                f.iter()
                    .any(|&h| plan.hosts[h.index()].observed == Observed::Unread)
            })
            .collect();
        if pending.contains(&true) {
            pending
        } else {
            Vec::new()
        }
    }

    /// Starts reading the hosts left unread, in the order of the services planned from them,
    /// and returns where the `pending` services' plans ([`Locked::not_planned`]) will come
    /// from. `None` when none is pending; never `None` when one is: a pending service's
    /// placeholders must not run as steps.
    pub fn plan_as_read(
        &mut self,
        planner: Planner,
        plan: &Plan,
        pending: Vec<bool>,
    ) -> Option<Planning> {
        let Planner {
            site,
            hosts,
            desired,
            selection,
        } = planner;
        if !pending.contains(&true) {
            return None;
        }
        let (tx, updates) = tokio::sync::mpsc::unbounded_channel();
        let observed: Vec<Observed> = plan.hosts.iter().map(|h| h.observed.clone()).collect();
        let from = planned_from(&site, &hosts, plan);
        let (Some(lock), Some(transport), true, true) = (
            self.lock_at_step(),
            self.transport().cloned(),
            from.len() == pending.len(),
            observed.len() == hosts.hosts.len(),
        ) else {
            // Nothing can read them: the services not planned end blocked (the channel is
            // closed), and their placeholders never run as steps.
            drop(tx);
            return Some(Planning { pending, updates });
        };
        let mut order = Vec::new();
        let mut seen: IdVec<HostId, bool> = vec![false; observed.len()].into();
        for &h in from.iter().flatten() {
            if observed[h.index()] == Observed::Unread && !std::mem::replace(&mut seen[h], true) {
                order.push(h);
            }
        }
        let reader = Reader {
            site,
            hosts,
            desired,
            selection,
            lock,
            transport,
            cancel: self.held.core.cancel.clone(),
            say: self.held.core.say.clone(),
        };
        let task =
            self.held
                .core
                .runtime
                .spawn(reader.run(order, observed, from, pending.clone(), tx));
        self.held.reader = Some(task);
        Some(Planning { pending, updates })
    }
}

/// Per service of `plan` (by index): the hosts it is planned from.
fn planned_from(site: &Site, hosts: &Hosts, plan: &Plan) -> Vec<Vec<HostId>> {
    plan.services
        .iter()
        .map(|s| {
            site.service(&s.name)
                .map(|sid| crate::plan::planned_from(site, hosts, sid))
                .unwrap_or_default()
        })
        .collect()
}

/// Reads the hosts and makes the plans.
struct Reader {
    site: Arc<Site>,
    hosts: Arc<Hosts>,
    desired: Arc<Desired>,
    selection: Selection,
    /// Takes this run's lock on a host and reads its state, in one command.
    lock: Arc<dyn LockAtStep<RunLink>>,
    transport: RunTransport,
    cancel: Cancel,
    say: super::Say,
}

impl Reader {
    /// Reads `order`, [`READ_AHEAD`] at a time; after each host, says what it was read to run
    /// (a service started before its plan steps it from then on) and plans the services whose
    /// hosts are all read. Stops starting reads once a lock is refused, the run is stopping
    /// or the rollout is over, but lets every read started end: a host it locks is then
    /// known to the fleet's lock.
    async fn run(
        self,
        order: Vec<HostId>,
        mut observed: Vec<Observed>,
        from: Vec<Vec<HostId>>,
        mut pending: Vec<bool>,
        tx: UnboundedSender<Planned>,
    ) {
        let this = Arc::new(self);
        let mut reads = JoinSet::new();
        let mut next = order.into_iter();
        let mut refused = false;
        loop {
            while reads.len() < READ_AHEAD && !refused && !tx.is_closed() && !this.cancel.stopping()
            {
                let Some(h) = next.next() else {
                    break;
                };
                let r = this.clone();
                reads.spawn(async move { (h, r.read(h).await) });
            }
            let Some(done) = reads.join_next().await else {
                break;
            };
            let Ok((h, result)) = done else {
                continue;
            };
            match result {
                Ok(o) => {
                    // As before the run: left alone, neither read nor changed.
                    if let Observed::Unreachable { .. } = &o {
                        (this.say)(&format!(
                            "warning: not locked, since they do not answer: {}",
                            this.hosts.hosts[h].name
                        ));
                    }
                    // A service started before it is planned steps the host from now on.
                    let _ = tx.send(Planned::Read {
                        host: this.hosts.hosts[h].name.clone(),
                        observed: o.clone(),
                    });
                    observed[h.index()] = o;
                }
                Err(reason) => {
                    refused = true;
                    let host = this.hosts.hosts[h].name.to_string();
                    let _ = tx.send(Planned::Refused { host, reason });
                    continue;
                }
            }
            if refused {
                continue;
            }
            let ready: Vec<usize> = (0..pending.len())
                .filter(|&s| {
                    pending[s]
                        && from[s]
                            .iter()
                            .all(|&h| observed[h.index()] != Observed::Unread)
                })
                .collect();
            if ready.is_empty() {
                continue;
            }
            let planned = crate::plan::plan(
                &this.site,
                &this.hosts,
                &observed,
                &this.desired,
                &this.selection,
            );
            let Ok(plan) = planned else {
                break;
            };
            for &s in &ready {
                pending[s] = false;
            }
            let _ = tx.send(Planned::Plan {
                plan: Arc::new(plan),
                ready,
            });
        }
        // Whatever is still running ends before the locks can be given back.
        while reads.join_next().await.is_some() {}
    }

    /// Connects to host `h`, locks it and reads its state in one command; its link is kept
    /// for its steps. `Err`: why its lock was refused.
    async fn read(&self, h: HostId) -> Result<Observed, String> {
        let host = &self.hosts.hosts[h];
        let target = Target {
            name: host.name.to_string(),
            address: host.address.to_string(),
        };
        let link = match self.transport.connect(&target).await {
            Ok(link) => link,
            Err(e) => {
                return Ok(Observed::Unreachable {
                    reason: format!("not locked: {e}"),
                })
            }
        };
        // Its steps' commands go over this link too (the kept shell).
        link.prepare().await;
        // The session's lock, as an unread step takes it: a lock taken over is said there.
        let taken = self.lock.lock_and_read(&link, &target).await;
        match &taken {
            Ok(Observed::Running { .. } | Observed::Fresh | Observed::Unreadable { .. }) => {
                self.transport.park(&target.name, link).await
            }
            _ => link.close().await,
        }
        Ok(match taken? {
            Observed::Unreachable { reason } => Observed::Unreachable {
                reason: format!("not locked: {reason}"),
            },
            o => o,
        })
    }
}
