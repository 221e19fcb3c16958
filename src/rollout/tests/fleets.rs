//! Random fleets with pool changes on the fake transport: services handed each other's
//! addresses, runtime needs, hosts new to a class or left behind by runs with `--on` or
//! stopped partway; every plan runs to the end, never on the stall guard.

use super::pool::waits_kept;
use super::rounds::recorded;
use super::*;
use proptest::prelude::*;

/// A random fleet: services in a chain of data needs both ways (pools that list each other),
/// some runtime needs forward, hosts added to any class, some hooks failing.
#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) services: usize,
    /// `data[i][j]`: service i needs j's addresses.
    pub(super) data: Vec<Vec<bool>>,
    /// `runtime[i]`: service i needs service i-1 at runtime.
    pub(super) runtime: Vec<bool>,
    /// Per class (one per service), how many hosts, and how many of them are new.
    pub(super) hosts: Vec<(usize, usize)>,
    pub(super) batch: usize,
    pub(super) fail: Vec<(usize, usize)>,
    pub(super) continue_on_failure: bool,
    /// Per host (bit `i % 64` of the `i`th): a new host that already runs its service, at
    /// the inputs of a run with `--on` that did not list the other new hosts.
    pub(super) members: u64,
    /// Per host (the `i`th, modulo): hosts (bits) its records do not list either, as a run
    /// with `--on` or stopped partway left them.
    pub(super) forgot: Vec<u64>,
    /// Per host (bit): runs 0.9 (a run stopped before it got there).
    pub(super) older: u64,
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    (2usize..=4)
        .prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec(prop::collection::vec(any::<bool>(), n), n),
                prop::collection::vec(any::<bool>(), n),
                prop::collection::vec((1usize..=3, 0usize..=2), n),
                1usize..=3,
                prop::collection::vec((0usize..n, 0usize..5), 0..3),
                any::<bool>(),
                (
                    prop_oneof![2 => Just(0u64), 3 => any::<u64>()],
                    prop::collection::vec(prop_oneof![2 => Just(0u64), 1 => any::<u64>()], 1..13),
                    prop_oneof![2 => Just(0u64), 1 => any::<u64>()],
                ),
            )
        })
        .prop_map(
            |(
                services,
                data,
                runtime,
                hosts,
                batch,
                fail,
                continue_on_failure,
                (members, forgot, older),
            )| Case {
                services,
                data,
                runtime,
                hosts: hosts.into_iter().map(|(n, new)| (n, new.min(n))).collect(),
                batch,
                fail,
                continue_on_failure,
                members,
                forgot,
                older,
            },
        )
}

/// The fleet of `c` planned with every host read, and the rules that fail its hooks.
pub(super) fn case_fixture(c: &Case) -> (Fixture, Rules) {
    let name = |i: usize| format!("s{i}");
    let mut body = String::new();
    for i in 0..c.services {
        body.push_str(&format!("class \"c{i}\" {{ service \"{}\" }}\n", name(i)));
    }
    for i in 0..c.services {
        let mut extra = format!("port {}; policy \"p.kdl\"", 8000 + i);
        for j in (0..c.services).filter(|j| c.data[i][*j] && *j != i) {
            extra.push_str(&format!("; needs \"{}\" addressable=\"all\"", name(j)));
        }
        if i > 0 && c.runtime[i] {
            extra.push_str(&format!("; needs \"{}\" healthy=1", name(i - 1)));
        }
        if i % 2 == 0 {
            extra.push_str(&format!("; reload \"hook reload {}\"", name(i)));
        }
        body.push_str(&svc(&name(i), &extra));
    }
    let mut hs: Vec<(String, &'static str)> = Vec::new();
    let mut added: Vec<String> = Vec::new();
    const CLASSES: [&str; 4] = ["c0", "c1", "c2", "c3"];
    for (i, (n, new)) in c.hosts.iter().enumerate() {
        for k in 0..*n {
            let host = format!("h{i}x{k}");
            if k >= n - new {
                added.push(host.clone());
            }
            hs.push((host, CLASSES[i]));
        }
    }
    let policy = format!(
        "batch {}; max-failed 0{}",
        c.batch,
        if c.continue_on_failure {
            "; on-failure \"continue\""
        } else {
            ""
        }
    );
    // What earlier runs left: a host new to its class is fresh, or (`members`) already runs
    // its service with records that do not list the other new hosts; the others do not list
    // any new host. Any of them may not list more (`forgot`), or run 0.9 (`older`).
    let bit = |mask: u64, i: usize| mask >> (i % 64) & 1 == 1;
    let is_new = |i: usize| added.contains(&hs[i].0);
    let fresh: Vec<&str> = (0..hs.len())
        .filter(|&i| is_new(i) && !bit(c.members, i))
        .map(|i| hs[i].0.as_str())
        .collect();
    let missing: Vec<(&str, Vec<&str>)> = (0..hs.len())
        .map(|i| {
            let forgot = c
                .forgot
                .get(i % c.forgot.len().max(1))
                .copied()
                .unwrap_or(0);
            let gone = (0..hs.len())
                .filter(|&j| j != i && (is_new(j) || bit(forgot, j)))
                .map(|j| hs[j].0.as_str())
                .collect();
            (hs[i].0.as_str(), gone)
        })
        .collect();
    let missing: Vec<(&str, &[&str])> = missing.iter().map(|(h, g)| (*h, g.as_slice())).collect();
    let older: Vec<&str> = (0..hs.len())
        .filter(|&i| bit(c.older, i))
        .map(|i| hs[i].0.as_str())
        .collect();
    let fx = recorded(
        &body,
        &host_refs(&hs),
        &[("p.kdl", &policy)],
        (&missing, &older, &fresh),
    );
    let mut rules = Rules::default().sleep(None, "hook install", 3);
    for (s, h) in &c.fail {
        let host = hs
            .iter()
            .filter(|(_, cl)| *cl == CLASSES[*s])
            .nth(*h)
            .map(|(n, _)| n.clone());
        if let Some(host) = host {
            rules = rules.fail(Some(&host), &format!("hook check {}", name(*s)));
        }
    }
    (fx, rules)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_with_pool_changes_runs_to_the_end(c in case()) {
        let (fx, rules) = case_fixture(&c);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        // `run` panics if the rollout does not finish (its deadlock guard).
        let ran = runtime.block_on(fx.run(rules, 16, true));
        prop_assert!(ran.stalled().is_empty(), "stalled: {:?}", ran.stalled());
        let (ok, failed, not_started) = ran.counts();
        prop_assert_eq!(ok + failed + not_started, fx.plan.steps(), "every step accounted for");
        if c.fail.is_empty() {
            prop_assert!(ran.summary.converged(), "{:?}", ran.summary);
        }
        if let Err(e) = waits_kept(&fx, &ran) {
            prop_assert!(false, "{}", e);
        }
    }
}
