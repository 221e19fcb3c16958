//! What a run changed per service, read from its journal: the steps it began (their hosts and
//! versions) and those that failed.

use super::Change;
use crate::state::journal::{Entry, Line};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Per service, in the order the journal first names it; nothing when the journal cannot be
/// read (a line that is not an entry is passed over: the journal's own reader reports it).
pub fn changes(journal: &Path) -> Vec<Change> {
    std::fs::read_to_string(journal)
        .map(|text| from_text(&text))
        .unwrap_or_default()
}

#[derive(Default)]
struct Seen {
    hosts: BTreeSet<String>,
    from: BTreeSet<Option<String>>,
    to: BTreeSet<String>,
    failed: BTreeSet<String>,
}

pub fn from_text(text: &str) -> Vec<Change> {
    let mut order: Vec<String> = Vec::new();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    for line in text.lines() {
        let Ok(line) = serde_json::from_str::<Line>(line) else {
            continue;
        };
        match line.entry {
            Entry::StepIntent {
                service,
                host,
                from,
                to,
            } => {
                if !seen.contains_key(&service) {
                    order.push(service.clone());
                }
                let s = seen.entry(service).or_default();
                s.hosts.insert(host);
                s.from.insert(from);
                s.to.insert(to);
            }
            Entry::StepResult {
                service, host, ok, ..
            } => {
                let s = seen.entry(service).or_default();
                if ok {
                    s.failed.remove(&host);
                } else {
                    s.failed.insert(host);
                }
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .filter_map(|service| {
            let s = seen.remove(&service)?;
            Some(Change {
                service,
                hosts: s.hosts.len(),
                from: s.from.into_iter().collect(),
                to: s.to.into_iter().collect(),
                failed: s.failed.len(),
            })
        })
        .collect()
}
