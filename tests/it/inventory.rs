//! Inventory backends end to end: `deploy plan --offline` on sites whose platform lists its
//! hosts with a program (`inventory "command"`) or in a static hosts file, one fixture per
//! case in tests/fixtures/inventory/. Every failure is snapshotted as the operator sees it.

use crate::support;

use drover::plan::Plan;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use support::cli::{deploy, Run};
use support::process::dead;

const FIXTURES: &str = "tests/fixtures/inventory";
const INVALID: i32 = 3;
const ENVIRONMENT: i32 = 5;

fn site(name: &str) -> String {
    format!("{FIXTURES}/{name}.kdl")
}

/// `deploy plan FIXTURE --offline ARGS…`.
fn plan(name: &str, args: &[&str]) -> Run {
    let site = site(name);
    let mut all = vec!["plan", site.as_str(), "--offline"];
    all.extend_from_slice(args);
    deploy(&all)
}

/// The plan of a fixture whose inventory resolves.
fn plan_json(name: &str) -> Plan {
    let run = plan(name, &["--json"]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    assert!(run.stderr.is_empty(), "stderr:\n{}", run.stderr);
    serde_json::from_str(&run.stdout).expect("--json output is a Plan")
}

/// Runs a fixture that must fail with `code`, printing nothing on stdout; its stderr.
fn fails(name: &str, code: i32) -> String {
    let run = plan(name, &[]);
    assert_eq!(
        run.code, code,
        "exit code of {name}\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert!(run.stdout.is_empty(), "stdout:\n{}", run.stdout);
    run.stderr
}

/// The hosts of each wave of `service`, in order.
fn waves(plan: &Plan, service: &str) -> Vec<Vec<String>> {
    let s = plan
        .services
        .iter()
        .find(|s| s.name == service)
        .unwrap_or_else(|| panic!("no service {service}"));
    s.waves
        .iter()
        .map(|w| w.steps.iter().map(|st| st.host.to_string()).collect())
        .collect()
}

fn all_hosts(waves: &[Vec<String>]) -> BTreeSet<&str> {
    waves.iter().flatten().map(String::as_str).collect()
}

/// Name → (address, classes, tags) of the plan's inventory snapshot.
type Snapshot = BTreeMap<String, (String, Vec<String>, BTreeMap<String, String>)>;

fn snapshot(plan: &Plan) -> Snapshot {
    plan.hosts
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                (h.address.to_string(), h.classes.clone(), h.tags.clone()),
            )
        })
        .collect()
}

/// The text plan with its digest masked.
fn redact(text: &str) -> String {
    let start = text.find("(digest ").expect("a digest") + "(digest ".len();
    let end = start + text[start..].find(')').expect("digest closed");
    format!("{}[digest]{}", &text[..start], &text[end..])
}

// ---- command: hosts a program prints ----------------------------------------------------------

#[test]
fn command_hosts_are_planned() {
    let run = plan("command", &[]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    insta::assert_snapshot!("command-plan", redact(&run.stdout));
    // One policy, one description: the same words for each service it rolls out, however many
    // waves each has (postgres has one, api two).
    let described: BTreeSet<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("  policy fixture:"))
        .collect();
    assert_eq!(described.len(), 1, "{}", run.stdout);

    let p = plan_json("command");
    let hosts = snapshot(&p);
    assert_eq!(
        hosts.keys().map(String::as_str).collect::<Vec<_>>(),
        ["app1", "app2", "db1", "edge1", "lb1"]
    );
    let (address, classes, tags) = &hosts["edge1"];
    assert_eq!(address, "10.0.3.1");
    assert_eq!(classes, &["app", "lb"]);
    // Tag values that are not strings are written out.
    assert_eq!(tags["spot"], "true");
    assert_eq!(hosts["app2"].2["rack"], "12");

    // A host of two classes runs the services of both, in each one's waves.
    assert_eq!(
        all_hosts(&waves(&p, "api")),
        ["app1", "app2", "edge1"].into()
    );
    assert_eq!(all_hosts(&waves(&p, "haproxy")), ["edge1", "lb1"].into());
    assert_eq!(all_hosts(&waves(&p, "postgres")), ["db1"].into());
}

#[test]
fn a_wrapper_script_beside_the_platform_runs_from_there() {
    // `run "./hosts-from-csv.py" "fleet.csv"`: the program and its argument are found in the
    // platform file's directory, though deploy runs from the repository root.
    let csv = plan_json("command-csv");
    let json = plan_json("command");
    let strip = |s: Snapshot| -> Vec<(String, String, Vec<String>, Option<String>)> {
        s.into_iter()
            .map(|(n, (a, c, t))| (n, a, c, t.get("zone").cloned()))
            .collect()
    };
    assert_eq!(strip(snapshot(&csv)), strip(snapshot(&json)));
}

#[test]
fn check_does_not_run_the_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pids_file = dir.path().join("pids");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["check", &site("command-slow")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DROVER_TEST_PIDS", &pids_file)
        .output()
        .expect("run deploy");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        !pids_file.exists(),
        "`deploy check` ran the inventory command"
    );
}

#[test]
fn invalid_json_points_at_the_place() {
    let stderr = fails("command-invalid-json", ENVIRONMENT);
    assert!(
        stderr.contains("╭─[stdout of python3 hosts.py invalid-json:4:60]"),
        "{stderr}"
    );
    insta::assert_snapshot!("command-invalid-json", stderr);
}

#[test]
fn a_wrong_shape_points_at_the_value() {
    insta::assert_snapshot!(
        "command-wrong-shape",
        fails("command-wrong-shape", ENVIRONMENT)
    );
}

#[test]
fn a_host_without_a_class_points_at_the_host() {
    insta::assert_snapshot!("command-no-class", fails("command-no-class", ENVIRONMENT));
}

#[test]
fn an_empty_address_points_at_it() {
    insta::assert_snapshot!(
        "command-empty-address",
        fails("command-empty-address", ENVIRONMENT)
    );
}

#[test]
fn an_unknown_class_suggests_the_near_one() {
    let stderr = fails("command-unknown-class", ENVIRONMENT);
    assert!(stderr.contains("help: did you mean `lb`?"), "{stderr}");
    insta::assert_snapshot!("command-unknown-class", stderr);
}

#[test]
fn another_schema_is_refused() {
    insta::assert_snapshot!("command-schema", fails("command-schema", ENVIRONMENT));
}

#[test]
fn a_failing_command_shows_its_stderr() {
    let stderr = fails("command-fails", ENVIRONMENT);
    assert!(stderr.contains("(exit code 3)"), "{stderr}");
    assert!(stderr.contains("503 Service Unavailable"), "{stderr}");
    insta::assert_snapshot!("command-fails", stderr);
}

#[test]
fn a_missing_program_is_named_with_its_path() {
    insta::assert_snapshot!("command-missing", fails("command-missing", ENVIRONMENT));
}

#[test]
fn duplicate_names_are_refused() {
    let stderr = fails("command-duplicate", ENVIRONMENT);
    assert!(
        stderr.contains("addresses 10.0.2.1 and 10.0.2.9"),
        "{stderr}"
    );
    insta::assert_snapshot!("command-duplicate", stderr);
}

#[test]
fn a_class_without_hosts_is_an_error_or_a_warning() {
    insta::assert_snapshot!(
        "command-empty-class",
        fails("command-empty-class", ENVIRONMENT)
    );
    let run = plan("command-empty-warn", &["--json"]);
    assert_eq!(run.code, 0, "stderr:\n{}", run.stderr);
    assert_eq!(
        run.stderr,
        "warning: class lb resolved to no hosts in the inventory of \
         tests/fixtures/inventory/platforms/command-empty-warn.kdl\n"
    );
    let p: Plan = serde_json::from_str(&run.stdout).expect("a plan");
    assert!(waves(&p, "haproxy").is_empty());
    assert_eq!(all_hosts(&waves(&p, "api")), ["app1", "app2"].into());
}

#[test]
fn a_spread_tag_no_host_carries_is_refused_when_planning() {
    // `deploy check` cannot know the hosts of a program: it says nothing.
    let site = site("command-spread-typo");
    let check = deploy(&["check", &site]);
    assert_eq!(check.code, 0, "stderr:\n{}", check.stderr);
    assert!(check.stderr.is_empty(), "stderr:\n{}", check.stderr);
    // Planning knows them: the policy's line, the tag, the classes and the tags the hosts
    // carry, the near one first.
    let stderr = fails("command-spread-typo", INVALID);
    assert!(
        stderr.contains(
            "tests/fixtures/inventory/shared/spread-typo.kdl:4: policy spread-typo spreads over"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `zone`?"), "{stderr}");
    insta::assert_snapshot!("command-spread-typo", stderr);
}

#[test]
fn a_slow_command_is_killed_with_its_children() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pids_file = dir.path().join("pids");
    let start = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["plan", &site("command-slow"), "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env("DROVER_TEST_PIDS", &pids_file)
        .output()
        .expect("run deploy");
    let took = start.elapsed();
    let stderr = String::from_utf8(out.stderr).expect("UTF-8");
    assert_eq!(out.status.code(), Some(ENVIRONMENT), "{stderr}");
    assert!(
        took < Duration::from_secs(10),
        "timeout=\"1s\" took {took:?}"
    );
    insta::assert_snapshot!("command-slow", stderr);

    // The script and the `sleep` it started are both killed (its process group), not left
    // running for the rest of their 30s.
    let pids: Vec<u32> = std::fs::read_to_string(&pids_file)
        .expect("the script wrote its pids")
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !pids.iter().all(|&p| dead(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pids {
        assert!(dead(p), "process {p} still runs");
    }
}

// ---- static: inline hosts and a hosts file -----------------------------------------------------

#[test]
fn a_hosts_file_and_inline_hosts_are_merged() {
    let p = plan_json("static-file");
    let hosts = snapshot(&p);
    assert_eq!(
        hosts.keys().map(String::as_str).collect::<Vec<_>>(),
        ["app1", "app2", "db1", "lb1"]
    );
    assert_eq!(hosts["lb1"].1, ["lb"], "the inline host");
    assert_eq!(hosts["app2"].2["rack"], "12", "a tag from the file");
    assert_eq!(all_hosts(&waves(&p, "api")), ["app1", "app2"].into());
    assert_eq!(all_hosts(&waves(&p, "haproxy")), ["lb1"].into());
}

#[test]
fn a_host_in_both_is_a_duplicate_naming_both_files() {
    let stderr = fails("static-duplicate", INVALID);
    assert!(
        stderr.contains("platforms/lab-hosts.kdl")
            && stderr.contains("platforms/static-duplicate.kdl"),
        "{stderr}"
    );
    insta::assert_snapshot!("static-duplicate", stderr);
}

#[test]
fn an_unknown_class_in_the_hosts_file_points_into_it() {
    let stderr = fails("static-unknown-class", INVALID);
    assert!(
        stderr.contains("╭─[tests/fixtures/inventory/platforms/bad-class-hosts.kdl:3:34]"),
        "{stderr}"
    );
    insta::assert_snapshot!("static-unknown-class", stderr);
}
