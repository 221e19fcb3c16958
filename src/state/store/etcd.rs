//! The etcd client: `etcd-client` over each endpoint in turn. That crate does not fail over
//! (a call to a member that is down fails with `Unavailable`), so every call here goes to the
//! endpoint that last answered and, when it cannot be reached, to the next one, round after
//! round, until the call's patience runs out. Every call is safe to send twice, and a copy of
//! it that arrives late changes nothing: reads, lease renewals, and writes fenced by the lock
//! and by the run's count of its writes ([`fenced_txn`]); the lock's own creation checks its
//! holder. With
//! etcd's `auth`, a call whose token etcd refuses is sent again with a fresh one.

#[path = "etcd_words.rs"]
mod words;

use super::{Fence, Keys, Store, StoreError, View, Write, MAX_OPS};
use crate::site::StoreSpec;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions, WatchStream,
};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Replies as large as a site's whole state (10,000 hosts is about 6.5 MiB): far above gRPC's
/// default of 4 MiB.
pub(super) const MAX_REPLY: usize = 256 * 1024 * 1024;

/// A connection to an etcd cluster.
pub struct Etcd {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// One client per endpoint, made when first used.
    clients: Mutex<Vec<Option<Client>>>,
    /// The endpoint that answered last.
    current: AtomicUsize,
    /// How long a call keeps trying other endpoints.
    patience: Duration,
    /// How many transactions each run (its [`Fence::counter`]) has written: held while one is
    /// written, so that a run's writes go one after the other.
    written: Mutex<HashMap<String, u64>>,
}

/// Whether an error means the request may not have been served, so another endpoint may be
/// asked (etcd's own "leader changed" and "no leader" are `Unavailable` too).
fn retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Aborted
        ),
        _ => false,
    }
}

/// Whether etcd refused the token a call was sent with (`auth`): expired (a simple token
/// lapses after `--auth-token-ttl` unused, 300 s by default; a JWT after its TTL), or issued
/// before etcd's users or roles changed. A fresh token makes the same call good.
fn stale_token(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    s.code() == tonic::Code::Unauthenticated
        || s.message().contains("invalid auth token")
        || s.message().contains("revision of auth store is old")
}

/// `call` on `client`; when etcd refuses its token, `client` authenticates again (with `auth`'s
/// user and password, kept by the client) and `call` is sent once more. Every kind of call
/// comes here: reads, writes, lease grants, renewals and revokes.
async fn authenticated<T, F, Fut>(client: Client, call: &F) -> Result<T, etcd_client::Error>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    match call(client.clone()).await {
        Err(e) if stale_token(&e) => {
            client.refresh_token().await?;
            call(client).await
        }
        result => result,
    }
}

impl Etcd {
    /// Connects to `spec`'s endpoints (the password, with `auth`, from its variable) and
    /// checks that one of them answers.
    pub async fn connect(spec: &StoreSpec, _platform: &str) -> Result<Etcd, StoreError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(spec.lock_ttl.max(Duration::from_secs(2)) / 2)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let Some(tls) = &spec.tls {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| StoreError::Failed(format!("{}: {e}", p.display())))
            };
            let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
            if let Some((cert, key)) = &tls.client {
                t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(t);
        }
        if let Some(auth) = &spec.auth {
            let password = std::env::var(&auth.password_env).map_err(|_| {
                StoreError::Failed(format!(
                    "the store's password is read from ${}, which is not set",
                    auth.password_env
                ))
            })?;
            options = options.with_user(auth.user.clone(), password);
        }
        let etcd = Etcd {
            clients: Mutex::new(vec![None; spec.endpoints.len()]),
            endpoints: spec.endpoints.clone(),
            options,
            current: AtomicUsize::new(0),
            patience: spec.lock_ttl,
            written: Mutex::new(HashMap::new()),
        };
        // A count of the keys under the prefix: a user of etcd's `auth` may read nothing else.
        let under = format!("{}/", spec.prefix.trim_end_matches('/'));
        etcd.call(|mut c| {
            let under = under.clone();
            async move {
                let count = GetOptions::new().with_prefix().with_count_only();
                c.get(under, Some(count)).await
            }
        })
        .await?;
        Ok(etcd)
    }

    /// The client of endpoint `i`, connected on first use. The connection is made without
    /// holding the others: an endpoint that does not answer does not hold up a call to one
    /// that does.
    async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        if let Some(c) = &self.clients.lock().await[i] {
            return Ok(c.clone());
        }
        let c = Client::connect([&self.endpoints[i]], Some(self.options.clone())).await?;
        Ok(self.clients.lock().await[i].get_or_insert(c).clone())
    }

    /// Runs `call` on the endpoint that answered last, then on the others in turn, until one
    /// serves it or `patience` has passed.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_for(self.patience, call).await
    }

    /// As [`Etcd::call`], for at most `patience`: each attempt, the connection included, is
    /// cut short when the time is up (a network that drops packets silently would otherwise
    /// hold one attempt for the request timeout, and a pass over every endpoint for that many
    /// times it). An endpoint that has not answered within half an attempt's time is not
    /// waited for before the next is asked too (the call is safe to send twice): the first
    /// answer is taken. So a controller cut off from the members it asks first, which still
    /// reaches one that serves, is answered within about half an attempt per silent member.
    pub async fn call_for<T, F, Fut>(&self, patience: Duration, call: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let began = Instant::now();
        let deadline = began + patience;
        let n = self.endpoints.len();
        // One attempt at one endpoint takes at most a quarter of the patience (at least
        // 300 ms), so that another (or the same one again, an election over) is still tried
        // in time; the next endpoint is asked beside it after half of that.
        let most = (patience / 4).max(Duration::from_millis(300));
        let hedge = most / 2;
        let attempt = |i: usize, cap: Duration| {
            let call = &call;
            Box::pin(async move {
                let served = tokio::time::timeout(cap, async {
                    let c = self.client(i).await?;
                    authenticated(c, call).await
                });
                (i, served.await.map_err(|_| cap))
            })
        };
        // What happened last at each endpoint.
        let mut last: Vec<Option<String>> = vec![None; n];
        loop {
            let first = self.current.load(Ordering::Relaxed);
            let mut queue: VecDeque<usize> = (0..n).map(|k| (first + k) % n).collect();
            let mut running = Vec::new();
            let mut next_at: Option<Pin<Box<tokio::time::Sleep>>>;
            loop {
                // The next endpoint, beside those still asked: at first, when one failed or
                // when they have not answered for `hedge`.
                let left = deadline.saturating_duration_since(Instant::now());
                match queue.pop_front() {
                    Some(i) if !left.is_zero() => {
                        running.push(attempt(i, left.min(most)));
                        next_at = Some(Box::pin(tokio::time::sleep(hedge)));
                    }
                    _ => next_at = None,
                }
                if running.is_empty() {
                    break;
                }
                let event = std::future::poll_fn(|cx| {
                    for k in 0..running.len() {
                        if let Poll::Ready(done) = running[k].as_mut().poll(cx) {
                            drop(running.swap_remove(k));
                            return Poll::Ready(Some(done));
                        }
                    }
                    match next_at.as_mut().map(|s| s.as_mut().poll(cx)) {
                        Some(Poll::Ready(())) => Poll::Ready(None),
                        _ => Poll::Pending,
                    }
                })
                .await;
                let Some((i, served)) = event else {
                    continue;
                };
                match served {
                    Ok(Ok(v)) => {
                        self.current.store(i, Ordering::Relaxed);
                        return Ok(v);
                    }
                    Ok(Err(e)) if retryable(&e) => last[i] = Some(words::said(&e)),
                    Ok(Err(e)) => {
                        return Err(StoreError::Failed(format!(
                            "{}: {}",
                            self.endpoints[i],
                            words::said(&e)
                        )))
                    }
                    Err(cap) => last[i] = Some(format!("no answer in {}", seconds(cap))),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let tried = self
                    .endpoints
                    .iter()
                    .zip(&last)
                    .map(|(endpoint, what)| {
                        let what = what.as_deref().unwrap_or("not tried: no time was left");
                        format!("\n  {endpoint}: {what}")
                    })
                    .collect();
                return Err(StoreError::Unavailable {
                    waited: seconds(began.elapsed()),
                    tried,
                });
            }
            tokio::time::sleep(left.min(Duration::from_millis(200))).await;
        }
    }

    /// A new lease of `ttl` (whole seconds: etcd's unit; `deploy check` refuses a `lock-ttl`
    /// with a fraction of a second): its id and the TTL etcd granted, in seconds.
    pub async fn grant(&self, ttl: Duration) -> Result<(i64, i64), StoreError> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        self.call(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map(|r| (r.id(), r.ttl()))
    }

    /// Renews `lease` once, trying for at most `patience`: `Ok(true)` if etcd renewed it,
    /// `Ok(false)` if etcd says it has expired (a reply of TTL 0, which etcd-client reports as
    /// the error "lease not found": not something to retry).
    pub async fn renew(&self, lease: i64, patience: Duration) -> Result<bool, StoreError> {
        // `lease_keep_alive` sends one keep-alive request and waits for its reply.
        self.call_for(patience, |mut c| async move {
            match c.lease_keep_alive(lease).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == "lease not found" => {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Revokes `lease` (its keys go with it).
    pub async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.call(|mut c| async move {
            match c.lease_revoke(lease).await {
                Ok(_) => Ok(()),
                // Already expired: nothing to revoke.
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Creates `key` with `value` under `lease` if it does not exist, trying for at most
    /// `patience`. `Ok(Ok(revision))`: made, at that revision (its create revision).
    /// `Ok(Err((value, lease, create revision)))`: it exists, and that is what it holds.
    pub async fn create(
        &self,
        key: &str,
        value: &str,
        lease: i64,
        patience: Duration,
    ) -> Result<Result<i64, (Vec<u8>, i64, i64)>, StoreError> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.txn_for(patience, txn).await?;
        let revision = r.header().map_or(0, |h| h.revision());
        if r.succeeded() {
            return Ok(Ok(revision));
        }
        let held = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.lease(), kv.create_revision())),
            _ => None,
        });
        // Gone between the compare and the read: as if held by no one readable.
        Ok(Err(held.unwrap_or_default()))
    }

    /// Deletes `key` only while its create revision is `revision`; whether it did.
    pub async fn delete_if(&self, key: &str, revision: i64) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key, None)]);
        self.txn(txn).await.map(|r| r.succeeded())
    }

    /// Sends `txn` as [`Etcd::call`] sends a call (it is safe to send twice: every one this
    /// store sends is conditioned).
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.txn_for(self.patience, txn).await
    }

    /// [`Etcd::txn`], trying for at most `patience`.
    async fn txn_for(&self, patience: Duration, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.call_for(patience, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Puts `value` at `key`, not fenced by the site's lock: only for keys no other run
    /// writes otherwise (a run's own history entry, or a chunk of a content-addressed blob,
    /// the same bytes whoever writes it).
    pub async fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.call(|mut c| {
            let (key, value) = (key.to_string(), value.to_vec());
            async move { c.put(key, value, None).await }
        })
        .await
        .map(|_| ())
    }

    /// The value at `key`, if there is one.
    pub async fn value(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut r = self
            .call(|c| {
                let key = key.to_string();
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_REPLY)
                        .get(key, None)
                        .await
                }
            })
            .await?;
        Ok(r.take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.value().to_vec()))
    }

    /// The revision etcd's quorum is at now (a linearizable read of `key`'s count).
    pub async fn revision(&self, key: &str) -> Result<i64, StoreError> {
        let r = self
            .call(|mut c| {
                let key = key.to_string();
                async move { c.get(key, Some(GetOptions::new().with_count_only())).await }
            })
            .await?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    /// Every key under `prefix` with its value (keys only, values empty, with `keys_only`),
    /// in key order.
    pub async fn range(
        &self,
        prefix: &str,
        keys_only: bool,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut r = self
            .call(|c| {
                let prefix = prefix.to_string();
                let mut options = GetOptions::new().with_prefix();
                if keys_only {
                    options = options.with_keys_only();
                }
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_REPLY)
                        .get(prefix, Some(options))
                        .await
                }
            })
            .await?;
        Ok(r.take_kvs()
            .into_iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?.to_string();
                Some((key, kv.value().to_vec()))
            })
            .collect())
    }

    /// One watch on every key under `prefix`.
    pub async fn watch(&self, prefix: &str) -> Result<Watching, StoreError> {
        self.call(|mut c| {
            let prefix = prefix.to_string();
            async move {
                c.watch(prefix, Some(WatchOptions::new().with_prefix()))
                    .await
            }
        })
        .await
        .map(Watching)
    }

    /// The site's keys but those under `history/` and `snapshots/` (what [`Store::read`]
    /// parses), as `(key, value, create revision)`, and the revision they were read at: three
    /// range reads at one revision.
    pub async fn site_keys(&self, keys: &Keys) -> Result<(Vec<SiteKey>, i64), StoreError> {
        let root = keys.root().to_string();
        let history = format!("{root}history/");
        // Past every key under `history/`, and the end of the site's keys (`/` + 1 is `0`).
        let after = format!("{root}history0");
        let end = format!("{}0", root.trim_end_matches('/'));
        let range = |from: String, to: String, revision: i64| {
            self.call(move |c| {
                let (from, to) = (from.clone(), to.clone());
                let mut options = GetOptions::new().with_range(to);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_REPLY)
                        .get(from, Some(options))
                        .await
                }
            })
        };
        // Pull mode's published snapshots (`snapshots/<digest>/<n>`, every one ever published)
        // are no host's state either: read by the agents, one at a time.
        let snapshots = format!("{root}snapshots/");
        let past_snapshots = format!("{root}snapshots0");
        let mut before = range(root.clone(), history, 0).await?;
        let revision = before.header().map_or(0, |h| h.revision());
        let mut middle = range(after, snapshots, revision).await?;
        let mut rest = range(past_snapshots, end, revision).await?;
        let kvs: Vec<_> = before
            .take_kvs()
            .into_iter()
            .chain(middle.take_kvs())
            .chain(rest.take_kvs())
            .collect();
        let kvs = kvs
            .into_iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?.to_string();
                Some((key, kv.value().to_vec(), kv.create_revision()))
            })
            .collect();
        Ok((kvs, revision))
    }

    /// The endpoints, as the platform names them.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }
}

/// One key of a site: its name, value and create revision.
pub type SiteKey = (String, Vec<u8>, i64);

/// A watch on a prefix ([`Etcd::watch`]).
pub struct Watching(WatchStream);

impl Watching {
    /// Waits until something under the prefix changes (or the watch is confirmed); `false`
    /// once the watch has ended or failed (open another).
    pub async fn changed(&mut self) -> bool {
        matches!(self.0.message().await, Ok(Some(_)))
    }
}

impl Store for Etcd {
    /// Three range reads at one revision: the site's keys but those under `history/` and
    /// `snapshots/`. The history (runs' snapshots, contents of any size) is no host's state,
    /// and is read only by `deploy history` and `deploy undo`; nor are pull mode's snapshots.
    async fn read(&self, keys: &Keys) -> Result<View, StoreError> {
        let (kvs, _) = self.site_keys(keys).await?;
        let triples = kvs.iter().map(|(k, v, c)| (k.as_str(), v.as_slice(), *c));
        Ok(View::parse(keys, triples))
    }

    async fn write(&self, fence: &Fence, writes: &[Write]) -> Result<(), StoreError> {
        // One transaction: the writer hands over at most `MAX_OPS` writes at once, a step's
        // keys never split ([`super::transactions`]); more is only ever one unit too large.
        // Writes of one run go one at a time, each the next of its count.
        let mut written = self.written.lock().await;
        let writes = super::last_per_key(writes);
        for chunk in writes.chunks(MAX_OPS) {
            let done = written.get(&fence.counter).copied().unwrap_or(0);
            let r = self.txn(fenced_txn(fence, done, chunk)).await?;
            if !r.succeeded() {
                // Either the lock is no longer this run's, or a copy of this very transaction
                // sent before (an attempt cut short, another member asked beside it) was
                // taken: its count is already `done + 1`; or (a pull agent's) the snapshot it
                // acts on is no longer the desired one.
                let (mut lock, mut count, mut snapshot) = (None, None, 0);
                for op in r.op_responses() {
                    if let TxnOpResponse::Get(g) = op {
                        for kv in g.kvs() {
                            if kv.key() == fence.key.as_bytes() {
                                lock = Some(kv.create_revision());
                            } else if kv.key() == fence.counter.as_bytes() {
                                count = kv.value_str().ok().and_then(|v| v.parse::<u64>().ok());
                            } else if fence
                                .snapshot
                                .as_ref()
                                .is_some_and(|(k, _)| kv.key() == k.as_bytes())
                            {
                                snapshot = kv.mod_revision();
                            }
                        }
                    }
                }
                if lock != Some(fence.revision) {
                    return Err(StoreError::Fenced(format!(
                        "{} is no longer at revision {}",
                        fence.key, fence.revision
                    )));
                }
                if count != Some(done + 1) {
                    if let Some((key, revision)) = &fence.snapshot {
                        if snapshot != *revision {
                            return Err(StoreError::Superseded {
                                key: key.clone(),
                                revision: *revision,
                                now: snapshot,
                            });
                        }
                    }
                    return Err(StoreError::Fenced(format!(
                        "{} counts {} writes where this run made {done}: another copy of this run writes too",
                        fence.counter,
                        count.map_or_else(|| "no".to_string(), |c| c.to_string())
                    )));
                }
            }
            written.insert(fence.counter.clone(), done + 1);
        }
        Ok(())
    }
}

/// The transaction that makes a run's write after its first `done`: taken only while the lock
/// is the run's (`fence`) and the run's count of writes is `done` (absent for none), which it
/// moves to `done + 1`. A copy of it that reaches etcd late (a request cut short and sent
/// again, or sent to a second member beside the first, whose first copy arrives after the
/// run's next write) finds the count moved on and changes nothing; otherwise it would write
/// over what the later write said. When not taken, it reads the lock and the count, so the
/// writer can tell a lost lock from a copy already taken.
pub fn fenced_txn(fence: &Fence, done: u64, writes: &[&Write]) -> Txn {
    let count = if done == 0 {
        Compare::create_revision(fence.counter.as_str(), CompareOp::Equal, 0)
    } else {
        Compare::value(fence.counter.as_str(), CompareOp::Equal, done.to_string())
    };
    let mut ops: Vec<TxnOp> = writes
        .iter()
        .map(|w| match *w {
            Write::Put { key, value } => TxnOp::put(key.as_str(), value.as_str(), None),
            Write::Delete { key } => TxnOp::delete(key.as_str(), None),
        })
        .collect();
    ops.push(TxnOp::put(
        fence.counter.as_str(),
        (done + 1).to_string(),
        Some(PutOptions::new().with_lease(fence.lease)),
    ));
    let mut when = vec![
        Compare::create_revision(fence.key.as_str(), CompareOp::Equal, fence.revision),
        count,
    ];
    let mut otherwise = vec![
        TxnOp::get(fence.key.as_str(), None),
        TxnOp::get(fence.counter.as_str(), None),
    ];
    if let Some((key, revision)) = &fence.snapshot {
        when.push(Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            *revision,
        ));
        otherwise.push(TxnOp::get(key.as_str(), None));
    }
    Txn::new().when(when).and_then(ops).or_else(otherwise)
}

/// `d` as a person reads it: `1.5 s`.
fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::stale_token;
    use etcd_client::Error;
    use tonic::{Code, Status};

    fn status(code: Code, message: &str) -> Error {
        Error::GRpcStatus(Status::new(code, message))
    }

    #[test]
    fn a_refused_token_is_renewed_and_nothing_else_is() {
        // etcd's own errors (rpctypes): an expired token, and as the Lock and Election services
        // relay it; a token from before a change to users or roles.
        for e in [
            status(Code::Unauthenticated, "etcdserver: invalid auth token"),
            status(Code::Unknown, "etcdserver: invalid auth token"),
            status(
                Code::InvalidArgument,
                "etcdserver: revision of auth store is old",
            ),
        ] {
            assert!(stale_token(&e), "{e}");
        }
        // A wrong password or a user not allowed the key: a new token changes nothing.
        for e in [
            status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
            status(Code::Unavailable, "etcdserver: leader changed"),
            Error::LeaseKeepAliveError("the keep-alive stream closed".into()),
        ] {
            assert!(!stale_token(&e), "{e}");
        }
    }
}
