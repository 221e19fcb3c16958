//! `deploy graph`: classes, services and every dependency, as text or Graphviz dot.

use crate::site::{Need, Quota, Site};
use std::fmt::Write;

fn describe(need: &Need) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(h) = need.healthy {
        out.push(format!("runtime, {} healthy", quota(h)));
    }
    if let Some(a) = need.addressable {
        out.push(format!("data, {} addressable", quota(a)));
    }
    out
}

fn quota(q: Quota) -> String {
    match q {
        Quota::All => "all".into(),
        other => other.to_string(),
    }
}

/// Classes with their services, then services in dependency order with their needs.
pub fn graph_text(site: &Site) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "site {}", site.name);
    let _ = writeln!(out, "\nclasses");
    for c in &site.classes {
        let names: Vec<&str> = c
            .services
            .iter()
            .map(|s| site.services[*s].name.as_str())
            .collect();
        let _ = writeln!(out, "  {}: {}", c.name, names.join(", "));
    }
    let _ = writeln!(out, "\nservices, in dependency order");
    for &sid in &site.order {
        let s = &site.services[sid];
        let classes: Vec<&str> = s
            .classes
            .iter()
            .map(|c| site.classes[*c].name.as_str())
            .collect();
        let _ = writeln!(out, "  {} {} [{}]", s.name, s.version, classes.join(", "));
        for n in &s.needs {
            for d in describe(n) {
                let _ = writeln!(out, "    needs {} ({d})", site.services[n.service].name);
            }
        }
    }
    out
}

/// The same graph for Graphviz: one cluster per class, runtime edges solid, data edges dashed.
/// An edge points from a service to the service it needs.
pub fn graph_dot(site: &Site) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", dot_id(&site.name));
    let _ = writeln!(out, "  rankdir=LR;\n  node [shape=box];");
    for (i, c) in site.classes.enumerate() {
        let _ = writeln!(
            out,
            "  subgraph cluster_{i} {{\n    label={};",
            dot_id(&format!("class {}", c.name))
        );
        for &s in &c.services {
            let _ = writeln!(
                out,
                "    {};",
                dot_id(&format!("{}/{}", c.name, site.services[s].name))
            );
        }
        let _ = writeln!(out, "  }}");
    }
    for &sid in &site.order {
        let s = &site.services[sid];
        for n in &s.needs {
            let t = &site.services[n.service];
            for &from_class in &s.classes {
                for &to_class in &t.classes {
                    let from = dot_id(&format!("{}/{}", site.classes[from_class].name, s.name));
                    let to = dot_id(&format!("{}/{}", site.classes[to_class].name, t.name));
                    if let Some(h) = n.healthy {
                        let _ = writeln!(
                            out,
                            "  {from} -> {to} [label={}];",
                            dot_id(&format!("healthy {}", quota(h)))
                        );
                    }
                    if let Some(a) = n.addressable {
                        let _ = writeln!(
                            out,
                            "  {from} -> {to} [style=dashed, label={}];",
                            dot_id(&format!("addressable {}", quota(a)))
                        );
                    }
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

/// A double-quoted dot identifier.
fn dot_id(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
