//! What each host must run: per service and host, every input its hooks are given (version,
//! hook texts, port, the host's own address, env, the addresses it needs, its files after
//! rendering, its secrets), as
//! the [`Inputs`] a host records. Takes the site and the resolved hosts; `plan` compares these
//! with what each host recorded, `rollout` delivers the files and records them.
//!
//! The one side effect: the sources of plain `file`s are read to digest them (streamed).

mod render;
#[cfg(test)]
mod tests;

pub use render::{Member, Pool};

use crate::inventory::{HostId, Hosts};
use crate::secrets::{hex, Secrets};
use crate::site::{IdVec, ServiceId, Site};
use crate::state::{Inputs, Takes};
use miette::Diagnostic;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// The input that holds the host's own address.
const ADDRESS: &str = "address";

/// Every service's desired inputs on each of its hosts.
#[derive(Debug, Default)]
pub struct Desired {
    services: IdVec<ServiceId, ServiceInputs>,
    /// Each host's address, as the inventory gives it (`DEPLOY_ADDRESS`): the `address` input
    /// of every service on it.
    addresses: IdVec<HostId, Arc<str>>,
    /// The sha256 of every plain file's source, read once when the run resolved what each
    /// host must run, and the source's stamp then: the steps send the content recorded under
    /// that digest, and check that the source they sent still has that stamp.
    digests: HashMap<PathBuf, (String, Stamp)>,
}

/// One service's inputs: what every host shares, and the template files that differ per host.
#[derive(Debug, Default)]
struct ServiceInputs {
    common: Inputs,
    /// Per host, `file:<path>` entries of its rendered templates.
    rendered: HashMap<HostId, Vec<(String, Arc<str>)>>,
    /// Per needed service, its hosts in name order.
    needs: Arc<BTreeMap<String, Pool>>,
    /// Keys that cannot be known here (a secret not readable by this command, the templates
    /// that render secrets, and `key` when no secret of the service could be read): taken as
    /// the host records them.
    unknown: Vec<String>,
}

/// A file to deliver to one host: where, with which mode, its content's digest (its name in the
/// host's store) and the content itself.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub to: String,
    pub mode: u32,
    pub digest: String,
    pub content: Content,
}

/// A delivered file's content.
#[derive(Clone)]
pub enum Content {
    /// A file on the controller, streamed as it is; `stamp` is what it was when it was
    /// digested.
    Path { path: PathBuf, stamp: Stamp },
    /// A rendered template.
    Rendered {
        text: Arc<String>,
        /// It renders secrets: never logged.
        secret: bool,
    },
}

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::Path { path, .. } => write!(f, "Path({})", path.display()),
            Content::Rendered { text, secret } => match secret {
                true => f.write_str("Rendered([secret])"),
                false => write!(f, "Rendered({} bytes)", text.len()),
            },
        }
    }
}

/// Why the desired state cannot be worked out.
#[derive(Debug, Error, Diagnostic)]
pub enum DesiredError {
    #[error("cannot read {path}: {reason}")]
    #[diagnostic(
        code(drover::desired::file),
        help(
            "a file's source must stay readable from `deploy check` to the end of `deploy apply`"
        )
    )]
    Unreadable { path: String, reason: String },
    /// Two services deliver one path to one host.
    #[error("{site}: services `{first}` and `{second}` both deliver {path}, to host {host}")]
    #[diagnostic(
        code(drover::desired::shared_path),
        help(
            "a file belongs to the service that delivers it (what it replaced is kept, and put \
             back if that service's step fails), so each would undo the other: deliver {path} \
             from one of them"
        )
    )]
    SharedPath {
        site: String,
        path: String,
        host: String,
        first: String,
        second: String,
    },
    /// A template that does not render for a host (an error pointing into the template).
    #[error("{service}: template does not render for host {host}")]
    #[diagnostic(code(drover::desired::render))]
    Render {
        service: String,
        host: String,
        #[related]
        cause: Vec<crate::site::SiteError>,
    },
}

/// Every problem, all at once.
#[derive(Debug, Error, Diagnostic)]
#[error("{} working out what the hosts must run", crate::words::count(.errors.len(), "problem"))]
#[diagnostic(code(drover::desired::invalid))]
pub struct DesiredErrors {
    #[related]
    pub errors: Vec<DesiredError>,
}

/// Works out every service's inputs on each of its hosts; every template is rendered for every
/// host it goes to, and every problem reported at once (one per template file).
pub fn resolve(site: &Site, hosts: &Hosts, secrets: &Secrets) -> Result<Desired, DesiredErrors> {
    let mut errors = shared_paths(site, hosts);
    let mut digests: HashMap<PathBuf, (String, Stamp)> = HashMap::new();
    for f in site.services.iter().flat_map(|s| &s.files) {
        if f.template.is_some() || digests.contains_key(&f.source) {
            continue;
        }
        match digest_file(&f.source) {
            Ok(read) => {
                digests.insert(f.source.clone(), read);
            }
            Err(e) => errors.push(DesiredError::Unreadable {
                path: f.source.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }
    let key_id = secrets.key().map(|k| k.id());
    let mut pools = HashMap::new();
    let mut services = IdVec::new();
    for (sid, service) in site.services.enumerate() {
        let needs = Arc::new(render::members(site, hosts, sid, &mut pools));
        let mut common: BTreeMap<String, Arc<str>> = BTreeMap::new();
        common.insert("version".to_string(), Arc::from(service.version.as_str()));
        common.insert(
            "port".to_string(),
            Arc::from(service.port.map(|p| p.to_string()).unwrap_or_default()),
        );
        for (name, hook) in hook_texts(&service.hooks) {
            common.insert(format!("hook:{name}"), short_digest(hook.as_bytes()).into());
        }
        for (name, value) in &service.env {
            common.insert(format!("env:{name}"), short_digest(value.as_bytes()).into());
        }
        for (name, pool) in needs.iter() {
            common.insert(format!("needs:{name}"), pool.entry.clone());
        }
        for f in service.files.iter().filter(|f| f.template.is_none()) {
            if let Some((d, _)) = digests.get(&f.source) {
                common.insert(
                    format!("file:{}", f.to),
                    format!("{d} {:o}", f.mode()).into(),
                );
            }
        }
        let declared: Vec<&str> = site
            .secrets
            .iter()
            .chain(&service.secrets)
            .map(|s| s.name.as_str())
            .collect();
        let mut unknown: Vec<String> = secrets
            .unknown()
            .iter()
            .filter(|n| declared.contains(&n.as_str()))
            .map(|n| format!("secret:{n}"))
            .collect();
        if !unknown.is_empty() {
            unknown.extend(
                service
                    .files
                    .iter()
                    .filter(|f| f.template.as_ref().is_some_and(|t| t.secret))
                    .map(|f| format!("file:{}", f.to)),
            );
        }
        let own = secrets.for_service(&service.name);
        if !unknown.is_empty() && own.is_empty() {
            // Which key the host's secrets were recorded under is known only with one of them.
            unknown.push("key".into());
        }
        for (name, value) in &own {
            common.insert(
                format!("secret:{name}"),
                secrets
                    .mac(&[b"secret", name.as_bytes(), value.as_bytes()])
                    .into(),
            );
        }
        if let (Some(id), false) = (&key_id, own.is_empty()) {
            common.insert("key".into(), id.as_str().into());
        }
        let mut rendered: HashMap<HostId, Vec<(String, Arc<str>)>> = HashMap::new();
        if service.files.iter().any(|f| f.template.is_some()) {
            let r = render::Renderer::new(site, sid, needs.clone(), secrets);
            let skip = !unknown.is_empty();
            for h in hosts.of_classes(&site.services[sid].classes) {
                match r.render_all(&hosts.hosts[h], skip) {
                    Ok(files) => {
                        let entries = files
                            .into_iter()
                            .map(|(to, mode, text, secret)| {
                                let d = content_digest(text.as_bytes(), secret, secrets);
                                (format!("file:{to}"), Arc::from(format!("{d} {mode:o}")))
                            })
                            .collect();
                        rendered.insert(h, entries);
                    }
                    Err(cause) => {
                        let first = errors.iter().any(|e| matches!(e, DesiredError::Render { service: s, .. } if *s == service.name));
                        if !first {
                            errors.push(DesiredError::Render {
                                service: service.name.clone(),
                                host: hosts.hosts[h].name.to_string(),
                                cause,
                            });
                        }
                    }
                }
            }
        }
        services.push(ServiceInputs {
            common: Inputs(common),
            rendered,
            needs,
            unknown,
        });
    }
    if errors.is_empty() {
        Ok(Desired {
            services,
            addresses: hosts.hosts.iter().map(|h| h.address.clone()).collect(),
            digests,
        })
    } else {
        Err(DesiredErrors { errors })
    }
}

/// Each path that two services deliver to one host, once per path and pair of services
/// (naming the first such host in name order): what a file replaced is kept and put back per service
/// (`state::files`), so two services placing one path would undo each other. A host in two
/// classes is how it comes about: one service naming a path twice, or two services of one
/// class, are the site checker's (`site::check_files::shared`).
fn shared_paths(site: &Site, hosts: &Hosts) -> Vec<DesiredError> {
    let mut by_path: BTreeMap<&str, Vec<ServiceId>> = BTreeMap::new();
    for (sid, service) in site.services.enumerate() {
        for f in &service.files {
            let sids = by_path.entry(f.to.as_str()).or_default();
            if !sids.contains(&sid) {
                sids.push(sid);
            }
        }
    }
    let mut errors = Vec::new();
    for (path, sids) in by_path.iter().filter(|(_, sids)| sids.len() > 1) {
        for (i, &first) in sids.iter().enumerate() {
            let on_first: HashSet<HostId> = hosts
                .of_classes(&site.services[first].classes)
                .into_iter()
                .collect();
            for &second in &sids[i + 1..] {
                let shared = hosts
                    .of_classes(&site.services[second].classes)
                    .into_iter()
                    .find(|h| on_first.contains(h));
                if let Some(h) = shared {
                    errors.push(DesiredError::SharedPath {
                        site: site.file.display().to_string(),
                        path: path.to_string(),
                        host: hosts.hosts[h].name.to_string(),
                        first: site.services[first].name.clone(),
                        second: site.services[second].name.clone(),
                    });
                }
            }
        }
    }
    errors
}

impl Desired {
    /// Everything `service` is given on `host`.
    pub fn inputs(&self, service: ServiceId, host: HostId) -> Inputs {
        let Some(s) = self.services.get(service) else {
            return Inputs::default();
        };
        let mut all = s.common.clone();
        if let Some(files) = s.rendered.get(&host) {
            all.0.extend(files.iter().cloned());
        }
        if let Some(address) = self.addresses.get(host) {
            all.0.insert(ADDRESS.into(), address.clone());
        }
        all
    }

    /// How what the host recorded differs from what `service` on `host` is given now; what
    /// cannot be known here is taken as recorded.
    pub fn reasons(&self, service: ServiceId, host: HostId, recorded: &Inputs) -> Vec<String> {
        self.as_known(service, host, recorded).reasons(recorded)
    }

    /// How a running `service` on `host` takes the change from `recorded` to what it is given
    /// now (what cannot be known here taken as recorded): the most any changed input needs,
    /// and the changed inputs that need a restart (their keys). `None` when nothing differs.
    pub fn takes(
        &self,
        service: ServiceId,
        host: HostId,
        recorded: &Inputs,
    ) -> Option<(Takes, Vec<String>)> {
        let now = self.as_known(service, host, recorded);
        let changed = now.changed(recorded);
        let most = changed.iter().map(|k| Takes::of(k)).max()?;
        let restarts = changed
            .into_iter()
            .filter(|k| Takes::of(k) == Takes::Restart)
            .map(str::to_string)
            .collect();
        Some((most, restarts))
    }

    /// What `service` on `host` is given now, with what cannot be known here (a secret this
    /// command cannot read) taken as `recorded` has it.
    fn as_known(&self, service: ServiceId, host: HostId, recorded: &Inputs) -> Inputs {
        let mut now = self.inputs(service, host);
        if !recorded.0.contains_key(ADDRESS) {
            // Recorded by a deploy that did not record the address: taken as the same, so
            // that a new deploy does not restart every service (the store and the connection
            // still tell a host that moved).
            now.0.remove(ADDRESS);
        }
        if let Some(s) = self.services.get(service) {
            for key in &s.unknown {
                match recorded.0.get(key) {
                    Some(v) => now.0.insert(key.clone(), v.clone()),
                    None => now.0.remove(key),
                };
            }
        }
        now
    }

    /// Whether `service` on `host` is given exactly `recorded`, without building its inputs.
    pub fn matches(&self, service: ServiceId, host: HostId, recorded: &Inputs) -> bool {
        let Some(s) = self.services.get(service) else {
            return false;
        };
        if !s.unknown.is_empty() {
            return self.reasons(service, host, recorded).is_empty();
        }
        let files = s.rendered.get(&host).map_or(&[][..], Vec::as_slice);
        let address = recorded.0.get(ADDRESS);
        if address.is_some_and(|a| self.addresses.get(host) != Some(a))
            || recorded.0.len() != s.common.0.len() + files.len() + usize::from(address.is_some())
        {
            return false;
        }
        s.common.0.iter().all(|(k, v)| recorded.0.get(k) == Some(v))
            && files.iter().all(|(k, v)| recorded.0.get(k) == Some(v))
    }

    /// The fingerprint of what `service` on `host` is given ([`Inputs::fingerprint`]); `None`
    /// when some of it cannot be known here (a secret this command cannot read).
    pub fn fingerprint(&self, service: ServiceId, host: HostId) -> Option<String> {
        let s = self.services.get(service)?;
        s.unknown
            .is_empty()
            .then(|| self.inputs(service, host).fingerprint())
    }

    /// For tests and benchmarks: records every service `observed` runs as given exactly its
    /// desired inputs (hosts in `hosts` order, as `resolve` was given them).
    #[doc(hidden)]
    pub fn stamp(&self, site: &Site, observed: &mut [crate::state::Observed]) {
        for (h, o) in observed.iter_mut().enumerate() {
            if let crate::state::Observed::Running { services } = o {
                for (name, record) in services.iter_mut() {
                    if let Some(sid) = site.service(name) {
                        record.inputs = Some(self.inputs(sid, HostId::new(h)));
                    }
                }
            }
        }
    }

    /// Per needed service, its hosts in name order (what `needs` holds in a template).
    pub fn needs(&self, service: ServiceId) -> Arc<BTreeMap<String, Pool>> {
        self.services
            .get(service)
            .map(|s| s.needs.clone())
            .unwrap_or_default()
    }
    /// The files `service` delivers to `host`, in the order the site gives them: templates
    /// rendered now, plain files under the digest [`resolve`] read (their sources must not
    /// change during a run).
    pub fn deliveries(
        &self,
        site: &Site,
        service: ServiceId,
        host: &crate::inventory::Host,
        secrets: &Secrets,
    ) -> Result<Vec<Delivery>, String> {
        self.deliveries_with(site, service, host, secrets, self.needs(service))
    }

    /// What `service` on `host` is given when the pools of its needs are `needs` instead of
    /// the site's (a dependent's hosts while a needed service's wave runs): its inputs, as
    /// the host records them, and its files.
    pub fn given_pools(
        &self,
        site: &Site,
        service: ServiceId,
        host: (HostId, &crate::inventory::Host),
        secrets: &Secrets,
        needs: Arc<BTreeMap<String, Pool>>,
    ) -> Result<(Inputs, Vec<Delivery>), String> {
        let mut inputs = self.inputs(service, host.0);
        for (name, pool) in needs.iter() {
            inputs.0.insert(format!("needs:{name}"), pool.entry.clone());
        }
        let files = self.deliveries_with(site, service, host.1, secrets, needs)?;
        for (f, d) in site.services[service].files.iter().zip(&files) {
            if f.template.is_some() {
                inputs.0.insert(
                    format!("file:{}", f.to),
                    format!("{} {:o}", d.digest, d.mode).into(),
                );
            }
        }
        Ok((inputs, files))
    }

    fn deliveries_with(
        &self,
        site: &Site,
        service: ServiceId,
        host: &crate::inventory::Host,
        secrets: &Secrets,
        needs: Arc<BTreeMap<String, Pool>>,
    ) -> Result<Vec<Delivery>, String> {
        let s = &site.services[service];
        let r = render::Renderer::new(site, service, needs, secrets);
        let mut out = Vec::with_capacity(s.files.len());
        for f in &s.files {
            match &f.template {
                None => {
                    let (digest, stamp) =
                        self.digests.get(&f.source).cloned().ok_or_else(|| {
                            format!("{} was not read when the run planned", f.source.display())
                        })?;
                    out.push(Delivery {
                        to: f.to.clone(),
                        mode: f.mode(),
                        digest,
                        content: Content::Path {
                            path: f.source.clone(),
                            stamp,
                        },
                    });
                }
                Some(t) => {
                    let text = r.render(f, t, host).map_err(|e| {
                        format!(
                            "template {} for host {}: {e}",
                            f.source.display(),
                            host.name
                        )
                    })?;
                    out.push(Delivery {
                        to: f.to.clone(),
                        mode: f.mode(),
                        digest: content_digest(text.as_bytes(), t.secret, secrets),
                        content: Content::Rendered {
                            text: Arc::new(text),
                            secret: t.secret,
                        },
                    });
                }
            }
        }
        Ok(out)
    }
}

impl crate::state::Expected for Desired {
    fn diverged(&self, service: ServiceId, host: HostId, recorded: Option<&Inputs>) -> Vec<String> {
        match recorded {
            None => vec!["configuration unknown (recorded by an older deploy)".into()],
            Some(r) if self.matches(service, host, r) => Vec::new(),
            Some(r) => self.reasons(service, host, r),
        }
    }
}

/// Hooks by name, with the text each counts by (a check's command only: its timeout and
/// interval say how drover waits, not what the service is given).
fn hook_texts(h: &crate::site::Hooks) -> Vec<(&'static str, &str)> {
    let plain = [
        ("stop", &h.stop),
        ("install", &h.install),
        ("migrate", &h.migrate),
        ("start", &h.start),
        ("reload", &h.reload),
        ("rollback", &h.rollback),
        ("remove", &h.remove),
    ];
    let mut out: Vec<(&'static str, &str)> = plain
        .into_iter()
        .filter_map(|(n, h)| h.as_ref().map(|h| (n, h.command.as_str())))
        .collect();
    if let Some(c) = &h.check {
        out.push(("check", c.command.as_str()));
    }
    out
}

/// A value's digest as inputs keep it: 128 bits of sha256, hex.
fn short_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes)[..16])
}

/// A content's name in a host's store: its sha256, or for content that holds secrets, the
/// sha256 of its HMAC under the fingerprint key (nothing to guess a secret from).
fn content_digest(bytes: &[u8], secret: bool, secrets: &Secrets) -> String {
    if secret {
        let mac = secrets.mac(&[b"file", bytes]);
        hex(&Sha256::digest(mac.as_bytes()))
    } else {
        hex(&Sha256::digest(bytes))
    }
}

/// What identifies one content of a file on the controller without reading it: its size,
/// modification and change times, inode and device. A write, a truncation, a copy over it or a
/// rename onto it changes the stamp (a change time cannot be set back), but for a rewrite of
/// the same size within one tick of the file system's clock; a `chmod` or `touch` changes it
/// too (the file is then read again on the next run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }

    /// The file's size then.
    pub fn size(&self) -> u64 {
        self.len
    }

    /// Whether `path` still has this stamp; the reason when it does not.
    pub fn check(&self, path: &Path) -> Result<(), String> {
        match std::fs::metadata(path) {
            Ok(m) if Stamp::of(&m) == *self => Ok(()),
            Ok(_) => Err(format!(
                "{} changed after this run read it: it is not put in place (nothing of it is \
                 kept); run `deploy apply` again to deliver its new content",
                path.display()
            )),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }
}

/// sha256 of a file's content, read in chunks, and its stamp (the same before and after the
/// read, or the file changed while it was read: an error).
pub fn digest_file(path: &Path) -> std::io::Result<(String, Stamp)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let before = Stamp::of(&f.metadata()?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if Stamp::of(&std::fs::metadata(path)?) != before {
        return Err(std::io::Error::other(
            "it changed while it was read: run the command again once it no longer changes",
        ));
    }
    Ok((hex(&hasher.finalize()), before))
}

impl crate::state::store::Fingerprints for Desired {
    fn fingerprint(&self, service: ServiceId, host: HostId) -> Option<String> {
        Desired::fingerprint(self, service, host)
    }
    fn inputs(&self, service: ServiceId, host: HostId) -> Inputs {
        Desired::inputs(self, service, host)
    }
}
