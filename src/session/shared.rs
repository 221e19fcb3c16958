//! The session's part in the shared store (`store "etcd"`): the site's lease lock (held for
//! the whole apply, its loss stopping the run from starting steps), which hosts must be read
//! over SSH (the others are as the store says, converged), and what the run publishes: the
//! desired state when it starts, every host it read, and each step's record as the step ends.
//! Publishing never holds the rollout up: writes go through a queue to one writer task, each
//! a transaction fenced by the lock.

use super::{Say, SessionError};
use crate::inventory::{HostId, Hosts};
use crate::plan::Plan;
use crate::rollout::{
    Cancel, Event, EventKind, Level, RevertEnd, RevertIntent, Sink, StepEnd, StepIntent,
};
use crate::site::Site;
use crate::state::lock::{Holder, Lock, LockError, Taken};
use crate::state::store::{self, Etcd, Fence, Fingerprints, Keys, LeaseLock, Store, Write};
use crate::state::Observed;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// The store of one apply, its lock taken.
pub struct Shared {
    etcd: Arc<Etcd>,
    keys: Keys,
    lock: LeaseLock,
    /// Why the lock was lost, once it was.
    lost: Arc<Mutex<Option<String>>>,
    /// Units of writes (a step's keys, a host's): each reaches etcd in one transaction; told
    /// on the sender, when one is given, once it has.
    queue: Mutex<Option<mpsc::UnboundedSender<Unit>>>,
    /// The run's stop, raised when a step's intent cannot be published.
    cancel: Cancel,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Writes that reach etcd in one transaction, and who waits to hear that they did.
type Unit = (Vec<Write>, Option<std::sync::mpsc::Sender<()>>);

/// Time a write is stamped with.
fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Refused while pull agents converge the site: a slot under `slots/` is held, or an agent
/// waits for its host's wave under `waiting/` (a canary not passed, a pause not over).
async fn converging(etcd: &Etcd, keys: &Keys, site: &str) -> Result<(), SessionError> {
    let mut held = etcd
        .range(&keys.all_slots(), true)
        .await
        .map_err(SessionError::Store)?;
    held.extend(
        etcd.range(&keys.all_waiting(), true)
            .await
            .map_err(SessionError::Store)?,
    );
    let Some((key, _)) = held.first() else {
        return Ok(());
    };
    Err(SessionError::Refused {
        reason: format!(
            "pull agents are converging site {site}: {key} is held ({} in all)",
            held.len(),
        ),
        help: "wait until they are done (`deploy status`; `deploy resume` for a pause \
               \"confirm\"), or stop them; a dead agent's keys go with its lease"
            .into(),
    })
}

impl Shared {
    /// Connects to the platform's store and takes the site's lease lock. When the lock is
    /// lost later (etcd unreachable for longer than `lock-ttl`), the run is told to start no
    /// new step, and [`Shared::lost`] says why.
    pub async fn open(
        site: &Site,
        me: &Holder,
        force: bool,
        cancel: Cancel,
        say: Say,
    ) -> Result<Option<(Shared, Taken)>, Result<SessionError, LockError>> {
        let Some(spec) = &site.platform.store else {
            return Ok(None);
        };
        let etcd = Etcd::connect(spec, &site.platform.name)
            .await
            .map_err(|e| Ok(SessionError::Store(e)))?;
        let etcd = Arc::new(etcd);
        let keys = Keys::new(&spec.prefix, &site.name);
        let lock = LeaseLock::new(etcd.clone(), &keys, spec.lock_ttl);
        let taken = lock.acquire(me, force).await.map_err(Err)?;
        // Push and pull exclude each other: no apply while an agent holds a slot (an agent
        // admits no step while this lock is held).
        if let Err(e) = converging(&etcd, &keys, &site.name).await {
            let _ = lock.release(me).await;
            return Err(Ok(e));
        }
        let lost = Arc::new(Mutex::new(None));
        let mut watch = lock.lost();
        let (why, stop) = (lost.clone(), cancel.clone());
        tokio::spawn(async move {
            if let Ok(reason) = watch.wait_for(Option::is_some).await {
                let reason = reason.clone().unwrap_or_default();
                // The reason may end in one line per endpoint: what the run does comes first.
                say(&format!(
                    "error: the site's lock in etcd is lost: no new step starts, running steps \
                     end and are recorded on their hosts and in the journal; {reason}"
                ));
                *why.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
                // Why was just said: the run's own line names the loss only.
                stop.raise(Level::Stop, "the site's lock in etcd is lost");
            }
        });
        let shared = Shared {
            etcd,
            keys,
            lock,
            lost,
            queue: Mutex::new(None),
            writer: Mutex::new(None),
            cancel: cancel.clone(),
        };
        shared.start_writer(cancel);
        Ok(Some((shared, taken)))
    }

    /// The run's fencing token.
    pub fn fence(&self) -> Option<Fence> {
        self.lock.fence()
    }

    /// Why the lock was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Per host, what the store says it runs if it need not be read (`None`: read it); all
    /// `None` with `read_all`.
    pub async fn converged(
        &self,
        site: &Site,
        hosts: &Hosts,
        desired: &dyn Fingerprints,
        read_all: bool,
    ) -> Result<Vec<Option<Observed>>, SessionError> {
        if read_all {
            return Ok(vec![None; hosts.hosts.len()]);
        }
        let view = self
            .etcd
            .read(&self.keys)
            .await
            .map_err(SessionError::Store)?;
        Ok(store::converged(&view, site, hosts, desired))
    }

    /// Publishes what the run starts from: every service's desired version and fingerprint
    /// (trigger_update), and every host that was read (`read`), with what it records.
    pub fn started(
        &self,
        site: &Site,
        hosts: &Hosts,
        desired: &dyn Fingerprints,
        observed: &[Observed],
        read: &[bool],
        run: &str,
    ) {
        let at = now();
        let mut writes = Vec::new();
        let mut units = Vec::new();
        for (sid, s) in site.services.enumerate() {
            let ids = hosts.of_classes(&s.classes);
            let fingerprint = store::service_fingerprint(
                ids.iter()
                    .map(|&h| (&*hosts.hosts[h].name, desired.fingerprint(sid, h))),
            );
            let value = store::DesiredValue {
                schema: store::STORE_SCHEMA,
                version: s.version.clone(),
                fingerprint,
                hosts: ids.len(),
                run: run.into(),
                at: at.clone(),
            };
            writes.extend(store::desired(&self.keys, &s.name, &value));
        }
        for (h, o) in observed.iter().enumerate() {
            if !read.get(h).copied().unwrap_or(false) {
                continue;
            }
            let host = &hosts.hosts[HostId::new(h)];
            let classes = host
                .classes
                .iter()
                .map(|c| site.classes[*c].name.clone())
                .collect();
            let unreachable = match o {
                Observed::Unreachable { reason } => Some(reason.as_str()),
                _ => None,
            };
            let mut unit = Vec::new();
            if unreachable.is_none() {
                // Read now: what it records is published here, whatever a run that died
                // while changing it left.
                unit.push(store::not_busy(&self.keys, &host.name));
            }
            unit.push(store::host_seen(
                &self.keys,
                &host.name,
                &host.address,
                classes,
                unreachable,
                run,
                &at,
            ));
            if let Observed::Running { services } = o {
                for (name, record) in services {
                    let port = site.service(name).and_then(|sid| site.services[sid].port);
                    let hs = store::HostService {
                        service: name,
                        host: &host.name,
                        address: address(&host.address, port),
                        record,
                    };
                    unit.extend(store::recorded(&self.keys, &hs, run, &at));
                }
            }
            units.push(unit);
        }
        self.publish(writes);
        for unit in units {
            self.publish(unit);
        }
    }

    /// Queues `writes` as one unit: they reach etcd in one transaction.
    fn publish(&self, writes: Vec<Write>) {
        if writes.is_empty() {
            return;
        }
        if let Some(q) = &*self.queue.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = q.send((writes, None));
        }
    }

    /// Writes `writes` as one unit and waits (blocking this thread) until etcd has them;
    /// whether it does within `lock-ttl` (not when the lock is lost meanwhile).
    fn publish_acknowledged(&self, writes: Vec<Write>) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            let Some(q) = &*queue else {
                return false;
            };
            if q.send((writes, Some(tx))).is_err() {
                return false;
            }
        }
        let wait = || rx.recv_timeout(self.lock.ttl()).is_ok();
        // On a worker of the runtime, its other tasks (the writer among them) move to another
        // thread while this one waits: steps that start at once never starve the writer.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            // A runtime of one thread runs the writer only once this returns: queued.
            Ok(_) => true,
            Err(_) => wait(),
        }
    }

    /// The one writer: queued units in order, batched into transactions that never split a
    /// unit ([`store::transactions`]), each fenced by the lock. A transaction etcd does not
    /// take is tried again until the lock is lost.
    fn start_writer(&self, cancel: Cancel) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Unit>();
        let (etcd, lost, keys) = (self.etcd.clone(), self.lost.clone(), self.keys.clone());
        let Some(fence) = self.fence() else {
            return;
        };
        let writer = tokio::spawn(async move {
            while let Some((first, ack)) = rx.recv().await {
                let mut acks: Vec<std::sync::mpsc::Sender<()>> = ack.into_iter().collect();
                let mut units = vec![first];
                let mut ops = units[0].len();
                while ops < store::MAX_OPS * 4 {
                    let Ok((more, ack)) = rx.try_recv() else {
                        break;
                    };
                    ops += more.len();
                    units.push(more);
                    acks.extend(ack);
                }
                for txn in store::transactions(&keys, &units) {
                    loop {
                        if lost.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                            return;
                        }
                        match etcd.write(&fence, &txn).await {
                            Ok(()) => break,
                            Err(store::StoreError::Fenced(why)) => {
                                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                                cancel.raise(
                                    Level::Stop,
                                    &format!("the site's lock in etcd is lost: {why}"),
                                );
                                return;
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
                        }
                    }
                }
                for ack in acks {
                    let _ = ack.send(());
                }
            }
        });
        *self.queue.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(writer);
    }

    /// Waits for every queued write (at most `lock-ttl`, then gives up on them: the hosts'
    /// own records and the journal have everything). Whether every write was made.
    pub async fn flush(&self) -> bool {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(writer) = writer else {
            return true;
        };
        let ok = tokio::time::timeout(self.lock.ttl(), writer).await.is_ok();
        ok && self.lost().is_none()
    }

    /// Gives the lock back.
    pub async fn release(&self, me: &Holder) -> Result<(), LockError> {
        self.lock.release(me).await
    }

    /// A sink that publishes each step's record as it ends, then passes events on.
    pub fn publishing(self: &Arc<Self>, inner: Arc<dyn Sink>, plan: &Plan) -> Arc<dyn Sink> {
        let ports: HashMap<String, Option<u16>> = plan
            .services
            .iter()
            .map(|s| (s.name.clone(), s.port))
            .collect();
        let addresses: HashMap<String, String> = plan
            .hosts
            .iter()
            .map(|h| (h.name.to_string(), h.address.to_string()))
            .collect();
        Arc::new(Publishing {
            shared: self.clone(),
            inner,
            ports,
            addresses,
            run: Mutex::new(String::new()),
        })
    }
}

/// `address` or `address:port` (`[ipv6]:port`).
fn address(host: &str, port: Option<u16>) -> String {
    store::with_port(host, port)
}

/// The event consumer that publishes steps' records (running_version, update_status).
struct Publishing {
    shared: Arc<Shared>,
    inner: Arc<dyn Sink>,
    ports: HashMap<String, Option<u16>>,
    addresses: HashMap<String, String>,
    run: Mutex<String>,
}

impl Sink for Publishing {
    fn emit(&self, event: Event) {
        match &event.kind {
            EventKind::RunStarted { run, .. } => {
                *self.run.lock().unwrap_or_else(|p| p.into_inner()) = run.clone();
            }
            // The step's intent, in etcd before its first command: a run that dies before it
            // publishes the step's result leaves it, and every later run reads the host.
            EventKind::StepStarted {
                intent: StepIntent {
                    service, host, to, ..
                },
                ..
            } => {
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let intent = store::busy(&self.shared.keys, host, service, to, &run, &now());
                if !self.shared.publish_acknowledged(vec![intent]) && self.shared.lost().is_none() {
                    self.shared.cancel.raise(
                        Level::Stop,
                        &format!(
                            "the intent of {service} on {host} did not reach etcd within \
                             lock-ttl; no new step starts"
                        ),
                    );
                }
            }
            EventKind::StepFinished {
                result:
                    StepEnd {
                        service,
                        host,
                        failed_hook,
                        reason,
                        ..
                    },
                record,
                ..
            } => {
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let at = now();
                let host_address = self.addresses.get(host).cloned().unwrap_or_default();
                let writes = match (failed_hook.as_deref(), record) {
                    // It could not be reached: the store says so; its record is unchanged.
                    (Some("connect"), _) => vec![store::host_seen(
                        &self.shared.keys,
                        host,
                        &host_address,
                        Vec::new(),
                        Some(reason.as_deref().unwrap_or("it did not answer")),
                        &run,
                        &at,
                    )],
                    (_, Some(record)) => {
                        let port = self.ports.get(service).copied().flatten();
                        let hs = store::HostService {
                            service,
                            host,
                            address: address(&host_address, port),
                            record,
                        };
                        store::recorded(&self.shared.keys, &hs, &run, &at)
                    }
                    (_, None) => Vec::new(),
                };
                let mut writes = writes;
                writes.push(store::not_busy(&self.shared.keys, host));
                self.shared.publish(writes);
            }
            // A service taken off a host: the store no longer has it there (nor, once it left
            // the site, its desired state).
            EventKind::RemovalFinished {
                service,
                host,
                why,
                ok: true,
                emptied,
                ..
            } => {
                let gone = *why == crate::plan::RemovalWhy::LeftSite;
                let mut writes = store::removed(&self.shared.keys, service, host, gone);
                // A host gone from the inventory with nothing left: the store forgets it.
                if *emptied && *why == crate::plan::RemovalWhy::LeftInventory {
                    writes.push(store::Write::Delete {
                        key: self.shared.keys.host(host),
                    });
                }
                self.shared.publish(writes);
            }
            // A revert's intent, as a step's: a run that dies during it leaves the host busy.
            EventKind::RevertStarted {
                intent: RevertIntent {
                    service, host, to, ..
                },
                ..
            } => {
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let intent = store::busy(&self.shared.keys, host, service, to, &run, &now());
                self.shared.publish_acknowledged(vec![intent]);
            }
            // A host switched back: the store says what it runs now, as its record does.
            EventKind::RevertFinished {
                result: RevertEnd { service, host, .. },
                record,
                ..
            } => {
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let mut writes = match record {
                    Some(record) => {
                        let host_address = self.addresses.get(host).cloned().unwrap_or_default();
                        let port = self.ports.get(service).copied().flatten();
                        let hs = store::HostService {
                            service,
                            host,
                            address: address(&host_address, port),
                            record,
                        };
                        store::recorded(&self.shared.keys, &hs, &run, &now())
                    }
                    None => Vec::new(),
                };
                writes.push(store::not_busy(&self.shared.keys, host));
                self.shared.publish(writes);
            }
            // A dependent reconfigured while a needed service's wave ran: the store says what
            // it was given, as its host's record does.
            EventKind::RepointFinished {
                service,
                host,
                record: Some(record),
                ..
            } => {
                let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let host_address = self.addresses.get(host).cloned().unwrap_or_default();
                let port = self.ports.get(service).copied().flatten();
                let hs = store::HostService {
                    service,
                    host,
                    address: address(&host_address, port),
                    record,
                };
                self.shared
                    .publish(store::recorded(&self.shared.keys, &hs, &run, &now()));
            }
            _ => {}
        }
        self.inner.emit(event);
    }
}
