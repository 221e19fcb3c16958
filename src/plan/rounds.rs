//! Waits that would go round: a pool wait (a step waiting for a needed service's step on a
//! host its pool adds, [`Step::waits`](super::Step::waits)) that closes a cycle with the
//! other waits, `after`, start conditions and wave order is dropped, and said why.
//!
//! Every relation but a pool wait goes forward in the plan's order (services in dependency
//! order, a service's waves in order): `after` and start conditions follow runtime needs,
//! wave order a service's own waves. So every cycle holds a pool wait for a step later in
//! that order. Those in a cycle are dropped, then each is kept again, in plan order of the
//! step that waits, unless it would close a cycle with those kept: what is dropped is only
//! what would go round, and the same for the same plan and run.

use super::{HostStep, Plan};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// A pool wait left out because keeping it would make the run's waits go round: the step of
/// `service` on `host` does not wait for `waits_for`, and may list its host before it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedWait {
    pub service: Arc<str>,
    pub host: Arc<str>,
    pub waits_for: HostStep,
    /// Why: from the step waited for back to the step that would wait (the last link), each
    /// link a step the one before it must follow, and how.
    pub round: Vec<Link>,
}

/// A step in a round, and how the step before it in the round follows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub by: LinkKind,
    pub service: Arc<str>,
    pub host: Arc<str>,
}

/// How one step follows another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    /// A pool wait kept.
    Waits,
    /// The same host, a service it needs at runtime first.
    After,
    /// A later wave of the same service.
    Wave,
    /// The service starts once a service it needs at runtime has its healthy hosts.
    Start,
}

impl DroppedWait {
    /// The wait and its round in words, with what it means for the host's configuration.
    pub fn words(&self) -> String {
        let w = &self.waits_for;
        let mut out = format!(
            "{} on {} does not wait for {} on {}: {} on {}",
            self.service, self.host, w.service, w.host, w.service, w.host
        );
        for (i, l) in self.round.iter().enumerate() {
            let lead = if i == 0 { " " } else { ", which " };
            let step = format!("{} on {}", l.service, l.host);
            let said = match l.by {
                LinkKind::Waits => format!("waits for {step}"),
                LinkKind::After => format!("runs after {step} on the same host"),
                LinkKind::Wave => format!("is in a later wave than {step}"),
                LinkKind::Start => format!(
                    "cannot start before {} is healthy on enough hosts, {step} among them",
                    l.service
                ),
            };
            out.push_str(lead);
            out.push_str(&said);
        }
        out.push_str(&format!(
            ". So {} on {} may be given {} as a host of {} before {}'s step on {} has ended: {} \
             may not serve {} yet",
            self.service, self.host, w.host, w.service, w.service, w.host, w.host, w.service
        ));
        out
    }
}

/// A pool wait by the plan's indices: the step of service `service` on host `host` waits for
/// the step of `on` on `on_host` (services in `Plan::services`, hosts in `Plan::hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitKey {
    pub service: usize,
    pub host: usize,
    pub on: usize,
    pub on_host: usize,
}

/// The steps of a round by the plan's indices, from the step waited for back to the one that
/// would wait: `(service, host, how the one before it follows it)`.
pub type Round = Vec<(usize, usize, LinkKind)>;

/// Where a run stands, for what may still wait: before the run nothing has started.
pub trait Progress {
    /// Whether step `i` of wave `w` of service `s` is still to start (its service not over).
    fn to_start(&self, s: usize, w: usize, i: usize) -> bool;
    /// Whether wave `w` of service `s` is still to open (wave 0: the service to start).
    fn to_open(&self, s: usize, w: usize) -> bool;
    /// Whether service `s`'s start still waits for service `t` to have `count` healthy hosts.
    fn start_waits_for(&self, s: usize, t: usize, count: usize) -> bool;
    /// The pool waits of service `s`'s step on host `h` beyond the step's own (an unread
    /// step's, found once its host is read): `(service, host)`.
    fn more_waits(&self, _s: usize, _h: usize) -> &[(usize, usize)] {
        &[]
    }
    /// Whether any step has waits beyond its own ([`Progress::more_waits`]).
    fn has_more_waits(&self) -> bool {
        false
    }
}

/// The plan before the run: every step to start, every condition counted from the hosts
/// healthy before it.
pub struct BeforeRun {
    healthy: Vec<usize>,
}

impl BeforeRun {
    pub fn new(plan: &Plan) -> Self {
        BeforeRun {
            healthy: plan
                .services
                .iter()
                .map(|s| plan.healthy_before(s))
                .collect(),
        }
    }
}

impl Progress for BeforeRun {
    fn to_start(&self, _: usize, _: usize, _: usize) -> bool {
        true
    }
    fn to_open(&self, _: usize, _: usize) -> bool {
        true
    }
    fn start_waits_for(&self, _: usize, t: usize, count: usize) -> bool {
        self.healthy[t] < count
    }
}

/// What a node of the graph stands for.
#[derive(Clone, Copy)]
enum Node {
    /// The opening of wave `w` of a service (wave 0: its start).
    Gate,
    /// A step: service, host.
    Step(usize, usize),
    /// Every step of a service ended.
    End,
}

struct Edge {
    to: usize,
    by: LinkKind,
    /// A pool wait's index in `Graph::waits`.
    wait: Option<usize>,
}

struct Graph {
    nodes: Vec<Node>,
    /// Whether the node is still to come (a step to start, a wave to open).
    live: Vec<bool>,
    /// `u → v`: v does not start before u has ended.
    out: Vec<Vec<Edge>>,
    waits: Vec<(WaitKey, usize, usize)>,
    /// Edges off: pool waits dropped.
    off: HashSet<usize>,
}

impl Graph {
    fn edge(&mut self, u: usize, v: usize, by: LinkKind, wait: Option<WaitKey>) {
        if !self.live[u] || !self.live[v] || u == v {
            return;
        }
        let wait = wait.map(|k| {
            self.waits.push((k, u, v));
            self.waits.len() - 1
        });
        self.out[u].push(Edge { to: v, by, wait });
    }

    fn on(&self, e: &Edge) -> bool {
        e.wait.is_none_or(|w| !self.off.contains(&w))
    }

    /// Strongly connected components (iterative Tarjan): per node, its component's id.
    fn components(&self) -> Vec<usize> {
        let n = self.nodes.len();
        let mut index = vec![usize::MAX; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut comp = vec![usize::MAX; n];
        let (mut next, mut comps) = (0, 0);
        for root in 0..n {
            if index[root] != usize::MAX {
                continue;
            }
            // (node, next edge to look at)
            let mut call = vec![(root, 0usize)];
            index[root] = next;
            low[root] = next;
            next += 1;
            stack.push(root);
            on_stack[root] = true;
            while let Some(&mut (v, ref mut e)) = call.last_mut() {
                if let Some(edge) = self.out[v].get(*e) {
                    *e += 1;
                    if !self.on(edge) {
                        continue;
                    }
                    let w = edge.to;
                    if index[w] == usize::MAX {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        call.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                call.pop();
                if let Some(&(parent, _)) = call.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp[w] = comps;
                        if w == v {
                            break;
                        }
                    }
                    comps += 1;
                }
            }
        }
        comp
    }

    /// A shortest path from `from` to `to` over the edges on, within component `c`:
    /// the edges taken, in order.
    fn path(&self, from: usize, to: usize, comp: &[usize]) -> Option<Vec<(usize, LinkKind)>> {
        let c = comp[from];
        let mut came: HashMap<usize, (usize, LinkKind)> = HashMap::new();
        let mut queue = VecDeque::from([from]);
        let mut seen = HashSet::from([from]);
        while let Some(u) = queue.pop_front() {
            if u == to {
                let mut edges = Vec::new();
                let mut at = to;
                while at != from {
                    let (prev, by) = came[&at];
                    edges.push((prev, by));
                    at = prev;
                }
                edges.reverse();
                return Some(edges);
            }
            for e in self.out[u].iter().filter(|e| self.on(e)) {
                if comp[e.to] == c && seen.insert(e.to) {
                    came.insert(e.to, (u, e.by));
                    queue.push_back(e.to);
                }
            }
        }
        None
    }
}

/// The pool waits of `plan` that would go round as the run stands (`now`), besides those
/// `dropped` already: each with its round. Empty when nothing goes round.
pub fn go_round(
    plan: &Plan,
    now: &impl Progress,
    dropped: &HashSet<WaitKey>,
) -> Vec<(WaitKey, Round)> {
    // Most plans have no pool wait at all: nothing to build then.
    let waits = |sp: &super::ServicePlan| sp.each_step().any(|st| !st.waits.is_empty());
    if !now.has_more_waits() && !plan.services.iter().any(waits) {
        return Vec::new();
    }
    let g = graph(plan, now, dropped);
    if g.waits.is_empty() {
        return Vec::new();
    }
    let comp = g.components();
    // Pool waits in a cycle for a step later in plan order: dropped, then kept again one by
    // one in plan order of the step that waits, if they close no cycle with those kept.
    let mut later: Vec<usize> = (0..g.waits.len())
        .filter(|&w| {
            let (_, u, v) = g.waits[w];
            u > v && comp[u] == comp[v]
        })
        .collect();
    if later.is_empty() {
        return Vec::new();
    }
    later.sort_by_key(|&w| (g.waits[w].2, g.waits[w].1));
    let mut g = g;
    g.off.extend(later.iter().copied());
    let mut gone = Vec::new();
    for &w in &later {
        let (_, u, v) = g.waits[w];
        if g.path(v, u, &comp).is_some() {
            gone.push(w);
        } else {
            g.off.remove(&w);
        }
    }
    gone.into_iter()
        .map(|w| {
            let (key, u, v) = g.waits[w];
            let edges = g.path(v, u, &comp).unwrap_or_default();
            // From the step waited for back to the one that would wait: each step on the
            // way, and how the next one along follows it.
            let round = edges
                .iter()
                .rev()
                .filter_map(|&(node, by)| match g.nodes[node] {
                    Node::Step(s, h) => Some((s, h, by)),
                    _ => None,
                })
                .collect();
            (key, round)
        })
        .collect()
}

/// The graph of what must end before what starts, as the run stands.
fn graph(plan: &Plan, now: &impl Progress, dropped: &HashSet<WaitKey>) -> Graph {
    let services: HashMap<&str, usize> = plan
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let hosts: HashMap<&str, usize> = plan
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (&*h.name, i))
        .collect();
    // Nodes in plan order: per service its gates and steps wave by wave, then its end.
    let mut nodes = Vec::new();
    let mut live = Vec::new();
    let mut gates: Vec<Vec<usize>> = Vec::with_capacity(plan.services.len());
    let mut ends = Vec::with_capacity(plan.services.len());
    let mut step_at: HashMap<(usize, usize), usize> = HashMap::new();
    for (s, sp) in plan.services.iter().enumerate() {
        let mut g = Vec::with_capacity(sp.waves.len());
        for (w, wave) in sp.waves.iter().enumerate() {
            g.push(nodes.len());
            nodes.push(Node::Gate);
            live.push(now.to_open(s, w));
            for (i, st) in wave.steps.iter().enumerate() {
                let h = hosts.get(&*st.host).copied().unwrap_or(usize::MAX);
                step_at.insert((s, h), nodes.len());
                nodes.push(Node::Step(s, h));
                live.push(now.to_start(s, w, i));
            }
        }
        gates.push(g);
        ends.push(nodes.len());
        nodes.push(Node::End);
        live.push(true);
    }
    let mut g = Graph {
        out: (0..nodes.len()).map(|_| Vec::new()).collect(),
        nodes,
        live,
        waits: Vec::new(),
        off: HashSet::new(),
    };
    for (s, sp) in plan.services.iter().enumerate() {
        // What the service's start waits for.
        if let Some(&start) = gates[s].first() {
            for c in &sp.waits_for {
                if let Some(&t) = services.get(c.service.as_str()) {
                    if t != s && now.start_waits_for(s, t, c.count) {
                        g.edge(ends[t], start, LinkKind::Start, None);
                    }
                }
            }
        }
        for (w, wave) in sp.waves.iter().enumerate() {
            let gate = gates[s][w];
            let next = gates[s].get(w + 1).copied();
            let by = if w == 0 {
                LinkKind::Start
            } else {
                LinkKind::Wave
            };
            for st in &wave.steps {
                let Some(&h) = hosts.get(&*st.host) else {
                    continue;
                };
                let me = step_at[&(s, h)];
                g.edge(gate, me, by, None);
                if let Some(next) = next {
                    g.edge(me, next, LinkKind::Wave, None);
                }
                g.edge(me, ends[s], LinkKind::Start, None);
                for a in &st.after {
                    if let Some(&u) = services.get(&**a).and_then(|t| step_at.get(&(*t, h))) {
                        g.edge(u, me, LinkKind::After, None);
                    }
                }
                let own = st
                    .waits
                    .iter()
                    .filter_map(|x| Some((*services.get(&*x.service)?, *hosts.get(&*x.host)?)));
                let more = now.more_waits(s, h).iter().copied();
                for (t, n) in own.chain(more) {
                    let key = WaitKey {
                        service: s,
                        host: h,
                        on: t,
                        on_host: n,
                    };
                    if dropped.contains(&key) {
                        continue;
                    }
                    if let Some(&u) = step_at.get(&(t, n)) {
                        g.edge(u, me, LinkKind::Waits, Some(key));
                    }
                }
            }
        }
    }
    g
}

/// The waits of `plan` dropped before the run, said as the plan says them.
pub fn dropped_before_run(plan: &Plan) -> Vec<DroppedWait> {
    go_round(plan, &BeforeRun::new(plan), &HashSet::new())
        .into_iter()
        .map(|(key, round)| said(plan, key, &round))
        .collect()
}

/// A dropped wait by the plan's names.
pub fn said(plan: &Plan, key: WaitKey, round: &[(usize, usize, LinkKind)]) -> DroppedWait {
    let service = |s: usize| -> Arc<str> { Arc::from(plan.services[s].name.as_str()) };
    let host = |h: usize| plan.hosts[h].name.clone();
    DroppedWait {
        service: service(key.service),
        host: host(key.host),
        waits_for: HostStep {
            service: service(key.on),
            host: host(key.on_host),
        },
        round: round
            .iter()
            .map(|&(s, h, by)| Link {
                by,
                service: service(s),
                host: host(h),
            })
            .collect(),
    }
}
