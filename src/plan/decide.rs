//! What each host of a service needs: a step of which kind and why, or nothing (the host is
//! left alone, and why). The same decision for a host read at its step ([`decide`]), and
//! what such a step waits for ([`unread_waits`]).

use super::host_order::RuntimeClosure;
use super::{service_hosts, Path, Selection, Skip, SkipReason, StepKind};
use crate::desired::Desired;
use crate::inventory::{HostId, Hosts};
use crate::site::{ServiceId, Site};
use crate::state::{added_hosts, moved_hosts, Observed};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a host whose state file cannot be read is said (the start of why it is left alone).
pub const STATE_UNREADABLE: &str = "state unreadable";

/// A service's hosts sorted into those with a step and those left alone.
pub(super) struct Sorted {
    pub(super) members: Vec<HostId>,
    /// In host id order.
    pub(super) todo: Vec<Todo>,
    pub(super) skipped: Vec<Skip>,
}

/// A host that gets a step.
pub(super) struct Todo {
    pub(super) host: HostId,
    pub(super) from: Option<Arc<str>>,
    pub(super) kind: StepKind,
    pub(super) reasons: Vec<String>,
    /// `None`: an unread step.
    pub(super) path: Option<Path>,
    pub(super) restarts: Vec<String>,
    /// The needed services' hosts this step's host does not list yet, or lists at another
    /// address or port, or (`drain=#true`) every one: `(service, hosts)`. Its step waits for
    /// their steps, so that it never lists a host where it does not serve.
    pub(super) added: Vec<(ServiceId, Vec<String>)>,
}

/// What `sid` does on each of its hosts, and why.
pub(super) fn sort(
    site: &Site,
    hosts: &Hosts,
    observed: &[Observed],
    desired: &Desired,
    selection: &Selection,
    sid: ServiceId,
    version: &Arc<str>,
) -> Sorted {
    let service = &site.services[sid];
    let members = service_hosts(site, hosts, sid);
    // The hosts of each service this one needs, as the inputs list them.
    let pools = desired.needs(sid);
    let mut todo = Vec::new();
    let mut skipped = Vec::new();
    for &h in &members {
        let record = observed[h.index()].service(&service.name);
        let running: Option<Arc<str>> = record.map(|r| {
            if *r.version == **version {
                version.clone()
            } else {
                Arc::from(r.version.as_str())
            }
        });
        let skip = |reason| Skip {
            host: hosts.hosts[h].name.clone(),
            version: running.clone(),
            reason,
        };
        if !selection.has(sid, h) {
            skipped.push(skip(SkipReason::NotSelected));
            continue;
        }
        if observed[h.index()] == Observed::Unread {
            todo.push(Todo {
                host: h,
                from: None,
                kind: StepKind::Unread,
                reasons: Vec::new(),
                path: None,
                restarts: Vec::new(),
                added: Vec::new(),
            });
            continue;
        }
        if !observed[h.index()].known() {
            skipped.push(skip(SkipReason::Unreachable));
            continue;
        }
        let repair = selection.repair.get(&(sid, h));
        let Some(c) = change(site, desired, sid, h, record, version).or_else(|| {
            repair.map(|why| Change {
                kind: StepKind::Repair,
                reasons: vec![why.clone()],
                path: Path::SwitchOver,
                restarts: Vec::new(),
            })
        }) else {
            skipped.push(skip(SkipReason::AtVersion));
            continue;
        };
        todo.push(Todo {
            host: h,
            from: running,
            kind: c.kind,
            reasons: c.reasons,
            path: Some(c.path),
            restarts: c.restarts,
            added: added(site, &pools, sid, record),
        });
    }
    Sorted {
        members,
        todo,
        skipped,
    }
}

/// The hosts each pool `sid` is given lists and the host's record of it (`record`) does not,
/// or lists at another address or port; for a need with `drain=#true`, every host of the pool:
/// `(needed service, hosts)`, once per needed service.
fn added(
    site: &Site,
    pools: &BTreeMap<String, crate::desired::Pool>,
    sid: ServiceId,
    record: Option<&crate::state::ServiceRecord>,
) -> Vec<(ServiceId, Vec<String>)> {
    let mut added: Vec<(ServiceId, Vec<String>)> = Vec::new();
    let Some(was) = record.and_then(|r| r.inputs.as_ref()) else {
        return added;
    };
    for need in &site.services[sid].needs {
        let name = &site.services[need.service].name;
        let Some(pool) = pools.get(name) else {
            continue;
        };
        let then = was.get(&format!("needs:{name}"));
        let new = if need.drain {
            added_hosts(&pool.entry, None)
        } else {
            let mut new = added_hosts(&pool.entry, then);
            new.extend(moved_hosts(&pool.entry, then));
            new
        };
        if !new.is_empty() && !added.iter().any(|(t, _)| *t == need.service) {
            added.push((need.service, new));
        }
    }
    added
}

/// What the step of an unread step (`StepKind::Unread`) of `sid` waits for once its host is
/// read and its record of `sid` found to be `record`, as [`Step::waits`] is for a host read
/// before the run: per needed service (not one that needs `sid` at runtime), the hosts its
/// pool adds to the host. The caller keeps those of them on which that service has a step,
/// and drops those that would go round with the run's other waits ([`super::go_round`]).
pub fn unread_waits(
    site: &Site,
    desired: &Desired,
    closure: &RuntimeClosure,
    sid: ServiceId,
    record: Option<&crate::state::ServiceRecord>,
) -> Vec<(ServiceId, Vec<String>)> {
    let mut out = added(site, &desired.needs(sid), sid, record);
    out.retain(|(x, _)| *x != sid && !closure.needs(*x, sid));
    out
}

/// What a host's step of a service does, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    pub kind: StepKind,
    pub reasons: Vec<String>,
    pub path: Path,
    /// See [`super::Step::restarts`].
    pub restarts: Vec<String>,
}

/// What `sid` must do on host `h`, whose record of it is `record`: a step of this kind, for
/// these reasons, by this path, or nothing when the host runs `version` healthy with exactly
/// the desired inputs.
fn change(
    site: &Site,
    desired: &Desired,
    sid: ServiceId,
    h: HostId,
    record: Option<&crate::state::ServiceRecord>,
    version: &str,
) -> Option<Change> {
    let switch_over = |kind| Change {
        kind,
        reasons: Vec::new(),
        path: Path::SwitchOver,
        restarts: Vec::new(),
    };
    let has_reload = site.services[sid].hooks.reload.is_some();
    Some(match record {
        None => switch_over(StepKind::Install),
        Some(r) if *r.version != *version => switch_over(StepKind::Upgrade),
        Some(r) if !r.healthy() => switch_over(StepKind::Retry),
        Some(r) => match &r.inputs {
            None => Change {
                kind: StepKind::Reconfigure,
                reasons: vec!["configuration unknown (recorded by an older deploy)".to_string()],
                path: Path::SwitchOver,
                restarts: match has_reload {
                    true => vec!["configuration".to_string()],
                    false => Vec::new(),
                },
            },
            Some(was) if desired.matches(sid, h, was) => return None,
            Some(was) => {
                let (takes, restarts) = desired.takes(sid, h, was)?;
                let path = Path::of(StepKind::Reconfigure, has_reload, Some(takes));
                Change {
                    kind: StepKind::Reconfigure,
                    reasons: desired.reasons(sid, h, was),
                    path,
                    restarts: match has_reload {
                        true => restarts,
                        false => Vec::new(),
                    },
                }
            }
        },
    })
}

/// What an unread step (`StepKind::Unread`) of `sid` on host `h` becomes once the host is
/// read at its step and found to run `observed`: the same decision the plan makes for a host
/// read before the run. `Ok(None)`: nothing to do. `Err`: the host's state cannot be read.
/// What such a step waits for once its host is read: [`unread_waits`].
pub fn decide(
    site: &Site,
    desired: &Desired,
    sid: ServiceId,
    h: HostId,
    observed: &Observed,
) -> Result<Option<Decided>, String> {
    let service = &site.services[sid];
    match observed {
        Observed::Unreachable { reason } => return Err(format!("does not answer: {reason}")),
        Observed::Unreadable { reason } => return Err(format!("{STATE_UNREADABLE}: {reason}")),
        Observed::Unread => return Err("not read".into()),
        Observed::Fresh | Observed::Running { .. } => {}
    }
    let record = observed.service(&service.name);
    Ok(
        change(site, desired, sid, h, record, &service.version).map(|c| Decided {
            from: record.map(|r| Arc::from(r.version.as_str())),
            kind: c.kind,
            reasons: c.reasons,
            path: c.path,
            restarts: c.restarts,
        }),
    )
}

/// An unread step, once its host is read: what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub from: Option<Arc<str>>,
    pub kind: StepKind,
    pub reasons: Vec<String>,
    pub path: Path,
    /// See [`super::Step::restarts`].
    pub restarts: Vec<String>,
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
