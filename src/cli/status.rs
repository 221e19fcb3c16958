//! `deploy status`: site → inventory (`--on`: some hosts) → what each host runs (the store's
//! one range read, or each host's state file) → table, failures or JSON.

use super::{code, say, Error, StatusArgs};
use crate::apply::{observe, on_hosts, selector};
use crate::inventory::{HostId, Hosts};
use crate::site::ServiceId;
use crate::state::store::{self, View};
use crate::{report, site, state};
use std::collections::{BTreeMap, BTreeSet, HashSet};

pub fn run(args: &StatusArgs) -> Result<u8, Error> {
    let site = site::load(&args.site.site)?;
    let on = selector(&args.on)?;
    let all = crate::apply::resolve(&site, &say)?;
    // Desired over every host (a service's `needs` lists them all), asked by name.
    let secrets = super::readable_secrets(&site, false)?;
    let desired = crate::desired::resolve(&site, &all, &secrets)?;
    let hosts = match on_hosts(on.as_ref(), &site, &all)? {
        Some(ids) => all.subset(&ids, site.classes.len()),
        None => all.clone(),
    };
    let unpublished = crate::session::unpublished(&site.name);
    let read = super::runtime()?.block_on(store::read(&site));
    let mut stale = None;
    let view = match read {
        Ok(view) => view,
        // `--hosts` answers from the hosts whatever the store does.
        Err(e) if args.hosts => {
            stale = Some(format!(
                "{e}: what follows is each host's own record, not compared with the store"
            ));
            None
        }
        Err(e) => {
            errln!("note: `deploy status --hosts` answers from the hosts themselves");
            return Err(Error::Store(e));
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
        Some(view) if !args.hosts && unpublished.is_none() => {
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
                let read = observe(&site, &subset, false, args.site.max_connections)?;
                disagreements = store::disagreements(view, &subset, &read);
                for ((&i, why), o) in unvouched.iter().zip(read) {
                    observed[i] = o;
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
            let observed = observe(&site, &hosts, false, args.site.max_connections)?;
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
    if args.check {
        let transport = std::sync::Arc::new(crate::transport::AnyTransport::for_platform(
            &site.platform,
            hosts.hosts.len(),
            args.site.max_connections,
        ));
        let checked = super::runtime()?.block_on(crate::rollout::check_status(
            std::sync::Arc::new(site.clone()),
            &all,
            &hosts,
            &observed,
            &desired,
            transport,
            args.site.max_connections,
            std::sync::Arc::new(secrets),
        ))?;
        status.checked = Some(checked);
    }
    status.unfinished_run = match crate::session::unfinished(&site.name) {
        Ok(rec) => rec,
        Err(e) => {
            errln!(
                "warning: the unfinished run of {} cannot be read: {e}",
                site.name
            );
            None
        }
    };
    status.site_lock = crate::session::site_lock(&site.name);
    if args.failures && args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status.failures()).unwrap_or_default()
        );
    } else if args.failures {
        out!("{}", report::failures_text(&status));
    } else if args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        out!("{}", report::status_text(&status));
    }
    let failing = status
        .checked
        .as_ref()
        .is_some_and(|c| !c.failing.is_empty());
    Ok(if failing { code::FAILED } else { code::OK })
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
    for (i, h) in hosts.hosts.iter().enumerate() {
        let Some(a) = all.find(&h.name) else {
            continue;
        };
        picked.push(said.observed[a].clone());
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
        service: usize,
        host: usize,
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
