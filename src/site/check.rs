//! Raw nodes → the checked [`Site`]: names resolved, defaults applied, every problem collected.

use super::check_files;
use super::cycle;
use super::error::{SiteError, Src};
use super::model::*;
use super::raw::{self, HookKind, RawHook, RawPlatform, RawPolicy, RawSecret, RawService, RawSite};
use super::read::{Reader, Spanned};
use super::source::{beside, Referrer, Sources};
use super::suggest;
use super::value::Quota;
use miette::SourceSpan;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Everything the checker carries while it walks the files.
pub struct Checker {
    pub sources: Sources,
    pub errors: Vec<SiteError>,
    policies: HashMap<PathBuf, Option<Arc<Policy>>>,
}

const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Checker {
    pub fn new() -> Self {
        Checker {
            sources: Sources::default(),
            errors: Vec::new(),
            policies: HashMap::new(),
        }
    }

    /// Reads the site at `path` and everything it names; `None` when anything is wrong.
    pub fn site(&mut self, path: &Path) -> Option<Site> {
        let (src, doc) = self.sources.load(path, None, &mut self.errors)?;
        let raw = raw::site(
            &mut Reader {
                src: &src,
                errors: &mut self.errors,
            },
            &doc,
        );
        drop(doc);
        let start = SourceSpan::from(0..0);
        let Some(name) = raw.name.clone() else {
            if raw.site_span.is_none() {
                self.errors.push(SiteError::Missing {
                    what: "a `site` node".into(),
                    src: src.clone(),
                    span: start,
                    help: "begin the file with `site \"name\" { version \"1.0\"; platform \"../platforms/lab.kdl\" }`".into(),
                });
            }
            return None;
        };
        let platform = self.platform(path, &src, &raw);
        let default_policy = match &raw.policy {
            Some(p) => self.policy(path, &src, p),
            None => Some(Arc::new(Policy::default())),
        };
        let (classes, class_ids) = self.classes(&src, &raw);
        let site_env = check_files::env(
            &mut Reader {
                src: &src,
                errors: &mut self.errors,
            },
            &raw.env,
        );
        let services = self.services(path, &src, &raw, &class_ids, default_policy, &site_env);
        let platform = platform.and_then(|p| self.platform_model(p, &class_ids, &src));
        let secrets = secrets(
            &mut Reader {
                src: &src,
                errors: &mut self.errors,
            },
            path,
            &raw.secrets,
        );
        if !self.errors.is_empty() {
            return None;
        }
        let (platform, mut services, mut classes) = (platform?, services?, classes);
        for (cid, class) in classes.iter_mut().enumerate() {
            for &sid in &class.services {
                services[sid].classes.push(cid);
            }
        }
        let order = cycle::order(&services);
        Some(Site {
            name: name.value,
            file: path.to_path_buf(),
            digest: self.sources.digest(),
            platform,
            classes,
            services,
            order,
            max_failed: raw.max_failed.as_ref().map(|m| m.value),
            secrets,
        })
    }

    fn classes(
        &mut self,
        src: &Src,
        raw: &RawSite,
    ) -> (Vec<Class>, BTreeMap<String, (ClassId, SourceSpan)>) {
        let mut ids: BTreeMap<String, (ClassId, SourceSpan)> = BTreeMap::new();
        let mut classes = Vec::new();
        let service_names: Vec<&str> = raw.services.iter().map(|s| s.name.value.as_str()).collect();
        let service_ids = first_index(&service_names);
        for c in &raw.classes {
            if let Some((_, first)) = ids.get(&c.name.value) {
                self.duplicate(src, "class", &c.name, *first);
                continue;
            }
            let mut members: Vec<(ServiceId, SourceSpan)> = Vec::new();
            for s in &c.services {
                let Some(&sid) = service_ids.get(s.value.as_str()) else {
                    self.unknown(src, "service", s, &service_names);
                    continue;
                };
                match members.iter().find(|(m, _)| *m == sid) {
                    Some((_, first)) => self.duplicate(src, "service in this class", s, *first),
                    None => members.push((sid, s.span)),
                }
            }
            ids.insert(c.name.value.clone(), (classes.len(), c.name.span));
            classes.push(Class {
                name: c.name.value.clone(),
                services: members.into_iter().map(|m| m.0).collect(),
            });
        }
        (classes, ids)
    }

    fn services(
        &mut self,
        site_path: &Path,
        src: &Src,
        raw: &RawSite,
        classes: &BTreeMap<String, (ClassId, SourceSpan)>,
        default_policy: Option<Arc<Policy>>,
        site_env: &[(String, String)],
    ) -> Option<Vec<Service>> {
        let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
        let names: Vec<&str> = raw.services.iter().map(|s| s.name.value.as_str()).collect();
        let ids = first_index(&names);
        // The services some declared class runs, found once rather than once per service.
        let in_classes: HashSet<&str> = raw
            .classes
            .iter()
            .filter(|c| classes.contains_key(&c.name.value))
            .flat_map(|c| c.services.iter().map(|m| m.value.as_str()))
            .collect();
        let mut out = Vec::with_capacity(raw.services.len());
        let mut ok = true;
        for s in &raw.services {
            if let Some(first) = seen.get(s.name.value.as_str()) {
                self.duplicate(src, "service", &s.name, *first);
                ok = false;
                continue;
            }
            seen.insert(&s.name.value, s.name.span);
            let in_a_class = in_classes.contains(s.name.value.as_str());
            if !in_a_class {
                let class_names: Vec<&str> = classes.keys().map(String::as_str).collect();
                let name = &s.name.value;
                let help = if class_names.is_empty() {
                    format!("define a class that runs it: `class \"app\" {{ service \"{name}\" }}`")
                } else {
                    format!(
                        "add `service \"{name}\"` to a class ({})",
                        class_names.join(", ")
                    )
                };
                self.errors.push(SiteError::OrphanService {
                    name: name.clone(),
                    src: src.clone(),
                    span: s.name.span,
                    help,
                });
            }
            let version = s
                .version
                .as_ref()
                .or(raw.version.as_ref())
                .map(|v| v.value.clone());
            if version.is_none() {
                self.errors.push(SiteError::Missing {
                    what: format!("a version for `{}`", s.name.value),
                    src: src.clone(),
                    span: s.name.span,
                    help: "give the site a default `version \"…\"` or the service its own".into(),
                });
            }
            let needs = self.needs(src, s, &names, &ids);
            let own_secrets = secrets(
                &mut Reader {
                    src,
                    errors: &mut self.errors,
                },
                site_path,
                &s.secrets,
            );
            let mut reader = Reader {
                src,
                errors: &mut self.errors,
            };
            let own_env = check_files::env(&mut reader, &s.env);
            let files = check_files::files(&mut reader, &mut self.sources, site_path, &s.files);
            let policy = match &s.policy {
                Some(p) => self.policy(site_path, src, p),
                None => default_policy.clone(),
            };
            match (version, needs, policy) {
                (Some(version), Some(needs), Some(policy)) => out.push(Service {
                    name: s.name.value.clone(),
                    version,
                    port: s.port.as_ref().and_then(|p| u16::try_from(p.value).ok()),
                    classes: Vec::new(),
                    needs,
                    policy,
                    hooks: hooks(&s.hooks, raw.hook_timeout.as_ref().map(|t| t.value)),
                    secrets: own_secrets,
                    env: check_files::merged_env(site_env, &own_env),
                    files,
                }),
                _ => ok = false,
            }
        }
        if ok {
            cycle::report(src, raw, &out, &mut self.errors);
        }
        ok.then_some(out)
    }

    fn needs(
        &mut self,
        src: &Src,
        s: &RawService,
        names: &[&str],
        ids: &HashMap<&str, ServiceId>,
    ) -> Option<Vec<Need>> {
        let mut out = Vec::new();
        let mut ok = true;
        for n in &s.needs {
            let Some(&service) = ids.get(n.service.value.as_str()) else {
                self.unknown(src, "service", &n.service, names);
                ok = false;
                continue;
            };
            let healthy = match (&n.healthy, &n.addressable) {
                (None, None) => Some(Quota::All),
                (h, _) => h.as_ref().map(|h| h.value),
            };
            out.push(Need {
                service,
                healthy,
                addressable: n.addressable.as_ref().map(|a| a.value),
            });
        }
        ok.then_some(out)
    }

    fn policy(
        &mut self,
        site_path: &Path,
        src: &Src,
        named: &Spanned<String>,
    ) -> Option<Arc<Policy>> {
        let path = beside(site_path, &named.value);
        if let Some(cached) = self.policies.get(&path) {
            return cached.clone();
        }
        let loaded = self.sources.load(
            &path,
            Some(Referrer {
                src,
                span: named.span,
            }),
            &mut self.errors,
        );
        let policy = loaded.and_then(|(psrc, doc)| {
            let raw = raw::policy(
                &mut Reader {
                    src: &psrc,
                    errors: &mut self.errors,
                },
                &doc,
            );
            policy_model(
                &mut Reader {
                    src: &psrc,
                    errors: &mut self.errors,
                },
                raw,
            )
        });
        let policy = policy.map(Arc::new);
        self.policies.insert(path, policy.clone());
        policy
    }

    fn platform(
        &mut self,
        site_path: &Path,
        src: &Src,
        raw: &RawSite,
    ) -> Option<(RawPlatform, Src, PathBuf)> {
        let Some(named) = &raw.platform else {
            self.errors.push(SiteError::Missing {
                what: "the platform".into(),
                src: src.clone(),
                span: raw.site_span.unwrap_or_else(|| (0..0).into()),
                help:
                    "name the platform file in the site node: `platform \"../platforms/lab.kdl\"`"
                        .into(),
            });
            return None;
        };
        let path = beside(site_path, &named.value);
        let (psrc, doc) = self.sources.load(
            &path,
            Some(Referrer {
                src,
                span: named.span,
            }),
            &mut self.errors,
        )?;
        let raw = raw::platform(
            &mut Reader {
                src: &psrc,
                errors: &mut self.errors,
            },
            &doc,
        );
        Some((raw, psrc, path))
    }

    fn platform_model(
        &mut self,
        (raw, src, path): (RawPlatform, Src, PathBuf),
        classes: &BTreeMap<String, (ClassId, SourceSpan)>,
        site: &Src,
    ) -> Option<Platform> {
        let mut r = Reader {
            src: &src,
            errors: &mut self.errors,
        };
        let top = raw.span.unwrap_or_else(|| (0..0).into());
        let Some(name) = raw.name else {
            if raw.span.is_none() {
                r.missing(
                    top,
                    "a `platform` node".into(),
                    "write `platform \"lab\" { transport \"ssh\"; inventory \"static\" { … } }`"
                        .into(),
                );
            }
            return None;
        };
        let transport = match raw.transport {
            Some(t) => transport_model(&mut r, t, &path),
            None => {
                r.missing(
                    name.span,
                    "a `transport`".into(),
                    "add `transport \"ssh\" user=\"root\"` or `transport \"local\" root=\"hosts\"`"
                        .into(),
                );
                None
            }
        };
        let state_dir = raw
            .state_dir
            .map(|s| s.value)
            .unwrap_or_else(|| "/var/lib/drover".into());
        let inventory = match raw.inventory {
            Some(inv) => super::check_inventory::inventory(self, inv, &src, &path, classes, site),
            None => {
                r.missing(
                    name.span,
                    "an `inventory`".into(),
                    "add `inventory \"static\" { host \"db1\" address=\"10.0.0.5\" class=\"db\" }`"
                        .into(),
                );
                None
            }
        };
        let store = match raw.store {
            Some(raw) => {
                let mut r = Reader {
                    src: &src,
                    errors: &mut self.errors,
                };
                Some(super::check_store::store(&mut r, raw, &path)?)
            }
            None => None,
        };
        Some(Platform {
            name: name.value,
            file: path,
            transport: transport?,
            state_dir,
            inventory: inventory.as_ref()?.0.clone(),
            on_empty: inventory?.1,
            store,
        })
    }

    fn duplicate(&mut self, src: &Src, kind: &str, again: &Spanned<String>, first: SourceSpan) {
        self.errors.push(SiteError::Duplicate {
            kind: kind.into(),
            name: again.value.clone(),
            src: src.clone(),
            first,
            second: again.span,
            help: format!(
                "rename one of them or merge them into one `{}`",
                kind.split(' ').next().unwrap_or(kind)
            ),
        });
    }

    fn unknown(&mut self, src: &Src, kind: &str, name: &Spanned<String>, known: &[&str]) {
        self.errors.push(SiteError::UnknownName {
            kind: kind.into(),
            name: name.value.clone(),
            src: src.clone(),
            span: name.span,
            help: suggest::help(&name.value, kind, known),
        });
    }
}

/// Each name → the index of its first occurrence (later duplicates are reported elsewhere).
fn first_index<'a>(names: &[&'a str]) -> HashMap<&'a str, usize> {
    let mut ids = HashMap::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        ids.entry(*n).or_insert(i);
    }
    ids
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

/// The hooks of a service; `default_timeout` (the site's `hook-timeout`) applies to every hook
/// but `check` that gives no `timeout=` of its own.
fn hooks(raw: &[RawHook], default_timeout: Option<Duration>) -> Hooks {
    let mut h = Hooks::default();
    for hook in raw {
        let plain = Some(Hook {
            command: hook.command.clone(),
            timeout: hook.timeout.or(default_timeout),
        });
        match hook.kind {
            HookKind::Stop => h.stop = plain,
            HookKind::Install => h.install = plain,
            HookKind::Migrate => h.migrate = plain,
            HookKind::Start => h.start = plain,
            HookKind::Rollback => h.rollback = plain,
            HookKind::Reload => h.reload = plain,
            HookKind::Check => {
                h.check = Some(Check {
                    command: hook.command.clone(),
                    timeout: hook.timeout.unwrap_or(DEFAULT_CHECK_TIMEOUT),
                    interval: hook.interval.unwrap_or(DEFAULT_CHECK_INTERVAL),
                })
            }
        }
    }
    h
}

/// Checks `secret` nodes of one scope (the site, or one service): a name fit for an
/// environment variable and not one of drover's own, given once, with exactly one source.
fn secrets(r: &mut Reader<'_>, site_path: &Path, raw: &[RawSecret]) -> Vec<Secret> {
    let mut out: Vec<Secret> = Vec::new();
    let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
    for s in raw {
        let name = &s.name.value;
        if !check_files::variable(r, &s.name, "the secret's name", "DB_PASSWORD") {
            continue;
        }
        if let Some(first) = seen.get(name.as_str()) {
            r.errors.push(SiteError::Duplicate {
                kind: "secret".into(),
                name: name.clone(),
                src: r.src.clone(),
                first: *first,
                second: s.name.span,
                help: "give each secret once".into(),
            });
            continue;
        }
        seen.insert(name, s.name.span);
        let source = match (&s.env, &s.file) {
            (Some(env), None) if !env.value.is_empty() => SecretSource::Env(env.value.clone()),
            (None, Some(file)) if !file.value.is_empty() => {
                SecretSource::File(beside(site_path, &file.value))
            }
            (Some(_), Some(file)) => {
                r.bad(
                    file.span,
                    "the secret's source".into(),
                    "a secret has one source".into(),
                    "give either `env=\"VAR\"` or `file=\"path\"`".into(),
                );
                continue;
            }
            (Some(e), None) | (None, Some(e)) => {
                r.bad(
                    e.span,
                    "the secret's source".into(),
                    "empty".into(),
                    "name an environment variable or a file".into(),
                );
                continue;
            }
            (None, None) => {
                r.missing(
                    s.span,
                    format!("the source of secret `{name}`"),
                    format!(
                        "write `secret \"{name}\" env=\"VAR\"` or `secret \"{name}\" file=\"path\"`"
                    ),
                );
                continue;
            }
        };
        out.push(Secret {
            name: name.clone(),
            source,
        });
    }
    out
}

fn policy_model(r: &mut Reader<'_>, raw: RawPolicy) -> Option<Policy> {
    let defaults = Policy::default();
    let Some(name) = raw.name else {
        if !raw.has_node {
            r.missing(
                (0..0).into(),
                "a `policy` node".into(),
                "write `policy \"name\" { batch \"30%\" }`".into(),
            );
        }
        return None;
    };
    let name = name.value;
    if let Some(b) = &raw.batch {
        if b.value == Quota::Count(0) || b.value == Quota::Percent(0) {
            r.bad(
                b.span,
                "the batch size".into(),
                "a batch of 0 never finishes".into(),
                "use at least 1 host or a percentage above 0%".into(),
            );
            return None;
        }
    }
    let on_failure = match raw.on_failure {
        None => defaults.on_failure,
        Some(s) => match s.value.as_str() {
            "rollback" => OnFailure::Rollback,
            "stop" => OnFailure::Stop,
            "continue" => OnFailure::Continue,
            other => {
                let help = suggest::help(other, "choice", &["rollback", "stop", "continue"]);
                r.bad(
                    s.span,
                    "`on-failure`".into(),
                    format!("`{other}` is not a choice"),
                    help,
                );
                return None;
            }
        },
    };
    Some(Policy {
        name,
        batch: raw.batch.map_or(defaults.batch, |b| b.value),
        max_failed: raw.max_failed.map_or(defaults.max_failed, |m| m.value),
        wave_max_failed: raw.wave_max_failed.map(|m| m.value),
        canary: raw.canary.map_or(0, |c| c.value),
        pause: match raw.pause {
            None => defaults.pause,
            Some(Spanned { value: Some(d), .. }) => Pause::Wait(d),
            Some(Spanned { value: None, .. }) => Pause::Confirm,
        },
        spread: raw.spread.map(|s| s.value),
        on_failure,
    })
}

fn transport_model(
    r: &mut Reader<'_>,
    t: raw::RawTransport,
    platform_file: &Path,
) -> Option<Transport> {
    let path = |s: Option<Spanned<String>>| s.map(|s| beside(platform_file, &s.value));
    match t.kind.value.as_str() {
        "ssh" => {
            if let Some(root) = &t.root {
                r.bad(
                    root.span,
                    "`root`".into(),
                    "only the local transport has a root".into(),
                    "remove `root=`".into(),
                );
                return None;
            }
            Some(Transport::Ssh(SshOptions {
                user: t.user.map(|u| u.value),
                port: t.port.and_then(|p| u16::try_from(p.value).ok()),
                identity: path(t.identity),
                known_hosts: path(t.known_hosts),
                config: path(t.config),
                connect_timeout: t
                    .connect_timeout
                    .map_or(DEFAULT_CONNECT_TIMEOUT, |c| c.value),
                keep_shell: t.keep_shell.is_none_or(|k| k.value),
                accept_new_host_keys: false,
            }))
        }
        "local" => {
            let port = t.port.as_ref().map(|p| p.span);
            let timeout = t.connect_timeout.as_ref().map(|c| c.span);
            let keep = t.keep_shell.as_ref().map(|k| k.span);
            let ssh_only = [&t.user, &t.identity, &t.known_hosts, &t.config]
                .into_iter()
                .flatten()
                .map(|s| s.span)
                .chain(port)
                .chain(timeout)
                .chain(keep)
                .next();
            if let Some(span) = ssh_only {
                r.bad(
                    span,
                    "the local transport".into(),
                    "this is an ssh setting".into(),
                    "remove it, or use `transport \"ssh\"`".into(),
                );
                return None;
            }
            let root = t.root.map_or_else(
                || beside(platform_file, "hosts"),
                |s| beside(platform_file, &s.value),
            );
            Some(Transport::Local { root })
        }
        other => {
            let help = suggest::help(other, "transport", &["ssh", "local"]);
            r.bad(
                t.kind.span,
                "the transport".into(),
                format!("`{other}` is not a transport"),
                help,
            );
            None
        }
    }
}
