//! One range read of a site's keys, made sense of: what the store says each host runs, which
//! hosts a command must still read itself, and where the store and the hosts disagree.

use super::{unsegment, BusyValue, HostValue, Keys, RunningValue, StatusValue, STORE_SCHEMA};
use crate::inventory::{Host, HostId, Hosts};
use crate::site::{ServiceId, Site};
use crate::state::lock::Holder;
use crate::state::{Inputs, Observed, ServiceRecord};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Everything the store holds of a site.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// `schema`, when written.
    pub schema: Option<u32>,
    /// The lock's holder and create revision.
    pub lock: Option<(Option<Holder>, i64)>,
    pub desired: BTreeMap<String, super::DesiredValue>,
    /// By host name.
    pub hosts: BTreeMap<String, HostEntry>,
    /// Keys or values this `deploy` cannot read (another schema, damage): `key: why`.
    pub problems: Vec<String>,
}

/// What the store holds of one host.
#[derive(Debug, Clone, Default)]
pub struct HostEntry {
    pub value: Option<HostValue>,
    /// A step's intent never cleared: the run that wrote it may have changed the host and died
    /// before publishing what it did.
    pub busy: Option<BusyValue>,
    /// By service name.
    pub services: BTreeMap<String, Published>,
}

/// What the store holds of one service on one host.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub running: Option<RunningValue>,
    pub configured: Option<StatusValue>,
    pub validated: Option<StatusValue>,
}

impl Published {
    /// As the host's own record would be, but for its inputs (the store keeps their
    /// fingerprint only).
    pub fn record(&self, inputs: Option<Inputs>) -> Option<ServiceRecord> {
        let running = self.running.as_ref()?;
        Some(ServiceRecord {
            version: running.version.clone(),
            configured: self.configured.as_ref().map(|s| s.mark.clone()),
            validated: self.validated.as_ref().map(|s| s.mark.clone()),
            inputs,
            removal: None,
            hooks: None,
        })
    }

    /// Why these keys cannot be taken for the host's state, when they cannot: no `running`
    /// key, a category's status missing, or a status written for another version than the
    /// one the host is said to run (a step published halfway, or a crash between its keys).
    /// Such a pair is unknown, never healthy: the host is read.
    pub fn unknown(&self, service: &str) -> Option<String> {
        let Some(running) = &self.running else {
            return Some(format!(
                "the store has {service}'s status but not its version"
            ));
        };
        for (name, status) in [
            ("configured", &self.configured),
            ("validated", &self.validated),
        ] {
            match status {
                None => {
                    return Some(format!(
                        "the store has no {name} status of {service} {}: what it runs is read \
                         from it",
                        running.version
                    ))
                }
                Some(s) if s.version != running.version => {
                    return Some(format!(
                        "the store's {name} status of {service} is for {}, its running version \
                         {}: what it runs is read from it",
                        s.version, running.version
                    ))
                }
                Some(_) => {}
            }
        }
        None
    }
}

/// What the store says of one service on one host, against what the host itself records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    pub host: String,
    pub service: String,
    /// What the store says, in words.
    pub store: String,
    /// What the host records, in words.
    pub recorded: String,
}

impl View {
    /// Reads `(key, value, create revision)` triples of one range read under `keys`.
    pub fn parse<'a>(keys: &Keys, kvs: impl IntoIterator<Item = (&'a str, &'a [u8], i64)>) -> View {
        let mut view = View::default();
        for (key, value, created) in kvs {
            let Some(rest) = key.strip_prefix(keys.root()) else {
                continue;
            };
            if let Err(why) = view.take(rest, value, created) {
                view.problems.push(format!("{key}: {why}"));
            }
        }
        view
    }

    /// Takes one key put after the view was read (a watch's event) as [`View::parse`] would
    /// have, had it been there; `false` when this view cannot tell what it leaves (a value it
    /// cannot read, which a parse would leave out instead of the one before, or a view with
    /// problems: parse the keys again).
    pub fn put(&mut self, keys: &Keys, key: &str, value: &[u8], created: i64) -> bool {
        let Some(rest) = key.strip_prefix(keys.root()) else {
            return true;
        };
        // A view with problems says which keys: parsed again, so that a key fixed since
        // is not still said.
        self.take(rest, value, created).is_ok() && self.problems.is_empty()
    }

    /// Forgets one key deleted after the view was read (a watch's event); `false` when this
    /// view cannot tell what the key's deletion leaves (a service's record or status, a host's
    /// entry: parse the keys again).
    pub fn forget(&mut self, keys: &Keys, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(keys.root()) else {
            return true;
        };
        if !self.problems.is_empty() {
            return false;
        }
        match rest.split('/').collect::<Vec<_>>().as_slice() {
            ["lock"] => self.lock = None,
            ["busy", host] => {
                let host = unsegment(host);
                if let Some(entry) = self.hosts.get_mut(&host) {
                    entry.busy = None;
                    // As a read finds it: no entry for a host with no key left.
                    if entry.value.is_none() && entry.services.is_empty() {
                        self.hosts.remove(&host);
                    }
                }
            }
            ["writer", _]
            | ["snapshots", _, _]
            | ["slots", _, _]
            | ["waiting", _, _]
            | ["resume", _]
            | ["history", ..] => {}
            ["desired", service] => {
                self.desired.remove(&unsegment(service));
            }
            _ => return false,
        }
        true
    }

    fn take(&mut self, rest: &str, value: &[u8], created: i64) -> Result<(), String> {
        let parts: Vec<&str> = rest.split('/').collect();
        let json = |v: &[u8]| -> Result<serde_json::Value, String> {
            let v: serde_json::Value = serde_json::from_slice(v).map_err(|e| e.to_string())?;
            match v.get("schema").and_then(serde_json::Value::as_u64) {
                Some(s) if s == u64::from(STORE_SCHEMA) => Ok(v),
                other => Err(format!(
                    "schema {other:?}, this deploy reads {STORE_SCHEMA}"
                )),
            }
        };
        match parts.as_slice() {
            ["schema"] => {
                self.schema = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
            }
            ["lock"] => self.lock = Some((serde_json::from_slice(value).ok(), created)),
            // A run's count of its writes: nothing a host runs.
            ["writer", _] => {}
            // Pull mode: the snapshot's digest (a service of that name has a JSON value),
            // the snapshots themselves, the slots and the hosts waiting for their wave: nothing
            // a host runs.
            ["desired", "current"] if !value.starts_with(b"{") => {
                // A digest where a service's value was (kept key by key): not a service.
                self.desired.remove("current");
            }
            ["snapshots", _, _] | ["slots", _, _] | ["waiting", _, _] | ["resume", _] => {}
            ["desired", service] => {
                self.desired
                    .insert(unsegment(service), typed(json(value)?)?);
            }
            ["running", service, host] => {
                self.service(host, service).running = Some(typed(json(value)?)?);
            }
            ["status", service, host, category] => {
                let v: StatusValue = typed(json(value)?)?;
                let p = self.service(host, service);
                match *category {
                    "configured" => p.configured = Some(v),
                    "validated" => p.validated = Some(v),
                    other => return Err(format!("no category `{other}`")),
                }
            }
            ["busy", host] => {
                self.hosts.entry(unsegment(host)).or_default().busy = Some(typed(json(value)?)?);
            }
            ["hosts", host] => {
                self.hosts.entry(unsegment(host)).or_default().value = Some(typed(json(value)?)?);
            }
            // Runs' snapshots (`history/runs/<run>`, `history/blobs/<digest>/<chunk>`): read
            // by `deploy history` and `deploy undo`, nothing a host's state depends on.
            ["history", "runs", _] | ["history", "blobs", _, _] => {}
            _ => return Err("not a key of this deploy's layout".into()),
        }
        Ok(())
    }

    fn service(&mut self, host: &str, service: &str) -> &mut Published {
        self.hosts
            .entry(unsegment(host))
            .or_default()
            .services
            .entry(unsegment(service))
            .or_default()
    }
}

/// A value of the layout, as its type.
fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// What a host's services are given now, as the `desired` stage answers it.
pub trait Fingerprints {
    /// `None` when it cannot be known here (a secret this command cannot read).
    fn fingerprint(&self, service: ServiceId, host: HostId) -> Option<String>;
    fn inputs(&self, service: ServiceId, host: HostId) -> Inputs;
}

/// The services `host` runs by its classes, in site order.
fn services_of(site: &Site, hosts: &Hosts, host: HostId) -> Vec<ServiceId> {
    let mut ids: Vec<ServiceId> = hosts.hosts[host]
        .classes
        .iter()
        .flat_map(|c| site.classes[*c].services.iter().copied())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Why what the store holds of `host` may not be the host the inventory names now: an address
/// it published (its `hosts/` entry, or a service's `running/` one) is not the inventory's
/// address of it. A host rebuilt under the same name comes back at another address, with an
/// empty disk: only reading it tells what it runs.
pub fn replaced(entry: &HostEntry, host: &Host) -> Option<String> {
    let now = &*host.address;
    let same = |published: &str| same_address(published, now);
    let published = entry
        .value
        .as_ref()
        .map(|v| v.address.as_str())
        .into_iter()
        .chain(
            entry
                .services
                .values()
                .filter_map(|p| p.running.as_ref().map(|r| r.address.as_str())),
        );
    for was in published {
        if !same(was) {
            return Some(format!(
                "the store has it at {was}, the inventory at {now}: replaced or moved, what it \
                 runs is read from it"
            ));
        }
    }
    None
}

/// `host` as a `running/` key publishes it: `address`, or with the service's port
/// `address:port`, an IPv6 address in brackets (`[fe80::1]:8080`), so that the port cannot be
/// read as the address's last group.
pub fn with_port(host: &str, port: Option<u16>) -> String {
    match port {
        Some(p) if ip_and_zone(host).is_some_and(|(ip, _)| ip.is_ipv6()) => format!("[{host}]:{p}"),
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// Whether `published` (a `hosts/` address, or a `running/` one: `address`, `address:port`,
/// `[ipv6]:port`) names the host at the inventory's `address`. IP addresses are compared as
/// addresses (`fe80::0:1` is `fe80::1`), never as text: an IPv6 address without brackets has
/// no port (`fe80::1:5` is another host than `fe80::1`, not its port 5), and its zone is part
/// of it (`fe80::1%eth0` is not `fe80::1%eth1`); a name is compared as written, with or
/// without a port.
pub fn same_address(published: &str, address: &str) -> bool {
    // The published address without its port, if it has one.
    let bare = match published.strip_prefix('[').and_then(|r| r.split_once(']')) {
        // `[ipv6]` or `[ipv6]:port` (`[fe80::1%eth0]:80`: a zone is no port).
        Some((inner, "")) => inner,
        Some((inner, port))
            if port
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok()) =>
        {
            inner
        }
        Some(_) => return false,
        None => match published.rsplit_once(':') {
            // `name:port` or `ipv4:port` (an IPv6 address has more than one `:`, and is whole).
            Some((name, port)) if !name.contains(':') && port.parse::<u16>().is_ok() => name,
            _ => published,
        },
    };
    match (ip_and_zone(bare), ip_and_zone(address)) {
        (Some(a), Some(b)) => a == b,
        (None, None) => bare == address,
        _ => false,
    }
}

/// `a` as an IP address and its zone (`fe80::1%eth0`: the link it is on; empty for none),
/// brackets allowed; `None` for a name.
fn ip_and_zone(a: &str) -> Option<(IpAddr, &str)> {
    let a = a
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(a);
    let (ip, zone) = a.split_once('%').unwrap_or((a, ""));
    Some((ip.parse().ok()?, zone))
}

/// For `plan` and `apply`: per host, what it runs when the store shows it converged (its
/// desired version, healthy, with exactly the site's inputs, at the address the inventory gives
/// it, and it answered its last run), so that it need not be read; `None` for a host to read:
/// one the store knows nothing of, that did not answer, that the store has at another address
/// ([`replaced`]), or whose recorded state differs from the site.
pub fn converged(
    view: &View,
    site: &Site,
    hosts: &Hosts,
    desired: &dyn Fingerprints,
) -> Vec<Option<Observed>> {
    hosts
        .hosts
        .ids()
        .map(|h| {
            let entry = view.hosts.get(&*hosts.hosts[h].name)?;
            if entry.busy.is_some() {
                return None;
            }
            if !entry.value.as_ref()?.reporting || replaced(entry, &hosts.hosts[h]).is_some() {
                return None;
            }
            let mut services = BTreeMap::new();
            for sid in services_of(site, hosts, h) {
                let s = &site.services[sid];
                let published = entry.services.get(&s.name)?;
                if published.unknown(&s.name).is_some() {
                    return None;
                }
                let fp = published.running.as_ref()?.fingerprint.as_deref()?;
                if desired.fingerprint(sid, h)?.as_str() != fp {
                    return None;
                }
                let record = published.record(Some(desired.inputs(sid, h)))?;
                if record.version != s.version || !record.healthy() {
                    return None;
                }
                services.insert(s.name.clone(), record);
            }
            // It publishes a service the site no longer runs there: read it (a removal).
            if entry.services.keys().any(|k| !services.contains_key(k)) {
                return None;
            }
            Some(Observed::Running { services })
        })
        .collect()
}

/// What the store says every host runs, for `status`.
#[derive(Debug, Clone, Default)]
pub struct Said {
    /// Per host, in order.
    pub observed: Vec<Observed>,
    /// Pairs whose inputs the store shows other than the site's (their fingerprints differ).
    pub differ: Vec<(ServiceId, HostId)>,
    /// Hosts the store cannot speak for, with why: the caller reads them itself. One the store
    /// has at another address ([`replaced`]), or whose inputs cannot be known here (a secret
    /// this command cannot read: only the host's own record can be compared).
    pub unvouched: Vec<(HostId, String)>,
}

/// For `status`: what the store says every host runs. A host it knows nothing of, or that did
/// not answer its last run, is unaccounted for. Inputs are the site's where the fingerprint
/// says so; elsewhere `None`, and the pair is in [`Said::differ`] to say they differ.
pub fn observed(view: &View, site: &Site, hosts: &Hosts, desired: &dyn Fingerprints) -> Said {
    let mut differ = Vec::new();
    let mut unvouched = Vec::new();
    let observed = hosts
        .hosts
        .enumerate()
        .map(|(h, host)| {
            let Some(entry) = view.hosts.get(&*host.name) else {
                return Observed::Unreachable {
                    reason: "not reporting: the store has no record of it (no apply has read \
                             it since the store was set up); `deploy status --hosts` reads it"
                        .into(),
                };
            };
            if let Some(v) = entry.value.as_ref().filter(|v| !v.reporting) {
                return Observed::Unreachable {
                    reason: format!(
                        "not reporting since {} (run {}): {}",
                        v.at,
                        v.run,
                        v.reason.as_deref().unwrap_or("it did not answer")
                    ),
                };
            }
            if let Some(b) = &entry.busy {
                unvouched.push((
                    h,
                    format!(
                        "in flux: run {} set out to change it ({} to {}, at {}) and has not \
                         published what it did: what it runs is read from it",
                        b.run, b.service, b.to, b.at
                    ),
                ));
            } else if let Some(why) = replaced(entry, host) {
                unvouched.push((h, why));
            }
            let mut services = BTreeMap::new();
            for (name, published) in &entry.services {
                let sid = site.service(name);
                if let Some(why) = published.unknown(name) {
                    if unvouched.last().map(|(u, _)| *u) != Some(h) {
                        unvouched.push((h, why));
                    }
                }
                if sid.is_some_and(|sid| desired.fingerprint(sid, h).is_none())
                    && unvouched.last().map(|(u, _)| *u) != Some(h)
                {
                    unvouched.push((
                        h,
                        format!(
                            "{name}'s inputs cannot be known here (a secret this command \
                             cannot read): compared with the host's own record"
                        ),
                    ));
                }
                let fp = published
                    .running
                    .as_ref()
                    .and_then(|r| r.fingerprint.clone());
                let inputs = match sid {
                    Some(sid) if fp.is_some() && desired.fingerprint(sid, h) == fp => {
                        Some(desired.inputs(sid, h))
                    }
                    Some(sid) => {
                        differ.push((sid, h));
                        None
                    }
                    None => None,
                };
                if let Some(record) = published.record(inputs) {
                    services.insert(name.clone(), record);
                }
            }
            if services.is_empty() {
                Observed::Fresh
            } else {
                Observed::Running { services }
            }
        })
        .collect();
    Said {
        observed,
        differ,
        unvouched,
    }
}

/// Where what the store says differs from what each host records (`observed`, read from the
/// hosts themselves): version, either category's outcome, or the inputs' fingerprint.
pub fn disagreements(view: &View, hosts: &Hosts, observed: &[Observed]) -> Vec<Disagreement> {
    let mut out = Vec::new();
    for (host, o) in hosts.hosts.iter().zip(observed) {
        let Observed::Running { services } = o else {
            if matches!(o, Observed::Fresh) {
                if let Some(e) = view.hosts.get(&*host.name) {
                    for name in e.services.keys() {
                        out.push(Disagreement {
                            host: host.name.to_string(),
                            service: name.clone(),
                            store: "recorded".into(),
                            recorded: "nothing (no state file)".into(),
                        });
                    }
                }
            }
            continue;
        };
        let entry = view.hosts.get(&*host.name);
        let mut names: Vec<&String> = services.keys().collect();
        if let Some(e) = entry {
            names.extend(e.services.keys());
        }
        names.sort();
        names.dedup();
        for name in names {
            let store = entry.and_then(|e| e.services.get(name));
            let said = store.and_then(|p| {
                let fp = p.running.as_ref()?.fingerprint.clone();
                Some((p.record(None)?, fp))
            });
            let recorded = services.get(name);
            let words = |r: &ServiceRecord, fp: Option<&str>| {
                let mark = |m: &Option<crate::state::Mark>| {
                    m.as_ref().map_or("-".to_string(), |m| {
                        format!("{:?}", m.outcome).to_lowercase()
                    })
                };
                // As published: a failed switch-over counts as not validated.
                let validated = r.validated.clone().or_else(|| {
                    r.configured
                        .clone()
                        .filter(|m| m.outcome == crate::state::Outcome::Failure)
                });
                format!(
                    "{} (configured {}, validated {}, inputs {})",
                    r.version,
                    mark(&r.configured),
                    mark(&validated),
                    fp.unwrap_or("-")
                )
            };
            let host_words = recorded.map(|r| {
                let fp = r.inputs.as_ref().map(Inputs::fingerprint);
                (words(r, fp.as_deref()), r)
            });
            let store_words = said.as_ref().map(|(r, fp)| (words(r, fp.as_deref()), r));
            let same = match (&store_words, &host_words) {
                (Some((a, _)), Some((b, _))) => a == b,
                (None, None) => true,
                _ => false,
            };
            if !same {
                out.push(Disagreement {
                    host: host.name.to_string(),
                    service: name.clone(),
                    store: store_words.map_or("nothing".into(), |(w, _)| w),
                    recorded: host_words.map_or("nothing".into(), |(w, _)| w),
                });
            }
        }
    }
    out
}

/// The hosts `known` leaves to be read (`None`), in order.
pub fn to_read(known: &[Option<Observed>]) -> std::collections::BTreeSet<HostId> {
    (0..known.len())
        .filter(|&h| known[h].is_none())
        .map(HostId::new)
        .collect()
}

/// What every host runs: `known` where the store says so, and `read` (the hosts of
/// [`to_read`], in order) for the rest.
pub fn merge(known: Vec<Option<Observed>>, read: Vec<Observed>) -> Vec<Observed> {
    let mut read = read.into_iter();
    known
        .into_iter()
        .map(|k| match k {
            Some(o) => o,
            None => read.next().unwrap_or(Observed::Fresh),
        })
        .collect()
}
