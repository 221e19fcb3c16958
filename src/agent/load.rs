//! A published snapshot on the agent's host: its manifest and contents brought from etcd, put
//! back into a private directory under the agent's state directory, and loaded by the site
//! stage; then given the hosts `publish` resolved (a static inventory: the agent resolves
//! nothing again) and the `local` transport onto its own host only.

use super::{Agent, AgentError};
use crate::history::{shared, Blobs, History};
use crate::publish::Manifest;
use crate::site::{InventorySpec, SecretSource, Site, Transport};
use crate::state::store::{Etcd, Keys};
use std::path::{Path, PathBuf};

/// A snapshot loaded as a site, and where it was put back (removed when dropped).
pub struct Loaded {
    /// The snapshot's digest.
    pub digest: String,
    /// The revision `desired/current` was last changed at when it named this snapshot: every
    /// write of a step on it is conditioned on it.
    pub revision: i64,
    pub site: Site,
    pub manifest: Manifest,
    work: PathBuf,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The manifest at `snapshots/<digest>/`, checked against the digest.
pub async fn manifest(etcd: &Etcd, keys: &Keys, digest: &str) -> Result<Manifest, AgentError> {
    crate::publish::read_manifest(etcd, keys, digest)
        .await
        .map_err(|e| match e {
            crate::publish::Unreadable::Store(e) => AgentError::Store(e),
            crate::publish::Unreadable::Damaged(reason) => AgentError::Snapshot {
                digest: digest.to_string(),
                reason,
            },
        })
}

/// Brings snapshot `digest` here and loads it (see the module's text).
pub async fn snapshot(agent: &Agent, digest: &str, revision: i64) -> Result<Loaded, AgentError> {
    let manifest = manifest(&agent.etcd, &agent.keys, digest).await?;
    let history = History::at(&agent.controller());
    let blobs: Blobs = history.blobs();
    let digests: Vec<_> = manifest.snapshot.digests().collect();
    shared::get_contents(&agent.etcd, &agent.keys, &blobs, digests.iter().copied()).await?;
    let work = agent.state_dir.join("work").join(digest);
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| AgentError::io(&work, e))?;
    }
    private_dir(&work)?;
    let (file, site_dir) = manifest.snapshot.put_back(&blobs, &work)?;
    let mut loaded = Loaded {
        digest: digest.to_string(),
        revision,
        site: crate::site::load(&file)?,
        manifest,
        work,
    };
    let site = &mut loaded.site;
    let hosts = loaded
        .manifest
        .inventory(site)
        .map_err(|reason| AgentError::Snapshot {
            digest: digest.to_string(),
            reason,
        })?;
    if !hosts.iter().any(|h| h.name == agent.host) {
        return Err(AgentError::NotInSnapshot {
            host: agent.host.clone(),
            digest: digest.to_string(),
        });
    }
    site.platform.inventory = InventorySpec::Static { hosts };
    // The agent's steps are its own: no site lock, its records published by the agent.
    site.platform.store = None;
    site.platform.transport = Transport::Local {
        root: agent.hosts_dir(),
    };
    secrets_here(site, &loaded.work, &site_dir, &agent.secrets);
    // A service this host does not run needs none of its secrets here (its hooks never run
    // here; what its hosts run is as their agents published it).
    let classes: Vec<&str> = loaded
        .manifest
        .hosts
        .iter()
        .filter(|h| h.name == agent.host)
        .flat_map(|h| h.classes.iter().map(String::as_str))
        .collect();
    let site = &mut loaded.site;
    let names: Vec<String> = site.classes.iter().map(|c| c.name.clone()).collect();
    for s in site.services.iter_mut() {
        if !s
            .classes
            .iter()
            .any(|c| classes.contains(&names[c.index()].as_str()))
        {
            s.secrets.clear();
        }
    }
    Ok(loaded)
}

/// A secret's file named relative to the site is read under the agent's secrets directory
/// (`--secrets`), at its path from the site file's directory with any leading `../` dropped
/// (`file="../secrets/api-token"`: `<secrets>/secrets/api-token`); an absolute one where it
/// is. A secret's value is never in a snapshot.
fn secrets_here(site: &mut Site, work: &Path, site_dir: &Path, secrets: &Path) {
    let all = site
        .secrets
        .iter_mut()
        .chain(site.services.iter_mut().flat_map(|s| s.secrets.iter_mut()));
    for secret in all {
        if let SecretSource::File(p) = &mut secret.source {
            if let (true, Some(rel)) = (p.starts_with(work), below(site_dir, p)) {
                *p = secrets.join(rel);
            }
        }
    }
}

/// `path`'s components after those it shares with `base`.
fn below(base: &Path, path: &Path) -> Option<PathBuf> {
    let common = base
        .components()
        .zip(path.components())
        .take_while(|(a, b)| a == b)
        .count();
    let rest: PathBuf = path.components().skip(common).collect();
    (!rest.as_os_str().is_empty()).then_some(rest)
}

/// `dir` made, readable by this user only.
pub fn private_dir(dir: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| AgentError::io(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| AgentError::io(dir, e))
}
