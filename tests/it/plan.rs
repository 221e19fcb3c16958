//! `deploy plan --offline`: text and JSON snapshots, `--only`, `--out`, determinism, and the
//! structural facts of the webshop plan that would break if the planner broke.

use crate::support;
use drover::plan::{Plan, ServicePlan, SkipReason};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use support::cli::deploy;

const WEBSHOP: &str = "sites/webshop.kdl";
const DEMO: &str = "sites/demo.kdl";

/// `deploy plan SITE --offline ARGS…`, which must succeed.
fn plan(site: &str, args: &[&str]) -> String {
    let mut all = vec!["plan", site, "--offline"];
    all.extend_from_slice(args);
    let run = deploy(&all);
    assert_eq!(
        run.code,
        0,
        "deploy {}\nstderr:\n{}",
        all.join(" "),
        run.stderr
    );
    assert!(run.stderr.is_empty(), "stderr:\n{}", run.stderr);
    run.stdout
}

fn plan_json(site: &str, args: &[&str]) -> Plan {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&plan(site, &all)).expect("--json output is a Plan")
}

/// The text plan with its digest (which changes with any byte of the site's files) masked.
fn redact_text(text: &str) -> String {
    let marker = "(digest ";
    let Some(at) = text.find(marker) else {
        panic!("no digest in the plan header:\n{text}");
    };
    let start = at + marker.len();
    let end = start + text[start..].find(')').expect("digest closed");
    let digest = &text[start..end];
    assert!(
        digest.len() == 12 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "short digest `{digest}`"
    );
    format!("{}[digest]{}", &text[..start], &text[end..])
}

/// The JSON plan with its digest masked.
fn redact_json(json: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    let digest = value["site_digest"].as_str().expect("site_digest");
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "digest `{digest}` is not sha256 hex"
    );
    value["site_digest"] = "[digest]".into();
    value
}

fn service<'p>(plan: &'p Plan, name: &str) -> &'p ServicePlan {
    plan.services
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no service {name} in the plan"))
}

// ---- snapshots ------------------------------------------------------------------------------

#[test]
fn webshop_text() {
    insta::assert_snapshot!("webshop", redact_text(&plan(WEBSHOP, &[])));
}

#[test]
fn demo_text() {
    if !Path::new(env!("CARGO_MANIFEST_DIR")).join(DEMO).exists() {
        eprintln!("{DEMO} does not exist (yet): skipped");
        return;
    }
    insta::assert_snapshot!("demo", redact_text(&plan(DEMO, &[])));
}

#[test]
fn webshop_json() {
    insta::assert_json_snapshot!("webshop-json", redact_json(&plan(WEBSHOP, &["--json"])));
}

#[test]
fn only_api_skips_the_others_as_not_selected() {
    let text = plan(WEBSHOP, &["--only", "api"]);
    insta::assert_snapshot!("webshop-only-api", redact_text(&text));

    let p = plan_json(WEBSHOP, &["--only", "api"]);
    let api = service(&p, "api");
    assert_eq!(api.waves.iter().map(|w| w.steps.len()).sum::<usize>(), 6);
    assert!(api.skipped.is_empty());
    for s in p.services.iter().filter(|s| s.name != "api") {
        assert!(s.waves.is_empty(), "{} has waves", s.name);
        assert_eq!(s.skipped.len(), s.hosts, "{}: every host skipped", s.name);
        assert!(
            s.skipped
                .iter()
                .all(|k| k.reason == SkipReason::NotSelected),
            "{}: {:?}",
            s.name,
            s.skipped
        );
    }
}

#[test]
fn only_is_repeatable_and_takes_commas() {
    let spaced = plan_json(WEBSHOP, &["--only", "api", "--only", "worker"]);
    let commas = plan_json(WEBSHOP, &["--only", "api,worker"]);
    assert_eq!(spaced, commas);
    let planned: BTreeSet<&str> = spaced
        .services
        .iter()
        .filter(|s| !s.waves.is_empty())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(planned, BTreeSet::from(["api", "worker"]));
}

#[test]
fn only_an_unknown_service_is_a_usage_error() {
    let run = deploy(&["plan", WEBSHOP, "--offline", "--only", "nosuch"]);
    assert_eq!(run.code, 2, "stderr:\n{}", run.stderr);
    assert!(run.stdout.is_empty(), "stdout:\n{}", run.stdout);
    insta::assert_snapshot!("only-nosuch", run.stderr);
}

// ---- --out and determinism ------------------------------------------------------------------

#[test]
fn out_saves_the_plan_that_json_prints() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("webshop.plan");
    let out = file.to_str().expect("UTF-8 temp path");
    let text = plan(WEBSHOP, &["--out", out]);
    assert!(
        text.starts_with("Plan for site webshop"),
        "--out still prints the plan:\n{text}"
    );
    let saved: Plan =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("the saved plan"))
            .expect("the saved plan is a Plan");
    assert_eq!(saved, plan_json(WEBSHOP, &[]));
    assert_eq!(saved.schema, drover::plan::SCHEMA);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("webshop.plan")]);
}

#[test]
fn out_to_an_unwritable_place_is_an_environment_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("no-such-dir").join("webshop.plan");
    let run = deploy(&[
        "plan",
        WEBSHOP,
        "--offline",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 5, "stderr:\n{}", run.stderr);
    assert!(run.stderr.contains("cannot write"), "{}", run.stderr);
}

#[test]
fn plans_are_deterministic() {
    assert_eq!(plan(WEBSHOP, &[]), plan(WEBSHOP, &[]));
    assert_eq!(plan(WEBSHOP, &["--json"]), plan(WEBSHOP, &["--json"]));
    let dir = tempfile::tempdir().expect("temp dir");
    let files: Vec<_> = ["a.plan", "b.plan"]
        .iter()
        .map(|f| dir.path().join(f))
        .collect();
    for f in &files {
        plan(WEBSHOP, &["--out", f.to_str().unwrap()]);
    }
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        std::fs::read(&files[1]).unwrap()
    );
}

// ---- what the webshop plan must say ---------------------------------------------------------

#[test]
fn services_come_after_what_they_need_at_runtime() {
    let p = plan_json(WEBSHOP, &[]);
    let names: Vec<&str> = p.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["postgres", "api", "worker", "haproxy"]);
    for (i, s) in p.services.iter().enumerate() {
        for w in &s.waits_for {
            let at = names.iter().position(|n| *n == w.service).unwrap();
            assert!(
                at < i,
                "{} waits for {} planned after it",
                s.name,
                w.service
            );
        }
    }
}

#[test]
fn every_host_of_a_service_is_planned_once() {
    let p = plan_json(WEBSHOP, &[]);
    let classes_of: BTreeMap<&str, &Vec<String>> =
        p.hosts.iter().map(|h| (&*h.name, &h.classes)).collect();
    for s in &p.services {
        let mut seen = BTreeSet::new();
        for step in s.waves.iter().flat_map(|w| &w.steps) {
            assert!(seen.insert(&*step.host), "{}: {} twice", s.name, step.host);
            assert!(classes_of[&*step.host]
                .iter()
                .any(|c| s.classes.contains(c)));
            assert_eq!(step.from, None, "offline, every host is fresh");
            assert_eq!(*step.to, *s.version);
        }
        assert_eq!(seen.len(), s.hosts, "{}", s.name);
        assert!(s.skipped.is_empty());
        for (i, w) in s.waves.iter().enumerate() {
            assert!(!w.steps.is_empty(), "{}: wave {} is empty", s.name, i + 1);
            if !w.canary {
                assert!(
                    w.steps.len() <= s.policy.batch_hosts,
                    "{}: wave {} too big",
                    s.name,
                    i + 1
                );
            }
        }
    }
    assert_eq!(service(&p, "postgres").hosts, 3);
    assert_eq!(service(&p, "api").hosts, 6);
    assert_eq!(service(&p, "worker").hosts, 6);
    assert_eq!(service(&p, "haproxy").hosts, 3);
}

#[test]
fn api_starts_with_a_canary_of_one_host() {
    let p = plan_json(WEBSHOP, &[]);
    let api = service(&p, "api");
    assert_eq!(api.policy.name, "canary-then-30");
    assert_eq!(api.policy.canary, 1);
    let first = &api.waves[0];
    assert!(first.canary, "the first wave is the canary");
    assert_eq!(first.steps.len(), 1);
    assert!(
        api.waves[1..].iter().all(|w| !w.canary),
        "only the first wave is a canary"
    );
    for other in ["postgres", "worker", "haproxy"] {
        assert!(
            service(&p, other).waves.iter().all(|w| !w.canary),
            "{other} has no canary"
        );
    }
}

#[test]
fn haproxy_goes_one_zone_at_a_time() {
    let p = plan_json(WEBSHOP, &[]);
    let zone: BTreeMap<&str, &str> = p
        .hosts
        .iter()
        .map(|h| (&*h.name, h.tags["zone"].as_str()))
        .collect();
    let haproxy = service(&p, "haproxy");
    assert_eq!(haproxy.policy.spread.as_deref(), Some("zone"));
    let mut zones = Vec::new();
    for w in &haproxy.waves {
        let in_wave: BTreeSet<&str> = w.steps.iter().map(|s| zone[&*s.host]).collect();
        assert_eq!(in_wave.len(), 1, "one zone per wave, got {in_wave:?}");
        let only = *in_wave.first().unwrap();
        assert_eq!(w.spread.as_deref(), Some(only), "the wave names its zone");
        zones.push(only);
    }
    assert_eq!(zones, ["a", "b", "c"], "each zone in one wave, in order");
    // Without `spread`, waves carry no zone.
    for other in ["postgres", "api", "worker"] {
        assert!(service(&p, other).waves.iter().all(|w| w.spread.is_none()));
    }
}

#[test]
fn worker_goes_after_api_on_each_host() {
    let p = plan_json(WEBSHOP, &[]);
    for step in service(&p, "worker").waves.iter().flat_map(|w| &w.steps) {
        assert_eq!(
            step.after,
            [std::sync::Arc::from("api")],
            "worker on {}",
            step.host
        );
    }
    // api shares the app hosts with worker but needs nothing on them; postgres and haproxy
    // have their hosts to themselves.
    for other in ["postgres", "api", "haproxy"] {
        for step in service(&p, other).waves.iter().flat_map(|w| &w.steps) {
            assert!(
                step.after.is_empty(),
                "{other} on {}: {:?}",
                step.host,
                step.after
            );
        }
    }
}

#[test]
fn conditions_count_hosts() {
    let p = plan_json(WEBSHOP, &[]);
    let conditions = |name: &str| {
        let s = service(&p, name);
        let fmt = |c: &drover::plan::Condition| format!("{} {}/{}", c.service, c.count, c.of);
        (
            s.waits_for.iter().map(fmt).collect::<Vec<_>>(),
            s.addresses_of.iter().map(fmt).collect::<Vec<_>>(),
        )
    };
    let none: Vec<String> = Vec::new();
    assert_eq!(conditions("postgres"), (none.clone(), none.clone()));
    assert_eq!(
        conditions("api"),
        (vec!["postgres 3/3".into()], vec!["haproxy 3/3".into()])
    );
    // healthy=1 is one host; "50%" of 3 postgres hosts rounds up to 2.
    assert_eq!(
        conditions("worker"),
        (vec!["api 1/6".into(), "postgres 2/3".into()], none)
    );
    assert_eq!(
        conditions("haproxy"),
        (vec!["api 3/6".into()], vec!["api 6/6".into()])
    );
}
