//! `deploy status`: site → inventory (`--on`: some hosts) → observed state → table or JSON.

use super::{code, plan::observe, Error, StatusArgs};
use crate::{report, site, state};

pub fn run(args: &StatusArgs) -> Result<u8, Error> {
    let site = site::load(&args.site.site)?;
    let on = super::plan::selector(&args.on)?;
    let all = super::resolve(&site)?;
    // Desired over every host (a service's `needs` lists them all), asked by name.
    let secrets = super::readable_secrets(&site);
    let desired = crate::desired::resolve(&site, &all, &secrets)?;
    let hosts = match super::plan::on_hosts(on.as_ref(), &site, &all)? {
        Some(ids) => all.subset(&ids, site.classes.len()),
        None => all.clone(),
    };
    let observed = observe(&site, &hosts, false, args.site.max_connections)?;
    let expected = ByName {
        desired: &desired,
        all: &all,
        hosts: &hosts,
    };
    let mut status = state::status(&site, &hosts, &observed, &expected);
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
    if args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        out!("{}", report::status_text(&status));
    }
    Ok(code::OK)
}

/// [`crate::desired::Desired`] asked for the hosts of a subset.
struct ByName<'a> {
    desired: &'a crate::desired::Desired,
    all: &'a crate::inventory::Hosts,
    hosts: &'a crate::inventory::Hosts,
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
        self.desired.diverged(service, h, recorded)
    }
}
