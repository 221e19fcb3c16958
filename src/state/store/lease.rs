//! The site's lock in etcd: `<prefix>/<site>/lock`, created in a transaction only if absent,
//! attached to a lease of `lock-ttl` that this process renews every sixth of it. The key's
//! create revision is the run's fencing token: every write of the run is a transaction
//! conditioned on it ([`super::Store::write`]), and each host records it beside its own lock.
//!
//! The lease's end is kept by this process's clocks (the monotonic one, and the boot clock, so
//! that a suspend of the machine counts: [`super::clock`]), never by an answer's arrival:
//! etcd starts a lease's TTL when it receives the grant (or a renewal), which is after this
//! process sent it, so the lease cannot expire in etcd before `sent + TTL`. The clock starts
//! before the grant is asked for, each renewal moves the end to its own sending time plus the
//! TTL, and every request is cut short by the time left. The loss is said a tenth of
//! `lock-ttl` before that end (time for a step decided just before to reach its host), at
//! once when etcd says the lease is gone (a keep-alive reply of TTL 0), and whatever the
//! network does: so no step starts once the lease can have expired, and no other controller
//! can have been given the lock yet (but for clock rates, and etcd-io/etcd#9395).

use super::clock::Stamp;
use super::{Etcd, Keys, StoreError};
use crate::state::lock::{Broken, Holder, Liveness, Lock, LockError, Taken};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// A run's fencing token: the lock key and the revision it was created at, with the lease it
/// is attached to and the key that counts the run's writes ([`Keys::writer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub revision: i64,
    pub lease: i64,
    /// `writer/<revision>`: how many transactions the run has written, attached to `lease`.
    pub counter: String,
    /// A pull agent's writes: the snapshot they act on, as `desired/current` and the revision
    /// it was last changed at when the agent read it. A write is taken only while that key is
    /// still at that revision: once a newer snapshot is published, a step of the older one
    /// writes nothing ([`StoreError::Superseded`]).
    pub snapshot: Option<(String, i64)>,
}

impl Fence {
    /// This fence, also conditioned on `key` being still at `revision` (see [`Fence::snapshot`]).
    pub fn on_snapshot(&self, key: String, revision: i64) -> Fence {
        Fence {
            snapshot: Some((key, revision)),
            ..self.clone()
        }
    }
}

/// The lease lock of one site.
pub struct LeaseLock {
    etcd: Arc<Etcd>,
    keys: Keys,
    key: String,
    ttl: Duration,
    held: Mutex<Option<Held>>,
    lost: watch::Sender<Option<String>>,
}

struct Held {
    lease: i64,
    fence: Fence,
    keeper: tokio::task::JoinHandle<()>,
}

impl LeaseLock {
    pub fn new(etcd: Arc<Etcd>, keys: &Keys, ttl: Duration) -> LeaseLock {
        LeaseLock::at(etcd, keys, keys.lock(), ttl)
    }

    /// A lease lock on another key of the site than its lock: a pull agent's slot
    /// (`slots/<service>/<host>`), fenced and kept alive as the site's lock is.
    pub fn at(etcd: Arc<Etcd>, keys: &Keys, key: String, ttl: Duration) -> LeaseLock {
        LeaseLock {
            etcd,
            keys: keys.clone(),
            key,
            ttl,
            held: Mutex::new(None),
            lost: watch::channel(None).0,
        }
    }

    /// The fencing token, while the lock is held.
    pub fn fence(&self) -> Option<Fence> {
        self.held().as_ref().map(|h| h.fence.clone())
    }

    /// Says why, once the lock is lost (`None` until then).
    pub fn lost(&self) -> watch::Receiver<Option<String>> {
        self.lost.subscribe()
    }

    /// The lease's time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn place(&self) -> String {
        format!("etcd key {}", self.key)
    }

    fn hold(&self, lease: Lease, revision: i64) {
        let (etcd, lost) = (self.etcd.clone(), self.lost.clone());
        let id = lease.id;
        let keeper = tokio::spawn(keep(etcd, lease, lost));
        *self.held() = Some(Held {
            lease: id,
            fence: Fence {
                key: self.key.clone(),
                revision,
                lease: id,
                counter: self.keys.writer(revision),
                snapshot: None,
            },
            keeper,
        });
    }
}

impl Drop for LeaseLock {
    /// A lock dropped without [`Lock::release`] (an error on the way) stops being renewed: its
    /// lease lapses within its TTL, and its key with it, instead of being kept alive for as
    /// long as the process runs.
    fn drop(&mut self) {
        let held = self
            .held
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(held) = held {
            held.keeper.abort();
        }
    }
}

/// A lease as this process knows it.
struct Lease {
    id: i64,
    /// What etcd restarts it at on each renewal (the TTL asked for, or less if etcd granted
    /// less).
    ttl: Duration,
    /// When the grant, or the last renewal etcd answered, was sent: etcd may expire the lease
    /// `ttl` after it, and not before. Counted by this process's clocks, a suspend of the
    /// machine included ([`Stamp`]).
    from: Stamp,
}

/// How long before its lease's end a run says the lock is lost: a tenth of `ttl`, so that a
/// step decided just before is started on its host before the end.
fn margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// How often a lease is renewed: every sixth of its TTL, so that a renewal that fails (a member
/// killed, an election under way: about a second with etcd's default election timeout) leaves
/// most of the TTL to find another member or the new leader before the run must stop.
fn every(ttl: Duration) -> Duration {
    ttl / 6
}

/// Renews `lease` every sixth of its TTL until it may have expired in etcd (a tenth of the TTL
/// before `ttl` after [`Lease::from`]: each renewal is tried only for the time left), or until
/// etcd says it expired; then says why on `lost` and stops. The time is read again on each
/// wake-up: after a suspend longer than that, the loss is said at once, no renewal sent.
async fn keep(etcd: Arc<Etcd>, mut lease: Lease, lost: watch::Sender<Option<String>>) {
    let ttl = lease.ttl;
    // Both counted from `lease.from`.
    let say_at = ttl - margin(ttl);
    let mut next = every(ttl);
    let mut last_error = None;
    loop {
        let since = lease.from.elapsed();
        tokio::time::sleep(next.min(say_at).saturating_sub(since)).await;
        let sent = Stamp::now();
        let Some(left) = say_at
            .checked_sub(lease.from.elapsed())
            .filter(|l| !l.is_zero())
        else {
            break;
        };
        match etcd.renew(lease.id, left).await {
            Ok(true) => {
                lease.from = sent;
                next = every(ttl);
                last_error = None;
            }
            Ok(false) => {
                let _ = lost.send(Some(format!(
                    "etcd says its lease has expired ({})",
                    etcd.endpoints()
                )));
                return;
            }
            Err(e) => {
                last_error = Some(e.to_string());
                next = lease.from.elapsed() + Duration::from_millis(200);
            }
        }
    }
    let why = last_error.unwrap_or_else(|| "no renewal could be sent in time".into());
    let _ = lost.send(Some(format!(
        "its lease could not be renewed, and etcd may let it expire within {} ms: {why}",
        margin(ttl).as_millis()
    )));
}

impl Lock for LeaseLock {
    async fn acquire(&self, me: &Holder, force: bool) -> Result<Taken, LockError> {
        let failed = |e: StoreError| LockError::Failed {
            place: self.place(),
            reason: e.to_string(),
        };
        // The lease's end is counted from before it is asked for.
        let asked = Stamp::now();
        let (lease, granted) = self.etcd.grant(self.ttl).await.map_err(failed)?;
        let ttl = self
            .ttl
            .min(Duration::from_secs(u64::try_from(granted).unwrap_or(0)));
        let held = |revision| {
            self.hold(
                Lease {
                    id: lease,
                    ttl,
                    from: asked,
                },
                revision,
            )
        };
        let left = || ttl.saturating_sub(asked.elapsed());
        let mine = me.json();
        let mut broken = Vec::new();
        for _ in 0..3 {
            let (value, their_lease, created) =
                match self.etcd.create(&self.key, &mine, lease, left()).await {
                    Ok(Ok(revision)) => {
                        held(revision);
                        return Ok(Taken {
                            broken,
                            ..Taken::default()
                        });
                    }
                    Ok(Err(held)) => held,
                    Err(e) => {
                        let _ = self.etcd.revoke(lease).await;
                        return Err(failed(e));
                    }
                };
            // A transaction sent twice (its first answer lost): it is ours already.
            if value == mine.as_bytes() && their_lease == lease {
                held(created);
                return Ok(Taken {
                    broken,
                    ..Taken::default()
                });
            }
            let holder: Option<Holder> = serde_json::from_slice(&value).ok();
            let stale = holder
                .as_ref()
                .is_some_and(|h| h.liveness() == Liveness::Dead);
            if !stale && !force {
                let _ = self.etcd.revoke(lease).await;
                return Err(LockError::Held {
                    place: self.place(),
                    holder: holder.map(Box::new),
                });
            }
            // Its holder is gone (or `--break-lock`): its lease goes, and the key with it;
            // a key with no lease only while it is still the one seen.
            let removed = if their_lease != 0 {
                self.etcd.revoke(their_lease).await.map(|()| true)
            } else {
                self.etcd.delete_if(&self.key, created).await
            };
            if let Err(e) = removed {
                let _ = self.etcd.revoke(lease).await;
                return Err(failed(e));
            }
            broken.push(Broken {
                place: self.place(),
                holder,
                stale,
                hooks_ended: 0,
            });
        }
        let _ = self.etcd.revoke(lease).await;
        Err(LockError::Failed {
            place: self.place(),
            reason: "it keeps changing hands".into(),
        })
    }

    async fn release(&self, _me: &Holder) -> Result<(), LockError> {
        let Some(held) = self.held().take() else {
            return Ok(());
        };
        held.keeper.abort();
        // Lost: the lease is gone or about to be, and etcd did not answer for most of it.
        if self.lost.borrow().is_some() {
            return Ok(());
        }
        let failed = |e: StoreError| LockError::Failed {
            place: self.place(),
            reason: e.to_string(),
        };
        // Revoking the lease deletes the lock key with it (one commit, not two); a key some
        // other run holds is attached to that run's lease, and revoking ours leaves it alone.
        self.etcd.revoke(held.lease).await.map_err(failed)
    }
}
