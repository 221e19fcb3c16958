//! Property tests of the planner: random sites, inventories, observed states and selections,
//! built directly as model values, against the rules the plan must keep.

use super::{plan, Plan, Selection, SkipReason};
use crate::inventory::{Host, HostId, Hosts};
use crate::site::{
    Class, ClassId, HostSpec, IdVec, InventorySpec, Need, OnFailure, Pause, Platform, Policy,
    Quota, Round, Service, ServiceId, Site, Transport,
};
use crate::state::{Mark, Observed, Outcome, ServiceRecord};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const ZONE: &str = "zone";

/// A choice among however many things there turn out to be.
#[derive(Debug, Clone, Copy)]
struct Pick(u32);

impl Pick {
    fn of(self, n: usize) -> usize {
        self.0 as usize % n
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    any::<u32>().prop_map(Pick)
}

/// How one service depends on an earlier one.
#[derive(Debug, Clone, Copy)]
enum NeedKind {
    /// `needs "x"`: runtime, all hosts.
    Runtime,
    /// `needs "x" healthy=…`: runtime, some hosts.
    Healthy(Quota),
    /// `needs "x" addressable=…`: data only.
    Data(Quota),
    /// Both at once.
    Both(Quota, Quota),
}

#[derive(Debug, Clone)]
struct PolicySpec {
    batch: Quota,
    max_failed: Quota,
    canary: u64,
    spread: bool,
}

#[derive(Debug, Clone)]
struct ServiceSpec {
    /// Needs on services of lower rank (an index into `0..rank`; none for rank 0).
    needs: Vec<(Pick, NeedKind)>,
    /// The classes that run it (at least one).
    classes: Vec<Pick>,
    policy: PolicySpec,
    /// Where this rank is declared: services are sorted by this key.
    declared: u32,
    /// Where it stands inside each of its classes.
    in_class: u32,
}

#[derive(Debug, Clone)]
struct HostSpecGen {
    class: Pick,
    /// A second class the host plays as well (the same one is ignored).
    also: Option<Pick>,
    /// `None`: the host has no zone tag.
    zone: Option<Pick>,
    /// `None`: fresh. Otherwise per service: 0 = at the desired version, 1/2 = older ones,
    /// 3 = at the desired version but its last check failed.
    observed: Option<Vec<(Pick, u8)>>,
    /// The host did not answer (or its state could not be read): nothing is known.
    unreachable: bool,
    /// Unused unless `--on` is given.
    selected: bool,
    /// Sort key for the shuffled input order.
    shuffle: u32,
}

#[derive(Debug, Clone)]
struct Spec {
    classes: usize,
    zones: usize,
    services: Vec<ServiceSpec>,
    hosts: Vec<HostSpecGen>,
    only: Option<Vec<bool>>,
    on: bool,
}

fn quota() -> impl Strategy<Value = Quota> {
    prop_oneof![
        Just(Quota::All),
        (1u64..12).prop_map(Quota::Count),
        (1u32..=10_000).prop_map(Quota::Percent),
    ]
}

fn need_kind() -> impl Strategy<Value = NeedKind> {
    prop_oneof![
        3 => Just(NeedKind::Runtime),
        1 => quota().prop_map(NeedKind::Healthy),
        2 => quota().prop_map(NeedKind::Data),
        1 => (quota(), quota()).prop_map(|(h, a)| NeedKind::Both(h, a)),
    ]
}

fn policy() -> impl Strategy<Value = PolicySpec> {
    (
        quota(),
        prop_oneof![Just(Quota::Count(0)), quota()],
        0u64..=3,
        any::<bool>(),
    )
        .prop_map(|(batch, max_failed, canary, spread)| PolicySpec {
            batch,
            max_failed,
            canary,
            spread,
        })
}

fn service() -> impl Strategy<Value = ServiceSpec> {
    (
        prop::collection::vec((pick(), need_kind()), 0..4),
        prop::collection::vec(pick(), 1..3),
        policy(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(needs, classes, policy, declared, in_class)| ServiceSpec {
            needs,
            classes,
            policy,
            declared,
            in_class,
        })
}

fn host() -> impl Strategy<Value = HostSpecGen> {
    (
        pick(),
        prop::option::weighted(0.15, pick()),
        prop::option::weighted(0.9, pick()),
        prop::option::of(prop::collection::vec((pick(), 0u8..4), 0..6)),
        prop::bool::weighted(0.05),
        any::<bool>(),
        any::<u32>(),
    )
        .prop_map(
            |(class, also, zone, observed, unreachable, selected, shuffle)| HostSpecGen {
                class,
                also,
                zone,
                observed,
                unreachable,
                selected,
                shuffle,
            },
        )
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        1usize..=4,
        1usize..=4,
        prop::collection::vec(service(), 1..=8),
        prop::collection::vec(host(), 1..=60),
        prop::option::of(prop::collection::vec(any::<bool>(), 8)),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(classes, zones, services, hosts, only, on)| Spec {
            classes,
            zones,
            services,
            hosts,
            only,
            on,
        })
}

/// Everything a plan is made from.
struct Built {
    site: Site,
    /// The hosts in the order they were generated (not yet sorted).
    hosts: Vec<Host>,
    /// Per host name, what it runs.
    observed: BTreeMap<Arc<str>, Observed>,
    only: Option<BTreeSet<ServiceId>>,
    /// `--on`: these host names.
    on: Option<BTreeSet<Arc<str>>>,
    /// Sort keys to shuffle `hosts` with.
    shuffle: Vec<u32>,
}

fn version(sid: ServiceId) -> String {
    format!("{}.0", sid.index() + 1)
}

fn build(spec: &Spec) -> Built {
    let n = spec.services.len();
    // Rank r is declared at position `perm[r]`: runtime edges only go from a higher rank
    // to a lower one, but declaration order is shuffled.
    let mut by_key: Vec<usize> = (0..n).collect();
    by_key.sort_by_key(|r| (spec.services[*r].declared, *r));
    let mut perm = vec![ServiceId::new(0); n];
    for (pos, r) in by_key.iter().enumerate() {
        perm[*r] = ServiceId::new(pos);
    }
    let class_count = spec.classes.min(spec.hosts.len());
    let mut services: IdVec<ServiceId, Option<Service>> = vec![None; n].into();
    for (r, s) in spec.services.iter().enumerate() {
        let mut needs = Vec::new();
        if r > 0 {
            for (i, kind) in &s.needs {
                let service = perm[i.of(r)];
                let (healthy, addressable) = match *kind {
                    NeedKind::Runtime => (Some(Quota::All), None),
                    NeedKind::Healthy(q) => (Some(q), None),
                    NeedKind::Data(q) => (None, Some(q)),
                    NeedKind::Both(h, a) => (Some(h), Some(a)),
                };
                needs.push(Need {
                    service,
                    healthy,
                    addressable,
                    drain: false,
                });
            }
        }
        let p = &s.policy;
        services[perm[r]] = Some(Service {
            name: format!("svc-{}", perm[r]),
            version: version(perm[r]),
            port: None,
            classes: Vec::new(),
            needs,
            policy: Arc::new(Policy {
                name: format!("policy-{}", perm[r]),
                batch: p.batch,
                max_failed: p.max_failed,
                wave_max_failed: None,
                canary: p.canary,
                pause: Pause::Wait(Duration::ZERO),
                spread: p.spread.then(|| ZONE.to_string()),
                spread_at: None,
                on_failure: OnFailure::Rollback,
                flow: Default::default(),
                progress_deadline: None,
            }),
            hooks: Default::default(),
            secrets: Vec::new(),
            env: Vec::new(),
            files: Vec::new(),
        });
    }
    let mut services: IdVec<ServiceId, Service> =
        services.into_iter().map(Option::unwrap).collect();
    let rank_of: IdVec<ServiceId, usize> = {
        let mut v: IdVec<ServiceId, usize> = vec![0; n].into();
        for (r, p) in perm.iter().enumerate() {
            v[*p] = r;
        }
        v
    };
    let mut classes: IdVec<ClassId, Class> = (0..class_count)
        .map(|c| Class {
            name: format!("class{c}"),
            services: Vec::new(),
        })
        .collect();
    for (sid, svc) in services.enumerate() {
        let s = &spec.services[rank_of[sid]];
        let _ = svc;
        let mut cs: Vec<usize> = s.classes.iter().map(|i| i.of(class_count)).collect();
        cs.sort_unstable();
        cs.dedup();
        for c in cs {
            classes[ClassId::new(c)].services.push(sid);
        }
    }
    for c in &mut classes {
        c.services
            .sort_by_key(|sid| (spec.services[rank_of[*sid]].in_class, *sid));
    }
    for (cid, class) in classes.enumerate() {
        for &sid in &class.services {
            services[sid].classes.push(cid);
        }
    }
    // A topological order (by rank), which is not the declaration order.
    let order: Vec<ServiceId> = perm.clone();

    let mut hosts = Vec::new();
    let mut specs = Vec::new();
    let mut observed = BTreeMap::new();
    let mut on = BTreeSet::new();
    for (i, h) in spec.hosts.iter().enumerate() {
        // The first hosts cover every class, so that no class is empty.
        let class = ClassId::new(if i < class_count {
            i
        } else {
            h.class.of(class_count)
        });
        let mut tags = BTreeMap::new();
        if let Some(z) = h.zone {
            tags.insert(ZONE.to_string(), format!("z{}", z.of(spec.zones) * 5));
        }
        tags.insert("rack".to_string(), format!("r{}", i % 3));
        let name: Arc<str> = format!("{}-{}", classes[class].name, i * 7 % 61).into();
        let mut classes_of_host = vec![class];
        if let Some(also) = h.also {
            let also = ClassId::new(also.of(class_count));
            if also != class {
                classes_of_host.push(also);
            }
        }
        let obs = match &h.observed {
            _ if h.unreachable => {
                if i % 2 == 0 {
                    Observed::Unreachable {
                        reason: "connection refused".into(),
                    }
                } else {
                    Observed::Unreadable {
                        reason: "not JSON".into(),
                    }
                }
            }
            None => Observed::Fresh,
            Some(list) => Observed::Running {
                services: list
                    .iter()
                    .map(|(s, v)| {
                        let sid = ServiceId::new(s.of(n));
                        let version = match v {
                            0 | 3 => version(sid),
                            1 => "0.9".to_string(),
                            _ => "0.10".to_string(),
                        };
                        let failed = (*v == 3).then(|| Mark {
                            outcome: Outcome::Failure,
                            at: "2026-11-22T00:00:00Z".into(),
                            run: "r1".into(),
                            log: "logs/r1".into(),
                            hook: Some("check".into()),
                        });
                        (
                            services[sid].name.clone(),
                            ServiceRecord {
                                version,
                                configured: None,
                                validated: failed,
                                inputs: None,
                                removal: None,
                                hooks: None,
                            },
                        )
                    })
                    .collect(),
            },
        };
        observed.insert(name.clone(), obs);
        if h.selected {
            on.insert(name.clone());
        }
        specs.push(HostSpec {
            name: name.to_string(),
            address: format!("127.0.0.{}", i + 1),
            class,
            tags: tags.clone(),
        });
        hosts.push(Host {
            name: name.clone(),
            address: format!("127.0.0.{}", i + 1).into(),
            classes: classes_of_host,
            tags,
        });
    }
    let only = spec.only.as_ref().map(|flags| {
        (0..n)
            .filter(|s| flags[*s % flags.len()])
            .map(ServiceId::new)
            .collect::<BTreeSet<_>>()
    });
    let site = Site {
        name: "prop".into(),
        file: PathBuf::from("sites/prop.kdl"),
        digest: "0".repeat(64),
        sources: Vec::new(),
        platform: Platform {
            name: "prop".into(),
            file: PathBuf::from("platforms/prop.kdl"),
            transport: Transport::Local {
                root: PathBuf::from("hosts"),
            },
            state_dir: "/var/lib/drover".into(),
            keep_generations: 3,
            on_empty: crate::site::OnEmpty::Error,
            inventory: InventorySpec::Static { hosts: specs },
            store: None,
        },
        classes,
        services,
        order,
        max_failed: None,
        prune: false,
        secrets: Vec::new(),
    };
    Built {
        site,
        hosts,
        observed,
        only,
        on: spec.on.then_some(on),
        shuffle: spec.hosts.iter().map(|h| h.shuffle).collect(),
    }
}

/// Resolves hosts from `list` and plans; the observed state and `--on` follow host names.
fn plan_with(b: &Built, list: Vec<Host>) -> (Hosts, Vec<Observed>, Selection, Plan) {
    let hosts = Hosts::new(list, b.site.classes.len());
    let observed: Vec<Observed> = hosts
        .hosts
        .iter()
        .map(|h| b.observed[&h.name].clone())
        .collect();
    let selection = Selection {
        services: b.only.clone(),
        hosts: b.on.as_ref().map(|names| {
            hosts
                .hosts
                .ids()
                .filter(|h| names.contains(&hosts.hosts[*h].name))
                .collect()
        }),
        ..Default::default()
    };
    let desired = crate::desired::resolve(&b.site, &hosts, &crate::secrets::Secrets::none())
        .expect("no files to read");
    let mut observed = observed;
    desired.stamp(&b.site, &mut observed);
    let p = plan(&b.site, &hosts, &observed, &desired, &selection).expect("observed matches hosts");
    (hosts, observed, selection, p)
}

/// Per service, every service it needs at runtime, directly or through others.
fn runtime_closure(site: &Site) -> IdVec<ServiceId, BTreeSet<ServiceId>> {
    fn visit(site: &Site, s: ServiceId, out: &mut BTreeSet<ServiceId>) {
        for n in site.services[s]
            .needs
            .iter()
            .filter(|n| n.healthy.is_some())
        {
            if out.insert(n.service) {
                visit(site, n.service, out);
            }
        }
    }
    site.services
        .ids()
        .map(|s| {
            let mut out = BTreeSet::new();
            visit(site, s, &mut out);
            out
        })
        .collect()
}

/// Per service id, its part of the plan.
fn by_service<'p>(site: &Site, p: &'p Plan) -> IdVec<ServiceId, &'p super::ServicePlan> {
    site.services
        .iter()
        .map(|s| {
            let found: Vec<_> = p.services.iter().filter(|sp| sp.name == s.name).collect();
            assert_eq!(found.len(), 1, "service {} planned once", s.name);
            found[0]
        })
        .collect()
}

fn hosts_of(site: &Site, hosts: &Hosts, sid: ServiceId) -> Vec<HostId> {
    hosts
        .hosts
        .ids()
        .filter(|h| {
            hosts.hosts[*h]
                .classes
                .iter()
                .any(|c| site.services[sid].classes.contains(c))
        })
        .collect()
}

fn check_plan(b: &Built) -> Result<(), TestCaseError> {
    let site = &b.site;
    let (hosts, observed, selection, p) = plan_with(b, b.hosts.clone());
    prop_assert_eq!(
        p.inconsistencies(),
        Vec::<String>::new(),
        "a plan made holds together"
    );
    if let Err(e) = super::rounds_tests::check(&p) {
        prop_assert!(false, "{}", e);
    }
    prop_assert_eq!(
        p.differences_from(site),
        Vec::<String>::new(),
        "and holds the site's services"
    );
    let services = by_service(site, &p);
    let closure = runtime_closure(site);
    let id_of: BTreeMap<&str, HostId> = hosts
        .hosts
        .enumerate()
        .map(|(i, h)| (&*h.name, i))
        .collect();
    // Which services have a step on which host.
    let mut steps_on: BTreeSet<(ServiceId, HostId)> = BTreeSet::new();
    for (sid, sp) in services.enumerate() {
        for st in sp.each_step() {
            steps_on.insert((sid, id_of[&*st.host]));
        }
    }
    let position: BTreeMap<&str, usize> = p
        .services
        .iter()
        .enumerate()
        .map(|(i, sp)| (sp.name.as_str(), i))
        .collect();
    prop_assert_eq!(p.services.len(), site.services.len());
    prop_assert_eq!(p.hosts.len(), hosts.hosts.len());

    for (sid, sp) in services.enumerate() {
        let service = &site.services[sid];
        let members = hosts_of(site, &hosts, sid);
        prop_assert_eq!(sp.hosts, members.len());
        prop_assert_eq!(&*sp.version, service.version.as_str());

        // Services in runtime dependency order.
        for t in &closure[sid] {
            prop_assert!(
                position[site.services[*t].name.as_str()] < position[service.name.as_str()],
                "{} planned before {}, which it needs at runtime",
                sp.name,
                site.services[*t].name
            );
        }

        // Each host of the service exactly once in waves ∪ skipped, and nothing else.
        let mut seen: BTreeMap<HostId, usize> = BTreeMap::new();
        let mut in_waves: BTreeSet<HostId> = BTreeSet::new();
        for st in sp.each_step() {
            let h = id_of[&*st.host];
            *seen.entry(h).or_default() += 1;
            in_waves.insert(h);
        }
        let mut in_skipped: BTreeMap<HostId, SkipReason> = BTreeMap::new();
        for k in &sp.skipped {
            let h = id_of[&*k.host];
            *seen.entry(h).or_default() += 1;
            in_skipped.insert(h, k.reason);
            prop_assert_eq!(
                k.version.as_deref(),
                observed[h.index()].version(&service.name),
                "skipped host {} records what it runs",
                k.host
            );
        }
        let expected: BTreeMap<HostId, usize> = members.iter().map(|h| (*h, 1)).collect();
        prop_assert_eq!(&seen, &expected, "hosts of {} once each", sp.name);
        for &h in &members {
            // At the version only when it runs it and nothing recorded failed since.
            let at_version = observed[h.index()]
                .service(&service.name)
                .is_some_and(|r| r.version == service.version && r.healthy());
            let reason = if !selection.has(sid, h) {
                Some(SkipReason::NotSelected)
            } else if !observed[h.index()].known() {
                Some(SkipReason::Unreachable)
            } else if at_version {
                Some(SkipReason::AtVersion)
            } else {
                None
            };
            match reason {
                None => {
                    prop_assert!(in_waves.contains(&h), "{} must change", hosts.hosts[h].name);
                    prop_assert!(!in_skipped.contains_key(&h));
                }
                Some(reason) => prop_assert_eq!(in_skipped.get(&h), Some(&reason)),
            }
        }

        // Wave sizes, canary, spread.
        let policy = &service.policy;
        let batch = policy.batch.of(members.len(), Round::Down).max(1);
        prop_assert_eq!(sp.policy.batch_hosts, batch);
        for (i, w) in sp.waves.iter().enumerate() {
            prop_assert!(!w.steps.is_empty(), "wave {} of {} is empty", i, sp.name);
            if w.canary {
                prop_assert_eq!(i, 0, "the canary wave comes first");
                prop_assert!(w.steps.len() as u64 <= policy.canary);
            } else {
                prop_assert!(w.steps.len() <= batch, "wave {} of {}", i, sp.name);
            }
            match &policy.spread {
                Some(tag) => {
                    for st in &w.steps {
                        let h = &hosts.hosts[id_of[&*st.host]];
                        prop_assert_eq!(h.tags.get(tag), w.spread.as_ref());
                    }
                }
                None => prop_assert_eq!(&w.spread, &None),
            }
            for st in &w.steps {
                let h = id_of[&*st.host];
                prop_assert_eq!(
                    st.from.as_deref(),
                    observed[h.index()].version(&service.name)
                );
                prop_assert_eq!(&*st.to, service.version.as_str());
            }
        }
        if policy.canary > 0 && !in_waves.is_empty() {
            let first = &sp.waves[0];
            prop_assert!(first.canary, "{} starts with a canary wave", sp.name);
            // Canary hosts come from the first spread group.
            let first_group = match &policy.spread {
                None => in_waves.len(),
                Some(tag) => {
                    let mut values: Vec<Option<&String>> = in_waves
                        .iter()
                        .map(|h| hosts.hosts[*h].tags.get(tag))
                        .collect();
                    values.sort_by(|a, b| match (a, b) {
                        (Some(a), Some(b)) => crate::inventory::natural_cmp(a, b),
                        (a, b) => b.is_some().cmp(&a.is_some()),
                    });
                    let v = values[0];
                    prop_assert_eq!(first.spread.as_ref(), v);
                    values.iter().filter(|x| **x == v).count()
                }
            };
            let want = usize::try_from(policy.canary).unwrap().min(first_group);
            prop_assert_eq!(first.steps.len(), want);
        }
        if policy.canary == 0 {
            prop_assert!(sp.waves.iter().all(|w| !w.canary));
        }

        // Same-host ordering: `after` is exactly the runtime needs changing on this host.
        for st in sp.each_step() {
            let h = id_of[&*st.host];
            let want: BTreeSet<&str> = hosts.hosts[h]
                .classes
                .iter()
                .flat_map(|c| site.classes[*c].services.iter())
                .filter(|t| closure[sid].contains(t) && steps_on.contains(&(**t, h)))
                .map(|t| site.services[*t].name.as_str())
                .collect();
            let got: BTreeSet<&str> = st.after.iter().map(|s| &**s).collect();
            prop_assert_eq!(got.len(), st.after.len(), "no service twice in after");
            prop_assert_eq!(&got, &want, "after of {} on {}", sp.name, st.host);
            for a in &st.after {
                prop_assert!(position[&**a] < position[sp.name.as_str()]);
            }
            prop_assert!(
                st.after
                    .windows(2)
                    .all(|w| position[&*w[0]] < position[&*w[1]]),
                "after in dependency order"
            );
        }
    }
    Ok(())
}

fn check_deterministic(b: &Built) -> Result<(), TestCaseError> {
    let (.., first) = plan_with(b, b.hosts.clone());
    let (.., again) = plan_with(b, b.hosts.clone());
    let first = serde_json::to_vec(&first).unwrap();
    prop_assert_eq!(&first, &serde_json::to_vec(&again).unwrap());
    let mut shuffled: Vec<(u32, Host)> = b.shuffle.iter().copied().zip(b.hosts.clone()).collect();
    shuffled.sort_by_key(|(k, _)| *k);
    let shuffled = shuffled.into_iter().map(|(_, h)| h).collect();
    let (.., other) = plan_with(b, shuffled);
    prop_assert_eq!(&first, &serde_json::to_vec(&other).unwrap());
    Ok(())
}

/// A service's part of the plan is made from the hosts [`super::planned_from`] names alone:
/// whatever every other host runs (`other[h]`: nothing, no answer, another host's state), it
/// is the same; and those hosts are exactly the service's and its needs' (no more, which would
/// leave less to plan early). `extra` adds needs for addresses only, which may name a service
/// of any rank (the generator's needs name lower ranks), so that a need on a later service is
/// covered too.
fn check_planned_from(
    mut b: Built,
    extra: &[(Pick, Pick, Quota)],
    other: &[(u8, Pick)],
) -> Result<(), TestCaseError> {
    let n = b.site.services.len();
    for &(from, to, q) in extra {
        let (s, t) = (ServiceId::new(from.of(n)), ServiceId::new(to.of(n)));
        if s != t && !b.site.services[s].needs.iter().any(|x| x.service == t) {
            b.site.services[s].needs.push(Need {
                service: t,
                healthy: None,
                addressable: Some(q),
                drain: false,
            });
        }
    }
    let (hosts, mut observed, selection, _) = plan_with(&b, b.hosts.clone());
    // Every other host recorded no pool of the services it needs: those steps then wait for
    // the needed services' steps on the pools' hosts, the one way another service's hosts
    // shape a service's plan.
    for o in observed.iter_mut().step_by(2) {
        if let Observed::Running { services } = o {
            for record in services.values_mut() {
                if let Some(inputs) = &mut record.inputs {
                    inputs.0.retain(|k, _| !k.starts_with("needs:"));
                }
            }
        }
    }
    let desired = crate::desired::resolve(&b.site, &hosts, &crate::secrets::Secrets::none())
        .expect("no files to read");
    let whole = plan(&b.site, &hosts, &observed, &desired, &selection).expect("as many as hosts");
    // Steps that wait for others: the plan still holds together, and runs through, with only
    // the waits that would go round dropped.
    prop_assert_eq!(whole.inconsistencies(), Vec::<String>::new());
    if let Err(e) = super::rounds_tests::check(&whole) {
        prop_assert!(false, "{}", e);
    }
    let planned = by_service(&b.site, &whole);
    for (sid, service) in planned.enumerate() {
        let from = super::planned_from(&b.site, &hosts, sid);
        let mut want: BTreeSet<HostId> = hosts_of(&b.site, &hosts, sid).into_iter().collect();
        for need in &b.site.services[sid].needs {
            want.extend(hosts_of(&b.site, &hosts, need.service));
        }
        prop_assert_eq!(
            &from,
            &want.into_iter().collect::<Vec<_>>(),
            "in id order, once each"
        );
        let mut changed = observed.clone();
        for (h, o) in changed.iter_mut().enumerate() {
            if from.binary_search(&HostId::new(h)).is_ok() {
                continue;
            }
            let (kind, pick) = other[h % other.len()];
            let was = o.clone();
            *o = match kind % 3 {
                0 => Observed::Fresh,
                1 => Observed::Unreachable {
                    reason: "not read yet".into(),
                },
                _ => observed[pick.of(observed.len())].clone(),
            };
            if *o == was {
                // Something else than it was, whatever was drawn.
                *o = match was {
                    Observed::Fresh => Observed::Unreachable {
                        reason: "not read yet".into(),
                    },
                    _ => Observed::Fresh,
                };
            }
        }
        let p = plan(&b.site, &hosts, &changed, &desired, &selection).expect("as many as hosts");
        prop_assert_eq!(p.inconsistencies(), Vec::<String>::new());
        if let Err(e) = super::rounds_tests::check(&p) {
            prop_assert!(false, "{}", e);
        }
        prop_assert_eq!(
            by_service(&b.site, &p)[sid],
            *service,
            "{}'s plan changed with hosts it is not planned from",
            &service.name
        );
    }
    Ok(())
}

/// Hosts left unread (every host [`super::deferrable`] says may be): the services that do
/// not stand alone are planned as before (among them those handed the addresses of, or
/// needing a share of, a service whose hosts are left unread: the same here, where every
/// record lists every host the site gives; a record missing one would add a wait on its
/// placeholder, which these fleets do not generate), and each unread step, decided from what its host
/// runs ([`super::decide`]), is the step the plan makes when the host is read first, or
/// nothing where that plan finds the host converged.
fn check_unread(b: &Built) -> Result<(), TestCaseError> {
    let (hosts, mut observed, selection, _) = plan_with(b, b.hosts.clone());
    let desired = crate::desired::resolve(&b.site, &hosts, &crate::secrets::Secrets::none())
        .expect("no files to read");
    // Some records with other inputs than the site's, or none: reconfigures, with reasons.
    for (h, o) in observed.iter_mut().enumerate() {
        if let Observed::Running { services } = o {
            for record in services.values_mut() {
                match h % 3 {
                    1 => record.inputs = None,
                    2 => {
                        if let Some(inputs) = &mut record.inputs {
                            inputs.0.insert("env:GONE".into(), Arc::from("1"));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let whole = plan(&b.site, &hosts, &observed, &desired, &selection).expect("as many as hosts");
    let may = super::deferrable(&b.site, &hosts);
    let mut unread = observed.clone();
    for (h, o) in unread.iter_mut().enumerate() {
        if may[h] {
            *o = Observed::Unread;
        }
    }
    let p = plan(&b.site, &hosts, &unread, &desired, &selection).expect("as many as hosts");
    let (before, after) = (by_service(&b.site, &whole), by_service(&b.site, &p));
    for (sid, service) in b.site.services.enumerate() {
        let members = hosts_of(&b.site, &hosts, sid);
        if !members.iter().any(|h| may[h.index()]) {
            prop_assert_eq!(
                after[sid],
                before[sid],
                "{} planned as before",
                &service.name
            );
            continue;
        }
        let step_of = |sp: &super::ServicePlan, name: &str| {
            sp.each_step().find(|st| &*st.host == name).cloned()
        };
        for &h in &members {
            let name = &*hosts.hosts[h].name;
            let was = step_of(before[sid], name);
            let Some(now) = step_of(after[sid], name) else {
                // Not selected: no step either way.
                prop_assert!(was.is_none(), "{}: a step lost", name);
                continue;
            };
            if now.kind != super::StepKind::Unread {
                prop_assert_eq!(Some(now), was, "{}: a host read first", name);
                continue;
            }
            prop_assert!(may[h.index()]);
            // No wait for another host's step; an `after` (a service this one needs, on the
            // same host) only for a service it needs at runtime, directly or through others,
            // on every host, which has ended before this one starts.
            prop_assert!(now.waits.is_empty());
            let closure = super::host_order::RuntimeClosure::new(&b.site);
            let needed: Vec<&str> = b
                .site
                .services
                .enumerate()
                .filter(|(t, _)| closure.needs(sid, *t))
                .map(|(_, t)| t.name.as_str())
                .collect();
            prop_assert!(
                now.after.iter().all(|a| needed.contains(&&**a)),
                "{}: after {:?}, needs {:?}",
                name,
                now.after,
                needed
            );
            let decided = super::decide(&b.site, &desired, sid, h, &observed[h.index()]);
            match (decided, was) {
                (Ok(Some(d)), Some(was)) => {
                    prop_assert_eq!(d.kind, was.kind, "{}", name);
                    prop_assert_eq!(d.from, was.from, "{}", name);
                    prop_assert_eq!(d.reasons, was.reasons, "{}", name);
                    prop_assert_eq!(Some(d.path), was.path, "{}: the same path", name);
                    prop_assert_eq!(d.restarts, was.restarts, "{}", name);
                }
                (Ok(None), None) => {
                    let skip = before[sid].skipped.iter().find(|k| &*k.host == name);
                    prop_assert_eq!(skip.map(|k| k.reason), Some(SkipReason::AtVersion));
                }
                (Err(_), None) => {
                    let skip = before[sid].skipped.iter().find(|k| &*k.host == name);
                    prop_assert_eq!(skip.map(|k| k.reason), Some(SkipReason::Unreachable));
                }
                (decided, was) => {
                    return Err(TestCaseError::fail(format!(
                        "{name}: decided {decided:?}, planned {was:?}"
                    )))
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn an_unread_step_is_decided_as_the_plan_decides_a_host_read_first(spec in spec()) {
        check_unread(&build(&spec))?;
    }

    #[test]
    fn a_service_is_planned_from_its_hosts_and_its_needs_hosts_alone(
        spec in spec(),
        extra in prop::collection::vec((pick(), pick(), quota()), 0..3),
        other in prop::collection::vec((any::<u8>(), pick()), 1..61),
    ) {
        check_planned_from(build(&spec), &extra, &other)?;
    }

    #[test]
    fn plans_keep_the_rules(spec in spec()) {
        check_plan(&build(&spec))?;
    }

    #[test]
    fn plans_are_deterministic(spec in spec()) {
        check_deterministic(&build(&spec))?;
    }
}

/// A hand-made case the properties are known to cover: two services on one class, one
/// needing the other at runtime, both changing everywhere.
#[test]
fn same_host_after_names_the_need() {
    let spec = Spec {
        classes: 1,
        zones: 2,
        services: vec![
            ServiceSpec {
                needs: vec![],
                classes: vec![Pick(0)],
                policy: PolicySpec {
                    batch: Quota::Count(2),
                    max_failed: Quota::Count(0),
                    canary: 1,
                    spread: true,
                },
                declared: 1,
                in_class: 1,
            },
            ServiceSpec {
                needs: vec![(Pick(0), NeedKind::Runtime)],
                classes: vec![Pick(0)],
                policy: PolicySpec {
                    batch: Quota::Percent(5000),
                    max_failed: Quota::Count(0),
                    canary: 0,
                    spread: false,
                },
                declared: 0,
                in_class: 0,
            },
        ],
        hosts: (0..5)
            .map(|i| HostSpecGen {
                class: Pick(0),
                also: None,
                zone: Some(Pick(i)),
                observed: None,
                unreachable: false,
                selected: true,
                shuffle: 5 - i,
            })
            .collect(),
        only: None,
        on: false,
    };
    let b = build(&spec);
    check_plan(&b).unwrap();
    check_deterministic(&b).unwrap();
    let (.., p) = plan_with(&b, b.hosts.clone());
    // Rank 1 is declared first, but planned second, each step after rank 0's.
    let second = &p.services[1];
    assert_eq!(second.name, b.site.services[b.site.order[1]].name);
    assert!(second
        .each_step()
        .all(|st| st.after.len() == 1 && *st.after[0] == *p.services[0].name));
}

/// Found by the properties: a canary policy with nothing to change made an empty canary wave.
#[test]
fn no_canary_wave_when_nothing_changes() {
    let spec = Spec {
        classes: 1,
        zones: 1,
        services: vec![ServiceSpec {
            needs: vec![],
            classes: vec![Pick(0)],
            policy: PolicySpec {
                batch: Quota::All,
                max_failed: Quota::Count(0),
                canary: 1,
                spread: false,
            },
            declared: 0,
            in_class: 0,
        }],
        hosts: vec![HostSpecGen {
            class: Pick(0),
            also: None,
            zone: None,
            observed: None,
            unreachable: false,
            selected: false,
            shuffle: 0,
        }],
        only: Some(vec![false; 8]),
        on: false,
    };
    let b = build(&spec);
    check_plan(&b).unwrap();
    let (.., p) = plan_with(&b, b.hosts.clone());
    assert!(p.services[0].waves.is_empty());
    assert_eq!(p.services[0].skipped.len(), 1);
}
