//! On one host, a service's step follows the steps of the services it needs at runtime.

use crate::inventory::HostId;
use crate::site::{ClassId, IdVec, ServiceId, Site};
use std::sync::Arc;

/// Per service, every service it needs at runtime, directly or through others.
pub struct RuntimeClosure {
    /// `needs[s]` is a bitset over services (bit `t.index()` for service `t`).
    needs: IdVec<ServiceId, Vec<u64>>,
    /// `rank[s]`: where `s` stands in the site's dependency order.
    rank: IdVec<ServiceId, usize>,
    /// Service names, shared by every step that names them.
    names: IdVec<ServiceId, Arc<str>>,
}

impl RuntimeClosure {
    pub fn new(site: &Site) -> Self {
        let words = site.services.len().div_ceil(64);
        let mut needs: IdVec<ServiceId, Vec<u64>> =
            vec![vec![0u64; words]; site.services.len()].into();
        for &s in &site.order {
            for n in site.services[s]
                .needs
                .iter()
                .filter(|n| n.healthy.is_some())
            {
                let t = n.service;
                let inherited = needs[t].clone();
                let mine = &mut needs[s];
                for (m, i) in mine.iter_mut().zip(inherited) {
                    *m |= i;
                }
                mine[t.index() / 64] |= 1 << (t.index() % 64);
            }
        }
        let mut rank: IdVec<ServiceId, usize> = vec![usize::MAX; site.services.len()].into();
        for (i, &s) in site.order.iter().enumerate() {
            rank[s] = i;
        }
        let names = site
            .services
            .iter()
            .map(|s| Arc::from(s.name.as_str()))
            .collect();
        RuntimeClosure { needs, rank, names }
    }

    /// Whether `service` needs `other` at runtime, directly or through others.
    pub fn needs(&self, service: ServiceId, other: ServiceId) -> bool {
        self.needs[service][other.index() / 64] & (1 << (other.index() % 64)) != 0
    }

    /// The name of `service`, shared.
    pub fn name(&self, service: ServiceId) -> Arc<str> {
        self.names[service].clone()
    }

    /// Where `service` stands in dependency order.
    pub fn rank(&self, service: ServiceId) -> usize {
        self.rank[service]
    }

    /// The services of `class` that `service` needs at runtime, in dependency order.
    pub fn after(&self, site: &Site, class: ClassId, service: ServiceId) -> Vec<ServiceId> {
        let bits = &self.needs[service];
        let mut mine: Vec<ServiceId> = site.classes[class]
            .services
            .iter()
            .copied()
            .filter(|t| bits[t.index() / 64] & (1 << (t.index() % 64)) != 0)
            .collect();
        mine.sort_by_key(|t| self.rank[*t]);
        mine
    }
}

/// Which services have a step on which host, filled in dependency order.
pub struct Changing {
    /// Per host, its changing services sorted by id: a host running many services answers
    /// `has` by binary search, not by scanning them all for each of its steps.
    per_host: IdVec<HostId, Vec<ServiceId>>,
}

impl Changing {
    pub fn new(hosts: usize) -> Self {
        Changing {
            per_host: vec![Vec::new(); hosts].into(),
        }
    }

    pub fn add(&mut self, host: HostId, service: ServiceId) {
        let list = &mut self.per_host[host];
        if let Err(at) = list.binary_search(&service) {
            list.insert(at, service);
        }
    }

    pub fn has(&self, host: HostId, service: ServiceId) -> bool {
        self.per_host[host].binary_search(&service).is_ok()
    }
}
