//! KDL documents → raw site, policy and platform nodes: typed, with spans, not yet cross-checked.

use super::error::Src;
use super::read::{Reader, Spanned};
use super::value::Quota;
use kdl::{KdlDocument, KdlNode};
use miette::SourceSpan;
use std::path::PathBuf;
use std::time::Duration;

/// The file a node was written in: its text, for diagnostics, and its path, against which the
/// node's relative paths (policies, files, secrets) resolve.
#[derive(Debug, Clone)]
pub struct Origin {
    pub src: Src,
    pub path: PathBuf,
}

/// The site file.
#[derive(Debug, Default)]
pub struct RawSite {
    pub name: Option<Spanned<String>>,
    pub version: Option<Spanned<String>>,
    pub platform: Option<Spanned<String>>,
    pub policy: Option<Spanned<String>>,
    /// The default `timeout=` of every hook but `check`.
    pub hook_timeout: Option<Spanned<Duration>>,
    /// The run's failure budget.
    pub max_failed: Option<Spanned<Quota>>,
    /// `prune #true`: `apply` carries out removals without `--prune`.
    pub prune: Option<Spanned<bool>>,
    pub secrets: Vec<RawSecret>,
    pub env: Vec<RawEnv>,
    /// In declaration order, included files read in place of their `include` node.
    pub classes: Vec<RawClass>,
    pub services: Vec<RawService>,
    /// `template` nodes: service children under a name, for services to take.
    pub templates: Vec<RawService>,
    /// Where a missing `site` node would go (the start of the file).
    pub site_span: Option<SourceSpan>,
}

#[derive(Debug)]
pub struct RawClass {
    pub name: Spanned<String>,
    pub services: Vec<Spanned<String>>,
    pub origin: Origin,
}

/// A `service` node, or a `template` node (which holds the same children).
#[derive(Debug)]
pub struct RawService {
    pub name: Spanned<String>,
    /// `template="NAME"`: the template whose children this one takes.
    pub template: Option<Spanned<String>>,
    pub origin: Origin,
    pub version: Option<Spanned<String>>,
    pub port: Option<Spanned<u64>>,
    pub needs: Vec<RawNeed>,
    pub policy: Option<Spanned<String>>,
    pub hooks: Vec<RawHook>,
    pub secrets: Vec<RawSecret>,
    pub env: Vec<RawEnv>,
    pub files: Vec<RawFile>,
}

/// `env "NAME" "value"`.
#[derive(Debug)]
pub struct RawEnv {
    pub name: Spanned<String>,
    pub value: String,
}

/// `file "source" to="/abs/path" mode="0644" template=#true`.
#[derive(Debug)]
pub struct RawFile {
    pub source: Spanned<String>,
    pub to: Option<Spanned<String>>,
    pub mode: Option<Spanned<String>>,
    pub template: bool,
    /// The whole node, for a missing `to=`.
    pub span: SourceSpan,
}

/// `secret "NAME" env="VAR"` or `secret "NAME" file="path"`.
#[derive(Debug)]
pub struct RawSecret {
    pub name: Spanned<String>,
    pub env: Option<Spanned<String>>,
    pub file: Option<Spanned<String>>,
    /// The node's name, for a secret that names no source.
    pub span: SourceSpan,
}

#[derive(Debug)]
pub struct RawNeed {
    pub service: Spanned<String>,
    pub healthy: Option<Spanned<Quota>>,
    pub addressable: Option<Spanned<Quota>>,
    /// `drain=#true`: dependents drop a host of the needed service before it stops.
    pub drain: Option<Spanned<bool>>,
    /// The whole `needs` line.
    pub span: SourceSpan,
}

#[derive(Debug)]
pub struct RawHook {
    pub kind: HookKind,
    pub command: String,
    pub timeout: Option<Duration>,
    pub interval: Option<Duration>,
    pub stable: Option<Duration>,
}

/// The hooks a service may have, in the order a version change runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    Stop,
    Install,
    Migrate,
    Start,
    Check,
    Rollback,
    Reload,
    /// Run after `stop` when the service leaves its host (a removal).
    Remove,
}

impl HookKind {
    pub const ALL: [(&'static str, HookKind); 8] = [
        ("stop", HookKind::Stop),
        ("install", HookKind::Install),
        ("migrate", HookKind::Migrate),
        ("start", HookKind::Start),
        ("check", HookKind::Check),
        ("rollback", HookKind::Rollback),
        ("reload", HookKind::Reload),
        ("remove", HookKind::Remove),
    ];
}

/// A policy file.
#[derive(Debug, Default)]
pub struct RawPolicy {
    /// Whether the file has a `policy` node at all.
    pub has_node: bool,
    pub name: Option<Spanned<String>>,
    pub batch: Option<Spanned<Quota>>,
    pub max_failed: Option<Spanned<Quota>>,
    pub wave_max_failed: Option<Spanned<Quota>>,
    pub canary: Option<Spanned<u64>>,
    /// `None` inside: "confirm".
    pub pause: Option<Spanned<Option<Duration>>>,
    pub spread: Option<Spanned<String>>,
    pub on_failure: Option<Spanned<String>>,
    pub flow: Option<Spanned<String>>,
    pub progress_deadline: Option<Spanned<Duration>>,
}

/// A platform file.
#[derive(Debug, Default)]
pub struct RawPlatform {
    pub name: Option<Spanned<String>>,
    pub transport: Option<RawTransport>,
    pub state_dir: Option<Spanned<String>>,
    pub keep_generations: Option<Spanned<u64>>,
    pub inventory: Option<super::raw_inventory::RawInventory>,
    pub store: Option<super::raw_store::RawStore>,
    pub span: Option<SourceSpan>,
}

#[derive(Debug)]
pub struct RawTransport {
    pub kind: Spanned<String>,
    pub user: Option<Spanned<String>>,
    pub port: Option<Spanned<u64>>,
    pub identity: Option<Spanned<String>>,
    pub known_hosts: Option<Spanned<String>>,
    pub config: Option<Spanned<String>>,
    pub connect_timeout: Option<Spanned<Duration>>,
    pub keep_shell: Option<Spanned<bool>>,
    pub persist: Option<Spanned<Duration>>,
    /// `direct-above`: a size, or `#false` (`Some(None)`).
    pub direct_above: Option<Spanned<Option<u64>>>,
    pub root: Option<Spanned<String>>,
}

/// The top-level nodes of the site file.
pub const SITE_TOP: &[&str] = &["site", "class", "service", "template", "include"];
/// The top-level nodes of an included file.
pub const INCLUDED_TOP: &[&str] = &["class", "service", "template", "include"];
const SITE_SETTINGS: &[&str] = &[
    "version",
    "platform",
    "policy",
    "hook-timeout",
    "max-failed",
    "prune",
    "secret",
    "env",
];
pub const SERVICE_NODES: &[&str] = &[
    "version", "port", "needs", "policy", "install", "stop", "migrate", "start", "check",
    "rollback", "reload", "remove", "secret", "env", "file",
];
const POLICY_NODES: &[&str] = &[
    "batch",
    "max-failed",
    "wave-max-failed",
    "canary",
    "pause",
    "spread",
    "on-failure",
    "flow",
    "progress-deadline",
];
const PLATFORM_NODES: &[&str] = &[
    "transport",
    "state-dir",
    "inventory",
    "store",
    "keep-generations",
];
const TRANSPORT_PROPS: &[&str] = &[
    "user",
    "port",
    "identity",
    "known-hosts",
    "config",
    "connect-timeout",
    "keep-shell",
    "persist",
    "direct-above",
    "root",
];

/// A `class`, `service` or `template` node of the file `origin`, added to `raw`.
pub fn unit(r: &mut Reader<'_>, node: &KdlNode, origin: &Origin, raw: &mut RawSite) {
    match node.name().value() {
        "class" => raw.classes.extend(class(r, node, origin)),
        "service" => raw.services.extend(service(r, node, origin)),
        _ => raw.templates.extend(service(r, node, origin)),
    }
}

/// The `site` node's settings.
pub fn site_node(r: &mut Reader<'_>, node: &KdlNode, raw: &mut RawSite) {
    r.shape(node, 1, &[], true);
    raw.name = r.string_arg(node, "the site's name");
    let (mut v, mut pl, mut po, mut ht, mut mf, mut pr) = (None, None, None, None, None, None);
    for n in r.children(node, SITE_SETTINGS) {
        match n.name().value() {
            "secret" => {
                raw.secrets.extend(secret(r, n));
                continue;
            }
            "env" => {
                raw.env.extend(env(r, n));
                continue;
            }
            "hook-timeout" => {
                r.shape(n, 1, &[], false);
                if r.once(&mut ht, n) {
                    raw.hook_timeout = r.duration_arg(n, "the default hook timeout");
                }
                continue;
            }
            "max-failed" => {
                r.shape(n, 1, &[], false);
                if r.once(&mut mf, n) {
                    raw.max_failed = r.quota_arg(n, "the run's failure budget");
                }
                continue;
            }
            "prune" => {
                r.shape(n, 1, &[], false);
                if r.once(&mut pr, n) {
                    raw.prune = r.bool_arg(n, "whether apply carries out removals");
                }
                continue;
            }
            _ => {}
        }
        r.shape(n, 1, &[], false);
        let (seen, slot) = match n.name().value() {
            "version" => (&mut v, &mut raw.version),
            "platform" => (&mut pl, &mut raw.platform),
            _ => (&mut po, &mut raw.policy),
        };
        if r.once(seen, n) {
            *slot = r.string_arg(n, &format!("the {}", n.name().value()));
        }
    }
}

/// `env "NAME" "value"`; repeatable.
fn env(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawEnv> {
    r.shape(n, 2, &[], false);
    let name = r.string_arg(n, "the variable's name")?;
    let value = match n.entries().iter().filter(|e| e.name().is_none()).nth(1) {
        Some(e) => match e.value() {
            kdl::KdlValue::String(s) => s.clone(),
            kdl::KdlValue::Integer(i) => i.to_string(),
            kdl::KdlValue::Float(f) => f.to_string(),
            kdl::KdlValue::Bool(b) => b.to_string(),
            kdl::KdlValue::Null => {
                r.bad(
                    e.span(),
                    format!("the value of `{}`", name.value),
                    "null is not a value".into(),
                    format!("write `env \"{}\" \"value\"`", name.value),
                );
                return None;
            }
        },
        None => {
            r.missing(
                Reader::name_span(n),
                format!("the value of `{}`", name.value),
                format!("write `env \"{}\" \"value\"`", name.value),
            );
            return None;
        }
    };
    Some(RawEnv { name, value })
}

/// `file "source" to="/path" mode="0644" template=#true`; repeatable.
fn file(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawFile> {
    r.shape(n, 1, &["to", "mode", "template"], false);
    let to = r.string_prop(n, "to");
    let mode = r.string_prop(n, "mode");
    let template = r.bool_prop(n, "template").is_some_and(|t| t.value);
    let source = r.string_arg(n, "the file's source")?;
    Some(RawFile {
        source,
        to,
        mode,
        template,
        span: Reader::name_span(n),
    })
}

/// `secret "NAME" env="VAR"` or `secret "NAME" file="path"`; repeatable.
fn secret(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawSecret> {
    r.shape(n, 1, &["env", "file"], false);
    let env = r.string_prop(n, "env");
    let file = r.string_prop(n, "file");
    let name = r.string_arg(n, "the secret's name")?;
    Some(RawSecret {
        name,
        env,
        file,
        span: Reader::name_span(n),
    })
}

fn class(r: &mut Reader<'_>, node: &KdlNode, origin: &Origin) -> Option<RawClass> {
    r.shape(node, 1, &[], true);
    let name = r.string_arg(node, "the class's name")?;
    let mut services = Vec::new();
    for n in r.children(node, &["service"]) {
        r.shape(n, usize::MAX, &[], false);
        for e in n.entries().iter().filter(|e| e.name().is_none()) {
            match e.value().as_string() {
                Some(s) => services.push(Spanned {
                    value: s.to_string(),
                    span: e.span(),
                }),
                None => r.bad(
                    e.span(),
                    "`service`".into(),
                    "expected a service name in quotes".into(),
                    "write it as `service \"api\"`".into(),
                ),
            }
        }
        if n.entries().iter().all(|e| e.name().is_some()) {
            r.missing(
                Reader::name_span(n),
                "the service's name".into(),
                "write it as `service \"api\"`".into(),
            );
        }
    }
    Some(RawClass {
        name,
        services,
        origin: origin.clone(),
    })
}

/// A `service` or `template` node: the same children, and `template="NAME"` on either.
fn service(r: &mut Reader<'_>, node: &KdlNode, origin: &Origin) -> Option<RawService> {
    let kind = node.name().value();
    r.shape(node, 1, &["template"], true);
    let template = r.string_prop(node, "template");
    let name = r.string_arg(node, &format!("the {kind}'s name"))?;
    let mut s = RawService {
        name,
        template,
        origin: origin.clone(),
        version: None,
        port: None,
        needs: Vec::new(),
        policy: None,
        hooks: Vec::new(),
        secrets: Vec::new(),
        env: Vec::new(),
        files: Vec::new(),
    };
    let mut seen: [Option<SourceSpan>; SERVICE_NODES.len()] = Default::default();
    let children = node.children().map_or(&[][..], |d| d.nodes());
    let context = format!("`{kind}`");
    let misplaced = |name: &str| {
        SITE_TOP.contains(&name).then(|| {
            format!(
                "`{name}` stands at the top level of a file; a {kind} holds service children only ({})",
                SERVICE_NODES.join(", ")
            )
        })
    };
    for n in r.known_nodes_or(children, &context, SERVICE_NODES, misplaced) {
        let key = n.name().value();
        if key == "needs" {
            s.needs.extend(need(r, n));
            continue;
        }
        match key {
            "secret" => {
                s.secrets.extend(secret(r, n));
                continue;
            }
            "env" => {
                s.env.extend(env(r, n));
                continue;
            }
            "file" => {
                s.files.extend(file(r, n));
                continue;
            }
            _ => {}
        }
        let slot = SERVICE_NODES.iter().position(|k| *k == key).unwrap_or(0);
        if !r.once(&mut seen[slot], n) {
            continue;
        }
        match key {
            "version" => {
                r.shape(n, 1, &[], false);
                s.version = r.string_arg(n, "the version");
            }
            "port" => {
                r.shape(n, 1, &[], false);
                s.port = r.integer_arg(n, "the port", 1, 65535);
            }
            "policy" => {
                r.shape(n, 1, &[], false);
                s.policy = r.string_arg(n, "the policy file");
            }
            _ => s.hooks.extend(hook(r, n)),
        }
    }
    Some(s)
}

fn need(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawNeed> {
    r.shape(n, 1, &["healthy", "addressable", "drain"], false);
    let healthy = r.quota_prop(n, "healthy");
    let addressable = r.quota_prop(n, "addressable");
    let drain = r.bool_prop(n, "drain");
    let service = r.string_arg(n, "the needed service")?;
    Some(RawNeed {
        service,
        healthy,
        addressable,
        drain,
        span: n.span(),
    })
}

fn hook(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawHook> {
    let kind = HookKind::ALL
        .iter()
        .find(|(k, _)| *k == n.name().value())?
        .1;
    let props: &[&str] = if kind == HookKind::Check {
        &["timeout", "interval", "stable"]
    } else {
        &["timeout"]
    };
    r.shape(n, 1, props, false);
    let timeout = r.duration_prop(n, "timeout").map(|d| d.value);
    let (interval, stable) = if kind == HookKind::Check {
        (
            r.duration_prop(n, "interval").map(|d| d.value),
            r.duration_prop(n, "stable").map(|d| d.value),
        )
    } else {
        (None, None)
    };
    let command = r.string_arg(n, "the command")?.value;
    Some(RawHook {
        kind,
        command,
        timeout,
        interval,
        stable,
    })
}

/// Reads a policy file: one `policy` node.
pub fn policy(r: &mut Reader<'_>, doc: &KdlDocument) -> RawPolicy {
    let mut raw = RawPolicy::default();
    let tops = r.known_nodes(doc.nodes(), "a policy file", &["policy"]);
    let mut seen_top = None;
    let mut seen: [Option<SourceSpan>; POLICY_NODES.len()] = Default::default();
    for top in tops {
        if !r.once(&mut seen_top, top) {
            continue;
        }
        raw.has_node = true;
        r.shape(top, 1, &[], true);
        raw.name = r.string_arg(top, "the policy's name");
        for n in r.children(top, POLICY_NODES) {
            let key = n.name().value();
            let slot = POLICY_NODES.iter().position(|k| *k == key).unwrap_or(0);
            if !r.once(&mut seen[slot], n) {
                continue;
            }
            r.shape(n, 1, &[], false);
            match key {
                "batch" => raw.batch = r.quota_arg(n, "the batch size"),
                "max-failed" => raw.max_failed = r.quota_arg(n, "the failure budget"),
                "wave-max-failed" => {
                    raw.wave_max_failed = r.quota_arg(n, "the wave's failure budget")
                }
                "canary" => {
                    raw.canary = r.integer_arg(n, "the canary size", 0, i128::from(u32::MAX))
                }
                "pause" => raw.pause = pause(r, n),
                "spread" => raw.spread = r.string_arg(n, "the tag to spread over"),
                "flow" => raw.flow = r.string_arg(n, "when the next wave may start"),
                "progress-deadline" => {
                    raw.progress_deadline = r.duration_arg(n, "the progress deadline")
                }
                _ => raw.on_failure = r.string_arg(n, "what to do on failure"),
            }
        }
    }
    raw
}

fn pause(r: &mut Reader<'_>, n: &KdlNode) -> Option<Spanned<Option<Duration>>> {
    let is_confirm = n
        .entries()
        .iter()
        .any(|e| e.name().is_none() && e.value().as_string() == Some("confirm"));
    if is_confirm {
        let span = n
            .entries()
            .iter()
            .find(|e| e.name().is_none())
            .map(|e| e.span())?;
        return Some(Spanned { value: None, span });
    }
    r.duration_arg(n, "the pause").map(|d| Spanned {
        value: Some(d.value),
        span: d.span,
    })
}

/// Reads a platform file: one `platform` node.
pub fn platform(r: &mut Reader<'_>, doc: &KdlDocument) -> RawPlatform {
    let mut raw = RawPlatform::default();
    let mut seen_top = None;
    let mut seen: [Option<SourceSpan>; PLATFORM_NODES.len()] = Default::default();
    for top in r.known_nodes(doc.nodes(), "a platform file", &["platform"]) {
        if !r.once(&mut seen_top, top) {
            continue;
        }
        raw.span = Some(Reader::name_span(top));
        r.shape(top, 1, &[], true);
        raw.name = r.string_arg(top, "the platform's name");
        for n in r.children(top, PLATFORM_NODES) {
            let key = n.name().value();
            let slot = PLATFORM_NODES.iter().position(|k| *k == key).unwrap_or(0);
            if !r.once(&mut seen[slot], n) {
                continue;
            }
            match key {
                "transport" => raw.transport = transport(r, n),
                "state-dir" => {
                    r.shape(n, 1, &[], false);
                    raw.state_dir = r.string_arg(n, "the state directory");
                }
                "keep-generations" => {
                    r.shape(n, 1, &[], false);
                    raw.keep_generations =
                        r.integer_arg(n, "how many generations each host keeps", 1, 100);
                }
                "store" => raw.store = super::raw_store::store(r, n),
                _ => raw.inventory = super::raw_inventory::inventory(r, n),
            }
        }
    }
    raw
}

fn transport(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawTransport> {
    r.shape(n, 1, TRANSPORT_PROPS, false);
    Some(RawTransport {
        user: r.string_prop(n, "user"),
        port: r.integer_prop(n, "port", 1, 65535),
        identity: r.string_prop(n, "identity"),
        known_hosts: r.string_prop(n, "known-hosts"),
        config: r.string_prop(n, "config"),
        connect_timeout: r.duration_prop(n, "connect-timeout"),
        keep_shell: r.bool_prop(n, "keep-shell"),
        persist: r.duration_prop(n, "persist"),
        direct_above: r.size_or_off_prop(n, "direct-above"),
        root: r.string_prop(n, "root"),
        kind: r.string_arg(n, "the transport (\"ssh\" or \"local\")")?,
    })
}
