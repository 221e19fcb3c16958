//! What each host of a service needs: a step of which kind and why, or nothing (the host is
//! left alone, and why). The same decision for a host read at its step ([`decide`]), and
//! what such a step waits for ([`unread_waits`]).

use super::host_order::RuntimeClosure;
use super::{service_hosts, Selection, Skip, SkipReason, StepKind};
use crate::desired::Desired;
use crate::inventory::{HostId, Hosts};
use crate::site::{ServiceId, Site};
use crate::state::{added_hosts, Observed};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// The needed services' hosts this step's host does not list yet: `(service, hosts)`.
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
        let record = observed[h].service(&service.name);
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
        if observed[h] == Observed::Unread {
            todo.push(Todo {
                host: h,
                from: None,
                kind: StepKind::Unread,
                reasons: Vec::new(),
                added: Vec::new(),
            });
            continue;
        }
        if !observed[h].known() {
            skipped.push(skip(SkipReason::Unreachable));
            continue;
        }
        let Some((kind, reasons)) = change(desired, sid, h, record, version) else {
            skipped.push(skip(SkipReason::AtVersion));
            continue;
        };
        todo.push(Todo {
            host: h,
            from: running,
            kind,
            reasons,
            added: added(site, &pools, sid, record),
        });
    }
    Sorted {
        members,
        todo,
        skipped,
    }
}

/// The hosts each pool `sid` is given lists and the host's record of it (`record`) does not:
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
        let new = added_hosts(&pool.entry, was.get(&format!("needs:{name}")));
        if !new.is_empty() && !added.iter().any(|(t, _)| *t == need.service) {
            added.push((need.service, new));
        }
    }
    added
}

/// What the step of an unread step (`StepKind::Unread`) of `sid` waits for once its host is
/// read and its record of `sid` found to be `record`, as [`Step::waits`] is for a host read
/// before the run: per needed service (not one that needs `sid` at runtime), the hosts its
/// pool adds to the host. The caller keeps those of them on which that service has a step.
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

/// What `sid` must do on host `h`, whose record of it is `record`: a step of this kind, for
/// these reasons, or nothing when the host runs `version` healthy with exactly the desired
/// inputs.
fn change(
    desired: &Desired,
    sid: ServiceId,
    h: HostId,
    record: Option<&crate::state::ServiceRecord>,
    version: &str,
) -> Option<(StepKind, Vec<String>)> {
    Some(match record {
        None => (StepKind::Install, Vec::new()),
        Some(r) if *r.version != *version => (StepKind::Upgrade, Vec::new()),
        Some(r) if !r.healthy() => (StepKind::Retry, Vec::new()),
        Some(r) => match &r.inputs {
            None => (
                StepKind::Reconfigure,
                vec!["configuration unknown (recorded by an older deploy)".to_string()],
            ),
            Some(was) if desired.matches(sid, h, was) => return None,
            Some(was) => (StepKind::Reconfigure, desired.reasons(sid, h, was)),
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
        Observed::Unreadable { reason } => return Err(format!("state unreadable: {reason}")),
        Observed::Unread => return Err("not read".into()),
        Observed::Fresh | Observed::Running { .. } => {}
    }
    let record = observed.service(&service.name);
    Ok(
        change(desired, sid, h, record, &service.version).map(|(kind, reasons)| Decided {
            from: record.map(|r| Arc::from(r.version.as_str())),
            kind,
            reasons,
        }),
    )
}

/// An unread step, once its host is read: what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub from: Option<Arc<str>>,
    pub kind: StepKind,
    pub reasons: Vec<String>,
}
