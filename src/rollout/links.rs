//! Open connections, at most `max` at once: reused for every step on a host, opened ahead of
//! need, handed back to the transport when the host is done (which closes or keeps it,
//! [`crate::transport::Kept`]), closed when another host needs the slot.
//!
//! A link is handed back in the background: closing an ssh master waits for it to exit, which
//! on a loaded controller takes tens of milliseconds, and the scheduler, which hands links back
//! as hosts finish, must not wait for that before it starts the next host (at 1,000 hosts
//! under the cap it delayed each step's end by seconds). A link being handed back still counts
//! against `max` until it is closed, and [`Links::close_all`] waits for every one.

use crate::transport::{Link, Target, Transport, TransportError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OnceCell};
use tokio::task::JoinHandle;

type Cell<L> = Arc<OnceCell<Result<Arc<L>, TransportError>>>;

/// A pool of links keyed by host name.
pub struct Links<T: Transport> {
    transport: Arc<T>,
    max: usize,
    open: Mutex<HashMap<String, Cell<T::Link>>>,
    freed: Notify,
    /// Links being handed back, not yet closed or parked: they count against `max`.
    handing_back: AtomicUsize,
    /// Tasks [`Links::close_all`] waits for: hand-backs, and connections opened ahead.
    handbacks: Mutex<Vec<JoinHandle<()>>>,
}

impl<T: Transport> Links<T> {
    pub fn new(transport: Arc<T>, max: usize) -> Self {
        Links {
            transport,
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            handing_back: AtomicUsize::new(0),
            handbacks: Mutex::new(Vec::new()),
        }
    }

    /// The link to `target`, connecting (once, however many ask) if needed.
    pub async fn get(&self, target: &Target) -> Result<Arc<T::Link>, TransportError> {
        let (cell, evicted) = loop {
            if let Some(found) = self.slot(&target.name, true) {
                break found;
            }
            let notified = self.freed.notified();
            if let Some(found) = self.slot(&target.name, true) {
                break found;
            }
            notified.await;
        };
        // The evicted link is closed (not handed back to be kept) before its slot is used:
        // never more than `max` open.
        if let Some(link) = evicted {
            link.close().await;
        }
        let result = self.fill(&cell, target).await;
        match &result {
            // Opened ahead, or kept since an earlier step, and its master gone meanwhile
            // (`persist`): connected anew, once.
            Ok(link) if !link.alive().await => {
                self.drop_cell(&target.name, &cell);
                match self.slot(&target.name, false) {
                    Some((fresh, _)) => self.fill(&fresh, target).await,
                    None => result,
                }
            }
            _ => result,
        }
    }

    /// The link in `cell`, connecting to `target` if it has none yet; a failed connection is
    /// forgotten (the next step on the host tries again).
    async fn fill(
        &self,
        cell: &Cell<T::Link>,
        target: &Target,
    ) -> Result<Arc<T::Link>, TransportError> {
        let result = cell
            .get_or_init(|| async { self.transport.connect(target).await.map(Arc::new) })
            .await
            .clone();
        if result.is_err() {
            self.drop_cell(&target.name, cell);
        }
        result
    }

    /// Forgets `cell` for `host`, if it is still the host's (another may have replaced it).
    fn drop_cell(&self, host: &str, cell: &Cell<T::Link>) {
        {
            let mut open = self.lock();
            if open.get(host).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                open.remove(host);
            }
        }
        self.freed.notify_waiters();
    }

    /// Starts connecting to `target` in the background if a slot is free now, `reserve`
    /// slots left aside (the steps just started, which would otherwise close the link made
    /// ahead to get their own, and the host would be connected twice).
    pub fn prefetch(self: &Arc<Self>, target: Target, reserve: usize) {
        let has_room = {
            let open = self.lock();
            // Links the transport keeps parked for other hosts are open connections too.
            let skip = |h: &str| h == target.name || open.contains_key(h);
            let parked = self.transport.idle(&skip);
            open.len() + self.handing_back.load(Ordering::SeqCst) + parked + reserve < self.max
        };
        if !has_room {
            return;
        }
        let Some((cell, _)) = self.slot(&target.name, false) else {
            return;
        };
        let links = self.clone();
        let handle = tokio::spawn(async move {
            // Into the cell taken above: it never waits for a slot, and [`Links::close_all`]
            // finds the link in it (it waits for this task first).
            let _ = links.fill(&cell, &target).await;
            // The link is idle now, once this task lets go of its cell: a step waiting for a
            // slot may evict it.
            drop(cell);
            links.freed.notify_waiters();
        });
        let mut tasks = self.handbacks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|h| !h.is_finished());
        tasks.push(handle);
    }

    /// The host needs no more commands: hand its link back, in the background.
    pub fn release(self: &Arc<Self>, host: &str) {
        // Counted as being handed back before it leaves the pool (under the pool's lock), so
        // that no slot is given out meanwhile as if it were closed.
        let cell = {
            let mut open = self.lock();
            let Some(cell) = open.remove(host) else {
                return;
            };
            self.handing_back.fetch_add(1, Ordering::SeqCst);
            cell
        };
        let Some(link) = only_holder(cell) else {
            self.handing_back.fetch_sub(1, Ordering::SeqCst);
            self.freed.notify_waiters();
            return;
        };
        let (links, host) = (self.clone(), host.to_string());
        let handle = tokio::spawn(async move {
            links.transport.park(&host, link).await;
            links.handing_back.fetch_sub(1, Ordering::SeqCst);
            links.freed.notify_waiters();
        });
        let mut handbacks = self.handbacks.lock().unwrap_or_else(|p| p.into_inner());
        handbacks.retain(|h| !h.is_finished());
        handbacks.push(handle);
    }

    /// Hands every link back, and waits for those handed back before.
    pub async fn close_all(&self) {
        let pending =
            std::mem::take(&mut *self.handbacks.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in pending {
            let _ = handle.await;
        }
        let cells: Vec<(String, Cell<T::Link>)> = self.lock().drain().collect();
        for (host, c) in cells {
            self.put_back(&host, c).await;
        }
        self.freed.notify_waiters();
    }

    /// Gives a link nobody else holds back to the transport.
    async fn put_back(&self, host: &str, cell: Cell<T::Link>) {
        if let Some(link) = only_holder(cell) {
            self.transport.park(host, link).await;
        }
    }

    /// The cell for `host`: existing, or new if under the cap (evicting an idle link if `evict`:
    /// one of the pool's, or one the transport keeps parked; the evicted link comes back with
    /// it, for the caller to close). Links the transport keeps parked for other hosts count
    /// against the cap: they are open connections too.
    #[allow(clippy::type_complexity)]
    fn slot(&self, host: &str, evict: bool) -> Option<(Cell<T::Link>, Option<T::Link>)> {
        let mut open = self.lock();
        if let Some(cell) = open.get(host) {
            return Some((cell.clone(), None));
        }
        let mut evicted = None;
        // A host with a cell already (being connected) may still have its parked link in the
        // transport: not counted twice, nor given up.
        let skip = |h: &str| h == host || open.contains_key(h);
        let parked = self.transport.idle(&skip);
        let handing_back = self.handing_back.load(Ordering::SeqCst);
        if open.len() + handing_back + parked >= self.max {
            // A link being handed back frees its slot soon: wait for it rather than close one
            // that is idle now but kept or opened ahead for a step about to start (its host
            // would be connected twice).
            if !evict || handing_back > 0 {
                return None;
            }
            // An idle link: connected, and nobody but the pool holds it.
            let idle = open
                .iter()
                .find(|(_, c)| {
                    Arc::strong_count(c) == 1
                        && matches!(c.get(), Some(Ok(l)) if Arc::strong_count(l) == 1)
                })
                .map(|(k, _)| k.clone());
            evicted = match idle {
                Some(idle) => open.remove(&idle).and_then(only_holder),
                None => Some(self.transport.take_idle(&skip)?),
            };
        }
        let cell: Cell<T::Link> = Arc::new(OnceCell::new());
        open.insert(host.to_string(), cell.clone());
        Some((cell, evicted))
    }

    /// A step on some host finished: a waiter may now find an idle link to evict.
    pub fn step_done(&self) {
        self.freed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cell<T::Link>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The connected link in `cell`, if the pool held the only reference to it.
fn only_holder<L>(cell: Cell<L>) -> Option<L> {
    let link = Arc::try_unwrap(cell).ok()?.into_inner()?.ok()?;
    Arc::try_unwrap(link).ok()
}
