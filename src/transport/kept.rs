//! Links kept open between the stages of one `deploy apply`: the lock, the observation, the
//! rollout and the lock's release reuse one connection per host instead of opening four.

use super::{Link, Target, Transport, TransportError};
use std::collections::HashMap;
use std::sync::Mutex;

/// A transport that hands out a host's parked link, if there is one, before connecting.
///
/// Links are parked only while there is room: `room` is the connection cap when the whole
/// fleet fits under it, and 0 otherwise (then every stage connects and closes as it goes, and
/// the cap holds across stages).
pub struct Kept<T: Transport> {
    inner: T,
    room: usize,
    parked: Mutex<HashMap<String, T::Link>>,
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
            parked: Mutex::new(HashMap::new()),
        }
    }

    /// How many links are parked now.
    pub fn parked(&self) -> usize {
        self.lock().len()
    }

    /// Closes every parked link.
    pub async fn close_all(&self) {
        let links: Vec<T::Link> = self.lock().drain().map(|(_, l)| l).collect();
        for link in links {
            link.close().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, T::Link>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Transport> Transport for Kept<T> {
    type Link = T::Link;

    async fn connect(&self, target: &Target) -> Result<T::Link, TransportError> {
        let parked = self.lock().remove(&target.name);
        match parked {
            Some(link) => Ok(link),
            None => self.inner.connect(target).await,
        }
    }

    async fn park(&self, host: &str, link: T::Link) {
        let refused = {
            let mut parked = self.lock();
            if parked.len() < self.room && !parked.contains_key(host) {
                parked.insert(host.to_string(), link);
                None
            } else {
                Some(link)
            }
        };
        if let Some(link) = refused {
            link.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts connections and closes.
    #[derive(Default)]
    struct Counting {
        connects: AtomicUsize,
        closes: Arc<AtomicUsize>,
    }

    struct CountingLink(Arc<AtomicUsize>);

    impl Transport for Counting {
        type Link = CountingLink;
        async fn connect(&self, _t: &Target) -> Result<CountingLink, TransportError> {
            self.connects.fetch_add(1, Ordering::SeqCst);
            Ok(CountingLink(self.closes.clone()))
        }
    }

    impl Link for CountingLink {
        async fn run(&self, _s: &str) -> Result<super::super::Output, TransportError> {
            Ok(Default::default())
        }
        async fn close(self) {
            self.0.fetch_add(1, Ordering::SeqCst);
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
}
