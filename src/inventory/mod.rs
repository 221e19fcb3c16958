//! Class → hosts: the [`Inventory`] trait and its backends.

mod order;
mod static_hosts;

pub use order::natural_cmp;
pub use static_hosts::Static;

use crate::site::{ClassId, InventorySpec, Site};
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

/// Index of a host in [`Hosts::hosts`].
pub type HostId = usize;

/// A real machine that plays one class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: Arc<str>,
    pub address: Arc<str>,
    pub class: ClassId,
    /// zone, rack, instance id, …: what `spread` and selectors look at.
    pub tags: BTreeMap<String, String>,
}

/// Every host of the site, resolved once per run and shared by every stage.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// In natural name order.
    pub hosts: Vec<Host>,
    /// Per class, its hosts in natural name order.
    pub by_class: Vec<Vec<HostId>>,
}

impl Hosts {
    /// Indexes `hosts` by class; sorts them by name.
    pub fn new(mut hosts: Vec<Host>, classes: usize) -> Hosts {
        hosts.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        let mut by_class = vec![Vec::new(); classes];
        for (id, h) in hosts.iter().enumerate() {
            if let Some(list) = by_class.get_mut(h.class) {
                list.push(id);
            }
        }
        Hosts { hosts, by_class }
    }

    /// The host of this name.
    pub fn find(&self, name: &str) -> Option<HostId> {
        self.hosts
            .binary_search_by(|h| natural_cmp(&h.name, name))
            .ok()
    }
}

/// What went wrong resolving the inventory.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum InventoryError {
    #[error("host `{host}` has class `{class}`, which the site does not declare")]
    #[diagnostic(code(drover::inventory::unknown_class))]
    UnknownClass { host: String, class: String },
    #[error("the inventory failed: {reason}")]
    #[diagnostic(code(drover::inventory::backend))]
    Backend { reason: String },
}

/// Backends being built: they resolve to an error that says so.
struct Pending;

impl Inventory for Pending {
    fn hosts(&self, _site: &Site) -> Result<Hosts, InventoryError> {
        Err(InventoryError::Backend {
            reason: "this inventory backend is not built yet".into(),
        })
    }
}

/// A source of hosts for the classes of a site.
pub trait Inventory {
    fn hosts(&self, site: &Site) -> Result<Hosts, InventoryError>;
}

/// The backend the site's platform names.
pub fn backend(site: &Site) -> Box<dyn Inventory> {
    match &site.platform.inventory {
        InventorySpec::Static { .. } => Box::new(Static),
        InventorySpec::Ec2(_) | InventorySpec::Command(_) => Box::new(Pending),
    }
}

/// Resolves the site's hosts through the platform's backend.
pub fn resolve(site: &Site) -> Result<Hosts, InventoryError> {
    backend(site).hosts(site)
}
