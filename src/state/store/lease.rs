//! The site's lock in etcd: `<prefix>/<site>/lock`, created in a transaction only if absent,
//! attached to a lease of `lock-ttl` that this process renews every third of it. The key's
//! create revision is the run's fencing token: every write of the run is a transaction
//! conditioned on it ([`super::Store::write`]), and each host records it beside its own lock.
//!
//! A renewal is timed from when it was sent, never from when the answer came: the lease can
//! only have expired later than that on etcd's side. The loss is said a tenth of `lock-ttl`
//! before the lease can have expired, so when this process says the lock is lost, no other
//! controller can have been given it yet (but for clock rates).

use super::{Etcd, Keys, StoreError};
use crate::state::lock::{Broken, Holder, Liveness, Lock, LockError, Taken};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A run's fencing token: the lock key and the revision it was created at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub revision: i64,
}

/// The lease lock of one site.
pub struct LeaseLock {
    etcd: Arc<Etcd>,
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
        LeaseLock {
            etcd,
            key: keys.lock(),
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

    fn hold(&self, lease: i64, revision: i64) {
        let (etcd, ttl, lost) = (self.etcd.clone(), self.ttl, self.lost.clone());
        let keeper = tokio::spawn(keep(etcd, lease, ttl, lost));
        *self.held() = Some(Held {
            lease,
            fence: Fence {
                key: self.key.clone(),
                revision,
            },
            keeper,
        });
    }
}

/// Renews `lease` every third of `ttl` until it may have expired in etcd (etcd counts its
/// `ttl` from the last renewal it received, no earlier than when that renewal was sent: the
/// loss is said a tenth of `ttl` before that, not after it), or until etcd says it expired;
/// then says why on `lost` and stops.
async fn keep(etcd: Arc<Etcd>, lease: i64, ttl: Duration, lost: watch::Sender<Option<String>>) {
    let mut renewed = Instant::now();
    let mut last_error = String::new();
    let safe = ttl.saturating_sub(ttl / 10);
    loop {
        let deadline = renewed + safe;
        let wake = (Instant::now() + ttl / 3).min(deadline);
        tokio::time::sleep_until(wake.into()).await;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let sent = Instant::now();
        match etcd.renew(lease, left).await {
            Ok(t) if t > 0 => renewed = sent,
            Ok(_) => {
                let _ = lost.send(Some(format!(
                    "its lease expired in etcd ({})",
                    etcd.endpoints()
                )));
                return;
            }
            Err(e) => last_error = e.to_string(),
        }
    }
    let _ = lost.send(Some(format!(
        "its lease could not be renewed for lock-ttl ({}s): {last_error}",
        ttl.as_secs()
    )));
}

impl Lock for LeaseLock {
    async fn acquire(&self, me: &Holder, force: bool) -> Result<Taken, LockError> {
        let failed = |e: StoreError| LockError::Failed {
            place: self.place(),
            reason: e.to_string(),
        };
        let lease = self.etcd.grant(self.ttl).await.map_err(failed)?;
        let mine = me.json();
        let mut broken = Vec::new();
        for _ in 0..3 {
            let (value, their_lease, created) =
                match self.etcd.create(&self.key, &mine, lease).await {
                    Ok(Ok(revision)) => {
                        self.hold(lease, revision);
                        return Ok(Taken {
                            broken,
                            unreachable: Vec::new(),
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
                self.hold(lease, created);
                return Ok(Taken {
                    broken,
                    unreachable: Vec::new(),
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
        let failed = |e: StoreError| LockError::Failed {
            place: self.place(),
            reason: e.to_string(),
        };
        // Revoking the lease deletes the lock key with it (one commit, not two); a key some
        // other run holds is attached to that run's lease, and revoking ours leaves it alone.
        self.etcd.revoke(held.lease).await.map_err(failed)
    }
}
