//! The `static` backend: hosts written in the platform file or a hosts file beside it.

use super::{Host, Inventory, InventoryError};
use crate::site::{InventorySpec, Site};

/// Hosts listed in the platform file (already checked against the site's classes).
pub struct Static;

impl Inventory for Static {
    fn hosts(&self, site: &Site) -> Result<Vec<Host>, InventoryError> {
        let InventorySpec::Static { hosts } = &site.platform.inventory else {
            return Ok(Vec::new());
        };
        Ok(hosts
            .iter()
            .map(|h| Host {
                name: h.name.as_str().into(),
                address: h.address.as_str().into(),
                classes: vec![h.class],
                tags: h.tags.clone(),
            })
            .collect())
    }
}
