//! The `static` backend: hosts written in the platform file.

use super::{Host, Hosts, Inventory, InventoryError};
use crate::site::{InventorySpec, Site};

/// Hosts listed in the platform file (already checked against the site's classes).
pub struct Static;

impl Inventory for Static {
    fn hosts(&self, site: &Site) -> Result<Hosts, InventoryError> {
        let InventorySpec::Static { hosts } = &site.platform.inventory else {
            return Ok(Hosts::new(Vec::new(), site.classes.len()));
        };
        let hosts = hosts
            .iter()
            .map(|h| Host {
                name: h.name.as_str().into(),
                address: h.address.as_str().into(),
                class: h.class,
                tags: h.tags.clone(),
            })
            .collect();
        Ok(Hosts::new(hosts, site.classes.len()))
    }
}
