//! Waits that would go round (records left by runs with `--on` or stopped partway): only
//! the waits that close a cycle with waits, `after`, start conditions and wave order are
//! dropped, said in the plan, and the run ends, never on the stall guard.

use super::pool::{planned, waits_kept};
use super::*;

/// What earlier runs left: per host, the hosts its records do not list; the hosts running
/// 0.9; the hosts running nothing.
pub(super) type Left<'a> = (&'a [(&'a str, &'a [&'a str])], &'a [&'a str], &'a [&'a str]);

/// Plans `body` on `hosts`, every host but the `fresh` ones running each of its services at
/// 1.0 with the inputs it had when the hosts `missing` names for it were not in the
/// inventory (none for a host not named): what runs with `--on` or stopped partway leave
/// behind; `older` hosts run 0.9 of their services.
pub(super) fn recorded(
    body: &str,
    hosts: &[(&str, &str)],
    policies: &[(&str, &str)],
    (missing, older, fresh): Left,
) -> Fixture {
    let fx = fixture(body, hosts, policies, &[]);
    let site = fx.site.clone();
    let full = crate::inventory::resolve(&site).expect("inventory");
    let secrets = crate::secrets::Secrets::none();
    let observed: Vec<Observed> = full
        .hosts
        .iter()
        .map(|h| {
            if fresh.contains(&&*h.name) {
                return Observed::Fresh;
            }
            let gone: &[&str] = missing
                .iter()
                .find(|(n, _)| *n == &*h.name)
                .map_or(&[], |(_, g)| g);
            let me = full.find(&h.name).expect("a host of the inventory");
            let kept = full
                .hosts
                .ids()
                .filter(|i| *i == me || !gone.contains(&&*full.hosts[*i].name))
                .collect();
            let before = full.subset(&kept, site.classes.len());
            let old = crate::desired::resolve(&site, &before, &secrets).expect("desired");
            let b = before.find(&h.name).expect("the host itself");
            let services = h
                .classes
                .iter()
                .flat_map(|c| site.classes[*c].services.iter().copied())
                .map(|sid| {
                    let version = match older.contains(&&*h.name) {
                        true => "0.9".to_string(),
                        false => site.services[sid].version.clone(),
                    };
                    let mut r = ServiceRecord::at(version);
                    r.inputs = Some(old.inputs(sid, b));
                    (site.services[sid].name.clone(), r)
                })
                .collect();
            Observed::Running { services }
        })
        .collect();
    planned(fx, &observed)
}

#[tokio::test]
async fn pool_waits_that_would_go_round_do_not_stall_the_run() {
    // s and x are handed each other's addresses. Runs with `--on` left h1 not listing n, n
    // not listing h2, and h2 not listing n2: s on h1 waits for x on n, which waits for s on
    // h2, which waits for x on n2 (upgraded from 0.9), in s's wave after h1's.
    let body = "class \"cs\" { service \"s\" }\nclass \"cx\" { service \"x\" }\n".to_string()
        + &svc(
            "s",
            "port 80; needs \"x\" addressable=\"all\"; policy \"p.kdl\"",
        )
        + &svc(
            "x",
            "port 81; needs \"s\" addressable=\"all\"; policy \"p.kdl\"",
        );
    let hs = [("h1", "cs"), ("h2", "cs"), ("n", "cx"), ("n2", "cx")];
    let missing: [(&str, &[&str]); 3] = [("h1", &["n"]), ("n", &["h2"]), ("h2", &["n2"])];
    let fx = recorded(
        &body,
        &hs,
        &[("p.kdl", "batch 1")],
        (&missing, &["n2"], &[]),
    );
    assert_eq!(fx.waves("s"), [["h1"], ["h2"]]);
    // The one wait that closes the round is dropped, and said so with the round.
    let gone = &fx.plan.dropped_waits;
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(
        gone[0].words(),
        "s on h1 does not wait for x on n: x on n waits for s on h2, which is in a later wave \
         than s on h1. So s on h1 may be given n as a host of x before x's step on n has \
         ended: n may not serve x yet"
    );
    let text = crate::report::plan_text(&fx.plan);
    let line = |has: &str| {
        text.lines()
            .find(|l| l.contains(has))
            .unwrap_or_else(|| panic!("{has}: {text}"))
            .to_string()
    };
    assert!(line("(needs x: +n; not after x on n: would go round)").ends_with(": h1"));
    assert!(line("(needs x: +n2; after x on n2)").ends_with(": h2"));
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.stalled().is_empty(), "stalled: {:?}", ran.events);
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    waits_kept(&fx, &ran).expect("the other waits kept");
    // The waits kept: x on n after s on h2, s on h2 after x on n2.
    let ended = |s: &str, h: &str| ran.step_finished(s, h).0;
    let began = |s: &str, h: &str| ran.first_hook(s, h).expect("ran").start;
    assert!(ended("s", "h2") < began("x", "n"));
    assert!(ended("x", "n2") < began("s", "h2"));
}

#[tokio::test]
async fn a_wait_that_would_go_round_through_after_and_runtime_needs_is_dropped() {
    // s needs x's addresses, x needs t at runtime on the same hosts, t needs y's addresses, y
    // needs s at runtime on the same hosts. Runs left a1 not listing b1 and b1 not listing
    // a1, both at 0.9: s on a1 waits for x on b1, which runs after t on b1, which waits for
    // y on a1, which runs after s on a1.
    let body = "class \"a\" { service \"s\"; service \"y\" }\n\
                class \"b\" { service \"t\"; service \"x\" }\n"
        .to_string()
        + &svc("s", "port 80; needs \"x\" addressable=\"all\"")
        + &svc("x", "port 81; needs \"t\"")
        + &svc("t", "port 82; needs \"y\" addressable=\"all\"")
        + &svc("y", "port 83; needs \"s\"");
    let hs = [("a1", "a"), ("b1", "b")];
    let missing: [(&str, &[&str]); 2] = [("a1", &["b1"]), ("b1", &["a1"])];
    let fx = recorded(&body, &hs, &[], (&missing, &["a1", "b1"], &[]));
    let waits = |service: &str| -> Vec<(String, String)> {
        fx.service(service)
            .each_step()
            .flat_map(|st| &st.waits)
            .map(|w| (w.service.to_string(), w.host.to_string()))
            .collect()
    };
    assert_eq!(waits("s"), [("x".to_string(), "b1".to_string())]);
    assert_eq!(waits("t"), [("y".to_string(), "a1".to_string())]);
    // One of the two waits goes: the one for the step later in the plan's order.
    let gone = &fx.plan.dropped_waits;
    assert_eq!(gone.len(), 1, "{gone:?}");
    let kinds: Vec<plan::LinkKind> = gone[0].round.iter().map(|l| l.by).collect();
    assert!(kinds.contains(&plan::LinkKind::After), "{gone:?}");
    assert!(kinds.contains(&plan::LinkKind::Waits), "{gone:?}");
    let (waiter, waited) = (&gone[0].service, &gone[0].waits_for);
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.stalled().is_empty(), "stalled: {:?}", ran.events);
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    waits_kept(&fx, &ran).expect("the other wait kept");
    // Every step ran once, and the same-host order held.
    for (service, host) in [("s", "a1"), ("y", "a1"), ("t", "b1"), ("x", "b1")] {
        assert!(
            ran.first_hook(service, host).is_some(),
            "{service} on {host}"
        );
    }
    let ended = |s: &str, h: &str| ran.step_finished(s, h).0;
    let began = |s: &str, h: &str| ran.first_hook(s, h).expect("ran").start;
    assert!(ended("s", "a1") < began("y", "a1"));
    assert!(ended("t", "b1") < began("x", "b1"));
    // The dropped one: the step that would wait did not.
    let host = &*gone[0].host;
    assert!(
        began(waiter, host) < ended(&waited.service, &waited.host),
        "{waiter} on {host} did not wait"
    );
}
