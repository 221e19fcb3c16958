//! The store's layout and view, without etcd: what a step's record becomes as keys, what a
//! range read of those keys says back, which hosts a plan must still read, and disagreements.

use super::*;
use crate::inventory::{HostId, Hosts};
use crate::site::{ids_of, ServiceId, Site};
use crate::state::{Inputs, Mark, Observed, Outcome, ServiceRecord};
use proptest::prelude::*;
use std::sync::Arc;

fn keys() -> Keys {
    Keys::new("/drover", "shop")
}

fn mark(outcome: Outcome, hook: Option<&str>) -> Mark {
    Mark {
        outcome,
        at: "2026-11-25T00:00:00Z".into(),
        run: "r1".into(),
        log: ".drover/runs/r1/app1/api.log".into(),
        hook: hook.map(str::to_string),
    }
}

fn inputs(version: &str) -> Inputs {
    Inputs(
        [("version".to_string(), Arc::<str>::from(version))]
            .into_iter()
            .collect(),
    )
}

fn healthy(version: &str) -> ServiceRecord {
    ServiceRecord {
        version: version.into(),
        configured: Some(mark(Outcome::Success, None)),
        validated: Some(mark(Outcome::Success, None)),
        inputs: Some(inputs(version)),
        removal: None,
        hooks: None,
    }
}

/// The view of `writes` as etcd would hold them (puts in order, deletes remove).
fn view_of(writes: &[Write]) -> View {
    let mut kv = std::collections::BTreeMap::new();
    for w in writes {
        match w {
            Write::Put { key, value } => {
                kv.insert(key.clone(), value.clone());
            }
            Write::Delete { key } => {
                kv.remove(key);
            }
        }
    }
    View::parse(
        &keys(),
        kv.iter().map(|(k, v)| (k.as_str(), v.as_bytes(), 7)),
    )
}

/// The inventory's address of `host` in [`site`] (`app2` → `10.0.0.2`).
fn address_of(host: &str) -> String {
    format!("10.0.0.{}", host.trim_start_matches("app"))
}

fn step(host: &str, record: &ServiceRecord) -> Vec<Write> {
    let hs = HostService {
        service: "api",
        host,
        address: format!("{}:8080", address_of(host)),
        record,
    };
    recorded(&keys(), &hs, "r1", "2026-11-25T00:00:00Z")
}

#[test]
fn a_step_is_one_running_key_and_exactly_one_outcome_per_category() {
    let w = step("app1", &healthy("2.0"));
    let keys: Vec<&str> = w.iter().map(Write::key).collect();
    assert_eq!(
        keys,
        [
            "/drover/shop/running/api/app1",
            "/drover/shop/status/api/app1/configured",
            "/drover/shop/status/api/app1/validated",
        ]
    );
    // A switch-over that failed before its check: not validated either.
    let failed = ServiceRecord {
        version: "1.0".into(),
        configured: Some(mark(Outcome::Failure, Some("start"))),
        validated: None,
        inputs: None,
        removal: None,
        hooks: None,
    };
    let view = view_of(&step("app1", &failed));
    let p = &view.hosts["app1"].services["api"];
    assert_eq!(
        p.configured.as_ref().map(|s| s.mark.outcome),
        Some(Outcome::Failure)
    );
    assert_eq!(
        p.validated.as_ref().map(|s| s.mark.outcome),
        Some(Outcome::Failure)
    );
    assert_eq!(
        p.running.as_ref().map(|r| r.fingerprint.clone()),
        Some(None)
    );
    // The next success replaces both.
    let mut all = step("app1", &failed);
    all.extend(step("app1", &healthy("2.0")));
    let view = view_of(&all);
    let p = &view.hosts["app1"].services["api"];
    assert_eq!(p.record(None).map(|r| r.healthy()), Some(true));
    assert_eq!(
        p.running.as_ref().map(|r| r.address.as_str()),
        Some("10.0.0.1:8080")
    );
}

#[test]
fn a_record_comes_back_from_a_range_read_as_it_was_but_its_inputs() {
    let rec = healthy("2.0");
    let view = view_of(&step("app1", &rec));
    let back = view.hosts["app1"].services["api"].record(rec.inputs.clone());
    assert_eq!(back, Some(rec.clone()));
    assert_eq!(
        view.hosts["app1"].services["api"]
            .running
            .as_ref()
            .and_then(|r| r.fingerprint.clone()),
        rec.inputs.as_ref().map(Inputs::fingerprint)
    );
    assert!(view.problems.is_empty());
}

#[test]
fn values_of_another_schema_and_unknown_keys_are_problems_not_state() {
    let other = r#"{"schema":2,"version":"9"}"#;
    let view = View::parse(
        &keys(),
        [
            ("/drover/shop/running/api/app1", other.as_bytes(), 1),
            ("/drover/shop/elsewhere", b"x".as_slice(), 1),
            ("/drover/other-site/running/api/app1", other.as_bytes(), 1),
        ],
    );
    assert_eq!(view.problems.len(), 2, "{:?}", view.problems);
    assert!(view
        .hosts
        .values()
        .all(|h| h.services.values().all(|p| p.running.is_none())));
}

#[test]
fn history_keys_are_the_layout_s_but_no_host_s_state() {
    let d = "ab".repeat(32);
    let (run, chunk) = (
        "/drover/shop/history/runs/2026-12-05T130000Z-1".to_string(),
        format!("/drover/shop/history/blobs/{d}/0"),
    );
    let view = View::parse(
        &keys(),
        [
            (run.as_str(), br#"{"schema":1}"#.as_slice(), 1),
            (chunk.as_str(), [0u8, 255].as_slice(), 1),
        ],
    );
    assert!(view.problems.is_empty(), "{:?}", view.problems);
    assert!(view.hosts.is_empty());
    assert_eq!(
        keys().history_blob(&d),
        format!("/drover/shop/history/blobs/{d}/")
    );
}

proptest! {
    #[test]
    fn names_survive_keys(service in "[a-z%/]{1,8}", host in "[a-z0-9%/.]{1,12}") {
        let rec = healthy("1.0");
        let hs = HostService { service: &service, host: &host, address: "a".into(), record: &rec };
        let w = recorded(&keys(), &hs, "r", "t");
        let view = view_of(&w);
        prop_assert!(view.hosts.get(&host).is_some_and(|h| h.services.contains_key(&service)));
        prop_assert_eq!(unsegment(&segment(&host)), host);
    }
}

/// A site of three app hosts running api 2.0, through a temporary directory.
fn site() -> (tempfile::TempDir, Site, Hosts) {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    w(
        "platform.kdl",
        "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
         host \"app1\" address=\"10.0.0.1\" class=\"app\"\n\
         host \"app2\" address=\"10.0.0.2\" class=\"app\"\n\
         host \"app3\" address=\"10.0.0.3\" class=\"app\"\n} }",
    );
    w(
        "site.kdl",
        "site \"shop\" { version \"1\"; platform \"platform.kdl\" }\n\
         class \"app\" { service \"api\" }\n\
         service \"api\" { version \"2.0\"; port 8080; start \"run\" }\n",
    );
    let site = crate::site::load(&dir.path().join("site.kdl")).expect("site");
    let hosts = crate::inventory::resolve(&site).expect("hosts");
    (dir, site, hosts)
}

/// Every host is given `inputs("2.0")`, but `odd` is given `inputs("odd")`.
struct Given {
    odd: Option<HostId>,
}

impl Fingerprints for Given {
    fn fingerprint(&self, s: ServiceId, h: HostId) -> Option<String> {
        Some(self.inputs(s, h).fingerprint())
    }
    fn inputs(&self, _s: ServiceId, h: HostId) -> Inputs {
        inputs(if Some(h) == self.odd { "odd" } else { "2.0" })
    }
}

fn seen(host: &str, reporting: bool) -> Write {
    host_seen(
        &keys(),
        host,
        &address_of(host),
        vec!["app".into()],
        (!reporting).then_some("connection refused"),
        "r1",
        "t",
    )
}

#[test]
fn a_plan_reads_only_hosts_the_store_does_not_show_converged() {
    let (_dir, site, hosts) = site();
    let mut writes = Vec::new();
    // app1: converged. app2: at 1.0. app3: converged but not reporting.
    writes.extend(step("app1", &healthy("2.0")));
    writes.push(seen("app1", true));
    writes.extend(step("app2", &healthy("1.0")));
    writes.push(seen("app2", true));
    writes.extend(step("app3", &healthy("2.0")));
    writes.push(seen("app3", false));
    let view = view_of(&writes);
    let known = converged(&view, &site, &hosts, &Given { odd: None });
    assert!(matches!(known[0], Some(Observed::Running { .. })));
    assert!(known[1].is_none() && known[2].is_none());
    assert_eq!(
        to_read(&known).into_iter().collect::<Vec<_>>(),
        ids_of(&[1, 2])
    );
    // The same store, but app1 is now given other inputs: read it.
    let known = converged(
        &view,
        &site,
        &hosts,
        &Given {
            odd: Some(HostId::new(0)),
        },
    );
    assert!(known[0].is_none());
    // A store with nothing: every host is read.
    let known = converged(&View::default(), &site, &hosts, &Given { odd: None });
    assert!(known.iter().all(Option::is_none));
    // What was read goes where it belongs.
    let read = vec![
        Observed::Fresh,
        Observed::Unreachable { reason: "x".into() },
    ];
    let merged = merge(
        vec![
            Some(Observed::Running {
                services: Default::default(),
            }),
            None,
            None,
        ],
        read,
    );
    assert!(matches!(merged[1], Observed::Fresh));
    assert!(matches!(merged[2], Observed::Unreachable { .. }));
}

#[test]
fn status_from_the_store_says_not_reporting_and_which_inputs_differ() {
    let (_dir, site, hosts) = site();
    let mut writes = step("app1", &healthy("2.0"));
    writes.push(seen("app1", true));
    writes.extend(step("app2", &healthy("2.0")));
    writes.push(seen("app2", false));
    let view = view_of(&writes);
    let Said {
        observed,
        differ,
        unvouched,
    } = observed(
        &view,
        &site,
        &hosts,
        &Given {
            odd: Some(HostId::new(0)),
        },
    );
    assert!(unvouched.is_empty());
    assert!(
        matches!(&observed[0], Observed::Running { services } if services["api"].inputs.is_none())
    );
    assert_eq!(differ, [(ServiceId::new(0), HostId::new(0))]);
    assert!(
        matches!(&observed[1], Observed::Unreachable { reason } if reason.starts_with("not reporting since t (run r1): connection refused"))
    );
    assert!(
        matches!(&observed[2], Observed::Unreachable { reason } if reason.contains("the store has no record of it"))
    );
}

/// A host rebuilt under its name comes back at another address: the store's word for it is
/// not taken, by `plan` or `status`; a port in a `running/` address is not an address change.
#[test]
fn a_host_the_store_has_at_another_address_is_read() {
    let (_dir, site, hosts) = site();
    let mut writes = Vec::new();
    for h in ["app1", "app2", "app3"] {
        writes.extend(step(h, &healthy("2.0")));
        writes.push(seen(h, true));
    }
    let given = Given { odd: None };
    let view = view_of(&writes);
    assert!(converged(&view, &site, &hosts, &given)
        .iter()
        .all(Option::is_some));
    assert!(observed(&view, &site, &hosts, &given).unvouched.is_empty());
    // app2 moved: its `hosts/` entry says so, and so does its `running/` entry alone.
    writes.push(host_seen(
        &keys(),
        "app2",
        "10.0.0.9",
        vec![],
        None,
        "r2",
        "t",
    ));
    let moved = view_of(&writes);
    let known = converged(&moved, &site, &hosts, &given);
    assert_eq!(
        to_read(&known).into_iter().collect::<Vec<_>>(),
        ids_of(&[1])
    );
    let said = observed(&moved, &site, &hosts, &given);
    assert_eq!(said.unvouched.len(), 1, "{:?}", said.unvouched);
    assert_eq!(said.unvouched[0].0, HostId::new(1));
    assert!(
        said.unvouched[0]
            .1
            .starts_with("the store has it at 10.0.0.9, the inventory at 10.0.0.2"),
        "{:?}",
        said.unvouched
    );
    let mut writes: Vec<Write> = writes[..writes.len() - 1].to_vec();
    let hs = HostService {
        service: "api",
        host: "app3",
        address: "10.0.0.33:8080".into(),
        record: &healthy("2.0"),
    };
    writes.extend(recorded(&keys(), &hs, "r2", "t"));
    let known = converged(&view_of(&writes), &site, &hosts, &given);
    assert_eq!(
        to_read(&known).into_iter().collect::<Vec<_>>(),
        ids_of(&[2])
    );
}

#[test]
fn disagreements_name_what_differs_and_only_that() {
    let (_dir, _site, hosts) = site();
    let mut writes = step("app1", &healthy("2.0"));
    writes.extend(step("app2", &healthy("2.0")));
    let view = view_of(&writes);
    let running = |r: ServiceRecord| Observed::Running {
        services: [("api".to_string(), r)].into_iter().collect(),
    };
    let observed = vec![
        running(healthy("2.0")),
        running(healthy("1.0")),
        running(healthy("2.0")),
    ];
    let d = disagreements(&view, &hosts, &observed);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!((d[0].host.as_str(), d[1].host.as_str()), ("app2", "app3"));
    assert!(d[0].store.starts_with("2.0 (configured success") && d[0].recorded.starts_with("1.0"));
    assert_eq!(d[1].store, "nothing");
}

#[cfg(not(feature = "etcd"))]
#[test]
fn without_the_etcd_feature_a_store_says_how_to_get_one() {
    let (_dir, site, _hosts) = site();
    let spec = crate::site::StoreSpec {
        endpoints: vec!["http://127.0.0.1:1".into()],
        prefix: "/drover".into(),
        lock_ttl: std::time::Duration::from_secs(10),
        tls: None,
        auth: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let err = rt
        .block_on(Etcd::connect(&spec, &site.platform.name))
        .err()
        .expect("no etcd in this build");
    assert!(matches!(err, StoreError::NotBuilt { .. }));
    assert!(err.to_string().contains("built without etcd support"));
}

#[test]
fn a_batch_writes_each_key_once_its_last_value_in_order() {
    let put = |k: &str, v: &str| Write::Put {
        key: k.into(),
        value: v.into(),
    };
    let writes = vec![
        put("a", "1"),
        put("b", "1"),
        put("a", "2"),
        Write::Delete { key: "c".into() },
        put("b", "2"),
    ];
    let kept: Vec<(&str, Option<&str>)> = last_per_key(&writes)
        .into_iter()
        .map(|w| match w {
            Write::Put { key, value } => (key.as_str(), Some(value.as_str())),
            Write::Delete { key } => (key.as_str(), None),
        })
        .collect();
    assert_eq!(kept, [("a", Some("2")), ("c", None), ("b", Some("2"))]);
}

/// Units of distinct keys (from a small pool, so that units overwrite each other), each write's
/// value naming its unit.
fn units_of(sizes: &[(usize, usize)]) -> Vec<Vec<Write>> {
    sizes
        .iter()
        .enumerate()
        .map(|(u, &(size, base))| {
            (0..size)
                .map(|k| Write::Put {
                    key: format!("k{}", (base + k) % 300),
                    value: u.to_string(),
                })
                .collect()
        })
        .collect()
}

proptest! {
    /// Whatever the steps' sizes, no transaction is over `MAX_OPS` and none splits a step: a
    /// crash between two transactions leaves each step all published or not at all. Applied
    /// in order, the transactions leave what the units in order would.
    #[test]
    fn transactions_never_split_a_step(
        sizes in proptest::collection::vec((1usize..=130, 0usize..300), 0..40),
    ) {
        let units = units_of(&sizes);
        let txns = transactions(&keys(), &units);
        let apply = |writes: &mut dyn Iterator<Item = &Write>| {
            let mut kv = std::collections::BTreeMap::new();
            for w in writes {
                if let Write::Put { key, value } = w {
                    kv.insert(key.clone(), value.clone());
                }
            }
            kv
        };
        prop_assert_eq!(
            apply(&mut txns.iter().flatten()),
            apply(&mut units.iter().flatten())
        );
        let mut last_unit = 0;
        for (t, txn) in txns.iter().enumerate() {
            prop_assert!(txn.len() <= MAX_OPS);
            let mut keys: Vec<&str> = txn.iter().map(Write::key).collect();
            keys.sort_unstable();
            keys.dedup();
            prop_assert_eq!(keys.len(), txn.len(), "a key twice in one transaction");
            for w in txn {
                let Write::Put { value, .. } = w else { continue };
                let u: usize = value.parse().expect("unit");
                prop_assert!(u >= last_unit, "units out of order");
                last_unit = u;
                // Every write of a unit that fits is in this transaction (or overwritten in it).
                if units[u].len() <= MAX_OPS {
                    for other in txns.iter().enumerate().filter(|(o, _)| *o != t) {
                        prop_assert!(
                            !other.1.iter().any(|x| matches!(x, Write::Put { value: v, .. } if v == value)),
                            "unit {} split across transactions {} and {}", u, t, other.0
                        );
                    }
                }
            }
        }
    }
}

/// A step published halfway (its `running` key and not its status, or a status of the
/// version before) is unknown, never healthy: `plan` reads the host, `status` reads it too.
#[test]
fn a_status_of_another_version_or_missing_is_unknown_and_the_host_is_read() {
    let (_dir, site, hosts) = site();
    let given = Given { odd: None };
    let mut writes = Vec::new();
    for h in ["app1", "app2", "app3"] {
        writes.extend(step(h, &healthy("1.0")));
        writes.push(seen(h, true));
    }
    // app1: converged at 2.0. app2: only the running key of its 2.0 step reached the store,
    // its status is 1.0's. app3: the running key of 2.0, its status keys gone.
    writes.extend(step("app1", &healthy("2.0")));
    writes.push(step("app2", &healthy("2.0")).remove(0));
    writes.push(step("app3", &healthy("2.0")).remove(0));
    for c in [Category::Configured, Category::Validated] {
        writes.push(Write::Delete {
            key: keys().status("api", "app3", c),
        });
    }
    let view = view_of(&writes);
    let known = converged(&view, &site, &hosts, &given);
    assert!(known[0].is_some());
    assert!(
        known[1].is_none(),
        "a status of 1.0 under running 2.0 is not healthy"
    );
    assert!(known[2].is_none(), "a missing status is not healthy");
    let said = observed(&view, &site, &hosts, &given);
    let read: Vec<(HostId, &str)> = said
        .unvouched
        .iter()
        .map(|(h, why)| (*h, why.as_str()))
        .collect();
    assert_eq!(read.len(), 2, "{read:?}");
    assert_eq!(read[0].0, HostId::new(1));
    assert!(
        read[0].1.contains("is for 1.0, its running version 2.0"),
        "{}",
        read[0].1
    );
    assert_eq!(read[1].0, HostId::new(2));
    assert!(read[1].1.contains("no configured status"), "{}", read[1].1);
}

/// A host with a step's intent left in the store (`busy/<host>`) is read by `plan` and
/// `status`, whatever its keys say; the result's transaction removes the intent.
#[test]
fn a_host_with_an_unfinished_intent_is_read_not_taken_from_the_store() {
    let (_dir, site, hosts) = site();
    let given = Given { odd: None };
    let mut writes = Vec::new();
    for h in ["app1", "app2", "app3"] {
        writes.extend(step(h, &healthy("2.0")));
        writes.push(seen(h, true));
    }
    writes.push(busy(&keys(), "app2", "api", "3.0", "r2", "t"));
    let view = view_of(&writes);
    let known = converged(&view, &site, &hosts, &given);
    assert!(known[0].is_some() && known[2].is_some());
    assert!(known[1].is_none(), "a host with an intent is read");
    let said = observed(&view, &site, &hosts, &given);
    assert_eq!(said.unvouched.len(), 1, "{:?}", said.unvouched);
    assert_eq!(said.unvouched[0].0, HostId::new(1));
    assert!(
        said.unvouched[0]
            .1
            .starts_with("in flux: run r2 set out to change it"),
        "{}",
        said.unvouched[0].1
    );
    // The step's result, published with the intent's removal: taken from the store again.
    let mut result = step("app2", &healthy("2.0"));
    result.push(not_busy(&keys(), "app2"));
    writes.extend(result);
    let view = view_of(&writes);
    assert!(converged(&view, &site, &hosts, &given)[1].is_some());
}

#[test]
fn addresses_are_compared_as_addresses_and_an_ipv6_port_is_bracketed() {
    // What a `running/` key publishes.
    assert_eq!(with_port("10.0.0.1", Some(80)), "10.0.0.1:80");
    assert_eq!(with_port("fe80::1", Some(5)), "[fe80::1]:5");
    assert_eq!(with_port("fe80::1", None), "fe80::1");
    assert_eq!(with_port("fe80::1%eth0", Some(80)), "[fe80::1%eth0]:80");
    assert_eq!(with_port("web1.example", Some(80)), "web1.example:80");
    // The same host, with or without its port, however its address is written.
    for (published, inventory) in [
        ("10.0.0.1", "10.0.0.1"),
        ("10.0.0.1:8080", "10.0.0.1"),
        ("[fe80::1]:5", "fe80::1"),
        ("fe80::1", "fe80::1"),
        ("fe80::0:1", "fe80::1"),
        ("[fe80::0001]:443", "fe80::1"),
        ("[fe80::1]", "fe80::1"),
        ("::ffff:10.0.0.1", "::ffff:10.0.0.1"),
        ("web1.example", "web1.example"),
        ("web1.example:80", "web1.example"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("[fe80::1%eth0]:8080", "fe80::1%eth0"),
        ("[fe80::0:1%eth0]", "fe80::1%eth0"),
    ] {
        assert!(
            same_address(published, inventory),
            "{published} vs {inventory}"
        );
        let back = with_port(inventory, Some(9000));
        assert!(same_address(&back, inventory), "{back} vs {inventory}");
    }
    // Another host: an IPv6 address without brackets has no port, and a prefix is not a match.
    for (published, inventory) in [
        ("fe80::1:5", "fe80::1"),
        ("fe80::1", "fe80::1:5"),
        ("fe80::15", "fe80::1"),
        ("[fe80::1:5]:80", "fe80::1"),
        ("10.0.0.12", "10.0.0.1"),
        ("10.0.0.12:80", "10.0.0.1"),
        ("10.0.0.1:99999", "10.0.0.1"),
        ("10.0.0.1:", "10.0.0.1"),
        ("web1.example:80", "web1"),
        ("web10", "web1"),
        ("10.0.0.1", "web1"),
        ("fe80::1%eth0", "fe80::1%eth1"),
        ("[fe80::1%eth0]:80", "fe80::1"),
        ("fe80::1", "fe80::1%eth0"),
        ("[fe80::1]x", "fe80::1"),
    ] {
        assert!(
            !same_address(published, inventory),
            "{published} taken for {inventory}"
        );
    }
}

proptest! {
    /// Any IP address with any port, published as a `running/` key does, is its host's and
    /// no other's.
    #[test]
    fn a_published_address_is_its_hosts_and_no_others(
        a in any::<std::net::IpAddr>(),
        b in any::<std::net::IpAddr>(),
        port in any::<u16>(),
    ) {
        let published = with_port(&a.to_string(), Some(port));
        prop_assert!(same_address(&published, &a.to_string()));
        prop_assert_eq!(same_address(&published, &b.to_string()), a == b);
        prop_assert_eq!(same_address(&a.to_string(), &b.to_string()), a == b);
    }
}

/// A host read with more services than one transaction holds (as `deploy apply` publishes it:
/// the intent's removal, the host, then each service's keys): each service's keys stay in one
/// transaction, and the intent's removal and the host's key come in the last, so that a crash
/// between leaves the intent and the next run reads the host.
#[test]
fn a_host_of_many_services_publishes_its_intent_last_and_each_service_whole() {
    let k = keys();
    let mut unit = vec![
        not_busy(&k, "app1"),
        host_seen(&k, "app1", "10.0.0.1", Vec::new(), None, "r1", "t"),
    ];
    let record = healthy("2.0");
    let services: Vec<String> = (0..50).map(|i| format!("svc/{i}")).collect();
    for s in &services {
        let hs = HostService {
            service: s,
            host: "app1",
            address: "10.0.0.1".into(),
            record: &record,
        };
        unit.extend(recorded(&k, &hs, "r1", "t"));
    }
    assert!(unit.len() > MAX_OPS);
    let txns = transactions(
        &k,
        &[step("app2", &record), unit.clone(), step("app3", &record)],
    );
    // app2's step, app1 in two, app3's step.
    assert_eq!(txns.len(), 4, "{txns:?}");
    assert!(txns.iter().all(|t| t.len() <= MAX_OPS));
    assert_eq!(txns.iter().map(Vec::len).sum::<usize>(), unit.len() + 6);
    let app1 = &txns[1..3];
    for key in [k.busy("app1"), k.host("app1")] {
        assert!(app1[1].iter().any(|w| w.key() == key), "{key} not last");
        assert!(!app1[0].iter().any(|w| w.key() == key), "{key} first");
    }
    for s in &services {
        let own = [
            k.running(s, "app1"),
            k.status(s, "app1", Category::Configured),
            k.status(s, "app1", Category::Validated),
        ];
        let counts: Vec<usize> = app1
            .iter()
            .map(|t| {
                t.iter()
                    .filter(|w| own.iter().any(|o| o == w.key()))
                    .count()
            })
            .collect();
        assert!(
            counts == [3, 0] || counts == [0, 3],
            "{s} split: {counts:?}"
        );
    }
}

/// One change a watch can bring: a step's records, an intent put or cleared, the lock taken
/// or given back, a slot, a digest, a record deleted.
fn change(kind: u8, host: u8, version: u8) -> Vec<Write> {
    let host = format!("app{}", host % 3 + 1);
    let version = format!("{}.0", version % 3 + 1);
    let k = keys();
    let put = |key: String, value: String| vec![Write::Put { key, value }];
    let delete = |key: String| vec![Write::Delete { key }];
    match kind % 13 {
        0 | 1 => step(&host, &healthy(&version)),
        2 => vec![busy(
            &k,
            &host,
            "api",
            &version,
            "agent-1",
            "2026-11-25T00:00:00Z",
        )],
        3 => delete(k.busy(&host)),
        4 => put(k.lock(), crate::state::lock::Holder::me("shop", "x").json()),
        5 => delete(k.lock()),
        6 => put(k.slot("api", &host), "{}".into()),
        7 => put(k.current(), version),
        8 => delete(k.running("api", &host)),
        // A value of another schema where a good one was: a problem, not the value before.
        9 => put(
            k.status("api", &host, Category::Validated),
            "{\"schema\":99}".into(),
        ),
        10 => vec![seen(&host, version.starts_with('1'))],
        11 => delete(k.host(&host)),
        _ => delete(k.status("api", &host, Category::Configured)),
    }
}

proptest! {
    /// A mirror's view, kept key by key from a watch's events (`View::put`, `View::forget`,
    /// parsed again only when a deletion cannot be taken back alone), is the view a range
    /// read after the same changes gives.
    #[test]
    fn a_view_kept_by_puts_and_deletions_is_the_one_read_after_them(
        changes in proptest::collection::vec((0u8..13, 0u8..3, 0u8..3), 0..40),
    ) {
        let k = keys();
        let mut kv = std::collections::BTreeMap::new();
        let mut kept = View::default();
        let mut all = Vec::new();
        for (kind, host, version) in changes {
            for w in change(kind, host, version) {
                match &w {
                    Write::Put { key, value } => {
                        kv.insert(key.clone(), value.clone());
                        if !kept.put(&k, key, value.as_bytes(), 7) {
                            kept = View::parse(
                                &k,
                                kv.iter().map(|(k, v)| (k.as_str(), v.as_bytes(), 7)),
                            );
                        }
                    }
                    Write::Delete { key } => {
                        kv.remove(key);
                        if !kept.forget(&k, key) {
                            kept = View::parse(
                                &k,
                                kv.iter().map(|(k, v)| (k.as_str(), v.as_bytes(), 7)),
                            );
                        }
                    }
                }
                all.push(w);
            }
        }
        prop_assert_eq!(format!("{kept:?}"), format!("{:?}", view_of(&all)));
    }
}
