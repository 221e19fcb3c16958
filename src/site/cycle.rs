//! Runtime dependency order of services, and the cycles that make an order impossible.

use super::error::{SiteError, Src};
use super::model::{Service, ServiceId};
use super::raw::RawSite;
use miette::LabeledSpan;
use std::collections::BTreeSet;

/// The services each service needs at runtime (deduplicated, self-needs kept).
fn runtime_needs(services: &[Service]) -> Vec<Vec<ServiceId>> {
    services
        .iter()
        .map(|s| {
            let set: BTreeSet<ServiceId> = s
                .needs
                .iter()
                .filter(|n| n.healthy.is_some())
                .map(|n| n.service)
                .collect();
            set.into_iter().collect()
        })
        .collect()
}

/// Kahn's algorithm, lowest declaration index first; returns the order and what is left over.
fn kahn(needs: &[Vec<ServiceId>], alive: &[bool]) -> (Vec<ServiceId>, Vec<bool>) {
    let n = needs.len();
    let mut indegree = vec![0usize; n];
    let mut dependents: Vec<Vec<ServiceId>> = vec![Vec::new(); n];
    for (s, ns) in needs.iter().enumerate().filter(|(s, _)| alive[*s]) {
        for &t in ns.iter().filter(|t| alive[**t]) {
            indegree[s] += 1;
            dependents[t].push(s);
        }
    }
    let mut ready: BTreeSet<ServiceId> =
        (0..n).filter(|s| alive[*s] && indegree[*s] == 0).collect();
    let mut order = Vec::with_capacity(n);
    let mut left = alive.to_vec();
    while let Some(s) = ready.pop_first() {
        order.push(s);
        left[s] = false;
        for &d in &dependents[s] {
            indegree[d] -= 1;
            if indegree[d] == 0 {
                ready.insert(d);
            }
        }
    }
    (order, left)
}

/// Services in runtime dependency order (the site must be free of cycles).
pub fn order(services: &[Service]) -> Vec<ServiceId> {
    kahn(&runtime_needs(services), &vec![true; services.len()]).0
}

/// Reports every independent runtime cycle, each edge labelled at its `needs` line.
pub fn report(src: &Src, raw: &RawSite, services: &[Service], errors: &mut Vec<SiteError>) {
    let needs = runtime_needs(services);
    let mut alive = vec![true; services.len()];
    loop {
        let (_, left) = kahn(&needs, &alive);
        let Some(start) = left.iter().position(|l| *l) else {
            return;
        };
        let cycle = find_cycle(&needs, &left, start);
        let mut edges = Vec::new();
        for (i, &s) in cycle.iter().enumerate() {
            let t = cycle[(i + 1) % cycle.len()];
            let (from, to) = (&services[s].name, &services[t].name);
            let span = raw.services[s]
                .needs
                .iter()
                .find(|n| {
                    n.service.value == *to && (n.healthy.is_some() || n.addressable.is_none())
                })
                .map(|n| n.span);
            if let Some(span) = span {
                edges.push(LabeledSpan::new_with_span(
                    Some(format!("`{from}` needs `{to}` at runtime")),
                    span,
                ));
            }
        }
        let mut names: Vec<&str> = cycle.iter().map(|s| services[*s].name.as_str()).collect();
        names.push(names[0]);
        errors.push(SiteError::Cycle {
            cycle: names.join(" → "),
            src: src.clone(),
            edges,
        });
        for s in cycle {
            alive[s] = false;
        }
        for (s, l) in left.iter().enumerate() {
            if !l {
                alive[s] = false;
            }
        }
    }
}

/// Follows runtime needs among the leftover services from `start` until one repeats.
fn find_cycle(needs: &[Vec<ServiceId>], left: &[bool], start: ServiceId) -> Vec<ServiceId> {
    let mut path = vec![start];
    let mut at = start;
    loop {
        let Some(&next) = needs[at].iter().find(|t| left[**t]) else {
            return path;
        };
        if let Some(pos) = path.iter().position(|p| *p == next) {
            return path.split_off(pos);
        }
        path.push(next);
        at = next;
    }
}
