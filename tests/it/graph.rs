//! `deploy graph`: the webshop as text and as Graphviz dot; data edges dashed, runtime solid.

use crate::support;
use std::collections::BTreeSet;
use std::path::Path;

use support::cli::deploy;

const WEBSHOP: &str = "sites/webshop.kdl";
const DATA_CYCLE: &str = "tests/fixtures/check/data-cycle.kdl";

/// `deploy graph SITE ARGS…`, which must succeed.
fn graph(site: &str, args: &[&str]) -> String {
    let mut all = vec!["graph", site];
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

/// An edge of a dot graph: `"from" -> "to" [attributes];`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    attributes: String,
}

fn edges(dot: &str) -> Vec<Edge> {
    dot.lines()
        .filter_map(|l| {
            let (from, rest) = l.trim().split_once(" -> ")?;
            let (to, attributes) = rest.split_once(" [")?;
            Some(Edge {
                from: from.trim_matches('"').into(),
                to: to.trim_matches('"').into(),
                attributes: attributes.trim_end_matches("];").into(),
            })
        })
        .collect()
}

/// Nodes declared inside the class clusters.
fn nodes(dot: &str) -> BTreeSet<String> {
    dot.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('"') && l.ends_with("\";"))
        .map(|l| l.trim_end_matches(';').trim_matches('"').to_string())
        .collect()
}

#[test]
fn webshop_text() {
    insta::assert_snapshot!("webshop-text", graph(WEBSHOP, &[]));
    assert_eq!(graph(WEBSHOP, &[]), graph(WEBSHOP, &["--format", "text"]));
}

#[test]
fn webshop_dot() {
    insta::assert_snapshot!("webshop-dot", graph(WEBSHOP, &["--format", "dot"]));
}

#[test]
fn data_edges_are_dashed_and_runtime_edges_solid() {
    let dot = graph(WEBSHOP, &["--format", "dot"]);
    let all = edges(&dot);
    assert!(!all.is_empty(), "no edges in:\n{dot}");
    for e in &all {
        let dashed = e.attributes.contains("style=dashed");
        if e.attributes.contains("label=\"addressable ") {
            assert!(dashed, "data edge not dashed: {e:?}");
        } else {
            assert!(
                e.attributes.contains("label=\"healthy "),
                "edge neither data nor runtime: {e:?}"
            );
            assert!(!dashed, "runtime edge dashed: {e:?}");
        }
    }
    let dashed: BTreeSet<(&str, &str)> = all
        .iter()
        .filter(|e| e.attributes.contains("style=dashed"))
        .map(|e| (e.from.as_str(), e.to.as_str()))
        .collect();
    assert_eq!(
        dashed,
        BTreeSet::from([("app/api", "lb/haproxy"), ("lb/haproxy", "app/api")]),
        "the webshop's two data dependencies, api ↔ haproxy"
    );
    let solid: BTreeSet<(&str, &str)> = all
        .iter()
        .filter(|e| !e.attributes.contains("style=dashed"))
        .map(|e| (e.from.as_str(), e.to.as_str()))
        .collect();
    assert_eq!(
        solid,
        BTreeSet::from([
            ("app/api", "db/postgres"),
            ("app/worker", "app/api"),
            ("app/worker", "db/postgres"),
            ("lb/haproxy", "app/api"),
        ])
    );
}

#[test]
fn dot_edges_join_declared_nodes_and_match_the_site() {
    let dot = graph(WEBSHOP, &["--format", "dot"]);
    assert!(dot.starts_with("digraph \"webshop\" {\n"), "{dot}");
    assert!(dot.ends_with("}\n"));
    assert_eq!(dot.matches('{').count(), dot.matches('}').count());
    let declared = nodes(&dot);
    for e in edges(&dot) {
        assert!(declared.contains(&e.from), "undeclared {}", e.from);
        assert!(declared.contains(&e.to), "undeclared {}", e.to);
    }

    // One edge per kind of every `needs` in the checked model, for each pair of classes.
    let site = drover::site::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(WEBSHOP))
        .expect("the webshop is valid");
    let mut expected = 0;
    for s in &site.services {
        let pairs = s.classes.len();
        for n in &s.needs {
            let kinds = usize::from(n.healthy.is_some()) + usize::from(n.addressable.is_some());
            expected += kinds * pairs * site.services[n.service].classes.len();
        }
    }
    assert_eq!(edges(&dot).len(), expected);
    let services_in_classes: usize = site.classes.iter().map(|c| c.services.len()).sum();
    assert_eq!(declared.len(), services_in_classes);
}

#[test]
fn a_data_cycle_is_drawn_both_ways() {
    let dot = graph(DATA_CYCLE, &["--format", "dot"]);
    let dashed: BTreeSet<(String, String)> = edges(&dot)
        .into_iter()
        .filter(|e| e.attributes.contains("style=dashed"))
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(
        dashed,
        BTreeSet::from([
            ("app/api".to_string(), "app/haproxy".to_string()),
            ("app/haproxy".to_string(), "app/api".to_string()),
        ])
    );
}

#[test]
fn graph_of_an_invalid_site_is_invalid() {
    let run = deploy(&["graph", "tests/fixtures/check/runtime-cycle.kdl"]);
    assert_eq!(run.code, 3);
    assert!(run.stdout.is_empty());
    assert!(run
        .stderr
        .contains("runtime dependency cycle: a → b → c → a"));
}

#[test]
fn graphs_are_deterministic() {
    for format in ["text", "dot"] {
        assert_eq!(
            graph(WEBSHOP, &["--format", format]),
            graph(WEBSHOP, &["--format", format])
        );
    }
}
