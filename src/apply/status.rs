//! `deploy status` as a library call: site → inventory (`--on`: some hosts) → what each host
//! runs (the store's one range read, or each host's state file; the hosts the store cannot
//! speak for read) → the site's [`Status`], its checks run when asked.

use super::{observe, on_hosts, planning::readable_secrets, selector, ApplyError, Say};
use crate::inventory::{HostId, Hosts};
use crate::site::ServiceId;
use crate::state::store::{self, View};
use crate::state::Status;
use crate::{site, state};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;

/// What `deploy status` is asked for.
#[derive(Debug, Clone, Default)]
pub struct StatusRequest {
    pub site: PathBuf,
    /// Only the hosts selected (`--on`).
    pub on: Vec<String>,
    /// Read every host, whatever the store says (`--hosts`).
    pub hosts: bool,
    /// Run every service's check on its hosts (`--check`).
    pub check: bool,
    pub max_connections: usize,
}

fn runtime() -> Result<tokio::runtime::Runtime, ApplyError> {
    crate::session::runtime().map_err(ApplyError::Runtime)
}

/// What the site's hosts run, as `deploy status` says it.
pub fn status(request: &StatusRequest, say: &Say) -> Result<Status, ApplyError> {
    let site = site::load(&request.site)?;
    let on = selector(&request.on)?;
    let all = super::resolve(&site, &**say)?;
    // Desired over every host (a service's `needs` lists them all), asked by name.
    let secrets = readable_secrets(&site, false, say)?;
    let desired = crate::desired::resolve(&site, &all, &secrets)?;
    let hosts = match on_hosts(on.as_ref(), &site, &all)? {
        Some(ids) => all.subset(&ids, site.classes.len()),
        None => all.clone(),
    };
    let unpublished = crate::session::unpublished(&site.name);
    let read = runtime()?.block_on(store::read(&site));
    let mut stale = None;
    let view = match read {
        Ok(view) => view,
        // `--hosts` answers from the hosts whatever the store does.
        Err(e) if request.hosts => {
            stale = Some(format!(
                "{e}: what follows is each host's own record, not compared with the store"
            ));
            None
        }
        Err(e) => {
            say("note: `deploy status --hosts` answers from the hosts themselves");
            return Err(ApplyError::Store(e));
        }
    };
    if let (Some(run), Some(_)) = (&unpublished, &view) {
        stale = Some(format!(
            "{run} could not publish all its state to etcd (.drover/unpublished): the store is \
             stale until the next `deploy apply`, which reads every host; every host was read \
             here"
        ));
    }
    let mut differ = HashSet::new();
    let mut read_themselves = Vec::new();
    let (observed, source, disagreements) = match &view {
        Some(view) if !request.hosts && unpublished.is_none() => {
            let FromStore {
                mut observed,
                differ: d,
                unvouched,
            } = from_store(view, &site, &all, &hosts, &desired);
            differ = d;
            let mut disagreements = Vec::new();
            if !unvouched.is_empty() {
                // The hosts the store cannot speak for are read, and say for themselves.
                let ids: BTreeSet<HostId> = unvouched.keys().copied().collect();
                let subset = hosts.subset(&ids, site.classes.len());
                let read = observe(&site, &subset, false, request.max_connections)?;
                disagreements = store::disagreements(view, &subset, &read);
                for ((&i, why), o) in unvouched.iter().zip(read) {
                    observed[i.index()] = o;
                    if let Some(h) = all.find(&hosts.hosts[i].name) {
                        differ.retain(|&(_, d)| d != h);
                    }
                    read_themselves.push(state::Unaccounted {
                        host: hosts.hosts[i].name.to_string(),
                        reason: why.clone(),
                    });
                }
            }
            (observed, state::Source::Store, disagreements)
        }
        _ => {
            let observed = observe(&site, &hosts, false, request.max_connections)?;
            let disagreements = view
                .as_ref()
                .map(|v| store::disagreements(v, &hosts, &observed))
                .unwrap_or_default();
            (observed, state::Source::Hosts, disagreements)
        }
    };
    let expected = ByName {
        desired: &desired,
        all: &all,
        hosts: &hosts,
        differ,
    };
    let mut status = state::status(&site, &hosts, &observed, &expected);
    status.source = source;
    status.disagreements = disagreements;
    status.stale = stale;
    status.read = read_themselves;
    if request.check {
        let transport = std::sync::Arc::new(crate::transport::AnyTransport::for_platform(
            &site.platform,
            hosts.hosts.len(),
            request.max_connections,
        ));
        let checked = runtime()?.block_on(crate::rollout::check_status(
            std::sync::Arc::new(site.clone()),
            &all,
            &hosts,
            &observed,
            &desired,
            transport,
            request.max_connections,
            std::sync::Arc::new(secrets),
        ))?;
        status.checked = Some(checked);
    }
    status.unfinished_run = match crate::session::unfinished(&site.name) {
        Ok(rec) => rec,
        Err(e) => {
            say(&format!(
                "warning: the unfinished run of {} cannot be read: {e}",
                site.name
            ));
            None
        }
    };
    status.site_lock = crate::session::site_lock(&site.name);
    Ok(status)
}

/// What the store says of the hosts of a subset.
struct FromStore {
    /// Per host of the subset.
    observed: Vec<state::Observed>,
    /// The pairs, as `(service, host of all)`, whose inputs differ from the site's.
    differ: HashSet<(ServiceId, HostId)>,
    /// The hosts (of the subset) the store cannot speak for, with why.
    unvouched: BTreeMap<HostId, String>,
}

/// What the store says the hosts of `hosts` (a subset of `all`) run.
fn from_store(
    view: &View,
    site: &site::Site,
    all: &Hosts,
    hosts: &Hosts,
    desired: &crate::desired::Desired,
) -> FromStore {
    let said = store::observed(view, site, all, desired);
    let mut picked = Vec::with_capacity(hosts.hosts.len());
    let mut unvouched = BTreeMap::new();
    for (i, h) in hosts.hosts.enumerate() {
        let Some(a) = all.find(&h.name) else {
            continue;
        };
        picked.push(said.observed[a.index()].clone());
        if let Some((_, why)) = said.unvouched.iter().find(|(u, _)| *u == a) {
            unvouched.insert(i, why.clone());
        }
    }
    FromStore {
        observed: picked,
        differ: said.differ.into_iter().collect(),
        unvouched,
    }
}

/// [`crate::desired::Desired`] asked for the hosts of a subset; pairs the store shows with
/// other inputs than the site's say so.
struct ByName<'a> {
    desired: &'a crate::desired::Desired,
    all: &'a Hosts,
    hosts: &'a Hosts,
    differ: HashSet<(ServiceId, HostId)>,
}

impl state::Expected for ByName<'_> {
    fn diverged(
        &self,
        service: ServiceId,
        host: HostId,
        recorded: Option<&state::Inputs>,
    ) -> Vec<String> {
        let Some(h) = self
            .hosts
            .hosts
            .get(host)
            .and_then(|h| self.all.find(&h.name))
        else {
            return Vec::new();
        };
        if self.differ.contains(&(service, h)) {
            return vec![
                "inputs differ from the site's (the store keeps only their fingerprint: \
                 `deploy status --hosts` or `deploy plan` says how)"
                    .into(),
            ];
        }
        self.desired.diverged(service, h, recorded)
    }
}
