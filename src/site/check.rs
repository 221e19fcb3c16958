//! Raw nodes → the checked [`Site`]: names resolved, defaults applied, every problem collected.

use super::check_files;
use super::check_service::{first_index, secrets, Classes, Context};
use super::cycle;
use super::error::{SiteError, Src};
use super::ids::IdVec;
use super::include;
use super::model::*;
use super::raw::{self, RawPlatform, RawPolicy, RawSite};
use super::read::{Reader, Spanned};
use super::source::{beside, Referrer, Sources};
use super::suggest;
use super::value::Quota;
use miette::SourceSpan;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Everything the checker carries while it walks the files.
pub struct Checker {
    pub sources: Sources,
    pub errors: Vec<SiteError>,
    /// What is worth a word but not wrong (said by `deploy check` only).
    pub warnings: Vec<SiteError>,
    policies: HashMap<PathBuf, Option<Arc<Policy>>>,
    /// Where each policy's `spread` is written.
    spreads: super::spread::Written,
}

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Files from this size on go to a host over a connection of their own (`direct-above`).
pub const DEFAULT_DIRECT_ABOVE: u64 = 64 << 20;

impl Checker {
    pub fn new() -> Self {
        Checker {
            sources: Sources::default(),
            errors: Vec::new(),
            warnings: Vec::new(),
            policies: HashMap::new(),
            spreads: Vec::new(),
        }
    }

    /// Reads the site at `path` and everything it names; `None` when anything is wrong.
    pub fn site(&mut self, path: &Path) -> Option<Site> {
        let (src, raw) = include::read(&mut self.sources, &mut self.errors, path)?;
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
        let (classes, class_ids) = self.classes(&raw);
        let site_env = check_files::env(
            &mut Reader {
                src: &src,
                errors: &mut self.errors,
            },
            &raw.env,
        );
        let state_dir = platform.as_ref().map(|(p, _, _)| {
            p.state_dir
                .as_ref()
                .map_or("/var/lib/drover", |s| s.value.as_str())
                .to_string()
        });
        let services = self.services(Context {
            raw: &raw,
            classes: &class_ids,
            default_policy,
            site_env: &site_env,
            state_dir: state_dir.as_deref(),
        });
        let platform = platform.and_then(|p| self.platform_model(p, &class_ids));
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
        let platform = platform?;
        let mut services: IdVec<ServiceId, Service> = services?.into();
        for (cid, class) in classes.enumerate() {
            for &sid in &class.services {
                services[sid].classes.push(cid);
            }
        }
        let order = cycle::order(services.as_slice());
        let site = Site {
            name: name.value,
            file: path.to_path_buf(),
            digest: self.sources.digest(),
            sources: self.sources.files().iter().map(PathBuf::from).collect(),
            platform,
            classes,
            services,
            order,
            max_failed: raw.max_failed.as_ref().map(|m| m.value),
            prune: raw.prune.as_ref().is_some_and(|p| p.value),
            secrets,
        };
        self.warnings = super::spread::warnings(&site, &self.spreads);
        Some(site)
    }

    fn classes(&mut self, raw: &RawSite) -> (IdVec<ClassId, Class>, Classes) {
        let mut ids = Classes::new();
        let mut classes = IdVec::new();
        let service_names: Vec<&str> = raw.services.iter().map(|s| s.name.value.as_str()).collect();
        let service_ids = first_index(&service_names);
        for c in &raw.classes {
            let src = &c.origin.src;
            if let Some((_, first, first_src)) = ids.get(&c.name.value) {
                self.errors.push(SiteError::duplicate(
                    "class",
                    &c.name.value,
                    (first_src, *first),
                    (src, c.name.span),
                    "rename one of them or merge them into one `class`".into(),
                ));
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
            ids.insert(
                c.name.value.clone(),
                (ClassId::new(classes.len()), c.name.span, src.clone()),
            );
            classes.push(Class {
                name: c.name.value.clone(),
                services: members.into_iter().map(|m| m.0).collect(),
            });
        }
        (classes, ids)
    }

    pub(super) fn policy(
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
        let mut spread = None;
        let policy = loaded.and_then(|(psrc, doc)| {
            let raw = raw::policy(
                &mut Reader {
                    src: &psrc,
                    errors: &mut self.errors,
                },
                &doc,
            );
            spread = raw.spread.as_ref().map(|s| (psrc.clone(), s.span));
            policy_model(
                &mut Reader {
                    src: &psrc,
                    errors: &mut self.errors,
                },
                raw,
            )
        });
        let policy = policy.map(Arc::new);
        if let (Some(p), Some((psrc, span))) = (&policy, spread) {
            self.spreads.push((p.clone(), psrc, span));
        }
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
        classes: &Classes,
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
            Some(inv) => super::check_inventory::inventory(self, inv, &src, &path, classes),
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
            keep_generations: raw
                .keep_generations
                .map_or(DEFAULT_GENERATIONS, |k| k.value as usize),
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

    pub(super) fn unknown(
        &mut self,
        src: &Src,
        kind: &str,
        name: &Spanned<String>,
        known: &[&str],
    ) {
        self.errors.push(SiteError::UnknownName {
            kind: kind.into(),
            name: name.value.clone(),
            src: src.clone(),
            span: name.span,
            help: suggest::help(&name.value, kind, known),
        });
    }
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}

/// The checked policy, every problem in it reported (none stops the others being found).
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
    let mut valid = true;
    if let Some(b) = &raw.batch {
        if b.value == Quota::Count(0) || b.value == Quota::Percent(0) {
            r.bad(
                b.span,
                "the batch size".into(),
                "a batch of 0 never finishes".into(),
                "use at least 1 host or a percentage above 0%".into(),
            );
            valid = false;
        }
    }
    if let Some(d) = raw.progress_deadline.as_ref().filter(|d| d.value.is_zero()) {
        r.bad(
            d.span,
            "the progress deadline".into(),
            "a deadline of 0 stops every service at once".into(),
            "give the longest a service may go without a host starting or ending its step, \
             e.g. `progress-deadline \"10m\"`"
                .into(),
        );
        valid = false;
    }
    let on_failure = match raw.on_failure {
        None => Some(defaults.on_failure),
        Some(s) => choice(r, &s, "`on-failure`", &OnFailure::ALL),
    };
    let flow = match raw.flow {
        None => Some(defaults.flow),
        Some(s) => choice(r, &s, "`flow`", &Flow::ALL),
    };
    let spread_at = raw
        .spread
        .as_ref()
        .map(|s| format!("{}:{}", r.src.name(), super::error::line_of(r.src, s.span)));
    if !valid {
        return None;
    }
    Some(Policy {
        name: name.value,
        flow: flow?,
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
        spread_at,
        on_failure: on_failure?,
        progress_deadline: raw
            .progress_deadline
            .map(|d| d.value)
            .or(defaults.progress_deadline),
    })
}

/// The value of `choices` named by `written`, or a problem reported with the near name.
fn choice<T: Copy>(
    r: &mut Reader<'_>,
    written: &Spanned<String>,
    what: &str,
    choices: &[(&str, T)],
) -> Option<T> {
    if let Some((_, v)) = choices.iter().find(|(n, _)| *n == written.value) {
        return Some(*v);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    r.bad(
        written.span,
        what.into(),
        format!("`{}` is not a choice", written.value),
        suggest::help(&written.value, "choice", &names),
    );
    None
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
                persist: t.persist.map_or(std::time::Duration::ZERO, |p| p.value),
                accept_new_host_keys: false,
                direct_above: t
                    .direct_above
                    .map_or(Some(DEFAULT_DIRECT_ABOVE), |d| d.value),
            }))
        }
        "local" => {
            let port = t.port.as_ref().map(|p| p.span);
            let timeout = t.connect_timeout.as_ref().map(|c| c.span);
            let keep = t.keep_shell.as_ref().map(|k| k.span);
            let persist = t.persist.as_ref().map(|p| p.span);
            let direct = t.direct_above.as_ref().map(|d| d.span);
            let ssh_only = [&t.user, &t.identity, &t.known_hosts, &t.config]
                .into_iter()
                .flatten()
                .map(|s| s.span)
                .chain(port)
                .chain(timeout)
                .chain(keep)
                .chain(persist)
                .chain(direct)
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
