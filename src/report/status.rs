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
    if !s.disagreements.is_empty() {
        let _ = writeln!(out, "\nthe store and the hosts disagree:");
        for d in &s.disagreements {
            let _ = writeln!(
                out,
                "  {} {}: store says {}; the host records {}",
                d.host, d.service, d.store, d.recorded
            );
        }
    }
    match &s.checked {
        Some(c) if !c.failing.is_empty() => {
            let _ = writeln!(
                out,
                "\nfailing checks (converged as recorded; `deploy apply --repair` re-runs their \
                 switch-over):"
            );
            for f in &c.failing {
                let _ = writeln!(out, "  {} {}: check failed: {}", f.host, f.service, f.why);
            }
        }
        Some(c) => {
            let _ = writeln!(
                out,
                "\nchecks of the converged host services, run now: {} passed, 0 failed.",
                c.ran
            );
        }
        None => {}
    }
    if !s.unaccounted.is_empty() {
        let _ = writeln!(out, "\nunaccounted:");
        for u in &s.unaccounted {
            let _ = writeln!(out, "  {}: {}", u.host, u.reason);
        }
    }
    if !s.read.is_empty() {
        let _ = writeln!(
            out,
            "\nread from the hosts themselves (the store cannot speak for them):"
        );
        for r in &s.read {
            let _ = writeln!(out, "  {}: {}", r.host, r.reason);
        }
    }
    if let Some(why) = &s.stale {
        let _ = writeln!(out, "\nthe store is stale:\n  {why}");
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
    if let Some(u) = &s.undone {
        let _ = writeln!(
            out,
            "\nundone:\n  the fleet was undone to run {} by run {} ({}, {}); `deploy plan` shows \
             what the site file would change",
            u.to, u.by, u.at, u.result
        );
    }
    if let Some(lock) = &s.site_lock {
        let holder = lock.holder.as_ref().map_or_else(
            || "a holder that cannot be read (a lock being taken, or a damaged one)".to_string(),
            |h| h.describe(),
        );
        let _ = writeln!(
            out,
            "\nsite lock:\n  {} is held by {holder}; `deploy apply` refuses until it is free",
            lock.path
        );
    }
    let read = match s.read.len() {
        0 => String::new(),
        1 => ", but for 1 host read itself".to_string(),
        n => format!(
            ", but for {} read themselves",
            crate::words::count(n, "host")
        ),
    };
    let from = match s.source {
        crate::state::Source::Hosts => String::new(),
        crate::state::Source::Store => format!(" (as the store says{read})"),
    };
    let _ = writeln!(
        out,
        "\n{} of {} converged (desired version and inputs, healthy){from}.",
        s.converged,
        crate::words::count(s.total, "host service")
    );
    out
}

/// `deploy status --failures`: one line per failed host, service and category, with its log.
pub fn failures_text(s: &Status) -> String {
    let mut out = String::new();
    for f in s.failures() {
        let _ = writeln!(
            out,
            "{} {} {} {}: failed{} at {} (run {}), log: {}",
            f.host,
            f.service,
            f.running.as_deref().unwrap_or("-"),
            f.category,
            f.mark
                .hook
                .as_deref()
                .map_or(String::new(), |h| format!(" in {h}")),
            f.mark.at,
            f.mark.run,
            f.mark.log
        );
    }
    out
}
