//! `deploy status` as a table for people.

use crate::state::{Mark, Outcome, Status};
use std::fmt::Write;

fn mark(m: &Option<Mark>) -> &'static str {
    match m.as_ref().map(|m| m.outcome) {
        Some(Outcome::Success) => "ok",
        Some(Outcome::Failure) => "FAILED",
        None => "-",
    }
}

pub fn status_text(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<12} {:<14} {:<14} {:<10} {:<10} LAST CHANGE",
        "HOST", "SERVICE", "RUNNING", "DESIRED", "CONFIGURED", "VALIDATED"
    );
    for h in &s.hosts {
        for sv in &h.services {
            let running = sv.running.as_deref().unwrap_or("-");
            let flag = if sv.ok { "" } else { " *" };
            let _ = writeln!(
                out,
                "{:<16} {:<12} {:<14} {:<14} {:<10} {:<10} {}{flag}",
                h.host,
                sv.service,
                running,
                sv.desired,
                mark(&sv.configured),
                mark(&sv.validated),
                sv.last_change.as_deref().unwrap_or("-")
            );
        }
    }
    let failed: Vec<String> = s
        .hosts
        .iter()
        .flat_map(|h| {
            h.services.iter().filter_map(move |sv| {
                sv.failure_log
                    .as_ref()
                    .map(|l| format!("  {} {}: see {l}", h.host, sv.service))
            })
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailed:\n{}", failed.join("\n"));
    }
    let diverged: Vec<String> = s
        .hosts
        .iter()
        .flat_map(|h| {
            h.services
                .iter()
                .filter(|sv| !sv.diverged.is_empty())
                .map(move |sv| format!("  {} {}: {}", h.host, sv.service, sv.diverged.join("; ")))
        })
        .collect();
    if !diverged.is_empty() {
        let _ = writeln!(
            out,
            "\ndiverged (at the desired version, given other inputs than the site says):\n{}",
            diverged.join("\n")
        );
    }
    if !s.unaccounted.is_empty() {
        let _ = writeln!(out, "\nunaccounted:");
        for u in &s.unaccounted {
            let _ = writeln!(out, "  {}: {}", u.host, u.reason);
        }
    }
    if let Some(run) = &s.unfinished_run {
        let _ = writeln!(out, "\nunfinished run:\n  {}", run.describe());
        let hint = if run.state == "running" {
            "it holds the site's lock until it ends"
        } else {
            "`deploy apply` carries it on"
        };
        let _ = writeln!(out, "  {hint}; journal: {}", run.journal);
    }
    let _ = writeln!(
        out,
        "\n{} of {} host services converged (desired version and inputs, healthy).",
        s.converged, s.total
    );
    out
}
