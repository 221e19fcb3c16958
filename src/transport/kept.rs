//! Links kept open between the stages of one `deploy apply`: the lock, the observation, the
//! rollout and the lock's release reuse one connection per host instead of opening four.
//! Over the cap, the links of the hosts expected to be stepped first are kept from the lock to
//! the rollout ([`Kept::keep_for_steps`]); every other host is connected by each stage anew.

use super::{Link, Target, Transport, TransportError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A transport that hands out a host's parked link, if there is one, before connecting.
///
/// Links are parked only while there is room: `room` is the connection cap when the whole
/// fleet fits under it, and 0 otherwise (then every stage connects and closes as it goes, and
/// the cap holds across stages), but for the hosts named by [`Kept::keep_for_steps`]: each of
/// those is parked once, up to the cap. Parked links count against the cap of the stage that
/// comes next ([`Transport::idle`]), which may close one to make room
/// ([`Transport::take_idle`]).
pub struct Kept<T: Transport> {
    inner: T,
    room: usize,
    cap: usize,
    /// Parked links, and the failures of warming (each handed to the next stage once).
    parked: Mutex<HashMap<String, Result<T::Link, TransportError>>>,
    /// Over the cap: hosts whose next link is parked, with the rank of their first step and
    /// whether it was parked already (once only).
    keep: Mutex<HashMap<String, (usize, bool)>>,
    /// A host whose link is parked whenever it is handed back, for a command at the run's end
    /// (the lock a run holds to its end, given back then): one connection, not two.
    hold: Mutex<Option<String>>,
}

impl<T: Transport> Kept<T> {
    /// Parks links for a fleet of `hosts` hosts under a cap of `max_connections`.
    pub fn new(inner: T, hosts: usize, max_connections: usize) -> Self {
        Kept {
            inner,
            room: if hosts <= max_connections {
                max_connections
            } else {
                0
            },
            cap: max_connections,
            parked: Mutex::new(HashMap::new()),
            keep: Mutex::new(HashMap::new()),
            hold: Mutex::new(None),
        }
    }

    /// Over the cap: park the next link handed back for each of `hosts` (at most the cap's
    /// worth, in the order their steps are expected), so that the rollout finds them connected
    /// by the lock. A host's link is parked once: after its steps it is closed as any other.
    pub fn keep_for_steps(&self, hosts: impl IntoIterator<Item = String>) {
        let mut keep = self.keep();
        keep.clear();
        // Under a cap of one, the link kept would leave no room to lock the others.
        if self.room == 0 && self.cap > 1 {
            keep.extend(
                hosts
                    .into_iter()
                    .take(self.cap)
                    .enumerate()
                    .map(|(i, h)| (h, (i, false))),
            );
        }
    }

    /// Parks `host`'s link whenever it is handed back, even over the cap: it counts against
    /// the cap while parked, and is never closed to make room (a stage waits for another link
    /// instead). Not under a cap below 4, where that one link would take too large a share.
    pub fn hold(&self, host: Option<String>) {
        if self.cap >= 4 {
            *self.hold.lock().unwrap_or_else(|p| p.into_inner()) = host;
        }
    }

    /// The lock is over: no more links are kept (a host whose link was not parked, having
    /// failed to connect, is connected as any other from now on). Those kept stay parked.
    pub fn stop_keeping(&self) {
        for (_, once) in self.keep().values_mut() {
            *once = true;
        }
    }

    /// Connects to every target at once and parks the links, when they all fit: the stages
    /// that follow (the lock first) find their connections made, instead of waiting for
    /// one host's handshake before the others'. A host that fails is left to the next
    /// stage, which is handed the failure instead of waiting for another timeout.
    pub async fn warm(self: &Arc<Self>, targets: &[Target]) {
        if targets.len() > self.room {
            return;
        }
        let mut tasks = tokio::task::JoinSet::new();
        for target in targets
            .iter()
            .filter(|t| !self.lock().contains_key(&t.name))
        {
            let (kept, target) = (self.clone(), target.clone());
            tasks.spawn(async move {
                match kept.inner.connect(&target).await {
                    Ok(link) => {
                        // Every stage's commands go over this link: get it ready for many.
                        link.prepare().await;
                        kept.park(&target.name, link).await
                    }
                    Err(e) => {
                        kept.lock().entry(target.name.clone()).or_insert(Err(e));
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// The hosts whose links are parked now.
    pub fn parked_hosts(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, l)| l.is_ok())
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// How many links are parked now.
    pub fn parked(&self) -> usize {
        self.lock().values().filter(|l| l.is_ok()).count()
    }

    /// Closes every parked link, all at once (each close is a round trip to its master).
    pub async fn close_all(&self) {
        let links: Vec<T::Link> = self.lock().drain().filter_map(|(_, l)| l.ok()).collect();
        let mut tasks = tokio::task::JoinSet::new();
        for link in links {
            tasks.spawn(link.close());
        }
        while tasks.join_next().await.is_some() {}
    }

    fn keep(&self) -> std::sync::MutexGuard<'_, HashMap<String, (usize, bool)>> {
        self.keep.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[allow(clippy::type_complexity)]
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Result<T::Link, TransportError>>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Transport> Transport for Kept<T> {
    type Link = T::Link;

    async fn connect(&self, target: &Target) -> Result<T::Link, TransportError> {
        let parked = self.lock().remove(&target.name);
        match parked {
            // A link parked a while ago may have lost its master (`persist`): connect anew.
            Some(Ok(link)) if !link.alive().await => {
                link.close().await;
                self.inner.connect(target).await
            }
            Some(link) => link,
            None => self.inner.connect(target).await,
        }
    }

    async fn park(&self, host: &str, link: T::Link) {
        let refused = {
            let mut parked = self.lock();
            let count = parked.values().filter(|l| l.is_ok()).count();
            let has_one = matches!(parked.get(host), Some(Ok(_)));
            let held = self
                .hold
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref()
                == Some(host);
            let kept = self.room == 0
                && count < self.cap
                && !has_one
                && (held
                    || self
                        .keep()
                        .get_mut(host)
                        .is_some_and(|(_, once)| !std::mem::replace(once, true)));
            let full = count >= self.room && !kept;
            if !full && !has_one {
                parked.insert(host.to_string(), Ok(link));
                None
            } else {
                Some(link)
            }
        };
        if let Some(link) = refused {
            link.close().await;
        }
    }

    /// Over the cap only: when the fleet fits, each host has at most one link, parked or in
    /// use, and they all fit.
    fn idle(&self, skip: &dyn Fn(&str) -> bool) -> usize {
        if self.room > 0 {
            return 0;
        }
        self.lock()
            .iter()
            .filter(|(h, l)| l.is_ok() && !skip(h))
            .count()
    }

    fn take_idle(&self, skip: &dyn Fn(&str) -> bool) -> Option<T::Link> {
        if self.room > 0 {
            return None;
        }
        let held = self.hold.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut parked = self.lock();
        // The one whose step is expected last; never the one held to the end (its lock is
        // given back over it at the run's end: closed, that would be a second login; a stage
        // that finds no other waits for a link handed back instead).
        let keep = self.keep();
        let host = parked
            .iter()
            .filter(|(h, l)| l.is_ok() && !skip(h) && held.as_deref() != Some(h.as_str()))
            .max_by_key(|(h, _)| keep.get(h.as_str()).map_or(usize::MAX, |(rank, _)| *rank))
            .map(|(h, _)| h.clone())?;
        parked.remove(&host)?.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts connections, links prepared and closes.
    #[derive(Default)]
    struct Counting {
        connects: AtomicUsize,
        prepared: Arc<AtomicUsize>,
        closes: Arc<AtomicUsize>,
    }

    struct CountingLink {
        prepared: Arc<AtomicUsize>,
        closes: Arc<AtomicUsize>,
    }

    impl Transport for Counting {
        type Link = CountingLink;
        async fn connect(&self, t: &Target) -> Result<CountingLink, TransportError> {
            self.connects.fetch_add(1, Ordering::SeqCst);
            if t.name == "down" {
                return Err(TransportError::Connect {
                    host: t.name.clone(),
                    address: t.address.clone(),
                    reason: "refused".into(),
                });
            }
            Ok(CountingLink {
                prepared: self.prepared.clone(),
                closes: self.closes.clone(),
            })
        }
    }

    impl Link for CountingLink {
        async fn run(&self, _s: &str) -> Result<super::super::Output, TransportError> {
            Ok(Default::default())
        }
        async fn prepare(&self) {
            self.prepared.fetch_add(1, Ordering::SeqCst);
        }
        async fn close(self) {
            self.closes.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn target(name: &str) -> Target {
        Target {
            name: name.into(),
            address: "127.0.0.1".into(),
        }
    }

    #[tokio::test]
    async fn a_parked_link_is_reused_once_and_closed_at_the_end() {
        let kept = Kept::new(Counting::default(), 2, 4);
        let link = kept.connect(&target("a")).await.expect("connects");
        kept.park("a", link).await;
        let again = kept.connect(&target("a")).await.expect("reuses");
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 1);
        // Taken out: a second caller would connect anew.
        assert_eq!(kept.parked(), 0);
        kept.park("a", again).await;
        kept.close_all().await;
        assert_eq!(kept.inner.closes.load(Ordering::SeqCst), 1);
        assert_eq!(kept.parked(), 0);
    }

    #[tokio::test]
    async fn warming_connects_each_host_once_and_the_next_stage_reuses_it() {
        let kept = Arc::new(Kept::new(Counting::default(), 3, 3));
        let targets: Vec<Target> = ["a", "b", "c"].into_iter().map(target).collect();
        kept.warm(&targets).await;
        kept.warm(&targets).await;
        assert_eq!(kept.parked(), 3);
        for t in &targets {
            let link = kept.connect(t).await.expect("parked");
            kept.park(&t.name, link).await;
        }
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 3);
        // Each warmed link was made ready for the stages' many commands, once.
        assert_eq!(kept.inner.prepared.load(Ordering::SeqCst), 3);
        // Over the cap, nothing is warmed.
        let over = Arc::new(Kept::new(Counting::default(), 3, 2));
        over.warm(&targets).await;
        assert_eq!(
            (over.parked(), over.inner.connects.load(Ordering::SeqCst)),
            (0, 0)
        );
    }

    #[tokio::test]
    async fn a_host_that_failed_warming_fails_the_next_connect_at_once_then_is_tried_again() {
        let kept = Arc::new(Kept::new(Counting::default(), 2, 2));
        kept.warm(&[target("a"), target("down")]).await;
        assert_eq!(kept.parked(), 1);
        assert!(kept.connect(&target("down")).await.is_err());
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 2);
        assert!(kept.connect(&target("down")).await.is_err());
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_fleet_larger_than_the_cap_parks_nothing() {
        let kept = Kept::new(Counting::default(), 5, 4);
        let link = kept.connect(&target("a")).await.expect("connects");
        kept.park("a", link).await;
        assert_eq!(kept.parked(), 0);
        assert_eq!(kept.inner.closes.load(Ordering::SeqCst), 1);
        kept.connect(&target("a")).await.expect("connects");
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn never_more_parked_than_the_cap_nor_two_for_one_host() {
        let kept = Kept::new(Counting::default(), 2, 2);
        let a1 = kept.connect(&target("a")).await.expect("connects");
        let a2 = kept.connect(&target("a")).await.expect("connects");
        kept.park("a", a1).await;
        kept.park("a", a2).await;
        assert_eq!(
            (kept.parked(), kept.inner.closes.load(Ordering::SeqCst)),
            (1, 1)
        );
        for name in ["b", "c"] {
            let link = kept.connect(&target(name)).await.expect("connects");
            kept.park(name, link).await;
        }
        assert_eq!(
            (kept.parked(), kept.inner.closes.load(Ordering::SeqCst)),
            (2, 2)
        );
    }

    #[tokio::test]
    async fn over_the_cap_the_hosts_stepped_first_are_parked_once_and_counted() {
        let kept = Kept::new(Counting::default(), 5, 2);
        kept.keep_for_steps(["a", "b", "c"].map(String::from));
        for name in ["c", "b", "a", "d"] {
            let link = kept.connect(&target(name)).await.expect("connects");
            kept.park(name, link).await;
        }
        // The cap's worth of the hosts named (the first two), never `d`: `c` and `d` closed.
        assert_eq!(
            (kept.parked(), kept.inner.closes.load(Ordering::SeqCst)),
            (2, 2)
        );
        assert_eq!((kept.idle(&|h| h == "x"), kept.idle(&|h| h == "a")), (2, 1));
        // Once used, a kept host's link is closed when handed back.
        let a = kept.connect(&target("a")).await.expect("parked");
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 4);
        kept.park("a", a).await;
        assert_eq!(kept.parked(), 1);
        // Room is made by giving up the one stepped last, never the caller's own.
        let link = kept.connect(&target("a")).await.expect("connects");
        kept.park("a", link).await;
        assert!(kept.take_idle(&|h| h == "b").is_none());
        assert!(kept.take_idle(&|h| h == "a").is_some());
        assert_eq!(kept.idle(&|h| h == "x"), 0);
        // When the fleet fits, parked links are every host's only one: none counts.
        let fits = Kept::new(Counting::default(), 2, 2);
        let link = fits.connect(&target("a")).await.expect("connects");
        fits.park("a", link).await;
        assert_eq!((fits.parked(), fits.idle(&|h| h == "x")), (1, 0));
        assert!(fits.take_idle(&|h| h == "x").is_none());
        // Once the lock is over, nothing more is parked (`b` could not be connected then).
        let late = Kept::new(Counting::default(), 5, 2);
        late.keep_for_steps(["a", "b"].map(String::from));
        late.stop_keeping();
        let b = late.connect(&target("b")).await.expect("connects");
        late.park("b", b).await;
        assert_eq!(late.parked(), 0);
        // Under a cap of one nothing is kept: the link would leave no room for the others.
        let one = Kept::new(Counting::default(), 5, 1);
        one.keep_for_steps(["a"].map(String::from));
        let a = one.connect(&target("a")).await.expect("connects");
        one.park("a", a).await;
        assert_eq!(one.parked(), 0);
    }

    #[tokio::test]
    async fn the_one_stepped_last_is_given_up_first() {
        let kept = Kept::new(Counting::default(), 9, 3);
        kept.keep_for_steps(["a", "b", "c"].map(String::from));
        for name in ["b", "c", "a"] {
            let link = kept.connect(&target(name)).await.expect("connects");
            kept.park(name, link).await;
        }
        assert_eq!(kept.parked(), 3);
        assert!(kept.take_idle(&|h| h == "x").is_some());
        // `c` went: `a` and `b` are still handed out without connecting.
        for name in ["a", "b"] {
            kept.connect(&target(name)).await.expect("parked");
        }
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn the_link_held_to_the_end_is_never_given_up() {
        let kept = Kept::new(Counting::default(), 9, 4);
        kept.keep_for_steps(["a", "b"].map(String::from));
        kept.hold(Some("z".into()));
        for name in ["z", "a"] {
            let link = kept.connect(&target(name)).await.expect("connects");
            kept.park(name, link).await;
        }
        // `a` goes first, then nothing: `z` stays parked for the lock's release at the end.
        assert!(kept.take_idle(&|h| h == "x").is_some());
        assert!(kept.take_idle(&|h| h == "x").is_none());
        kept.connect(&target("z")).await.expect("parked");
        assert_eq!(kept.inner.connects.load(Ordering::SeqCst), 2);
    }
}
