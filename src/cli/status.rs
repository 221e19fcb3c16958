//! `deploy status`: site → inventory (`--on`: some hosts) → what each host runs (the store's
//! one range read, or each host's state file) → table, failures or JSON.

use super::{code, plan::observe, Error, StatusArgs};
use crate::inventory::{HostId, Hosts};
use crate::site::ServiceId;
use crate::state::store::{self, View};
use crate::{report, site, state};
use std::collections::HashSet;

pub fn run(args: &StatusArgs) -> Result<u8, Error> {
    let site = site::load(&args.site.site)?;
    let on = super::plan::selector(&args.on)?;
    let all = super::resolve(&site)?;
    // Desired over every host (a service's `needs` lists them all), asked by name.
    let secrets = super::readable_secrets(&site, false)?;
    let desired = crate::desired::resolve(&site, &all, &secrets)?;
    let hosts = match super::plan::on_hosts(on.as_ref(), &site, &all)? {
        Some(ids) => all.subset(&ids, site.classes.len()),
        None => all.clone(),
    };
    let view = super::runtime()?
        .block_on(store::read(&site))
        .map_err(Error::Store)?;
    let mut differ = HashSet::new();
    let (observed, source, disagreements) = match &view {
        Some(view) if !args.hosts => {
            let (observed, d) = from_store(view, &site, &all, &hosts, &desired);
            differ = d;
            (observed, state::Source::Store, Vec::new())
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
    Ok(code::OK)
}

/// What the store says the hosts of `hosts` (a subset of `all`) run; and the pairs, as
/// `(service, host of all)`, whose inputs differ from the site's.
fn from_store(
    view: &View,
    site: &site::Site,
    all: &Hosts,
    hosts: &Hosts,
    desired: &crate::desired::Desired,
) -> (Vec<state::Observed>, HashSet<(ServiceId, HostId)>) {
    let (observed, differ) = store::observed(view, site, all, desired);
    let picked = hosts
        .hosts
        .iter()
        .filter_map(|h| all.find(&h.name).map(|i| observed[i].clone()))
        .collect();
    (picked, differ.into_iter().collect())
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
