//! What a run changed per service, tallied from its events as they pass on to the run's other
//! consumers: the steps it began (their hosts, versions, kinds and reasons), those that failed,
//! the services it removed and the hosts it reverted.

use super::{Change, Kinded};
use crate::plan::StepKind;
use crate::rollout::{Event, EventKind, Sink};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// A sink that tallies every change of the run, then passes the event on to `inner`.
pub struct Tally {
    inner: Arc<dyn Sink>,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Services in the order the run first changed each.
    order: Vec<String>,
    services: BTreeMap<String, Service>,
}

#[derive(Default)]
struct Service {
    hosts: BTreeSet<String>,
    from: BTreeSet<Option<String>>,
    to: BTreeSet<String>,
    /// Per host, what its step did (the last step begun there).
    kinds: BTreeMap<String, StepKind>,
    reasons: BTreeSet<String>,
    failed: BTreeSet<String>,
    /// Versions removed, and the hosts they were removed from.
    removed_versions: BTreeSet<String>,
    removed: BTreeSet<String>,
    reverted: BTreeSet<String>,
}

impl Tally {
    pub fn new(inner: Arc<dyn Sink>) -> Tally {
        Tally {
            inner,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Per service, in the order the run first changed each; nothing for a run that began no
    /// step, removed nothing and reverted nothing.
    pub fn changes(&self) -> Vec<Change> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.order
            .iter()
            .filter_map(|name| {
                let s = seen.services.get(name)?;
                let mut kinds: Vec<Kinded> = Vec::new();
                for kind in s.kinds.values() {
                    match kinds.iter_mut().find(|k| k.kind == *kind) {
                        Some(k) => k.hosts += 1,
                        None => kinds.push(Kinded {
                            kind: *kind,
                            hosts: 1,
                        }),
                    }
                }
                Some(Change {
                    service: name.clone(),
                    hosts: s.hosts.len(),
                    from: s.from.iter().cloned().collect(),
                    to: s.to.iter().cloned().collect(),
                    failed: s.failed.len(),
                    kinds,
                    reasons: s.reasons.iter().cloned().collect(),
                    removed: s.removed.len(),
                    removed_versions: s.removed_versions.iter().cloned().collect(),
                    reverted: s.reverted.len(),
                })
            })
            .collect()
    }

    fn note(&self, kind: &EventKind) {
        // The service an event changes, and whether it is the first word of that service (a
        // step begun, a removal begun, a revert done); the end of a step only counts for a
        // service already seen.
        let (name, first) = match kind {
            EventKind::StepStarted { intent, .. } => (&intent.service, true),
            EventKind::RemovalStarted { service, .. } => (service, true),
            EventKind::RevertFinished { result, .. } if result.ok => (&result.service, true),
            EventKind::StepFinished { result, .. } => (&result.service, false),
            EventKind::RemovalFinished { service, .. } => (service, false),
            _ => return,
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.services.contains_key(name.as_str()) {
            if !first {
                return;
            }
            seen.order.push(name.clone());
        }
        let s = seen.services.entry(name.clone()).or_default();
        match kind {
            EventKind::StepStarted {
                intent,
                kind,
                reasons,
                ..
            } => {
                s.hosts.insert(intent.host.clone());
                s.from.insert(intent.from.clone());
                s.to.insert(intent.to.clone());
                s.kinds.insert(intent.host.clone(), *kind);
                s.reasons.extend(reasons.iter().cloned());
            }
            EventKind::StepFinished { result, .. } => {
                if result.ok {
                    s.failed.remove(&result.host);
                } else {
                    s.failed.insert(result.host.clone());
                }
            }
            EventKind::RemovalStarted { version, .. } => {
                s.removed_versions.insert(version.clone());
            }
            EventKind::RemovalFinished { host, ok, .. } => {
                if *ok {
                    s.removed.insert(host.clone());
                } else {
                    s.failed.insert(host.clone());
                }
            }
            EventKind::RevertFinished { result, .. } => {
                s.reverted.insert(result.host.clone());
            }
            _ => {}
        }
    }
}

impl Sink for Tally {
    fn emit(&self, event: Event) {
        self.note(&event.kind);
        self.inner.emit(event);
    }
}
