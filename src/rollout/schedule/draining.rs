//! A dependent's configuration never points at an address where the needed host does not
//! serve. Before a wave of a needed service stops hosts that a dependent's host lists (their
//! address or port changes, or the need says `drain=#true`), that host drops them: one
//! reconfigure (files, then `reload`, then `check`) with a pool without them; once the wave is
//! over, another lists them again at their current address. These reconfigures are not the
//! plan's steps: the wave waits for them, and each is recorded on its host with the inputs it
//! was given, so that the host's record says what it runs at every moment.

use super::super::event::Phase;
use super::super::step::StepResult;
use super::Scheduler;
use crate::desired::{Member, Pool};
use crate::plan::{Path, Plan, Step, StepKind};
use crate::site::{ServiceId, Site};
use crate::state::{member_of, HostRecord, Inputs};
use crate::transport::Transport;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::task::JoinSet;

/// One reconfigure of dependent `d` (by index in the plan's services) on host `host`, for wave
/// `wave` of the needed service `x`.
#[derive(Debug, Clone)]
pub(super) struct Repoint {
    pub(super) x: usize,
    pub(super) wave: usize,
    pub(super) d: usize,
    pub(super) host: usize,
    pub(super) phase: Phase,
    /// The hosts of `x` it drops, or lists again.
    pub(super) hosts: Vec<Arc<str>>,
}

/// A dependent (by index in the plan's services), its host, and the hosts it dropped.
type Dropped = (usize, usize, Vec<Arc<str>>);

/// Where the dependents' reconfigures stand.
#[derive(Default)]
pub(super) struct Repoints {
    /// Waves opened whose drops are not decided yet: a dependent's host is still being read.
    undecided: Vec<(usize, usize)>,
    /// Waiting for their host to be free.
    pub(super) queued: Vec<Repoint>,
    pub(super) tasks: JoinSet<(Repoint, StepResult)>,
    /// Which reconfigure each task runs (a task that panics ends without saying).
    pub(super) task_repoints: HashMap<tokio::task::Id, Repoint>,
    /// Per needed service: reconfigures queued or running for it; its waves wait for them.
    holding: HashMap<usize, usize>,
    /// Hosts of a needed service its dependents dropped and have not listed again:
    /// `(service, host)`.
    pub(super) dropped: HashSet<(usize, usize)>,
    /// Per `(service, wave)`: the dependents' hosts that dropped its hosts, and which.
    by_wave: HashMap<(usize, usize), Vec<Dropped>>,
    /// `(host, service, log)` of each failed reconfigure.
    pub(super) failures: Vec<super::super::Failure>,
}

impl Repoints {
    /// Whether nothing is queued or running.
    pub(super) fn idle(&self) -> bool {
        self.queued.is_empty() && self.tasks.is_empty()
    }

    /// Whether the waves of `x` wait for its dependents' reconfigures.
    pub(super) fn holds(&self, x: usize) -> bool {
        self.holding.get(&x).is_some_and(|n| *n > 0) || self.undecided.iter().any(|(s, _)| *s == x)
    }

    /// The reconfigures of `(x, w)` are over or replaced: forgotten.
    pub(super) fn forget_wave(&mut self, x: usize, w: usize) {
        self.by_wave.remove(&(x, w));
    }

    /// `x` is being reverted: its waves' drops not decided yet never will be.
    pub(super) fn forget_undecided(&mut self, x: usize) {
        self.undecided.retain(|(s, _)| *s != x);
    }

    pub(super) fn hold(&mut self, x: usize) {
        *self.holding.entry(x).or_default() += 1;
    }

    pub(super) fn let_go(&mut self, x: usize) {
        if let Some(n) = self.holding.get_mut(&x) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Per service of `plan` (by index), the services that are handed its addresses (`needs …
/// addressable=…`, or `drain=#true`), each with whether its need says `drain=#true`.
pub(super) fn dependents(site: &Site, plan: &Plan) -> Vec<Vec<(usize, bool)>> {
    let index: HashMap<ServiceId, usize> = plan
        .services
        .iter()
        .enumerate()
        .filter_map(|(i, s)| site.service(&s.name).map(|sid| (sid, i)))
        .collect();
    let mut out = vec![Vec::new(); plan.services.len()];
    for (d, sp) in plan.services.iter().enumerate() {
        let Some(dsid) = site.service(&sp.name) else {
            continue;
        };
        for need in &site.services[dsid].needs {
            if need.addressable.is_none() && !need.drain {
                continue;
            }
            if let Some(&x) = index.get(&need.service) {
                if x != d && !out[x].iter().any(|(t, _)| *t == d) {
                    out[x].push((d, need.drain));
                }
            }
        }
    }
    out
}

/// The hosts of `steps` that a dependent's host whose `needs:` entry is `entry` must drop
/// before they stop: those it lists elsewhere than they will serve (`desired`, the pool the
/// site gives it), and with `drain`, every one it lists whose step stops the service.
fn to_drop(steps: &[Step], entry: &str, desired: &Pool, drain: bool) -> Vec<Arc<str>> {
    steps
        .iter()
        .filter(|st| {
            let Some(listed) = member_of(entry, &st.host) else {
                return false;
            };
            let moved = desired
                .members
                .iter()
                .find(|m| m.host == st.host)
                .is_none_or(|m| m.entry() != listed);
            moved || (drain && stops(st))
        })
        .map(|st| st.host.clone())
        .collect()
}

/// Whether a step stops the service on its host: not a fresh install, nor a reconfigure by
/// `reload` (or by recording alone); an unread step may.
fn stops(st: &Step) -> bool {
    match (st.kind, st.path) {
        (StepKind::Install, _) => false,
        (StepKind::Unread, _) | (_, None | Some(Path::SwitchOver)) => true,
        (_, Some(Path::Reload | Path::Record)) => false,
    }
}

/// Where `host` serves by the inputs it records (`address`, or `fallback` in a record that
/// has none, and `port`).
pub(super) fn recorded_member(host: &Arc<str>, fallback: &Arc<str>, inputs: &Inputs) -> Member {
    Member {
        host: host.clone(),
        address: inputs
            .get("address")
            .map_or_else(|| fallback.clone(), Arc::from),
        port: inputs.get("port").and_then(|p| p.parse().ok()),
    }
}

/// The `needs:` entry for `needed` in `service`'s record on a host, if it runs it.
pub(super) fn listed<'a>(record: &'a HostRecord, service: &str, needed: &str) -> Option<&'a str> {
    record
        .services
        .get(service)?
        .inputs
        .as_ref()?
        .get(&format!("needs:{needed}"))
}

impl<T: Transport> Scheduler<T> {
    /// Whether host `h` may be reconfigured for a needed service's wave: it then keeps one
    /// step more, so that its lock is not given back with its last step's command while one
    /// may come.
    pub(super) fn may_repoint(&self, h: usize) -> bool {
        let plan = &self.r.plan;
        let ph = &plan.hosts[h];
        self.dependents.iter().enumerate().any(|(x, deps)| {
            let xs = &plan.services[x];
            let steps: Vec<Step> = xs.each_step().cloned().collect();
            deps.iter().any(|&(d, drain)| {
                let ds = &plan.services[d];
                let Some(dsid) = self.r.site.service(&ds.name) else {
                    return false;
                };
                let pools = self.r.desired.needs(dsid);
                let (Some(desired), true) = (pools.get(&xs.name), ds.runs_on(ph)) else {
                    return false;
                };
                listed(&self.hosts[h].record, &ds.name, &xs.name)
                    .is_some_and(|entry| !to_drop(&steps, entry, desired, drain).is_empty())
            })
        })
    }

    /// Wave `w` of `x` just opened: its steps wait until the dependents' hosts that list hosts
    /// of it that must not be listed while it runs have dropped them.
    pub(super) fn drop_before(&mut self, x: usize, w: usize) {
        if !self.dependents[x].is_empty() {
            self.repoints.undecided.push((x, w));
        }
    }

    /// Decides the drops of each wave opened once none of its dependents' hosts is still
    /// being read.
    fn decide_drops(&mut self) {
        let plan = self.r.plan.clone();
        for (x, w) in std::mem::take(&mut self.repoints.undecided) {
            if self.r.cancel.stopping() || self.svcs[x].finished.is_some() {
                continue;
            }
            let reading = self.may_drop(x, w)
                && self.dependents[x].iter().any(|&(d, _)| {
                    plan.hosts
                        .iter()
                        .enumerate()
                        .any(|(h, ph)| plan.services[d].runs_on(ph) && self.hosts[h].awaiting)
                });
            if reading {
                self.repoints.undecided.push((x, w));
            } else {
                self.drop_now(x, w);
            }
        }
    }

    /// Whether a dependent's host still being read may have to drop hosts of wave `w` of `x`:
    /// a dependent drains `x`, or a step of the wave moves its host to another port or
    /// address (or its host is not read yet). Only then does the wave wait for those hosts to
    /// be read.
    fn may_drop(&self, x: usize, w: usize) -> bool {
        let xs = &self.r.plan.services[x];
        if self.dependents[x].iter().any(|(_, drain)| *drain) {
            return true;
        }
        xs.waves[w].steps.iter().any(|st| self.may_move(x, st))
    }

    /// Whether step `st` of `x` may move its host to another port or address (or its host is
    /// not read yet).
    pub(super) fn may_move(&self, x: usize, st: &Step) -> bool {
        let xs = &self.r.plan.services[x];
        let Some(&h) = self.host_index.get(&st.host) else {
            return false;
        };
        let port = xs.port.map(|p| p.to_string()).unwrap_or_default();
        let recorded = self.hosts[h]
            .record
            .services
            .get(&xs.name)
            .and_then(|r| r.inputs.as_ref());
        let moved = recorded.is_some_and(|i| {
            i.get("port").is_some_and(|p| p != port)
                || i.get("address")
                    .is_some_and(|a| a != &*self.r.plan.hosts[h].address)
        });
        !self.hosts[h].read || moved
    }

    /// Each dependent's host that lists hosts of wave `w` of `x` that must not be listed while
    /// the wave runs drops them first.
    fn drop_now(&mut self, x: usize, w: usize) {
        let plan = self.r.plan.clone();
        let xs = &plan.services[x];
        let steps = &xs.waves[w].steps;
        for &(d, drain) in &self.dependents[x].clone() {
            let ds = &plan.services[d];
            let Some(dsid) = self.r.site.service(&ds.name) else {
                continue;
            };
            let pools = self.r.desired.needs(dsid);
            let Some(desired) = pools.get(&xs.name) else {
                continue;
            };
            for (h, entry) in self.listing(x, d) {
                let hosts = to_drop(steps, &entry, desired, drain);
                self.queue_drop(x, w, d, h, hosts);
            }
        }
    }

    /// The hosts of dependent `d` that may be reconfigured (read by the run, still held) and
    /// list `x`, each with its `needs:` entry for it.
    pub(super) fn listing(&self, x: usize, d: usize) -> Vec<(usize, String)> {
        let plan = &self.r.plan;
        let (xs, ds) = (&plan.services[x], &plan.services[d]);
        plan.hosts
            .iter()
            .enumerate()
            .filter(|(h, ph)| {
                ds.runs_on(ph)
                    && self.hosts[*h].read
                    && !self.released.iter().any(|r| **r == *ph.name)
            })
            .filter_map(|(h, _)| {
                let entry = listed(&self.hosts[h].record, &ds.name, &xs.name)?;
                Some((h, entry.to_string()))
            })
            .collect()
    }

    /// Dependent `d`'s host `h` drops `hosts` of `x` before wave `w` (or a revert's batch,
    /// keyed past the plan's waves) stops them; their wave waits for it.
    pub(super) fn queue_drop(
        &mut self,
        x: usize,
        w: usize,
        d: usize,
        h: usize,
        hosts: Vec<Arc<str>>,
    ) {
        if hosts.is_empty() {
            return;
        }
        for name in &hosts {
            if let Some(&m) = self.host_index.get(name) {
                self.repoints.dropped.insert((x, m));
            }
        }
        self.repoints
            .by_wave
            .entry((x, w))
            .or_default()
            .push((d, h, hosts.clone()));
        self.queue_repoint(x, w, d, h, Phase::Drop, hosts);
    }

    /// Wave `w` of `x` is over: the dependents' hosts that dropped its hosts list them again,
    /// at their current address; not one whose own step comes next and lists them anyway.
    pub(super) fn list_after(&mut self, x: usize, w: usize) {
        let Some(dropped) = self.repoints.by_wave.remove(&(x, w)) else {
            return;
        };
        for (_, _, hosts) in &dropped {
            for name in hosts {
                if let Some(&m) = self.host_index.get(name) {
                    self.repoints.dropped.remove(&(x, m));
                }
            }
        }
        // A revert's batch (keyed past the plan's waves): no step of the run comes next.
        let reverted = w >= self.r.plan.services[x].waves.len();
        for (d, h, hosts) in dropped {
            if !reverted && self.own_step_next(d, h) {
                continue;
            }
            self.queue_list(x, w, d, h, hosts);
        }
    }

    /// Dependent `d`'s host `h` lists `hosts` of `x` again after wave `w` (or a revert's
    /// batch); the next wave waits for it.
    pub(super) fn queue_list(
        &mut self,
        x: usize,
        w: usize,
        d: usize,
        h: usize,
        hosts: Vec<Arc<str>>,
    ) {
        self.queue_repoint(x, w, d, h, Phase::List, hosts);
    }

    /// Queues dependent `d`'s reconfigure on host `h` for wave `w` of `x` (or a revert's
    /// batch); `x` waits for it.
    fn queue_repoint(
        &mut self,
        x: usize,
        w: usize,
        d: usize,
        h: usize,
        phase: Phase,
        hosts: Vec<Arc<str>>,
    ) {
        self.repoints.hold(x);
        self.repoints.queued.push(Repoint {
            x,
            wave: w,
            d,
            host: h,
            phase,
            hosts,
        });
    }

    /// `x` ended: what its open waves' dependents dropped is listed again.
    pub(super) fn list_left(&mut self, x: usize) {
        let mut waves: Vec<usize> = self
            .repoints
            .by_wave
            .keys()
            .filter(|(s, _)| *s == x)
            .map(|(_, w)| *w)
            .collect();
        waves.sort_unstable();
        for w in waves {
            self.list_after(x, w);
        }
    }

    /// Whether dependent `d` has a step of its own on host `h` that has not run and waits for
    /// nothing more: it gives the host the site's pools.
    fn own_step_next(&mut self, d: usize, h: usize) -> bool {
        let plan = self.r.plan.clone();
        let name = &plan.hosts[h].name;
        let Some(st) = plan.services[d].each_step().find(|st| st.host == *name) else {
            return false;
        };
        let ended = self.hosts[h].done.contains(&d) || self.hosts[h].broken.contains(&d);
        if ended || self.svcs[d].finished.is_some() {
            return false;
        }
        let waited = st.waits.iter().all(|w| {
            match (
                self.service_index.get(&*w.service),
                self.host_index.get(&w.host),
            ) {
                (Some(&t), Some(&n)) => self.step_ended(t, n),
                _ => true,
            }
        });
        waited && (st.kind != StepKind::Unread || self.unread_waited(d, h))
    }

    /// Starts each queued reconfigure whose host is free (one that drops hosts only while the
    /// run is not stopping: its wave will not run). Whether a service's waves no longer wait
    /// for them.
    pub(super) fn start_repoints(&mut self) -> bool {
        let held: Vec<usize> = (0..self.svcs.len())
            .filter(|&x| self.repoints.holds(x))
            .collect();
        self.decide_drops();
        let stopping = self.r.cancel.stopping();
        for rp in std::mem::take(&mut self.repoints.queued) {
            // A wave that will not run (its service over, or being reverted) drops nothing.
            let over = self.svcs[rp.x].finished.is_some()
                || (self.svcs[rp.x].reverting.is_some()
                    && rp.wave < self.r.plan.services[rp.x].waves.len());
            if (stopping || over) && rp.phase == Phase::Drop {
                self.repoints.let_go(rp.x);
                continue;
            }
            if self.hosts[rp.host].busy {
                self.repoints.queued.push(rp);
                continue;
            }
            self.spawn_repoint(rp);
        }
        held.into_iter().any(|x| !self.repoints.holds(x))
    }
}
