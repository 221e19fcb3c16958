//! A service's semaphore in etcd (locksmith-style): `slots/<service>/<host>`, one key per
//! agent waiting or stepping, each attached to a lease of the agent's own ([`LeaseLock`], kept
//! alive as the site's lock is, so that a dead agent's slot goes with its lease). A slot is
//! admitted once fewer than the capacity (the policy's batch of the service's hosts, as the
//! plan computes it for push) were created before it (creation-revision order), and only while
//! the service's failure budget holds and its runtime needs' `healthy=` thresholds are met, as
//! the published status says. Under a policy's `canary` or `pause`, a host first waits for its
//! wave ([`crate::publish::Rollout`]: the canary passed, the waves before it ended, the pause
//! over or confirmed by `deploy resume`) without a slot, so that a host held back by its wave
//! never takes a place in the semaphore from one that may go.

use super::{Agent, AgentError};
use crate::publish::{progress, Rollout};
use crate::site::{OnFailure, Pause, Quota, Round, ServiceId, Site};
use crate::state::lock::{Holder, Lock, LockError};
use crate::state::store::{Fence, LeaseLock, Mirror, View};
use crate::state::Outcome;
use std::time::Duration;

/// How often a timed pause is looked at again, and how long a waiting agent lets etcd be
/// before it opens a watch that ended again.
const POLL: Duration = Duration::from_millis(200);

/// A slot taken and admitted; given back with [`Slot::release`] (or with the lease, when the
/// agent dies).
pub struct Slot {
    lock: LeaseLock,
    me: Holder,
    pub fence: Fence,
}

/// What admission waits on, for one service.
pub struct Admission<'a> {
    pub site: &'a Site,
    pub service: ServiceId,
    /// The published hosts, by name, with their classes.
    pub hosts: &'a crate::publish::Manifest,
    /// The snapshot it converges on: a newer one published meanwhile ends the wait.
    pub digest: &'a str,
    /// The policy's batch of the service's hosts (the plan's `batch_hosts`).
    pub capacity: usize,
    /// Failed hosts the service tolerates (the plan's `max_failed_hosts`).
    pub max_failed: usize,
}

impl Slot {
    pub async fn release(self) {
        let _ = self.lock.release(&self.me).await;
    }
}

/// Takes the service's slot for the agent's host and waits until it is admitted; `None` when
/// the agent is told to stop meanwhile, or a newer snapshot is published (the slot is given
/// back: an agent waiting on a spent budget takes up a fixed snapshot).
pub async fn take(
    agent: &Agent,
    a: &Admission<'_>,
    mirror: &mut Mirror,
) -> Result<Option<Slot>, AgentError> {
    let Some(waiting) = wave(agent, a, mirror).await? else {
        return Ok(None);
    };
    let slot = slot_after_wave(agent, a, mirror).await;
    if let Some(waiting) = waiting {
        waiting.release().await;
    }
    slot
}

/// Takes the slot once the host's wave may start, and waits for admission.
async fn slot_after_wave(
    agent: &Agent,
    a: &Admission<'_>,
    mirror: &mut Mirror,
) -> Result<Option<Slot>, AgentError> {
    let name = &a.site.services[a.service].name;
    let key = agent.keys.slot(name, &agent.host);
    let (lock, me) = take_key(agent, &a.site.name, key.clone()).await?;
    let Some(fence) = lock.fence() else {
        let _ = lock.release(&me).await;
        return Err(AgentError::Store(crate::state::store::StoreError::Failed(
            format!("{key}: taken without a fencing token"),
        )));
    };
    let slot = Slot { lock, me, fence };
    // Given back on every way out but admission, an error included (a slot kept would hold
    // a place in the semaphore, and refuse `deploy apply`, for as long as the agent runs).
    match admit(agent, a, &slot, &key, mirror).await {
        Ok(true) => Ok(Some(slot)),
        Ok(false) => {
            slot.release().await;
            Ok(None)
        }
        Err(e) => {
            slot.release().await;
            Err(e)
        }
    }
}

/// The key an agent holds while it waits for its host's wave (`waiting/<service>/<host>`, on
/// a lease of its own): given back once its slot is taken, so that `deploy apply` finds one
/// or the other at every moment of a rollout held back by its policy.
struct Waiting {
    lock: LeaseLock,
    me: Holder,
}

impl Waiting {
    async fn release(self) {
        let _ = self.lock.release(&self.me).await;
    }
}

/// Waits until the host's wave may start (`Ok(Some(_))`, with the waiting key held when there
/// was one to wait for), or until the agent is told to stop or a newer snapshot is published
/// (`Ok(None)`). At once, holding nothing, without a canary or a pause.
async fn wave(
    agent: &Agent,
    a: &Admission<'_>,
    mirror: &mut Mirror,
) -> Result<Option<Option<Waiting>>, AgentError> {
    let rollout = Rollout::new(a.site, a.hosts, a.service);
    if rollout.canary == 0 && rollout.pause.is_none() {
        return Ok(Some(None));
    }
    let Some(position) = rollout.hosts.iter().position(|h| *h == agent.host) else {
        return Ok(Some(None));
    };
    let key = agent.keys.waiting(&rollout.name, &agent.host);
    let (lock, me) = take_key(agent, &a.site.name, key).await?;
    let waiting = Waiting { lock, me };
    match wait_for_wave(agent, a, &rollout, position, mirror).await {
        Ok(true) => Ok(Some(Some(waiting))),
        other => {
            waiting.release().await;
            other.map(|_| None)
        }
    }
}

/// Takes `key` on a lease of the agent's own (a slot, or its waiting key); one left by this
/// very process (a step or a wait that ended on an error before giving it back) is ours,
/// taken over.
async fn take_key(
    agent: &Agent,
    site: &str,
    key: String,
) -> Result<(LeaseLock, Holder), AgentError> {
    let lock = LeaseLock::at(agent.etcd.clone(), &agent.keys, key, agent.ttl);
    let me = Holder::me(site, &format!("agent-{}", std::process::id()));
    match lock.acquire(&me, false).await {
        Ok(_) => {}
        Err(LockError::Held {
            holder: Some(h), ..
        }) if is_mine(&h, &me) => {
            lock.acquire(&me, true).await.map_err(lock_error)?;
        }
        Err(e) => return Err(lock_error(e)),
    }
    Ok((lock, me))
}

fn lock_error(e: LockError) -> AgentError {
    match e {
        LockError::Held { place, holder } => AgentError::SlotHeld {
            place,
            holder: holder.map_or_else(|| "a holder that cannot be read".into(), |h| h.describe()),
        },
        LockError::Failed { place, reason } => AgentError::Store(
            crate::state::store::StoreError::Failed(format!("{place}: {reason}")),
        ),
    }
}

async fn wait_for_wave(
    agent: &Agent,
    a: &Admission<'_>,
    rollout: &Rollout,
    position: usize,
    mirror: &mut Mirror,
) -> Result<bool, AgentError> {
    let mut said = None;
    let resume_key = agent.keys.resume(&rollout.name);
    loop {
        if agent.stopping() || !current(agent, a, mirror) {
            return Ok(false);
        }
        let resumed = if rollout.pause == Pause::Confirm {
            progress::resumed(mirror.value(&resume_key), a.digest)
        } else {
            0
        };
        let view = mirror.view();
        // A timed pause runs from when this agent first saw the waves before ended.
        let now = std::time::Instant::now();
        let seen = {
            let mut seen = agent.waves_seen.lock().unwrap_or_else(|e| e.into_inner());
            let key = (rollout.name.clone(), rollout.wave_of(position));
            if rollout.waves_before_ended(view, position) {
                Some(*seen.entry(key).or_insert(now))
            } else {
                seen.remove(&key);
                None
            }
        };
        match rollout.held(view, position, resumed, seen, now) {
            None => return Ok(true),
            Some(why) => {
                if said.as_ref() != Some(&why) {
                    agent.say(&format!("{}: waiting: {why}", rollout.name));
                    said = Some(why);
                }
            }
        }
        // A timed pause ends with no key changing: looked at again every `POLL` meanwhile.
        next_change(agent, mirror, Some(POLL), &[agent.keys.root().to_string()]).await?;
    }
}

/// Waits until a key under one of `relevant` changes (every change taken into `mirror`), the
/// agent is told to stop, or `at_most` has passed; a watch that ended is opened again (the
/// site read again).
async fn next_change(
    agent: &Agent,
    mirror: &mut Mirror,
    at_most: Option<Duration>,
    relevant: &[String],
) -> Result<(), AgentError> {
    let changed = tokio::select! {
        changed = mirror.changed_under(&agent.etcd, relevant) => changed,
        () = super::until(agent) => true,
        () = tokio::time::sleep(at_most.unwrap_or(POLL)), if at_most.is_some() => true,
    };
    if !changed {
        // Not at once again (etcd may be going away), and not every agent together (a
        // cancelled watch may be every agent's).
        tokio::time::sleep(super::spread(POLL * 2)).await;
        *mirror = agent.etcd.mirror(&agent.keys).await?;
    }
    Ok(())
}

/// Whether `desired/current` still names the snapshot admission is for (said when not).
fn current(agent: &Agent, a: &Admission<'_>, mirror: &Mirror) -> bool {
    if mirror.value(&agent.keys.current()) == Some(a.digest.as_bytes()) {
        return true;
    }
    agent.say(&format!(
        "{}: a newer snapshot was published: the slot is given back",
        a.site.services[a.service].name
    ));
    false
}

/// Whether a slot's holder is this process (same machine, boot, pid and pid start).
fn is_mine(h: &Holder, me: &Holder) -> bool {
    h.controller == me.controller
        && h.boot == me.boot
        && h.machine == me.machine
        && h.pid == me.pid
        && h.pid_start == me.pid_start
        && !me.boot.is_empty()
}

/// Waits until `slot` is admitted (`true`), or until the agent is told to stop or a newer
/// snapshot is published (`false`). Decided again on each change of the site's keys, from a
/// [`Mirror`] of them: no read of etcd while it waits.
async fn admit(
    agent: &Agent,
    a: &Admission<'_>,
    slot: &Slot,
    key: &str,
    mirror: &mut Mirror,
) -> Result<bool, AgentError> {
    let name = &a.site.services[a.service].name;
    let slots = agent.keys.slots(name);
    let mut said = None;
    let members = Members::of(a.site, a.hosts, a.service);
    // What admission is decided on: decided again only when one of these changes.
    let mut relevant = vec![slots.clone(), agent.keys.lock(), agent.keys.current()];
    for sid in members.0.keys() {
        let service = &a.site.services[*sid].name;
        relevant.push(agent.keys.status_of(service));
        relevant.push(agent.keys.running_of(service));
    }
    // The slot just taken (this very key, at its create revision: not one this process left
    // before under the same name), in the mirror before anything is counted ahead of it: the
    // watch brings keys in revision order, so every slot created before it is there too.
    let mine = slot.fence.revision;
    while !mirror
        .created_under(&slots)
        .any(|(k, created)| k == key && created == mine)
    {
        next_change(agent, mirror, Some(POLL), &relevant).await?;
        if agent.stopping() {
            return Ok(false);
        }
    }
    loop {
        if agent.stopping() || !current(agent, a, mirror) {
            return Ok(false);
        }
        let ahead = mirror
            .created_under(&slots)
            .filter(|(k, rev)| *rev < slot.fence.revision && *k != key)
            .count();
        let waiting = if ahead >= a.capacity {
            Some(format!(
                "{ahead} hosts ahead in slots/{name}/ (capacity {})",
                a.capacity
            ))
        } else {
            unmet(mirror.view(), a, &members)
        };
        match waiting {
            None => return Ok(true),
            Some(why) => {
                if said.as_ref() != Some(&why) {
                    agent.say(&format!("{name}: waiting: {why}"));
                    said = Some(why);
                }
            }
        }
        next_change(agent, mirror, None, &relevant).await?;
    }
}

/// Why the service may not start a step now, from the store: the site's lock is held (a push,
/// or a publish writing), its failure budget is spent, or a runtime need's `healthy=` is not
/// met.
fn unmet(view: &View, a: &Admission<'_>, members: &Members<'_>) -> Option<String> {
    let site = a.site;
    let s = &site.services[a.service];
    // Push and pull exclude each other: no step while an apply (or a publish) holds the lock.
    if let Some((holder, _)) = &view.lock {
        return Some(format!(
            "the site's lock is held by {}",
            holder
                .as_ref()
                .map_or_else(|| "a holder that cannot be read".into(), |h| h.describe())
        ));
    }
    let budget = match s.policy.on_failure {
        OnFailure::Continue => usize::MAX,
        OnFailure::Stop => 0,
        OnFailure::Rollback | OnFailure::Revert => a.max_failed,
    };
    let failed = members
        .of_service(a.service)
        .filter(|h| failed_at(view, h, &s.name, &s.version))
        .count();
    if failed > budget {
        return Some(format!(
            "{failed} hosts failed at {}, more than the budget of {budget}",
            s.version
        ));
    }
    needs_unmet(view, site, a.service, members)
}

/// Which runtime need of `service` has its `healthy=` unmet, as the store says.
fn needs_unmet(
    view: &View,
    site: &Site,
    service: ServiceId,
    members: &Members<'_>,
) -> Option<String> {
    for need in &site.services[service].needs {
        // Data only: no ordering.
        if need.healthy.is_none() && need.addressable.is_some() {
            continue;
        }
        let x = &site.services[need.service];
        let of = members.of_service(need.service).count();
        let wanted = need.healthy.unwrap_or(Quota::All).of(of, Round::Up);
        let healthy = members
            .of_service(need.service)
            .filter(|h| healthy_at(view, h, &x.name, &x.version))
            .count();
        if healthy < wanted {
            return Some(format!(
                "needs {} healthy at {} on {wanted} of {of} hosts, {healthy} are",
                x.name, x.version
            ));
        }
    }
    None
}

/// The published hosts of the service admitted and of its needs, listed once.
struct Members<'a>(std::collections::HashMap<ServiceId, Vec<&'a str>>);

impl<'a> Members<'a> {
    fn of(
        site: &'a Site,
        manifest: &'a crate::publish::Manifest,
        service: ServiceId,
    ) -> Members<'a> {
        let s = &site.services[service];
        let ids = std::iter::once(service).chain(s.needs.iter().map(|n| n.service));
        Members(
            ids.map(|sid| (sid, hosts_of(site, manifest, sid).collect()))
                .collect(),
        )
    }

    fn of_service(&self, service: ServiceId) -> impl Iterator<Item = &'a str> + '_ {
        self.0.get(&service).into_iter().flatten().copied()
    }
}

/// The published hosts that run `service`.
fn hosts_of<'a>(
    site: &'a Site,
    manifest: &'a crate::publish::Manifest,
    service: ServiceId,
) -> impl Iterator<Item = &'a str> + 'a {
    let s = &site.services[service];
    let classes: Vec<&str> = s
        .classes
        .iter()
        .map(|c| site.classes[*c].name.as_str())
        .collect();
    manifest
        .hosts
        .iter()
        .filter(move |h| h.classes.iter().any(|c| classes.contains(&c.as_str())))
        .map(|h| h.name.as_str())
}

/// Whether the store says `service` on `host` passed its check at `version`.
fn healthy_at(view: &View, host: &str, service: &str, version: &str) -> bool {
    let Some(p) = view.hosts.get(host).and_then(|e| e.services.get(service)) else {
        return false;
    };
    p.running.as_ref().is_some_and(|r| r.version == version)
        && p.validated
            .as_ref()
            .is_some_and(|v| v.version == version && v.mark.outcome == Outcome::Success)
}

/// Whether the store says a step of `service` to `version` failed on `host`.
fn failed_at(view: &View, host: &str, service: &str, version: &str) -> bool {
    let Some(p) = view.hosts.get(host).and_then(|e| e.services.get(service)) else {
        return false;
    };
    [&p.configured, &p.validated]
        .into_iter()
        .flatten()
        .any(|m| m.version == version && m.mark.outcome == Outcome::Failure)
}

#[cfg(test)]
mod tests {
    use super::is_mine;
    use crate::state::lock::Holder;

    #[test]
    fn a_slot_left_by_this_process_is_its_own_and_no_other_is() {
        let me = Holder::me("site", "agent-1");
        let mut earlier = Holder::me("site", "agent-1");
        earlier.since = "2026-01-01T00:00:00Z".into();
        if me.boot.is_empty() {
            // No boot id (not Linux): nothing is judged ours.
            assert!(!is_mine(&earlier, &me));
            return;
        }
        assert!(is_mine(&earlier, &me));
        let mut other = earlier.clone();
        other.pid += 1;
        assert!(!is_mine(&other, &me));
        let mut elsewhere = earlier.clone();
        elsewhere.boot = "another boot".into();
        assert!(!is_mine(&elsewhere, &me));
    }
}
