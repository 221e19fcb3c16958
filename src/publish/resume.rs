//! `deploy resume SITE`: the confirmation a `pause "confirm"` policy waits for in pull mode.
//! For each service of the site whose policy pauses with `"confirm"`, and whose next wave of
//! the current snapshot waits for it (every wave before it ended, as the published status
//! says), `resume/<service>` is set to that wave, at that snapshot ([`Resumed`]); the agents of
//! that wave then go on. Written with the site's lock held (as `publish` writes), fenced by it.
//! The site file given names the store; the policies and versions are the published
//! snapshot's, as the agents act on them.

use super::progress::{self, Resumed, Rollout, RESUME_SCHEMA};
use super::{refusal, Manifest, PublishError, Unreadable};
use crate::history::{shared, History};
use crate::site::{Pause, Site};
use crate::state::journal::CONTROLLER_DIR;
use crate::state::lock::{Holder, Lock};
use crate::state::store::{Etcd, Keys, LeaseLock, Store, StoreError, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `deploy resume` is asked.
#[derive(Debug, Clone)]
pub struct ResumeRequest {
    /// The site file.
    pub site: PathBuf,
}

/// What it confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeDone {
    pub site: String,
    /// The snapshot (`desired/current`).
    pub digest: String,
    /// `(service, wave)`, the wave numbered from 1 as `apply` numbers it, and its key.
    pub resumed: Vec<(String, usize, String)>,
}

/// Confirms every wave that waits for it (see the module's text); refused when none waits.
pub fn resume(request: &ResumeRequest) -> Result<ResumeDone, PublishError> {
    let site = crate::site::load(&request.site)?;
    let Some(spec) = site.platform.store.clone() else {
        return Err(PublishError::NoStore {
            at: super::platform_line(&site.platform.file),
            platform: site.platform.name.clone(),
        });
    };
    let runtime = crate::session::runtime().map_err(PublishError::Runtime)?;
    let keys = Keys::new(&spec.prefix, &site.name);
    runtime.block_on(async {
        let etcd = Arc::new(Etcd::connect(&spec, &site.platform.name).await?);
        let digest = match etcd.value(&keys.current()).await? {
            Some(v) => String::from_utf8_lossy(&v).trim().to_string(),
            None => {
                return Err(PublishError::Refused {
                    reason: format!("site {} has no published snapshot", site.name),
                    help: "publish it first: `deploy publish SITE`".into(),
                })
            }
        };
        let manifest = super::read_manifest(&etcd, &keys, &digest)
            .await
            .map_err(|e| match e {
                Unreadable::Store(e) => PublishError::Store(e),
                Unreadable::Damaged(reason) => PublishError::Refused {
                    reason: format!("snapshot {digest} cannot be read: {reason}"),
                    help: "publish the site again".into(),
                },
            })?;
        // The policies and versions the agents act on: the published snapshot's.
        let published = published_site(&etcd, &keys, &manifest, &digest).await?;
        let waiting = waiting(&etcd, &keys, &published, &manifest, &digest).await?;
        if waiting.is_empty() {
            return Err(PublishError::Refused {
                reason: format!(
                    "nothing of snapshot {digest} waits for `deploy resume`: no service with \
                     pause \"confirm\" has ended a wave whose next one is not confirmed"
                ),
                help: "nothing was written; `deploy status SITE` shows where the hosts are".into(),
            });
        }
        write(&etcd, &keys, &site, &digest, &waiting, spec.lock_ttl).await?;
        Ok(ResumeDone {
            site: site.name.clone(),
            resumed: waiting
                .into_iter()
                .map(|(s, w)| {
                    let key = keys.resume(&s);
                    (s, w + 1, key)
                })
                .collect(),
            digest,
        })
    })
}

/// Snapshot `digest` loaded as a site: its contents fetched into the controller's history
/// (`.drover/history/`, as `publish` keeps them), put back under `.drover/resume/<digest>/`
/// for the site stage to read, then removed.
async fn published_site(
    etcd: &Etcd,
    keys: &Keys,
    manifest: &Manifest,
    digest: &str,
) -> Result<Site, PublishError> {
    let blobs = History::default().blobs();
    let digests: Vec<_> = manifest.snapshot.digests().collect();
    shared::get_contents(etcd, keys, &blobs, digests.iter().copied()).await?;
    let work = Path::new(CONTROLLER_DIR).join("resume").join(digest);
    let io = |source| PublishError::Read {
        path: work.clone(),
        source,
    };
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(io)?;
    }
    std::fs::create_dir_all(&work).map_err(io)?;
    let loaded = manifest
        .snapshot
        .put_back(&blobs, &work)
        .map_err(PublishError::from)
        .and_then(|(file, _)| Ok(crate::site::load(&file)?));
    let _ = std::fs::remove_dir_all(&work);
    loaded
}

/// `(service, wave)` of every wave that waits for `deploy resume` now (waves from 0).
async fn waiting(
    etcd: &Etcd,
    keys: &Keys,
    site: &Site,
    manifest: &Manifest,
    digest: &str,
) -> Result<Vec<(String, usize)>, StoreError> {
    let view = etcd.read(keys).await?;
    let mut out = Vec::new();
    for &sid in &site.order {
        if site.services[sid].policy.pause != Pause::Confirm {
            continue;
        }
        let rollout = Rollout::new(site, manifest, sid);
        let value = etcd.value(&keys.resume(&rollout.name)).await?;
        let resumed = progress::resumed(value.as_deref(), digest);
        if let Some(wave) = rollout.awaiting_resume(&view, resumed) {
            out.push((rollout.name.clone(), wave));
        }
    }
    Ok(out)
}

/// The confirmations, with the site's lock held, fenced by it.
async fn write(
    etcd: &Arc<Etcd>,
    keys: &Keys,
    site: &Site,
    digest: &str,
    waiting: &[(String, usize)],
    ttl: std::time::Duration,
) -> Result<(), PublishError> {
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let me = Holder::me(&site.name, &format!("resume-{}", std::process::id()));
    let lock = LeaseLock::new(etcd.clone(), keys, ttl);
    lock.acquire(&me, false)
        .await
        .map_err(refusal(&site.name))?;
    let written = async {
        let fence = lock
            .fence()
            .ok_or_else(|| StoreError::Fenced("no lock".into()))?;
        let writes: Vec<Write> = waiting
            .iter()
            .map(|(service, wave)| Write::Put {
                key: keys.resume(service),
                value: serde_json::json!(Resumed {
                    schema: RESUME_SCHEMA,
                    digest: digest.to_string(),
                    waves: *wave,
                    by: me.describe(),
                    at: at.clone(),
                })
                .to_string(),
            })
            .collect();
        etcd.write(&fence, &writes).await
    }
    .await;
    let released = lock.release(&me).await;
    written?;
    released.map_err(refusal(&site.name))
}
