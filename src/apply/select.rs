//! What may change: `--only` service names and `--on` host selectors, checked against the site
//! and its hosts.

use super::ApplyError;
use crate::inventory::{HostId, Hosts, Selector};
use crate::plan::Selection;
use crate::site::Site;
use std::collections::BTreeSet;

/// `--only` names → service ids; an unknown name is an error with a suggestion.
pub fn selection(site: &Site, only: &[String]) -> Result<Selection, ApplyError> {
    if only.is_empty() {
        return Ok(Selection::default());
    }
    let mut services = BTreeSet::new();
    for name in only {
        match site.service(name) {
            Some(id) => {
                services.insert(id);
            }
            None => {
                let names: Vec<&str> = site.services.iter().map(|s| s.name.as_str()).collect();
                return Err(ApplyError::UnknownService {
                    name: name.into(),
                    help: format!("services: {}", names.join(", ")),
                });
            }
        }
    }
    Ok(Selection {
        services: Some(services),
        ..Default::default()
    })
}

/// `--on` values → a selector, checked before the inventory is resolved; `None` without any.
pub fn selector(on: &[String]) -> Result<Option<Selector>, ApplyError> {
    if on.is_empty() {
        return Ok(None);
    }
    Ok(Some(Selector::parse_all(on)?))
}

/// The hosts a selector picks (`None`: all); a term matching no host is an error.
pub fn on_hosts(
    on: Option<&Selector>,
    site: &Site,
    hosts: &Hosts,
) -> Result<Option<BTreeSet<HostId>>, ApplyError> {
    let Some(on) = on else {
        return Ok(None);
    };
    Ok(Some(on.select_in(site, hosts)?))
}
