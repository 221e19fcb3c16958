//! Hosts gone from the inventory that the store still knows: a `hosts/<host>` key with the
//! address it was last seen at, and services published there. Each is added to the run's hosts
//! in no class, so that it is locked and read like the others and every service it records is
//! a removal ([`crate::plan::RemovalWhy::LeftInventory`]). Without a store such a host is not
//! known, and not found.

use super::ApplyError;
use crate::inventory::{Host, Hosts};
use crate::site::Site;
use std::sync::Arc;

/// `hosts` with the hosts the store knows and the inventory no longer gives (none without a
/// store). One range read of the store's keys.
pub fn with_gone_hosts(site: &Site, hosts: Hosts, say: &dyn Fn(&str)) -> Result<Hosts, ApplyError> {
    if site.platform.store.is_none() {
        return Ok(hosts);
    }
    let runtime = crate::session::runtime().map_err(ApplyError::Runtime)?;
    let view = runtime
        .block_on(crate::state::store::read(site))
        .map_err(ApplyError::Store)?;
    let Some(view) = view else {
        return Ok(hosts);
    };
    let gone: Vec<Host> = view
        .hosts
        .iter()
        .filter(|(name, entry)| hosts.find(name).is_none() && !entry.services.is_empty())
        .filter_map(|(name, entry)| {
            let value = entry.value.as_ref()?;
            Some(Host {
                name: Arc::from(name.as_str()),
                address: Arc::from(value.address.as_str()),
                classes: Vec::new(),
                tags: Default::default(),
            })
        })
        .collect();
    if gone.is_empty() {
        return Ok(hosts);
    }
    let names: Vec<&str> = gone.iter().map(|h| &*h.name).collect();
    say(&format!(
        "note: the store knows {} the inventory no longer gives ({}): read for its removals",
        crate::words::count(gone.len(), "host"),
        names.join(", ")
    ));
    let Hosts {
        hosts: mut all,
        warnings,
        ..
    } = hosts;
    all.extend(gone);
    let mut out = Hosts::new(all.into_vec(), site.classes.len());
    out.warnings = warnings;
    Ok(out)
}
