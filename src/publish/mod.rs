//! The publish stage (pull mode): `deploy publish SITE` checks the site, resolves its
//! inventory, and writes a snapshot of the desired state to the platform's etcd for agents to
//! converge on ([`publish`], the one entry point): the contents (site files, templates, `file`
//! contents) as the history keeps them (`history/blobs/<sha256>/<n>`, chunked, each written
//! once), then with the site's lock held (the lock `deploy apply` takes, for the write only)
//! the manifest at `snapshots/<digest>/<n>` and `desired/current` = digest, each write fenced
//! by the lock. Secrets are never in it: a snapshot names a secret's source, never its value.
//! Above [`crate::history`] (whose snapshot and chunking it reuses); nothing here prints.

mod follow;
mod manifest;
pub mod progress;
mod resume;

pub use follow::Followed;
pub use manifest::{
    parts, read as read_manifest, unsupported, Manifest, PublishedHost, Unreadable, MANIFEST_SCHEMA,
};
pub use progress::{Resumed, Rollout};
pub use resume::{resume, ResumeDone, ResumeRequest};

use crate::apply::{ApplyError, Say};
use crate::history::{shared, Blobs, History, HistoryError, Snapshot};
use crate::site::Site;
use crate::state::lock::{Holder, Lock, LockError};
use crate::state::store::{Etcd, Keys, LeaseLock, Store, StoreError, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest snapshot `publish` writes, its contents added up: 64 MiB. etcd keeps every
/// revision of every key until compaction, in memory-mapped pages of a backend that defaults to
/// a 2 GiB quota; a snapshot is read by every agent of the fleet.
pub const MAX_SNAPSHOT_BYTES: u64 = 64 * 1024 * 1024;

/// What a publish is asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    /// The site file.
    pub site: PathBuf,
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub site: String,
    /// The snapshot's digest, now `desired/current`.
    pub digest: String,
    /// Contents written now (those the store had are not written again).
    pub new_contents: usize,
    /// Contents the snapshot names.
    pub contents: usize,
    /// Their size, added up.
    pub bytes: u64,
    pub hosts: usize,
    /// `desired/current` named this snapshot already.
    pub unchanged: bool,
    /// The etcd key `desired/current`.
    pub key: String,
}

/// Why a publish cannot go on.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PublishError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Site(#[from] crate::site::SiteErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    History(#[from] HistoryError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{at}: platform {platform} has no `store \"etcd\"`: pull mode keeps the snapshot in etcd"
    )]
    #[diagnostic(
        code(drover::publish::no_store),
        help(
            "add to the platform: store \"etcd\" endpoints=\"http://10.0.0.11:2379\" prefix=\"/drover\" \
             (book: \"Shared state on etcd\"), or roll the site out with `deploy apply`"
        )
    )]
    NoStore { at: String, platform: String },
    #[error("pull mode cannot honour this site yet:\n  {lines}")]
    #[diagnostic(
        code(drover::publish::unsupported),
        help("nothing was published; roll it out with `deploy apply`, or use a policy without these (book: \"Pull mode\")")
    )]
    Unsupported { lines: String },
    #[error("refused: the snapshot is {size}, over the limit of {limit}; the biggest files:\n  {biggest}")]
    #[diagnostic(
        code(drover::publish::too_large),
        help("nothing was published; deliver large files from a package or artifact store, and have a hook fetch them")
    )]
    TooLarge {
        size: String,
        limit: String,
        biggest: String,
    },
    #[error("refused: {reason}")]
    #[diagnostic(code(drover::publish::refused), help("{help}"))]
    Refused { reason: String, help: String },
    #[error("cannot read {path}: {source}")]
    #[diagnostic(code(drover::publish::read))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    #[diagnostic(code(drover::publish::runtime))]
    Runtime(std::io::Error),
}

/// Checks and resolves the site, and publishes its snapshot (see the module's text).
pub fn publish(request: &Request, say: &Say) -> Result<Published, PublishError> {
    publish_and_follow(request, say, None, &|_| {}).map(|(p, _)| p)
}

/// As [`publish`], what it published given to `published`; then, given a `sink`, follows
/// the snapshot to its end (`deploy publish --follow`: its progress from the store, as the
/// rollout's events).
pub fn publish_and_follow(
    request: &Request,
    say: &Say,
    sink: Option<&dyn crate::rollout::Sink>,
    published: &dyn Fn(&Published),
) -> Result<(Published, Option<Followed>), PublishError> {
    let site = crate::site::load(&request.site)?;
    let Some(spec) = site.platform.store.clone() else {
        return Err(PublishError::NoStore {
            at: platform_line(&site.platform.file),
            platform: site.platform.name.clone(),
        });
    };
    let refused = unsupported(&site);
    if !refused.is_empty() {
        return Err(PublishError::Unsupported {
            lines: refused.join("\n  "),
        });
    }
    // Secrets are not read here: each agent reads its own, on its host.
    let hosts = crate::apply::resolve_for_plan(&site, &|t: &str| say(t))?;
    let bytes = within_limit(&site)?;
    let blobs = History::default().blobs();
    let snapshot = Snapshot::take(&site, &blobs)?;
    let manifest = Manifest::new(&site, &hosts, snapshot);
    let runtime = crate::session::runtime().map_err(PublishError::Runtime)?;
    let keys = Keys::new(&spec.prefix, &site.name);
    runtime.block_on(async {
        let etcd = Arc::new(Etcd::connect(&spec, &site.platform.name).await?);
        let done = write(&etcd, &keys, &site, &blobs, &manifest, spec.lock_ttl, bytes).await?;
        published(&done);
        let Some(sink) = sink else {
            return Ok((done, None));
        };
        let followed = follow::follow(
            &etcd,
            &keys,
            &site,
            &manifest,
            &done.digest,
            done.unchanged,
            sink,
        )
        .await?;
        Ok((done, Some(followed)))
    })
}

/// Contents first (unfenced: each is the same bytes whoever writes it), then, with the site's
/// lock held, the manifest and `desired/current`, fenced by it.
async fn write(
    etcd: &Arc<Etcd>,
    keys: &Keys,
    site: &Site,
    blobs: &Blobs,
    manifest: &Manifest,
    ttl: std::time::Duration,
    bytes: u64,
) -> Result<Published, PublishError> {
    let digests: Vec<_> = manifest.snapshot.digests().collect();
    let new_contents = shared::put_contents(etcd, keys, blobs, digests.iter().copied()).await?;
    let (text, digest) = manifest.encode();
    let run = format!(
        "publish-{}-{}",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', ""),
        std::process::id()
    );
    let me = Holder::me(&site.name, &run);
    let lock = LeaseLock::new(etcd.clone(), keys, ttl);
    lock.acquire(&me, false)
        .await
        .map_err(refusal(&site.name))?;
    let written = async {
        let fence = lock
            .fence()
            .ok_or_else(|| StoreError::Fenced("no lock".into()))?;
        let prefix = keys.snapshot(digest.as_str());
        let there = etcd.range(&prefix, true).await?;
        let parts = parts(&text);
        if there.len() != parts.len() {
            // One part per transaction: each is up to a chunk, etcd's request limit.
            for (i, part) in parts.iter().enumerate() {
                let put = Write::Put {
                    key: format!("{prefix}{i}"),
                    value: (*part).to_string(),
                };
                etcd.write(&fence, &[put]).await?;
            }
        }
        let before = etcd.value(&keys.current()).await?;
        let unchanged = before.as_deref() == Some(digest.as_str().as_bytes());
        let current = Write::Put {
            key: keys.current(),
            value: digest.to_string(),
        };
        etcd.write(&fence, &[current]).await?;
        Ok::<bool, StoreError>(unchanged)
    }
    .await;
    let released = lock.release(&me).await;
    let unchanged = written?;
    released.map_err(refusal(&site.name))?;
    Ok(Published {
        site: site.name.clone(),
        digest: digest.to_string(),
        new_contents,
        contents: digests
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        bytes,
        hosts: manifest.hosts.len(),
        unchanged,
        key: keys.current(),
    })
}

/// A lock that cannot be taken, as the operator is told.
fn refusal(site: &str) -> impl Fn(LockError) -> PublishError + '_ {
    move |e| match e {
        LockError::Held { place, holder } => PublishError::Refused {
            reason: match holder {
                Some(h) => format!(
                    "site {site} is being changed: {place} is held by {}",
                    h.describe()
                ),
                None => format!("site {site} is being changed: {place} is held"),
            },
            help: "wait for that run to finish (`deploy status` names it), then publish again"
                .into(),
        },
        LockError::Failed { place, reason } => PublishError::Refused {
            reason: format!("cannot lock site {site} ({place}): {reason}"),
            help: "nothing was published".into(),
        },
    }
}

/// The snapshot's size, added up from the files it would keep (each path once); over
/// [`MAX_SNAPSHOT_BYTES`] an error naming the biggest, before anything is copied.
fn within_limit(site: &Site) -> Result<u64, PublishError> {
    let mut files: Vec<&Path> = site.sources.iter().map(PathBuf::as_path).collect();
    files.extend(
        site.services
            .iter()
            .flat_map(|s| s.files.iter().map(|f| f.source.as_path())),
    );
    files.sort();
    files.dedup();
    let mut sized = Vec::with_capacity(files.len());
    for path in files {
        let len = std::fs::metadata(path)
            .map_err(|source| PublishError::Read {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        sized.push((len, path));
    }
    let total: u64 = sized.iter().map(|(n, _)| n).sum();
    if total <= MAX_SNAPSHOT_BYTES {
        return Ok(total);
    }
    sized.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let biggest: Vec<String> = sized
        .iter()
        .take(3)
        .map(|(n, p)| format!("{} ({})", p.display(), size(*n)))
        .collect();
    Err(PublishError::TooLarge {
        size: mib(total),
        limit: mib(MAX_SNAPSHOT_BYTES),
        biggest: biggest.join("\n  "),
    })
}

/// `n` bytes in MiB, one decimal.
fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

/// `n` bytes as a person reads them: bytes, KiB or MiB.
fn size(n: u64) -> String {
    match n {
        0..1024 => format!("{n} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => mib(n),
    }
}

/// `file:line` of the platform's `platform` node (the line the store goes under).
fn platform_line(file: &Path) -> String {
    let line = std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines()
                .position(|l| l.trim_start().starts_with("platform "))
                .map(|i| i + 1)
        })
        .unwrap_or(1);
    format!("{}:{line}", file.display())
}
