//! A published snapshot's manifest: the run's [`Snapshot`] (site files, templates, `file`
//! contents, each by digest) and the resolved hosts and classes, serialized once; its sha256 is
//! the snapshot's digest (`snapshots/<digest>/`), so that the same content is the same
//! snapshot. Also what pull mode cannot honour yet, said the same way by `publish` and `agent`.

use crate::history::{shared::CHUNK, Digest, Snapshot};
use crate::inventory::Hosts;
use crate::site::{HostSpec, OnFailure, Site};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the manifest's layout.
pub const MANIFEST_SCHEMA: u32 = 1;

/// One host of the inventory as `publish` resolved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedHost {
    pub name: String,
    pub address: String,
    /// Its classes, by name.
    pub classes: Vec<String>,
    pub tags: BTreeMap<String, String>,
}

/// What one `deploy publish` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub site: String,
    pub snapshot: Snapshot,
    /// In the inventory's order (natural name order).
    pub hosts: Vec<PublishedHost>,
}

impl Manifest {
    pub fn new(site: &Site, hosts: &Hosts, snapshot: Snapshot) -> Manifest {
        let hosts = hosts
            .hosts
            .iter()
            .map(|h| PublishedHost {
                name: h.name.to_string(),
                address: h.address.to_string(),
                classes: h
                    .classes
                    .iter()
                    .map(|c| site.classes[*c].name.clone())
                    .collect(),
                tags: h.tags.clone(),
            })
            .collect();
        Manifest {
            schema: MANIFEST_SCHEMA,
            site: site.name.clone(),
            snapshot,
            hosts,
        }
    }

    /// Its bytes as published, and their digest (the snapshot's name).
    pub fn encode(&self) -> (String, Digest) {
        let text = serde_json::to_string(self).unwrap_or_default();
        let digest = Digest::of(text.as_bytes());
        (text, digest)
    }

    /// `text` read back from `snapshots/<digest>/`, checked against `digest`.
    pub fn decode(digest: &str, text: &str) -> Result<Manifest, String> {
        let got = Digest::of(text.as_bytes());
        if got.as_str() != digest {
            return Err(format!("its content has digest {got}, not {digest}"));
        }
        let m: Manifest = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if m.schema != MANIFEST_SCHEMA {
            return Err(format!(
                "schema {}, this deploy reads {MANIFEST_SCHEMA}",
                m.schema
            ));
        }
        Ok(m)
    }

    /// The published hosts as a static inventory of `site` (the snapshot loaded again): one
    /// entry per host and class. A class the site does not have is an error naming it.
    pub fn inventory(&self, site: &Site) -> Result<Vec<HostSpec>, String> {
        let mut out = Vec::new();
        for h in &self.hosts {
            for class in &h.classes {
                let id = site.class(class).ok_or_else(|| {
                    format!("host {} has class {class}, which the site lacks", h.name)
                })?;
                out.push(HostSpec {
                    name: h.name.clone(),
                    address: h.address.clone(),
                    class: id,
                    tags: h.tags.clone(),
                });
            }
        }
        Ok(out)
    }
}

/// Why a published manifest cannot be read back.
#[derive(Debug)]
pub enum Unreadable {
    Store(crate::state::store::StoreError),
    /// Missing, damaged, or of another schema: why.
    Damaged(String),
}

/// The manifest at `snapshots/<digest>/`, its parts in order, checked against the digest.
pub async fn read(
    etcd: &crate::state::store::Etcd,
    keys: &crate::state::store::Keys,
    digest: &str,
) -> Result<Manifest, Unreadable> {
    let prefix = keys.snapshot(digest);
    let names: Vec<String> = etcd
        .range(&prefix, true)
        .await
        .map_err(Unreadable::Store)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    if names.is_empty() {
        return Err(Unreadable::Damaged(format!("nothing under {prefix}")));
    }
    let n = crate::history::shared::chunk_count(&prefix, &names).map_err(Unreadable::Damaged)?;
    let mut text = String::new();
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let part = etcd
            .value(&key)
            .await
            .map_err(Unreadable::Store)?
            .ok_or_else(|| Unreadable::Damaged(format!("{key} went while it was read")))?;
        text.push_str(&String::from_utf8(part).map_err(|e| Unreadable::Damaged(e.to_string()))?);
    }
    Manifest::decode(digest, &text).map_err(Unreadable::Damaged)
}

/// `text` in parts of at most [`CHUNK`] bytes, each cut at a character boundary (at least one).
pub fn parts(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > CHUNK {
        let mut cut = CHUNK;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out.push(rest);
    out
}

/// What the site asks that pull mode cannot honour yet, one line each (empty: nothing).
/// `publish` refuses such a site and an agent refuses such a snapshot: never silently ignored.
pub fn unsupported(site: &Site) -> Vec<String> {
    let mut out = Vec::new();
    if site.services.iter().any(|s| s.name == "current") {
        out.push(
            "service `current`: pull mode keeps the snapshot's digest at desired/current, \
             which is that service's key; rename the service"
                .to_string(),
        );
    }
    if site.max_failed.is_some() {
        out.push("site `max-failed` (a budget over all services)".into());
    }
    if site.prune {
        out.push("site `prune #true` (removals)".into());
    }
    for s in site.services.iter() {
        let p = &s.policy;
        let mut no = |what: String| {
            out.push(format!(
                "service {}: policy \"{}\" has {what}",
                s.name, p.name
            ))
        };
        if let Some(tag) = &p.spread {
            no(format!("spread \"{tag}\" (waves by tag)"));
        }
        if p.on_failure == OnFailure::Revert {
            no("on-failure \"revert\"".into());
        }
        if p.wave_max_failed.is_some() {
            no("a wave's max-failed".into());
        }
        if p.progress_deadline.is_some() {
            no("progress-deadline".into());
        }
        if p.flow != crate::site::Flow::Slots {
            no(format!("flow \"{}\"", p.flow.name()));
        }
        for n in &s.needs {
            if n.drain {
                out.push(format!(
                    "service {}: needs \"{}\" drain=#true",
                    s.name, site.services[n.service].name
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_at_characters_and_join_again() {
        let text = "é".repeat(CHUNK); // 2 bytes each
        let got = parts(&text);
        assert!(got.iter().all(|p| p.len() <= CHUNK));
        assert_eq!(got.len(), 2);
        assert_eq!(got.concat(), text);
        assert_eq!(parts(""), vec![""]);
    }
}
