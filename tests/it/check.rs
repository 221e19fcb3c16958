//! `deploy check` on one small fixture per kind of problem (tests/fixtures/check/).
//!
//! Every invalid fixture must exit 3 with nothing on stdout, and its stderr is snapshotted:
//! each diagnostic names its file, line and column, labels the spot and says what to do.
//! Valid fixtures exit 0 with nothing on stderr.

use crate::support;
use std::path::Path;

use support::cli::{deploy, Run};

const FIXTURES: &str = "tests/fixtures/check";
const INVALID: i32 = 3;
const OK: i32 = 0;
/// Valid (exit 0), with warnings on stderr.
const WARNED: i32 = -1;

fn check(site: &str) -> Run {
    deploy(&["check", site])
}

/// The diagnostics of a report, split at each `  × ` (error) or `  ⚠ ` (warning) headline.
fn diagnostics(stderr: &str) -> Vec<&str> {
    let mut starts: Vec<usize> = ["\n  × ", "\n  ⚠ "]
        .iter()
        .flat_map(|m| stderr.match_indices(m).map(|(i, _)| i))
        .collect();
    starts.sort_unstable();
    starts
        .iter()
        .enumerate()
        .map(|(k, &i)| &stderr[i..starts.get(k + 1).copied().unwrap_or(stderr.len())])
        .collect()
}

/// Runs `deploy check` on `<name>.kdl`, asserts its exit code and snapshots what it printed.
fn fixture(name: &str, code: i32) -> Run {
    let path = format!("{FIXTURES}/{name}.kdl");
    let run = check(&path);
    if code == WARNED {
        assert_eq!(run.code, OK, "stderr:\n{}", run.stderr);
        let found = diagnostics(&run.stderr);
        assert!(!found.is_empty(), "no warning in:\n{}", run.stderr);
        for d in &found {
            assert!(d.starts_with("\n  ⚠ "), "not a warning:\n{d}");
            assert!(
                d.contains(&format!("╭─[{FIXTURES}/")),
                "warning without a file:\n{d}"
            );
            assert!(d.contains("  help: "), "warning without help:\n{d}");
        }
        insta::assert_snapshot!(name, format!("{}\n--- stderr\n{}", run.stdout, run.stderr));
        return run;
    }
    assert_eq!(
        run.code, code,
        "exit code of `deploy check {path}`\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    if code == OK {
        assert!(
            run.stderr.is_empty(),
            "stderr of a valid site:\n{}",
            run.stderr
        );
        insta::assert_snapshot!(name, run.stdout);
        return run;
    }
    assert!(
        run.stdout.is_empty(),
        "stdout of an invalid site:\n{}",
        run.stdout
    );
    let found = diagnostics(&run.stderr);
    assert!(!found.is_empty(), "no diagnostic in:\n{}", run.stderr);
    for d in &found {
        assert!(
            d.contains(&format!("╭─[{FIXTURES}/")),
            "diagnostic without a file:line:column:\n{d}"
        );
        assert!(d.contains("╰──"), "diagnostic without a label:\n{d}");
        assert!(d.contains("  help: "), "diagnostic without help:\n{d}");
    }
    let summary = match found.len() {
        1 => format!("error: 1 problem in {path}\n"),
        n => format!("error: {n} problems in {path}\n"),
    };
    assert!(
        run.stderr.ends_with(&summary),
        "summary line `{summary}` missing from:\n{}",
        run.stderr
    );
    insta::assert_snapshot!(name, run.stderr);
    run
}

/// One test per fixture, named like its file (`unknown_node` → `unknown-node.kdl`), plus the
/// list of them all, so that a fixture without a test is noticed.
macro_rules! fixtures {
    ($($test:ident => $code:expr),* $(,)?) => {
        const ALL: &[&str] = &[$(stringify!($test)),*];
        $(
            #[test]
            fn $test() {
                fixture(&stringify!($test).replace('_', "-"), $code);
            }
        )*
    };
}

fixtures! {
    valid => OK,
    data_cycle => OK,
    unknown_node => INVALID,
    unknown_property => INVALID,
    port_string => INVALID,
    bad_duration => INVALID,
    bad_percentage => INVALID,
    on_failure_typo => INVALID,
    flow_typo => INVALID,
    duplicate_class => INVALID,
    duplicate_service => INVALID,
    duplicate_host => INVALID,
    needs_unknown_service => INVALID,
    class_unknown_service => INVALID,
    orphan_service => INVALID,
    empty_class => INVALID,
    missing_platform => INVALID,
    syntax_error => INVALID,
    syntax_unquoted_duration => INVALID,
    missing_site => INVALID,
    runtime_cycle => INVALID,
    self_cycle => INVALID,
    several_problems => INVALID,
    empty_policy => INVALID,
    local_ssh_setting => INVALID,
    keep_shell_string => INVALID,
    direct_above_bad => INVALID,
    file_problems => INVALID,
    shared_path => INVALID,
    state_dir_file => INVALID,
    template_problems => INVALID,
    template_names => INVALID,
    store_problems => INVALID,
    store_lock_ttl_fraction => INVALID,
    service_template_problems => INVALID,
    include_problems => INVALID,
    every_error_at_once => INVALID,
    policy_problems => INVALID,
    spread_typo => WARNED,
    templated => OK,
}

#[test]
fn every_fixture_has_a_test() {
    let mut on_disk: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES))
            .expect("read the fixture directory")
            .map(|e| e.expect("fixture entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "kdl"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().replace('-', "_"))
            .collect();
    on_disk.sort();
    let mut tested: Vec<String> = ALL.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(on_disk, tested);
}

#[test]
fn unknown_node_suggests_the_near_name() {
    let run = check(&format!("{FIXTURES}/unknown-node.kdl"));
    assert!(run.stderr.contains("unknown node `instal` in `service`"));
    assert!(run.stderr.contains("help: did you mean `install`?"));
}

#[test]
fn runtime_cycle_shows_every_edge_at_its_needs_line() {
    let run = check(&format!("{FIXTURES}/runtime-cycle.kdl"));
    assert_eq!(diagnostics(&run.stderr).len(), 1, "{}", run.stderr);
    assert!(run
        .stderr
        .contains("runtime dependency cycle: a → b → c → a"));
    for (line, edge) in [
        (r#"17 │     needs "b""#, "`a` needs `b` at runtime"),
        (
            r#"22 │     needs "c" healthy=1"#,
            "`b` needs `c` at runtime",
        ),
        (
            r#"27 │     needs "a" healthy="50%""#,
            "`c` needs `a` at runtime",
        ),
    ] {
        assert!(run.stderr.contains(line), "line `{line}` not shown");
        assert!(run.stderr.contains(edge), "edge `{edge}` not labelled");
    }
    // The `needs "postgres"` of `a` is no part of the cycle.
    assert!(!run.stderr.contains("`a` needs `postgres`"));
}

#[test]
fn self_cycle_is_a_cycle_of_one() {
    let run = check(&format!("{FIXTURES}/self-cycle.kdl"));
    assert!(run.stderr.contains("runtime dependency cycle: api → api"));
    assert!(run.stderr.contains("`api` needs `api` at runtime"));
}

#[test]
fn several_problems_are_all_reported_in_one_run() {
    let run = check(&format!("{FIXTURES}/several-problems.kdl"));
    let found = diagnostics(&run.stderr);
    let expected = [
        // the site file
        "bad value for the port: expected a whole number, found a string",
        "unknown property `healty` on `needs`",
        "unknown node `strat` in `service`",
        "unknown service `ap`",
        "bad value for `timeout`: `5` is not a duration",
        "class `db` has no hosts",
        // the platform file
        "bad value for the transport: `sssh` is not a transport",
        "`address=` is missing",
        "unknown class `dbs`",
        // the policy file
        "bad value for the failure budget: -1 is negative",
        "bad value for `on-failure`: `stopp` is not a choice",
    ];
    for e in expected {
        assert!(
            run.stderr.contains(e),
            "`{e}` not reported in:\n{}",
            run.stderr
        );
    }
    assert_eq!(found.len(), expected.len(), "{}", run.stderr);
    for file in [
        "several-problems.kdl",
        "platforms/several-problems.kdl",
        "policies/several-problems.kdl",
    ] {
        assert!(
            run.stderr.contains(&format!("╭─[{FIXTURES}/{file}:")),
            "nothing reported in {file}"
        );
    }
}

#[test]
fn problems_are_reported_file_by_file_in_line_order() {
    let run = check(&format!("{FIXTURES}/several-problems.kdl"));
    let locations: Vec<(String, usize, usize)> = run
        .stderr
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("╭─["))
        .map(|l| {
            let l = l.trim_end_matches(']');
            let mut parts = l.rsplitn(3, ':');
            let column = parts.next().unwrap().parse().unwrap();
            let line = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap().to_string(), line, column)
        })
        .collect();
    let files: Vec<&str> = locations.iter().map(|l| l.0.as_str()).collect();
    let mut grouped = files.clone();
    grouped.dedup();
    assert_eq!(
        grouped,
        [
            "tests/fixtures/check/several-problems.kdl",
            "tests/fixtures/check/platforms/several-problems.kdl",
            "tests/fixtures/check/policies/several-problems.kdl",
        ],
        "each file's problems together, the site's first"
    );
    let mut sorted = locations.clone();
    sorted.sort_by_key(|(f, line, column)| (grouped.iter().position(|g| g == f), *line, *column));
    assert_eq!(locations, sorted, "problems in line order within each file");
}

#[test]
fn every_policy_problem_is_reported_in_one_run() {
    let run = check(&format!("{FIXTURES}/policy-problems.kdl"));
    for e in [
        "bad value for the batch size: a batch of 0 never finishes",
        "bad value for `flow`: `lockstep` is not a choice",
        "bad value for `on-failure`: `abort` is not a choice",
        "unknown node `canery` in `policy`",
        "help: did you mean `canary`?",
        "bad value for the progress deadline: a deadline of 0 stops every service at once",
    ] {
        assert!(
            run.stderr.contains(e),
            "`{e}` not reported in:\n{}",
            run.stderr
        );
    }
    assert_eq!(diagnostics(&run.stderr).len(), 5, "{}", run.stderr);
}

#[test]
fn template_names_the_site_does_not_give_are_said_with_the_near_one() {
    let run = check(&format!("{FIXTURES}/template-names.kdl"));
    for e in [
        "`needs.apu` is not given to service `lb`",
        "did you mean `needs.api`? (`lb` needs api)",
        "`env.MODEE` is not given to service `lb`",
        "did you mean `env.MODE`? (`lb` is given MODE)",
        "╭─[tests/fixtures/check/templates/names.j2:3:",
        "╭─[tests/fixtures/check/templates/names.j2:1:",
    ] {
        assert!(run.stderr.contains(e), "`{e}` not said in:\n{}", run.stderr);
    }
    assert_eq!(diagnostics(&run.stderr).len(), 2, "{}", run.stderr);
}

#[test]
fn data_cycle_is_fine() {
    let run = check(&format!("{FIXTURES}/data-cycle.kdl"));
    assert_eq!(run.code, OK, "{}", run.stderr);
    assert!(run.stdout.contains("ok — site data-cycle"));
}

#[test]
fn missing_platform_points_at_the_platform_line() {
    let run = check(&format!("{FIXTURES}/missing-platform.kdl"));
    assert!(run
        .stderr
        .contains("cannot read tests/fixtures/check/platforms/no-such-platform.kdl"));
    assert!(run
        .stderr
        .contains("╭─[tests/fixtures/check/missing-platform.kdl:4:14]"));
    assert!(run.stderr.contains("named here"));
}

#[test]
fn a_missing_site_file_is_invalid_too() {
    let run = check(&format!("{FIXTURES}/no-such-site.kdl"));
    assert_eq!(run.code, INVALID);
    assert!(run
        .stderr
        .contains("cannot read tests/fixtures/check/no-such-site.kdl"));
}

#[test]
fn the_example_site_is_valid() {
    let run = check("sites/webshop.kdl");
    assert_eq!(run.code, OK, "{}", run.stderr);
    assert!(run.stderr.is_empty());
}

#[test]
fn a_reader_that_stops_early_ends_check_and_graph_quietly() {
    // `deploy check SITE | head -1`: the pipe closes before anything is written. A failed
    // write was a panic ("failed printing to stdout"), exit 101.
    for args in [
        ["check", "sites/webshop.kdl"],
        ["graph", "sites/webshop.kdl"],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_deploy"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run deploy");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("deploy ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(OK), "deploy {args:?}: {stderr}");
        assert!(stderr.is_empty(), "deploy {args:?}: {stderr}");
    }
}
