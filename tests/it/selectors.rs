//! `--on SELECTOR` on `plan`, `status` and `apply`: each form, unions, exclusions and globs
//! pick the right hosts; the rest are "not selected"; a selector that matches nothing or is
//! malformed is a usage error (exit 2) pointing at the term, with a suggestion.
//!
//! The site is tests/fixtures/inventory/select.kdl: db1 db2 (db), app1–app4 (app), lb1 (lb),
//! zones eu-1a / eu-1b; its recorded state is in platforms/select-hosts/ (local transport).

use crate::support;

use drover::plan::{Plan, SkipReason};
use std::collections::BTreeSet;
use support::cli::{deploy, Run};

const SITE: &str = "tests/fixtures/inventory/select.kdl";
const USAGE: i32 = 2;

/// `deploy plan SITE --offline --on A --on B …`.
fn plan_on(on: &[&str], json: bool) -> Run {
    let mut args = vec!["plan", SITE, "--offline"];
    if json {
        args.push("--json");
    }
    for o in on {
        args.extend(["--on", o]);
    }
    deploy(&args)
}

/// The hosts that `--on` selects, by the plan: each host with a step, after checking that every
/// other host is skipped as not selected.
fn selected(on: &[&str]) -> BTreeSet<String> {
    let run = plan_on(on, true);
    assert_eq!(run.code, 0, "--on {on:?}\nstderr:\n{}", run.stderr);
    let plan: Plan = serde_json::from_str(&run.stdout).expect("a plan");
    let mut stepped = BTreeSet::new();
    let mut skipped = BTreeSet::new();
    for s in &plan.services {
        stepped.extend(
            s.waves
                .iter()
                .flat_map(|w| &w.steps)
                .map(|st| st.host.to_string()),
        );
        for k in &s.skipped {
            assert_eq!(k.reason, SkipReason::NotSelected, "--on {on:?}: {k:?}");
            skipped.insert(k.host.to_string());
        }
    }
    assert!(stepped.is_disjoint(&skipped), "--on {on:?}");
    assert_eq!(
        stepped.len() + skipped.len(),
        plan.hosts.len(),
        "--on {on:?}"
    );
    stepped
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `deploy plan … --on SELECTOR` must fail as a usage error; its stderr.
fn usage_error(on: &str) -> String {
    let run = plan_on(&[on], false);
    assert_eq!(run.code, USAGE, "--on {on}\nstderr:\n{}", run.stderr);
    assert!(run.stdout.is_empty(), "stdout:\n{}", run.stdout);
    run.stderr
}

#[test]
fn each_form_selects_its_hosts() {
    assert_eq!(selected(&["class:db"]), set(&["db1", "db2"]));
    assert_eq!(selected(&["host:app3"]), set(&["app3"]));
    assert_eq!(
        selected(&["tag:zone=eu-1a"]),
        set(&["app1", "app3", "db1", "lb1"])
    );
    assert_eq!(
        selected(&["host:app*"]),
        set(&["app1", "app2", "app3", "app4"])
    );
    assert_eq!(selected(&["tag:zone=*-1b"]), set(&["app2", "app4", "db2"]));
}

#[test]
fn commas_and_repeated_flags_are_unions() {
    let both = set(&["app3", "db1", "db2"]);
    assert_eq!(selected(&["class:db,host:app3"]), both);
    assert_eq!(selected(&["class:db", "host:app3"]), both);
    assert_eq!(selected(&["host:app3,class:db"]), both);
}

#[test]
fn exclusions_remove_hosts() {
    assert_eq!(
        selected(&["class:app,!host:app3"]),
        set(&["app1", "app2", "app4"])
    );
    // Only exclusions: every host but those.
    assert_eq!(selected(&["!class:app"]), set(&["db1", "db2", "lb1"]));
    assert_eq!(
        selected(&["!tag:zone=eu-1a,!class:db"]),
        set(&["app2", "app4"])
    );
}

#[test]
fn the_others_are_not_selected_in_the_plan() {
    let run = plan_on(&["class:app,!host:app3"], false);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    let start = run.stdout.find("(digest ").expect("digest") + "(digest ".len();
    let end = start + run.stdout[start..].find(')').expect("closed");
    let text = format!("{}[digest]{}", &run.stdout[..start], &run.stdout[end..]);
    assert!(text.contains("skipped, not selected: app3"), "{text}");
    insta::assert_snapshot!("plan-on-app-but-app3", text);
}

#[test]
fn a_term_matching_no_host_is_an_error() {
    let stderr = usage_error("class:db,host:app33");
    assert!(stderr.contains("did you mean `host:app3`?"), "{stderr}");
    insta::assert_snapshot!("no-such-host", stderr);
    insta::assert_snapshot!("no-such-class", usage_error("class:ap"));
    let stderr = usage_error("class:api");
    assert!(
        stderr.contains("select services with `--only api`"),
        "{stderr}"
    );
    insta::assert_snapshot!("no-such-tag-value", usage_error("tag:zone=eu-1c"));
    insta::assert_snapshot!("no-host-like", usage_error("host:web*"));
    // A misspelt exclusion would widen the rollout: it is an error too.
    let stderr = usage_error("class:app,!host:app9");
    assert!(stderr.contains("`!host:app9` matches no host"), "{stderr}");
    insta::assert_snapshot!("nothing-selected", usage_error("class:app,!class:app"));
}

#[test]
fn a_malformed_selector_suggests_the_fix() {
    let stderr = usage_error("zone=eu-1a");
    assert!(
        stderr.contains("did you mean `tag:zone=eu-1a`?"),
        "{stderr}"
    );
    insta::assert_snapshot!("no-kind", stderr);
    let stderr = usage_error("class:db,klass:app");
    assert!(stderr.contains("did you mean `class:app`?"), "{stderr}");
    insta::assert_snapshot!("unknown-kind", stderr);
    insta::assert_snapshot!("tag-without-value", usage_error("tag:zone"));
    insta::assert_snapshot!("empty-part", usage_error("class:db,,host:app1"));
}

#[test]
fn status_lists_only_the_selected_hosts() {
    let run = deploy(&["status", SITE, "--on", "class:db,host:app3"]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    insta::assert_snapshot!("status-on", run.stdout);

    let run = deploy(&["status", SITE, "--json", "--on", "!class:app"]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
    let hosts: Vec<&str> = json["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h["host"].as_str().expect("host"))
        .collect();
    assert_eq!(hosts, ["db1", "db2", "lb1"]);
    assert_eq!(json["total"], 3);

    let run = deploy(&["status", SITE, "--on", "klass:db"]);
    assert_eq!(run.code, USAGE, "stderr:\n{}", run.stderr);
}

#[test]
fn a_saved_plan_takes_no_selector() {
    let dir = tempfile::tempdir().expect("temp dir");
    let saved = dir.path().join("select.plan");
    let saved = saved.to_str().expect("UTF-8 path");
    let run = deploy(&[
        "plan",
        SITE,
        "--offline",
        "--on",
        "class:db",
        "--out",
        saved,
    ]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    let run = deploy(&["apply", saved, "--yes", "--on", "class:app"]);
    assert_eq!(run.code, USAGE, "stderr:\n{}", run.stderr);
    assert!(
        run.stderr.contains("--on does not apply to a saved plan"),
        "{}",
        run.stderr
    );
}

#[test]
fn apply_changes_only_the_selected_hosts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    std::fs::write(
        root.join("platform.kdl"),
        r#"platform "tmp" {
    transport "local" root="hosts"
    inventory "static" {
        host "app1" address="127.0.64.1" class="app" zone="a"
        host "app2" address="127.0.64.2" class="app" zone="b"
        host "app3" address="127.0.64.3" class="app" zone="a"
    }
}
"#,
    )
    .expect("write the platform");
    std::fs::write(
        root.join("site.kdl"),
        r##"site "tmp" {
    version "2.0"
    platform "platform.kdl"
}
class "app" { service "web" }
service "web" {
    install #"mkdir -p srv && echo "$DEPLOY_NEW_VERSION" >srv/web"#
}
"##,
    )
    .expect("write the site");
    let site = root.join("site.kdl");
    let site = site.to_str().expect("UTF-8 path");
    // A selector that matches nothing is refused before any host is contacted (locked).
    let run = deploy(&["apply", site, "--yes", "--on", "host:nope"]);
    assert_eq!(run.code, USAGE, "stderr:\n{}", run.stderr);
    assert!(!root.join("hosts").exists(), "a host was contacted");
    let run = deploy(&["apply", site, "--yes", "--on", "tag:zone=a,!host:app1"]);
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let installed = |h: &str| root.join("hosts").join(h).join("srv/web").exists();
    assert!(installed("app3"), "{}", run.stdout);
    assert!(!installed("app1") && !installed("app2"), "{}", run.stdout);
    let state = |h: &str| root.join("hosts").join(h).join("var/lib/drover/state.json");
    assert!(state("app3").exists());
    assert!(!state("app1").exists() && !state("app2").exists());
}
