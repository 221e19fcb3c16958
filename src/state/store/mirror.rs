//! A site's keys kept on this side, as a pull agent's waits decide on them: read once (the
//! three range reads of [`super::Store::read`]), then kept up to date by one prefix watch on
//! the site from the revision after that read. A waiting agent then asks etcd nothing more
//! to decide again, and decides again only when a key changed: where it polled the semaphore
//! and the site's whole state every 200 ms (a read of every host's keys, by every waiting
//! agent), it now gets each change once.
//!
//! etcd sends the events of one revision in one watch response, so a transaction (a step's
//! records, written together) is never seen half applied. The view is updated key by key;
//! the deletion of a key it cannot take back alone (a service's record) has the keys parsed
//! again, once, when the view is next asked for.

use super::etcd::SiteKey;
use super::{Etcd, Keys, StoreError, View};
use etcd_client::{EventType, WatchOptions, WatchStream};
use std::collections::BTreeMap;

/// The site's keys (but `history/` and `snapshots/`) as of the last watch response taken.
pub struct Mirror {
    keys: Keys,
    /// Key → (value, create revision).
    kvs: BTreeMap<String, (Vec<u8>, i64)>,
    view: View,
    /// The view misses a deletion: parse `kvs` again before it is read.
    stale: bool,
    stream: WatchStream,
}

impl Etcd {
    /// The site's keys, read now and watched from then on.
    pub async fn mirror(&self, keys: &Keys) -> Result<Mirror, StoreError> {
        let (read, revision) = self.site_keys(keys).await?;
        let root = keys.root().to_string();
        let stream = self
            .call(|mut c| {
                let options = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1);
                let root = root.clone();
                async move { c.watch(root, Some(options)).await }
            })
            .await?;
        let kvs: BTreeMap<String, (Vec<u8>, i64)> = read
            .into_iter()
            .map(|(k, v, c): SiteKey| (k, (v, c)))
            .collect();
        let mut mirror = Mirror {
            keys: keys.clone(),
            kvs,
            view: View::default(),
            stale: true,
            stream,
        };
        mirror.view();
        Ok(mirror)
    }
}

impl Mirror {
    /// The site's state, as [`super::Store::read`] would read it now (but for the changes
    /// still on their way).
    pub fn view(&mut self) -> &View {
        if self.stale {
            let triples = self
                .kvs
                .iter()
                .map(|(k, (v, c))| (k.as_str(), v.as_slice(), *c));
            self.view = View::parse(&self.keys, triples);
            self.stale = false;
        }
        &self.view
    }

    /// The value of `key`.
    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.kvs.get(key).map(|(v, _)| v.as_slice())
    }

    /// Every key under `prefix`, with its create revision.
    pub fn created_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, i64)> {
        self.kvs
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, (_, c))| (k.as_str(), *c))
    }

    /// Takes every change under the site until one touches a key under one of `prefixes`
    /// (`true`), or the watch ends (`false`: etcd went away, or compacted past it; open
    /// another mirror).
    pub async fn changed_under(&mut self, prefixes: &[String]) -> bool {
        loop {
            let response = match self.stream.message().await {
                Ok(Some(r)) => r,
                _ => return false,
            };
            if response.canceled() {
                return false;
            }
            if response.events().is_empty() {
                // The watch's confirmation, or a progress note.
                continue;
            }
            let mut touched = false;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                if self.skipped(key) {
                    continue;
                }
                touched |= prefixes.iter().any(|p| key.starts_with(p.as_str()));
                match event.event_type() {
                    EventType::Put => {
                        let created = kv.create_revision();
                        self.kvs
                            .insert(key.to_string(), (kv.value().to_vec(), created));
                        if !self.stale {
                            self.view.put(&self.keys, key, kv.value(), created);
                        }
                    }
                    EventType::Delete => {
                        self.kvs.remove(key);
                        if !self.stale && !self.view.forget(&self.keys, key) {
                            self.stale = true;
                        }
                    }
                }
            }
            if touched {
                return true;
            }
        }
    }

    /// Keys the read leaves out: runs' history and published snapshots.
    fn skipped(&self, key: &str) -> bool {
        key.strip_prefix(self.keys.root())
            .is_none_or(|rest| rest.starts_with("history/") || rest.starts_with("snapshots/"))
    }
}
