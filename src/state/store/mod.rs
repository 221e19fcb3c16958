//! The fleet's state in one shared place (`store "etcd"`): the key layout, the values (schema
//! [`STORE_SCHEMA`]), the writes a run makes as data, and what one range read of the site's
//! keys says of each host. The client itself is [`Etcd`] (the `etcd` cargo feature), the
//! site's lease lock on it is [`LeaseLock`].
//!
//! Under `<prefix>/<site>/`, as the jiocloud notes keep it:
//! - `schema`: `1`.
//! - `lock`: the holder of the site (attached to its lease); its create revision is the run's
//!   fencing token.
//! - `desired/<service>`: the version and fingerprint the last apply set out to reach
//!   (trigger_update).
//! - `running/<service>/<host>`: the version the host runs, its `address:port`, and the
//!   fingerprint of its inputs (running_version).
//! - `status/<service>/<host>/configured` and `…/validated`: exactly one of success or failure
//!   each, with time, run, version and log, both written in one transaction (update_status).
//! - `hosts/<host>`: every host of the inventory, its classes, and whether it answered the last
//!   run that tried it (to find the hosts that are not reporting).
//! - `busy/<host>`: a step is changing the host: written (and acknowledged by etcd) before the
//!   step's first command, removed in the transaction that publishes its result. A run that
//!   dies between leaves it, so that every later run, from any controller, reads the host.
//!
//! - `history/runs/<run>`: what a run that changed hosts applied (its snapshot's manifest, who
//!   ran it, what changed, how it ended), and `history/blobs/<sha256>/<n>`: the contents it
//!   names, each in chunks below etcd's request limit (`crate::history`). Written unfenced
//!   (no other run writes those keys, and a blob is the same bytes whoever writes it).
//!
//! - Pull mode (`crate::publish`, `crate::agent`): `desired/current` (the digest of the snapshot
//!   the fleet converges on), `snapshots/<digest>/<n>` (its manifest, in chunks; its contents
//!   are kept as the history's are, under `history/blobs/`), and `slots/<service>/<host>` (a
//!   counting semaphore per service, each slot attached to its agent's lease), and
//!   `resume/<service>` (the waves of a `pause "confirm"` policy `deploy resume` confirmed, at
//!   which snapshot).
//!
//! Service and host names are escaped in keys (`%` → `%25`, `/` → `%2F`).

mod clock;
#[cfg_attr(not(feature = "etcd"), path = "absent.rs")]
mod etcd;
mod lease;
#[cfg(feature = "etcd")]
mod mirror;
#[cfg(feature = "etcd")]
mod snapshot_fence;
#[cfg(test)]
mod tests;
mod view;

#[cfg(feature = "etcd")]
pub use etcd::fenced_txn;
#[cfg(not(feature = "etcd"))]
pub use etcd::Mirror;
pub use etcd::{Etcd, Watching};
pub use lease::{Fence, LeaseLock};
#[cfg(feature = "etcd")]
pub use mirror::Mirror;
pub use view::{
    converged, disagreements, merge, observed, replaced, same_address, to_read, with_port,
    Disagreement, Fingerprints, HostEntry, Published, Said, View,
};

/// What the platform's store holds of `site`: one connection, one range read. `None` when the
/// platform names no store.
pub async fn read(site: &crate::site::Site) -> Result<Option<View>, StoreError> {
    let Some(spec) = &site.platform.store else {
        return Ok(None);
    };
    let etcd = Etcd::connect(spec, &site.platform.name).await?;
    etcd.read(&Keys::new(&spec.prefix, &site.name))
        .await
        .map(Some)
}

use super::{Mark, Outcome, ServiceRecord};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// Version of the key layout and values; written to `<prefix>/<site>/schema`.
pub const STORE_SCHEMA: u32 = 1;

/// What went wrong with the shared store.
#[derive(Debug, Clone, thiserror::Error, miette::Diagnostic)]
pub enum StoreError {
    /// This `deploy` was built without the store's client.
    #[error("this deploy was built without etcd support, and platform {platform} names `store \"etcd\"`")]
    #[diagnostic(
        code(drover::store::not_built),
        help("build it with `cargo build --release --features etcd` (it needs protoc: Debian's protobuf-compiler), or remove the store from the platform")
    )]
    NotBuilt { platform: String },
    /// No endpoint answered: `tried` has one line per endpoint, what happened there.
    #[error("etcd does not answer (each endpoint tried for {waited}):{tried}")]
    #[diagnostic(
        code(drover::store::unavailable),
        help("the command stopped there: nothing was read from etcd or changed; check that etcd runs and that the platform's `store` endpoints, TLS and auth are right; `--read-hosts` does not help: the store holds the lock")
    )]
    Unavailable { waited: String, tried: String },
    /// A fenced write found the lock no longer this run's.
    #[error("the site's lock in etcd is no longer this run's: {0}")]
    #[diagnostic(code(drover::store::fenced))]
    Fenced(String),
    /// A pull agent's write of a snapshot that is no longer the desired one: nothing written.
    #[error("{key} was changed at revision {now}, after snapshot {revision} this write acts on: nothing written, a newer snapshot is published")]
    #[diagnostic(code(drover::store::superseded))]
    Superseded {
        key: String,
        revision: i64,
        now: i64,
    },
    /// etcd answered with an error.
    #[error("etcd: {0}")]
    #[diagnostic(code(drover::store::failed))]
    Failed(String),
}

/// The keys of one site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// `<prefix>/<site>/`.
    root: String,
}

/// A name as one key segment.
pub fn segment(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// A key segment back to the name.
pub fn unsegment(seg: &str) -> String {
    seg.replace("%2F", "/").replace("%25", "%")
}

impl Keys {
    pub fn new(prefix: &str, site: &str) -> Keys {
        Keys {
            root: format!("{}/{}/", prefix.trim_end_matches('/'), segment(site)),
        }
    }
    /// Every key of the site starts with this.
    pub fn root(&self) -> &str {
        &self.root
    }
    pub fn schema(&self) -> String {
        format!("{}schema", self.root)
    }
    pub fn lock(&self) -> String {
        format!("{}lock", self.root)
    }
    pub fn desired(&self, service: &str) -> String {
        format!("{}desired/{}", self.root, segment(service))
    }
    pub fn running(&self, service: &str, host: &str) -> String {
        format!(
            "{}running/{}/{}",
            self.root,
            segment(service),
            segment(host)
        )
    }
    pub fn status(&self, service: &str, host: &str, category: Category) -> String {
        format!(
            "{}status/{}/{}/{}",
            self.root,
            segment(service),
            segment(host),
            category.name()
        )
    }
    /// `running/<service>/`: every host's running version of one service.
    pub fn running_of(&self, service: &str) -> String {
        format!("{}running/{}/", self.root, segment(service))
    }
    /// `status/<service>/`: every host's status of one service.
    pub fn status_of(&self, service: &str) -> String {
        format!("{}status/{}/", self.root, segment(service))
    }
    pub fn host(&self, host: &str) -> String {
        format!("{}hosts/{}", self.root, segment(host))
    }
    pub fn busy(&self, host: &str) -> String {
        format!("{}busy/{}", self.root, segment(host))
    }
    /// The count of the transactions written by the run whose lock was created at `revision`
    /// (its fencing token): each of its writes compares and moves it, so that a late copy of
    /// one (a request sent again, or to a second member, whose first copy arrives after the
    /// next write) changes nothing.
    pub fn writer(&self, revision: i64) -> String {
        format!("{}writer/{revision}", self.root)
    }
    /// `history/runs/`: every run's entry is under it.
    pub fn history_runs(&self) -> String {
        format!("{}history/runs/", self.root)
    }
    /// `history/blobs/<digest>/`: the chunks of one content.
    pub fn history_blob(&self, digest: &str) -> String {
        format!("{}history/blobs/{}/", self.root, segment(digest))
    }
    /// Pull mode: `desired/current`, the digest of the snapshot the fleet converges on.
    pub fn current(&self) -> String {
        format!("{}desired/current", self.root)
    }
    /// Pull mode: `desired/`, what an agent watches (one prefix watch).
    pub fn desired_prefix(&self) -> String {
        format!("{}desired/", self.root)
    }
    /// Pull mode: `snapshots/<digest>/`, the chunks of one published snapshot's manifest.
    pub fn snapshot(&self, digest: &str) -> String {
        format!("{}snapshots/{}/", self.root, segment(digest))
    }
    /// Pull mode: `slots/`, every service's semaphore.
    pub fn all_slots(&self) -> String {
        format!("{}slots/", self.root)
    }
    /// Pull mode: `slots/<service>/`, the semaphore of one service.
    pub fn slots(&self, service: &str) -> String {
        format!("{}slots/{}/", self.root, segment(service))
    }
    /// Pull mode: `slots/<service>/<host>`, one host's slot.
    pub fn slot(&self, service: &str, host: &str) -> String {
        format!("{}{}", self.slots(service), segment(host))
    }

    /// Pull mode: `waiting/`, every host whose agent waits for its wave (a canary not passed,
    /// a pause not over) without a slot: `deploy apply` is refused while one is there.
    pub fn all_waiting(&self) -> String {
        format!("{}waiting/", self.root)
    }
    /// Pull mode: `waiting/<service>/<host>`, one agent waiting for its host's wave, on its
    /// lease.
    pub fn waiting(&self, service: &str, host: &str) -> String {
        format!(
            "{}waiting/{}/{}",
            self.root,
            segment(service),
            segment(host)
        )
    }

    /// Pull mode: `resume/<service>`, the waves `deploy resume` confirmed of a service whose
    /// policy pauses with `"confirm"` (`crate::publish::Resumed`).
    pub fn resume(&self, service: &str) -> String {
        format!("{}resume/{}", self.root, segment(service))
    }

    /// What `key` says of one service on one host (its `running/` or a `status/` key):
    /// `Some(service/host)`, escaped; `None` for any other key.
    fn service_on_host<'k>(&self, key: &'k str) -> Option<&'k str> {
        let rest = key.strip_prefix(&self.root)?;
        if let Some(sh) = rest.strip_prefix("running/") {
            return (sh.matches('/').count() == 1).then_some(sh);
        }
        let (sh, _category) = rest.strip_prefix("status/")?.rsplit_once('/')?;
        (sh.matches('/').count() == 1).then_some(sh)
    }

    /// Whether `key` is a host's `busy/` or `hosts/` key.
    fn of_host(&self, key: &str) -> bool {
        key.strip_prefix(&self.root).is_some_and(|rest| {
            ["busy/", "hosts/"]
                .iter()
                .any(|k| rest.strip_prefix(k).is_some_and(|h| !h.contains('/')))
        })
    }
}

/// The two categories a host records per service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Configured,
    Validated,
}

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::Configured => "configured",
            Category::Validated => "validated",
        }
    }
}

/// `desired/<service>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredValue {
    pub schema: u32,
    pub version: String,
    /// sha256 (128 bits, hex) over every host's input fingerprint, in host name order.
    pub fingerprint: String,
    pub hosts: usize,
    pub run: String,
    pub at: String,
}

/// `running/<service>/<host>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningValue {
    pub schema: u32,
    pub version: String,
    /// `address` or `address:port`.
    pub address: String,
    /// The fingerprint of the inputs the host recorded; `None` when it recorded none that
    /// count (a failed switch-over, or a record older than state schema 2).
    pub fingerprint: Option<String>,
    pub run: String,
    pub at: String,
}

/// `status/<service>/<host>/<category>`: the host's mark, with the version it was for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusValue {
    pub schema: u32,
    pub version: String,
    #[serde(flatten)]
    pub mark: Mark,
}

/// `hosts/<host>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostValue {
    pub schema: u32,
    pub address: String,
    pub classes: Vec<String>,
    /// Whether it answered the last run that tried it.
    pub reporting: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub run: String,
    pub at: String,
}

/// `busy/<host>`: a step of `run` is changing the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusyValue {
    pub schema: u32,
    pub service: String,
    /// The version the step goes to.
    pub to: String,
    pub run: String,
    pub at: String,
}

/// `busy/<host>`: a step of `service` (to version `to`) is about to change `host`.
pub fn busy(keys: &Keys, host: &str, service: &str, to: &str, run: &str, at: &str) -> Write {
    Write::put(
        keys.busy(host),
        &BusyValue {
            schema: STORE_SCHEMA,
            service: service.into(),
            to: to.into(),
            run: run.into(),
            at: at.into(),
        },
    )
}

/// Removes `busy/<host>`: what the host records is published in the same transaction.
pub fn not_busy(keys: &Keys, host: &str) -> Write {
    Write::Delete {
        key: keys.busy(host),
    }
}

/// One write of a run, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put { key: String, value: String },
    Delete { key: String },
}

impl Write {
    fn put(key: String, value: &impl Serialize) -> Write {
        Write::Put {
            key,
            value: serde_json::to_string(value).unwrap_or_default(),
        }
    }
    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// `writes` with only the last write to each key, in the order of those last writes: etcd
/// refuses a transaction that names a key twice, and a batch of queued writes often does (a
/// host's record published when it is read, then again when its step ends).
pub fn last_per_key(writes: &[Write]) -> Vec<&Write> {
    let mut last: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(writes.len());
    for (i, w) in writes.iter().enumerate() {
        last.insert(w.key(), i);
    }
    writes
        .iter()
        .enumerate()
        .filter(|(i, w)| last.get(w.key()) == Some(i))
        .map(|(_, w)| w)
        .collect()
}

/// A place that keeps the fleet's state: one range read of a site's keys, and writes
/// (in one transaction each call, a key written twice counting once: the last) fenced by
/// the site's lock.
pub trait Store {
    fn read(&self, keys: &Keys) -> impl Future<Output = Result<View, StoreError>> + Send;
    fn write(
        &self,
        fence: &Fence,
        writes: &[Write],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What a service on a host is, as [`running`] and [`status`] write it.
pub struct HostService<'a> {
    pub service: &'a str,
    pub host: &'a str,
    /// `address` or `address:port`.
    pub address: String,
    pub record: &'a ServiceRecord,
}

/// The `running` and both `status` keys of a service on a host, from its record: one
/// transaction, so that a reader never sees one category of one step and the other of another.
pub fn recorded(keys: &Keys, hs: &HostService<'_>, run: &str, at: &str) -> Vec<Write> {
    let r = hs.record;
    let mut out = vec![Write::put(
        keys.running(hs.service, hs.host),
        &RunningValue {
            schema: STORE_SCHEMA,
            version: r.version.clone(),
            address: hs.address.clone(),
            fingerprint: r.inputs.as_ref().map(super::Inputs::fingerprint),
            run: run.into(),
            at: at.into(),
        },
    )];
    // A switch-over that failed before its check leaves no validation: it counts as failed
    // (exactly one of success or failure per category).
    let validated = r.validated.clone().or_else(|| {
        r.configured
            .clone()
            .filter(|m| m.outcome == Outcome::Failure)
    });
    for (category, mark) in [
        (Category::Configured, &r.configured),
        (Category::Validated, &validated),
    ] {
        let key = keys.status(hs.service, hs.host, category);
        out.push(match mark {
            Some(mark) => Write::put(
                key,
                &StatusValue {
                    schema: STORE_SCHEMA,
                    version: r.version.clone(),
                    mark: mark.clone(),
                },
            ),
            None => Write::Delete { key },
        });
    }
    out
}

/// A service taken off a host (a removal): its `running` and `status` keys go, in one
/// transaction; with `gone` (the service left the site), its `desired` key too.
pub fn removed(keys: &Keys, service: &str, host: &str, gone: bool) -> Vec<Write> {
    let mut out = vec![
        Write::Delete {
            key: keys.running(service, host),
        },
        Write::Delete {
            key: keys.status(service, host, Category::Configured),
        },
        Write::Delete {
            key: keys.status(service, host, Category::Validated),
        },
    ];
    if gone {
        out.push(Write::Delete {
            key: keys.desired(service),
        });
    }
    out
}

/// `hosts/<host>`: a host of the inventory, and whether it answered.
pub fn host_seen(
    keys: &Keys,
    host: &str,
    address: &str,
    classes: Vec<String>,
    unreachable: Option<&str>,
    run: &str,
    at: &str,
) -> Write {
    Write::put(
        keys.host(host),
        &HostValue {
            schema: STORE_SCHEMA,
            address: address.into(),
            classes,
            reporting: unreachable.is_none(),
            reason: unreachable.map(str::to_string),
            run: run.into(),
            at: at.into(),
        },
    )
}

/// `desired/<service>` (trigger_update), with the store's `schema`.
pub fn desired(keys: &Keys, service: &str, value: &DesiredValue) -> Vec<Write> {
    vec![
        Write::Put {
            key: keys.schema(),
            value: STORE_SCHEMA.to_string(),
        },
        Write::put(keys.desired(service), value),
    ]
}

/// The fingerprint of a service over its hosts' fingerprints, in the order given.
pub fn service_fingerprint<'a>(hosts: impl Iterator<Item = (&'a str, Option<String>)>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (name, fp) in hosts {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(fp.unwrap_or_default().as_bytes());
        h.update([b'\n']);
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// etcd takes at most 128 operations in one transaction by default: writes in chunks that keep
/// a step's keys together.
pub const MAX_OPS: usize = 120;

/// Queued units of writes (each a step's keys, or one host's, which must be seen together) as
/// transactions: units in order, whole, packed into transactions of at most [`MAX_OPS`]
/// writes, each transaction with only the last write to each key ([`last_per_key`]). A unit is
/// never split across two transactions (a crash between them would publish half a step), but
/// for one larger than [`MAX_OPS`] by itself (a host read with more than 39 services), which
/// goes alone, in as few transactions as hold it ([`split_large`]): each service's keys
/// together, and the host's `busy/` and `hosts/` keys in the last, so that a crash between
/// them leaves the intent, and the next run reads the host.
pub fn transactions(keys: &Keys, units: &[Vec<Write>]) -> Vec<Vec<Write>> {
    let mut out: Vec<Vec<Write>> = Vec::new();
    let mut current: Vec<Write> = Vec::new();
    let close = |current: &mut Vec<Write>, out: &mut Vec<Vec<Write>>| {
        if !current.is_empty() {
            out.push(last_per_key(current).into_iter().cloned().collect());
            current.clear();
        }
    };
    for unit in units {
        let unit: Vec<Write> = last_per_key(unit).into_iter().cloned().collect();
        if unit.is_empty() {
            continue;
        }
        if unit.len() > MAX_OPS {
            close(&mut current, &mut out);
            out.extend(split_large(keys, unit));
            continue;
        }
        if current.len() + unit.len() > MAX_OPS {
            close(&mut current, &mut out);
        }
        current.extend(unit);
    }
    close(&mut current, &mut out);
    out
}

/// A unit of more than [`MAX_OPS`] writes (each key once) as transactions of at most that many:
/// the keys of one service on one host always in one, the host's `busy/` and `hosts/` keys in
/// the last; the rest in order.
fn split_large(keys: &Keys, unit: Vec<Write>) -> Vec<Vec<Write>> {
    let mut groups: Vec<(Option<String>, Vec<Write>)> = Vec::new();
    let mut last = Vec::new();
    for w in unit {
        if keys.of_host(w.key()) {
            last.push(w);
            continue;
        }
        let sh = keys.service_on_host(w.key()).map(str::to_string);
        match groups.iter_mut().find(|(g, _)| sh.is_some() && *g == sh) {
            Some((_, ws)) => ws.push(w),
            None => groups.push((sh, vec![w])),
        }
    }
    groups.push((None, last));
    let mut out: Vec<Vec<Write>> = Vec::new();
    let mut current: Vec<Write> = Vec::new();
    for (_, group) in groups {
        if !current.is_empty() && current.len() + group.len() > MAX_OPS {
            out.push(std::mem::take(&mut current));
        }
        // A group is a service's three keys, or a host's two: over MAX_OPS only for keys of
        // no such layout, each of which stands alone.
        if group.len() > MAX_OPS {
            out.extend(group.chunks(MAX_OPS).map(<[Write]>::to_vec));
            continue;
        }
        current.extend(group);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}
