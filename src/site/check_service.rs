//! Services: every `service` and `template` node checked once, in the file it is written in;
//! then each service merged from the templates it takes (most general first) and its own nodes.

use super::check::Checker;
use super::check_files;
use super::cycle::{self, Edge};
use super::error::{SiteError, Src};
use super::model::*;
use super::raw::{HookKind, RawHook, RawSecret, RawService, RawSite};
use super::read::Reader;
use super::source::beside;
use super::template;
use super::value::Quota;
use miette::SourceSpan;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The classes by name: index, and where the class is written.
pub type Classes = BTreeMap<String, (ClassId, SourceSpan, Src)>;

/// One `service` or `template` node's own children, checked.
#[derive(Clone, Default)]
struct Layer {
    /// Every child checked without a problem.
    ok: bool,
    version: Option<String>,
    port: Option<u16>,
    needs: Vec<(Need, Edge)>,
    /// Given (`Some`), and then whether it loaded.
    policy: Option<Option<Arc<Policy>>>,
    hooks: Hooks,
    secrets: Vec<Secret>,
    env: Vec<(String, String)>,
    files: Vec<File>,
    /// Where each file's `to=` is written, for the class check (`check_files::shared`).
    places: Vec<check_files::Place>,
}

impl Layer {
    /// `self` with `top`'s nodes on it: single-valued ones replace, repeatable ones add up
    /// (an `env` or `secret` of the same name, or a `file` to the same path, replaces).
    fn with(mut self, top: &Layer) -> Layer {
        self.ok &= top.ok;
        if top.version.is_some() {
            self.version.clone_from(&top.version);
        }
        if top.port.is_some() {
            self.port = top.port;
        }
        if top.policy.is_some() {
            self.policy.clone_from(&top.policy);
        }
        let (h, t) = (&mut self.hooks, &top.hooks);
        for (mine, theirs) in [
            (&mut h.stop, &t.stop),
            (&mut h.install, &t.install),
            (&mut h.migrate, &t.migrate),
            (&mut h.start, &t.start),
            (&mut h.rollback, &t.rollback),
            (&mut h.reload, &t.reload),
            (&mut h.remove, &t.remove),
        ] {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
        if t.check.is_some() {
            h.check.clone_from(&t.check);
        }
        self.needs.extend(top.needs.iter().cloned());
        self.secrets
            .retain(|s| !top.secrets.iter().any(|t| t.name == s.name));
        self.secrets.extend(top.secrets.iter().cloned());
        self.env = check_files::merged_env(&self.env, &top.env);
        self.files
            .retain(|f| !top.files.iter().any(|t| t.to == f.to));
        self.files.extend(top.files.iter().cloned());
        self.places
            .retain(|p| !top.places.iter().any(|t| t.to == p.to));
        self.places.extend(top.places.iter().cloned());
        self
    }
}

/// What every service is checked against.
pub struct Context<'a> {
    pub raw: &'a RawSite,
    pub classes: &'a Classes,
    pub default_policy: Option<Arc<Policy>>,
    pub site_env: &'a [(String, String)],
    /// The platform's `state-dir`, when its file could be read: no `file` may go there.
    pub state_dir: Option<&'a str>,
}

impl Checker {
    /// The site's services, in declaration order; every problem is reported, runtime cycles
    /// among the services' resolved needs included. `None` when anything is wrong.
    pub(super) fn services(&mut self, cx: Context<'_>) -> Option<Vec<Service>> {
        let raw = cx.raw;
        let names: Vec<&str> = raw.services.iter().map(|s| s.name.value.as_str()).collect();
        let ids = first_index(&names);
        let chains = template::chains(raw, &mut self.errors);
        let hook_timeout = raw.hook_timeout.as_ref().map(|t| t.value);
        let templates: Vec<Layer> = raw
            .templates
            .iter()
            .map(|t| self.layer(t, true, &names, &ids, hook_timeout))
            .collect();
        // The services some declared class runs, found once rather than once per service.
        let in_classes: HashSet<&str> = raw
            .classes
            .iter()
            .filter(|c| cx.classes.contains_key(&c.name.value))
            .flat_map(|c| c.services.iter().map(|m| m.value.as_str()))
            .collect();
        let mut seen: HashMap<&str, &RawService> = HashMap::new();
        let mut out = Vec::with_capacity(raw.services.len());
        let mut edges: Vec<Vec<Edge>> = vec![Vec::new(); raw.services.len()];
        let mut places: Vec<Vec<check_files::Place>> = vec![Vec::new(); raw.services.len()];
        let mut ok = true;
        for (i, s) in raw.services.iter().enumerate() {
            if let Some(first) = seen.get(s.name.value.as_str()) {
                self.errors.push(SiteError::duplicate(
                    "service",
                    &s.name.value,
                    (&first.origin.src, first.name.span),
                    (&s.origin.src, s.name.span),
                    "rename one of them or merge them into one `service`".into(),
                ));
                ok = false;
                continue;
            }
            seen.insert(&s.name.value, s);
            if !in_classes.contains(s.name.value.as_str()) {
                self.orphan(s, cx.classes);
            }
            let own = self.layer(s, false, &names, &ids, hook_timeout);
            let merged = match &chains.services[i] {
                Some(chain) => chain.iter().map(|t| &templates[*t]).chain([&own]).fold(
                    Layer {
                        ok: true,
                        ..Layer::default()
                    },
                    |m, l| m.with(l),
                ),
                None => Layer { ok: false, ..own },
            };
            places[i].clone_from(&merged.places);
            edges[i] = merged
                .needs
                .iter()
                .filter(|(n, _)| n.healthy.is_some())
                .map(|(_, e)| e.clone())
                .collect();
            let version = merged
                .version
                .clone()
                .or_else(|| raw.version.as_ref().map(|v| v.value.clone()));
            if version.is_none() {
                self.errors.push(SiteError::Missing {
                    what: format!("a version for `{}`", s.name.value),
                    src: s.origin.src.clone(),
                    span: s.name.span,
                    help: "give the site a default `version \"…\"`, the service its own, or its template one".into(),
                });
            }
            let policy = match merged.policy {
                Some(p) => p,
                None => cx.default_policy.clone(),
            };
            let env = check_files::merged_env(cx.site_env, &merged.env);
            let given = merged.ok && {
                let needs: Vec<&str> = merged
                    .needs
                    .iter()
                    .map(|(n, _)| names[n.service.index()])
                    .collect();
                let env: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
                super::template_names::check(
                    &s.name.value,
                    &merged.files,
                    &needs,
                    &env,
                    &mut self.errors,
                )
            };
            match (version, policy, merged.ok && given) {
                (Some(version), Some(policy), true) => out.push(Service {
                    name: s.name.value.clone(),
                    version,
                    port: merged.port,
                    classes: Vec::new(),
                    needs: merged.needs.into_iter().map(|(n, _)| n).collect(),
                    policy,
                    hooks: merged.hooks,
                    secrets: merged.secrets,
                    env,
                    files: merged.files,
                }),
                _ => ok = false,
            }
        }
        cycle::report(&names, &edges, &mut self.errors);
        let before = self.errors.len();
        check_files::shared(raw, &ids, &places, &mut self.errors);
        if let Some(state_dir) = cx.state_dir {
            check_files::outside_state_dir(state_dir, &places, &mut self.errors);
        }
        ok &= self.errors.len() == before;
        ok.then_some(out)
    }

    fn orphan(&mut self, s: &RawService, classes: &Classes) {
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
            src: s.origin.src.clone(),
            span: s.name.span,
            help,
        });
    }

    /// The children of one `service` or `template` node, checked in its own file.
    fn layer(
        &mut self,
        s: &RawService,
        is_template: bool,
        names: &[&str],
        ids: &HashMap<&str, ServiceId>,
        hook_timeout: Option<Duration>,
    ) -> Layer {
        let before = self.errors.len();
        let (src, path) = (&s.origin.src, s.origin.path.as_path());
        let via = is_template.then(|| s.name.value.clone());
        let needs = self.needs(s, via, names, ids);
        let secrets = secrets(
            &mut Reader {
                src,
                errors: &mut self.errors,
            },
            path,
            &s.secrets,
        );
        let mut reader = Reader {
            src,
            errors: &mut self.errors,
        };
        let env = check_files::env(&mut reader, &s.env);
        let (files, places) = check_files::files(&mut reader, &mut self.sources, path, &s.files);
        let policy = s.policy.as_ref().map(|p| self.policy(path, src, p));
        Layer {
            ok: self.errors.len() == before && !matches!(policy, Some(None)),
            version: s.version.as_ref().map(|v| v.value.clone()),
            port: s.port.as_ref().and_then(|p| u16::try_from(p.value).ok()),
            needs,
            policy,
            hooks: hooks(&s.hooks, hook_timeout),
            secrets,
            env,
            files,
            places,
        }
    }

    /// The `needs` of one node that name a known service (the others are reported), each
    /// with where it is written.
    fn needs(
        &mut self,
        s: &RawService,
        via: Option<String>,
        names: &[&str],
        ids: &HashMap<&str, ServiceId>,
    ) -> Vec<(Need, Edge)> {
        let mut out = Vec::new();
        for n in &s.needs {
            let Some(&service) = ids.get(n.service.value.as_str()) else {
                self.unknown(&s.origin.src, "service", &n.service, names);
                continue;
            };
            let healthy = match (&n.healthy, &n.addressable) {
                (None, None) => Some(Quota::All),
                (h, _) => h.as_ref().map(|h| h.value),
            };
            let need = Need {
                service,
                healthy,
                addressable: n.addressable.as_ref().map(|a| a.value),
                drain: n.drain.as_ref().is_some_and(|d| d.value),
            };
            let edge = Edge {
                to: service,
                src: s.origin.src.clone(),
                span: n.span,
                via: via.clone(),
            };
            out.push((need, edge));
        }
        out
    }
}

/// Each name → the index of its first occurrence (later duplicates are reported elsewhere).
pub fn first_index<'a>(names: &[&'a str]) -> HashMap<&'a str, ServiceId> {
    let mut ids = HashMap::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        ids.entry(*n).or_insert(ServiceId::new(i));
    }
    ids
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
            HookKind::Remove => h.remove = plain,
            HookKind::Check => {
                h.check = Some(Check {
                    command: hook.command.clone(),
                    timeout: hook.timeout.unwrap_or(DEFAULT_CHECK_TIMEOUT),
                    interval: hook.interval.unwrap_or(DEFAULT_CHECK_INTERVAL),
                    stable: hook.stable.unwrap_or_default(),
                })
            }
        }
    }
    h
}

/// Checks `secret` nodes of one scope (the site, or one service): a name fit for an
/// environment variable and not one of drover's own, given once, with exactly one source.
pub fn secrets(r: &mut Reader<'_>, named_in: &Path, raw: &[RawSecret]) -> Vec<Secret> {
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
                SecretSource::File(beside(named_in, &file.value))
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
