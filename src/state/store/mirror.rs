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

use super::etcd::{SiteKey, MAX_REPLY};
use super::{Etcd, Keys, StoreError, View};
use etcd_client::{EventType, WatchOptions, WatchResponse, WatchStream};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a watch may stay silent before it is asked for its progress, and then how long it
/// has to answer: a watch that answers nothing then is taken as ended (a member that stopped
/// sending without closing the stream), and a new mirror is opened.
const QUIET: Duration = Duration::from_secs(5);

/// The site's keys (but `history/` and `snapshots/`) as of the last watch response taken.
pub struct Mirror {
    keys: Keys,
    /// The revision the watch has brought the copy to (each response's header).
    seen: i64,
    /// When the watch last sent something (or was last checked).
    heard: tokio::time::Instant,
    /// The quorum's revision the watch was asked to show it reached, and by when.
    owed: Option<(i64, tokio::time::Instant)>,
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
            .call(|c| {
                let options = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1);
                let root = root.clone();
                // A catch-up after a busy moment comes as one response of many revisions.
                let mut watch = c.watch_client().max_decoding_message_size(MAX_REPLY);
                async move { watch.watch(root, Some(options)).await }
            })
            .await?;
        let kvs: BTreeMap<String, (Vec<u8>, i64)> = read
            .into_iter()
            .map(|(k, v, c): SiteKey| (k, (v, c)))
            .collect();
        let mut mirror = Mirror {
            keys: keys.clone(),
            seen: revision,
            heard: tokio::time::Instant::now(),
            owed: None,
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
    /// (`true`), or the watch ends (`false`: etcd went away, compacted past it, or the member
    /// watched fell behind; open another mirror).
    ///
    /// A quiet site sends nothing, and neither does a member cut off from the others (its
    /// stream stays open, its copy stops moving). So after [`QUIET`] without a response, the
    /// revision etcd's quorum is at is read (through any endpoint) and the watch is asked for
    /// its progress: a watch that has not reached that revision [`QUIET`] later has fallen
    /// behind, and is given up.
    pub async fn changed_under(&mut self, etcd: &Etcd, prefixes: &[String]) -> bool {
        // What it waits for is kept in `self` (`heard`, `owed`): a caller that gives up
        // waiting (a timeout of its own) and calls again does not start the count over.
        loop {
            let until = match self.owed {
                Some((_, by)) => by,
                None => self.heard + QUIET,
            };
            let response = match tokio::time::timeout_at(until, self.stream.message()).await {
                Ok(Ok(Some(r))) => r,
                Ok(_) => return false,
                Err(_) if self.owed.is_some() => return false,
                Err(_) => {
                    // etcd not answering is for the calls to say: the watch is kept, and
                    // checked again after another quiet while.
                    self.heard = tokio::time::Instant::now();
                    if let Ok(at) = etcd.revision(&self.keys.lock()).await {
                        if at > self.seen {
                            if self.stream.request_progress().await.is_err() {
                                return false;
                            }
                            self.owed = Some((at, tokio::time::Instant::now() + QUIET));
                        }
                    }
                    continue;
                }
            };
            self.heard = tokio::time::Instant::now();
            let taken = self.take(&response, prefixes);
            if self.owed.is_some_and(|(at, _)| self.seen >= at) {
                self.owed = None;
            }
            match taken {
                None => return false,
                Some(true) => return true,
                Some(false) => {}
            }
        }
    }

    /// Takes the changes already received, without waiting for more; `false` when the watch
    /// has ended (open another mirror).
    pub async fn catch_up(&mut self) -> bool {
        loop {
            // A timeout of zero polls the stream once: what is there is taken.
            match tokio::time::timeout(Duration::ZERO, self.stream.message()).await {
                Ok(Ok(Some(r))) => {
                    if self.take(&r, &[]).is_none() {
                        return false;
                    }
                }
                Ok(_) => return false,
                Err(_) => return true,
            }
        }
    }

    /// Takes one response's events; whether one touched a key under `prefixes` (`None`: the
    /// watch was cancelled).
    fn take(&mut self, response: &WatchResponse, prefixes: &[String]) -> Option<bool> {
        if response.canceled() {
            return None;
        }
        if let Some(h) = response.header() {
            self.seen = self.seen.max(h.revision());
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
                    if !self.stale && !self.view.put(&self.keys, key, kv.value(), created) {
                        self.stale = true;
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
        Some(touched)
    }

    /// Keys the read leaves out: runs' history and published snapshots.
    fn skipped(&self, key: &str) -> bool {
        key.strip_prefix(self.keys.root())
            .is_none_or(|rest| rest.starts_with("history/") || rest.starts_with("snapshots/"))
    }
}
