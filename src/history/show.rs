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

/// `api: 1.0 → 2.0 on 3 hosts: 2 upgrades, 1 install (1 failed)`, with the reasons of its
/// reconfigures (`1 reconfigure: env: MODE`), the hosts switched back (`3 reverted`), and what
/// it removed (`api: 1.0 removed from 2 hosts`).
fn change(c: &Change) -> String {
    use super::Kinded;
    use crate::plan::StepKind;
    use crate::words::count;
    let mut said = Vec::new();
    if c.hosts > 0 {
        let from: Vec<&str> = c
            .from
            .iter()
            .map(|f| f.as_deref().unwrap_or("fresh"))
            .collect();
        let mut line = format!(
            "{} → {} on {}",
            from.join(", "),
            c.to.join(", "),
            count(c.hosts, "host")
        );
        // What the steps did, unless the versions say it: one kind, installs or upgrades.
        let plain = matches!(
            c.kinds.as_slice(),
            [] | [Kinded {
                kind: StepKind::Install | StepKind::Upgrade,
                ..
            }]
        );
        if !plain {
            let kinds: Vec<String> = c
                .kinds
                .iter()
                .map(|k| kind_count(k.hosts, k.kind))
                .collect();
            line.push_str(&format!(": {}", kinds.join(", ")));
            if !c.reasons.is_empty() {
                line.push_str(&format!(" ({})", c.reasons.join(", ")));
            }
        }
        said.push(line);
    }
    // What it removed, or tried to (a removal that failed counts in `failed`).
    if c.removed > 0 || (said.is_empty() && !c.removed_versions.is_empty()) {
        let versions = match c.removed_versions.as_slice() {
            [] => String::new(),
            v => format!("{} ", v.join(", ")),
        };
        said.push(format!(
            "{versions}removed from {}",
            count(c.removed, "host")
        ));
    }
    let mut notes = Vec::new();
    if c.failed > 0 {
        notes.push(format!("{} failed", c.failed));
    }
    if c.reverted > 0 {
        notes.push(format!("{} reverted", c.reverted));
    }
    let notes = match notes.is_empty() {
        true => String::new(),
        false => format!(" ({})", notes.join(", ")),
    };
    format!("{}: {}{notes}", c.service, said.join("; "))
}

/// `n` steps of `kind` in words: "2 upgrades", "1 retry".
fn kind_count(n: usize, kind: crate::plan::StepKind) -> String {
    use crate::plan::StepKind;
    let (one, many) = match kind {
        StepKind::Install => ("install", "installs"),
        StepKind::Upgrade => ("upgrade", "upgrades"),
        StepKind::Retry => ("retry", "retries"),
        StepKind::Reconfigure => ("reconfigure", "reconfigures"),
        StepKind::Repair => ("repair", "repairs"),
        StepKind::Unread => ("step decided at its start", "steps decided at their start"),
    };
    format!("{n} {}", if n == 1 { one } else { many })
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
