//! The history as `deploy history` prints it: a line per run (when, who, how it ended, what it
//! went back to) with a line per service it changed; or one JSON document.

use super::{Change, Entry};
use serde::Serialize;
use std::fmt::Write as _;

/// Version of the JSON `deploy history --json` prints.
pub const HISTORY_JSON_SCHEMA: u32 = 1;

/// Oldest first.
pub fn text(site: &str, entries: &[Entry]) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        let _ = writeln!(out, "No run of {site} has changed hosts yet.");
        return out;
    }
    for e in entries {
        let undo = e
            .undone_to
            .as_ref()
            .map(|to| format!("  undo to {to}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}  {}  {}  {}{undo}",
            e.run,
            e.started,
            e.who,
            e.result.word()
        );
        for c in &e.changes {
            let _ = writeln!(out, "    {}", change(c));
        }
    }
    out
}

/// `api: 1.0 → 2.0 on 3 hosts (1 failed)`.
fn change(c: &Change) -> String {
    let from: Vec<&str> = c
        .from
        .iter()
        .map(|f| f.as_deref().unwrap_or("fresh"))
        .collect();
    let hosts = if c.hosts == 1 { "host" } else { "hosts" };
    let failed = match c.failed {
        0 => String::new(),
        n => format!(" ({n} failed)"),
    };
    format!(
        "{}: {} → {} on {} {hosts}{failed}",
        c.service,
        from.join(", "),
        c.to.join(", "),
        c.hosts
    )
}

#[derive(Serialize)]
struct Json<'a> {
    schema: u32,
    site: &'a str,
    runs: Vec<RunJson<'a>>,
}

#[derive(Serialize)]
struct RunJson<'a> {
    run: &'a str,
    started: &'a str,
    finished: &'a str,
    who: String,
    result: super::RunResult,
    changes: &'a [Change],
    undone_to: Option<&'a str>,
    site_digest: &'a str,
    /// How many files the snapshot keeps: the site's and those it delivers.
    files: usize,
}

/// The JSON document, oldest run first.
pub fn json(site: &str, entries: &[Entry]) -> String {
    let doc = Json {
        schema: HISTORY_JSON_SCHEMA,
        site,
        runs: entries
            .iter()
            .map(|e| RunJson {
                run: e.run.as_str(),
                started: &e.started,
                finished: &e.finished,
                who: e.who.to_string(),
                result: e.result,
                changes: &e.changes,
                undone_to: e.undone_to.as_ref().map(super::RunId::as_str),
                site_digest: &e.snapshot.site_digest,
                files: e.snapshot.sources.len() + e.snapshot.delivered.len(),
            })
            .collect(),
    };
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}
