//! The ideal schedule (`ideal.rs`): zero overhead under the plan's own rules, on plans made
//! by the scheduler tests' fixture.

use super::*;

/// `makespan` of the plan of `body` on `hosts`, with `policies`, each step taking the
/// milliseconds `ms(service, host)` says.
fn ideal(
    body: &str,
    hosts: &[(&str, &str)],
    policies: &[(&str, &str)],
    ms: impl Fn(&str, &str) -> u64,
) -> u64 {
    let fx = fixture(body, hosts, policies, &[]);
    let d = crate::rollout::ideal_makespan(&fx.plan, |s, h| Duration::from_millis(ms(s, h)));
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[test]
fn the_ideal_of_a_chain_is_the_sum_and_of_a_diamond_its_longest_path() {
    let chain = format!(
        "class \"x\" {{ service \"a\" }}\nclass \"y\" {{ service \"b\" }}\n{}{}",
        svc("a", ""),
        svc("b", "needs \"a\"")
    );
    let two = [("x1", "x"), ("y1", "y")];
    assert_eq!(
        ideal(&chain, &two, &[], |s, _| if s == "a" { 100 } else { 200 }),
        300
    );
    let diamond = format!(
        "class \"w\" {{ service \"a\" }}\nclass \"x\" {{ service \"b\" }}\n\
         class \"y\" {{ service \"c\" }}\nclass \"z\" {{ service \"d\" }}\n{}{}{}{}",
        svc("a", ""),
        svc("b", "needs \"a\""),
        svc("c", "needs \"a\""),
        svc("d", "needs \"b\"\n    needs \"c\"")
    );
    let four = [("w1", "w"), ("x1", "x"), ("y1", "y"), ("z1", "z")];
    let ms = |s: &str, _: &str| match s {
        "a" => 100,
        "b" => 200,
        "c" => 300,
        _ => 100,
    };
    assert_eq!(ideal(&diamond, &four, &[], ms), 500, "a, then c, then d");
}

#[test]
fn the_ideal_starts_a_dependent_at_its_partial_healthy_count() {
    // b needs one healthy a of two: it starts when the fast a1 ends.
    let body = |healthy: &str| {
        format!(
            "class \"x\" {{ service \"a\" }}\nclass \"y\" {{ service \"b\" }}\n{}{}",
            svc("a", ""),
            svc("b", &format!("needs \"a\" healthy={healthy}"))
        )
    };
    let hs = [("x1", "x"), ("x2", "x"), ("y1", "y")];
    let ms = |s: &str, h: &str| match (s, h) {
        ("a", "x1") => 100,
        ("a", _) => 500,
        _ => 100,
    };
    assert_eq!(
        ideal(&body("1"), &hs, &[], ms),
        500,
        "b ends at 200, a2 at 500"
    );
    assert_eq!(ideal(&body("\"all\""), &hs, &[], ms), 600);
}

#[test]
fn the_ideal_of_batches_behind_a_straggler_follows_the_flow() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 4);
    let ms = |_: &str, h: &str| if h == "app1" { 500 } else { 100 };
    // Slots: app1 holds one slot for 500; the other carries app2, app3, app4 (300).
    assert_eq!(
        ideal(&body, &host_refs(&hs), &[("p.kdl", "batch 2")], ms),
        500
    );
    // Whole waves: [app1 app2] 500, then [app3 app4] 100.
    let waves = [("p.kdl", "batch 2; flow \"waves\"")];
    assert_eq!(ideal(&body, &host_refs(&hs), &waves, ms), 600);
    // A pause between whole waves counts.
    let paused = [("p.kdl", "batch 2; pause \"50ms\"")];
    assert_eq!(ideal(&body, &host_refs(&hs), &paused, ms), 650);
    // All at once: the straggler alone.
    let all = [("p.kdl", "batch \"100%\"")];
    assert_eq!(ideal(&body, &host_refs(&hs), &all, ms), 500);
}

#[test]
fn the_ideal_runs_one_step_per_host() {
    // api and worker on the same two hosts, no dependency: each host runs them one after
    // the other.
    let body = api_and_worker("", "");
    let hs = hosts("app", "app", 2);
    assert_eq!(ideal(&body, &host_refs(&hs), &[], |_, _| 100), 200);
}
