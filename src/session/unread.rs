//! Which hosts `deploy apply --yes` leaves unread before the run ([`super::Session::lock`]):
//! under `--max-connections`, all but the first host by name and the hosts the first service
//! is planned from, read as the run goes ([`super::Locked::plan_as_read`]); over it, the hosts
//! [`crate::plan::deferrable`] says may be, but the cap's worth stepped first, read at their
//! step.

use crate::inventory::{HostId, Hosts};
use crate::site::{IdVec, Site};
use crate::state::Observed;
use std::collections::HashSet;

/// The hosts a run left unread before it.
#[derive(Default)]
pub(super) struct Unread {
    /// How many.
    pub count: usize,
    /// They are read as the run goes, each service planned once its hosts are.
    pub plans_as_read: bool,
    /// Over the cap: the hosts that may be left unread (`plan::deferrable`).
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
    let first_host = hosts
        .hosts
        .ids()
        .min_by(|a, b| hosts.hosts[*a].name.cmp(&hosts.hosts[*b].name))?;
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
        let mut of_some: IdVec<HostId, bool> = vec![false; hosts.hosts.len()].into();
        for sid in site.services.ids() {
            for h in crate::plan::planned_from(site, hosts, sid) {
                of_some[h] = true;
            }
        }
        first.extend(hosts.hosts.ids().filter(|&h| !of_some[h]));
        let mut unread = 0;
        for (h, k) in known.iter_mut().enumerate() {
            if !first.contains(&HostId::new(h)) && k.is_none() {
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
    let mut first: HashSet<HostId> = stepped_first(&selected, Some(first_host), max_connections)
        .into_iter()
        .collect();
    first.insert(first_host);
    // Hosts selected for no service are not stepped: read as always.
    let selected: HashSet<HostId> = selected.into_iter().collect();
    let mut unread = 0;
    let alone = &mut left.alone;
    for (h, may) in crate::plan::deferrable(site, hosts).into_iter().enumerate() {
        if !may {
            continue;
        }
        let h = HostId::new(h);
        alone.insert(hosts.hosts[h].name.to_string());
        // A host with a service left out of the run (`--only`) is read before it: that
        // service has no step there to count it healthy, and a service that needs it counts
        // it healthy from what it was read to run (`Plan::healthy_before`).
        let whole = hosts.hosts[h]
            .classes
            .iter()
            .flat_map(|&c| site.classes[c].services.iter())
            .all(|&s| selection.has(s, h));
        if whole && !first.contains(&h) && selected.contains(&h) && known[h.index()].is_none() {
            known[h.index()] = Some(Observed::Unread);
            unread += 1;
        }
    }
    left.count = unread;
    anchor
}

/// The hosts read before the run over the cap whose links are kept for their steps: the cap's
/// worth of `order` (the hosts in the order of their first step), less one when the first host
/// by name (`anchor`) is not among them, since the run holds that one's link to its end too
/// ([`crate::transport::Kept::hold`], from a cap of 4): kept beside the cap's worth, it went
/// over the cap, and closed to make room, it was connected again at its step.
pub(super) fn stepped_first<T: PartialEq + Clone>(
    order: &[T],
    anchor: Option<T>,
    max_connections: usize,
) -> Vec<T> {
    let mut first: Vec<T> = order.iter().take(max_connections).cloned().collect();
    if anchor.is_some_and(|a| max_connections >= 4 && !first.contains(&a)) {
        first.truncate(max_connections - 1);
    }
    first
}

#[cfg(test)]
mod tests {
    use super::stepped_first;

    #[test]
    fn the_first_host_by_name_takes_one_of_the_kept_links_when_it_is_stepped_later() {
        let order = [5, 6, 7, 8, 9, 1];
        // Among the first four: the cap's worth.
        assert_eq!(stepped_first(&order, Some(6), 4), [5, 6, 7, 8]);
        // Stepped later: one less, so that its held link and those kept fit under the cap.
        assert_eq!(stepped_first(&order, Some(1), 4), [5, 6, 7]);
        // No first host held (under a cap of 4, or none left unread): the cap's worth.
        assert_eq!(stepped_first(&order, Some(1), 3), [5, 6, 7]);
        assert_eq!(stepped_first(&order, None, 4), [5, 6, 7, 8]);
        // Fewer hosts than the cap.
        assert_eq!(stepped_first(&order[..2], Some(1), 4), [5, 6]);
    }
}
