//! Which hosts `deploy apply --yes` leaves unread before the run ([`super::Session::lock`]):
//! under `--max-connections`, all but the first host by name and the hosts the first service
//! is planned from, read as the run goes ([`super::Locked::plan_as_read`]); over it, the hosts
//! of services that stand alone, but the cap's worth stepped first, read at their step.

use crate::inventory::{HostId, Hosts};
use crate::site::Site;
use crate::state::Observed;
use std::collections::HashSet;

/// The hosts a run left unread before it.
#[derive(Default)]
pub(super) struct Unread {
    /// How many.
    pub count: usize,
    /// They are read as the run goes, each service planned once its hosts are.
    pub plans_as_read: bool,
    /// Over the cap: the hosts whose services stand alone (`plan::deferrable`).
    pub alone: HashSet<String>,
}

/// Marks `Observed::Unread` in `known` the hosts this run leaves unread before it (called
/// when nothing is confirmed first, no store is used and no run is carried on). Returns the
/// first host by name (the anchor, locked first, alone, and held to the end) when it left
/// any unread.
pub(super) fn leave_unread(
    max_connections: usize,
    site: &Site,
    hosts: &Hosts,
    selection: &crate::plan::Selection,
    known: &mut [Option<Observed>],
    left: &mut Unread,
) -> Option<String> {
    // The first host by name: every run of the site, whatever its selection, asks for it
    // before any other, and this run holds it to the end (`Journaled::held_to_end`), so
    // that no second run starts while this one locks its other hosts later.
    let first_host =
        (0..hosts.hosts.len()).min_by(|a, b| hosts.hosts[*a].name.cmp(&hosts.hosts[*b].name))?;
    let anchor = Some(hosts.hosts[first_host].name.to_string());
    if hosts.hosts.len() <= max_connections {
        // Under the cap: the hosts the first service is planned from are read before the
        // run (and the first host by name); the others are read as the run goes on, and
        // each service is planned once its hosts are.
        let first_service = site.order.iter().copied().find(|&sid| {
            hosts
                .of_classes(&site.services[sid].classes)
                .into_iter()
                .any(|h| selection.has(sid, h))
        })?;
        let mut first: HashSet<HostId> = crate::plan::planned_from(site, hosts, first_service)
            .into_iter()
            .collect();
        first.insert(first_host);
        // A host no service is planned from is read before the run, as always.
        let mut of_some = vec![false; hosts.hosts.len()];
        for sid in 0..site.services.len() {
            for h in crate::plan::planned_from(site, hosts, sid) {
                of_some[h] = true;
            }
        }
        first.extend((0..hosts.hosts.len()).filter(|&h| !of_some[h]));
        let mut unread = 0;
        for (h, k) in known.iter_mut().enumerate() {
            if !first.contains(&h) && k.is_none() {
                *k = Some(Observed::Unread);
                unread += 1;
            }
        }
        left.count = unread;
        left.plans_as_read = unread > 0;
        return anchor;
    }
    // Over the cap: the hosts that may be are left unread until their first step, but the
    // cap's worth stepped first (read now, their links kept for their steps).
    let selected = crate::plan::first_hosts(site, hosts, selection);
    let mut first: HashSet<HostId> = selected.iter().copied().take(max_connections).collect();
    first.insert(first_host);
    // Hosts selected for no service are not stepped: read as always.
    let selected: HashSet<HostId> = selected.into_iter().collect();
    let mut unread = 0;
    let alone = &mut left.alone;
    for (h, may) in crate::plan::deferrable(site, hosts).into_iter().enumerate() {
        if !may {
            continue;
        }
        alone.insert(hosts.hosts[h].name.to_string());
        if !first.contains(&h) && selected.contains(&h) && known[h].is_none() {
            known[h] = Some(Observed::Unread);
            unread += 1;
        }
    }
    left.count = unread;
    anchor
}
