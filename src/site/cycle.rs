//! Runtime dependency order of services, and the cycles that make an order impossible.

use super::error::{SiteError, Src};
use super::model::{Service, ServiceId};
use miette::{LabeledSpan, SourceSpan};
use std::collections::BTreeSet;

/// The services each service needs at runtime (deduplicated, self-needs kept), by index.
fn runtime_needs(services: &[Service]) -> Vec<Vec<usize>> {
    services
        .iter()
        .map(|s| {
            let set: BTreeSet<usize> = s
                .needs
                .iter()
                .filter(|n| n.healthy.is_some())
                .map(|n| n.service.index())
                .collect();
            set.into_iter().collect()
        })
        .collect()
}

/// Kahn's algorithm, lowest declaration index first; returns the order and what is left over
/// (services by index, as in the services' list).
fn kahn(needs: &[Vec<usize>], alive: &[bool]) -> (Vec<usize>, Vec<bool>) {
    let n = needs.len();
    let mut indegree = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (s, ns) in needs.iter().enumerate().filter(|(s, _)| alive[*s]) {
        for &t in ns.iter().filter(|t| alive[**t]) {
            indegree[s] += 1;
            dependents[t].push(s);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|s| alive[*s] && indegree[*s] == 0).collect();
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
    kahn(&runtime_needs(services), &vec![true; services.len()])
        .0
        .into_iter()
        .map(ServiceId::new)
        .collect()
}

/// A runtime `needs` of one service on another, where it is written.
#[derive(Debug, Clone)]
pub struct Edge {
    pub to: ServiceId,
    pub src: Src,
    /// The whole `needs` line.
    pub span: SourceSpan,
    /// The template it comes from, if not the service's own node.
    pub via: Option<String>,
}

/// Reports every independent runtime cycle among `edges` (per service, its runtime needs that
/// resolved, whatever else is wrong with the site), each edge labelled at its `needs` line.
/// `names` and `edges` are by service index.
pub fn report(names: &[&str], edges: &[Vec<Edge>], errors: &mut Vec<SiteError>) {
    let needs: Vec<Vec<usize>> = edges
        .iter()
        .map(|es| {
            let set: BTreeSet<usize> = es.iter().map(|e| e.to.index()).collect();
            set.into_iter().collect()
        })
        .collect();
    let mut alive = vec![true; names.len()];
    loop {
        let (_, left) = kahn(&needs, &alive);
        let Some(start) = left.iter().position(|l| *l) else {
            return;
        };
        let cycle = find_cycle(&needs, &left, start);
        let mut labelled: Vec<(Src, LabeledSpan)> = Vec::new();
        for (i, &s) in cycle.iter().enumerate() {
            let t = cycle[(i + 1) % cycle.len()];
            if let Some(e) = edges[s].iter().find(|e| e.to.index() == t) {
                let via = e
                    .via
                    .as_ref()
                    .map_or(String::new(), |t| format!(" (template `{t}`)"));
                let label = format!("`{}` needs `{}` at runtime{via}", names[s], names[t]);
                labelled.push((
                    e.src.clone(),
                    LabeledSpan::new_with_span(Some(label), e.span),
                ));
            }
        }
        let mut shown: Vec<&str> = cycle.iter().map(|s| names[*s]).collect();
        shown.push(shown[0]);
        if let Some((src, _)) = labelled.first().cloned() {
            let (here, elsewhere): (Vec<_>, Vec<_>) = labelled
                .into_iter()
                .partition(|(s, _)| s.name() == src.name());
            errors.push(SiteError::Cycle {
                cycle: shown.join(" → "),
                src,
                edges: here.into_iter().map(|(_, l)| l).collect(),
                elsewhere: elsewhere
                    .into_iter()
                    .map(|(src, l)| SiteError::CycleEdge {
                        label: l.label().unwrap_or_default().to_string(),
                        span: *l.inner(),
                        src,
                    })
                    .collect(),
            });
        }
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
fn find_cycle(needs: &[Vec<usize>], left: &[bool], start: usize) -> Vec<usize> {
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
