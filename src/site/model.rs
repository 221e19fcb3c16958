//! The checked site model: every name resolved, every value parsed, no optional soup.

use super::ids::IdVec;
pub use super::ids::{ClassId, ServiceId};
use super::value::Quota;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A whole site: classes, services, their dependencies, the platform and policies.
#[derive(Debug, Clone)]
pub struct Site {
    pub name: String,
    /// The site file as the operator named it.
    pub file: PathBuf,
    /// sha256 over every file read (site, platform, policies), in reading order.
    pub digest: String,
    /// Every file read for it (site, platform, policies, includes, templates, hosts files), in
    /// reading order, as named from where `deploy` runs: what a run's snapshot keeps
    /// (`crate::history`).
    pub sources: Vec<PathBuf>,
    pub platform: Platform,
    pub classes: IdVec<ClassId, Class>,
    pub services: IdVec<ServiceId, Service>,
    /// Services in dependency order: a service comes after every service it needs at runtime;
    /// ties keep declaration order.
    pub order: Vec<ServiceId>,
    /// The run's failure budget (`max-failed` in the `site` node): no new wave of any service
    /// starts once more hosts than this have failed across the run. `None`: no run budget.
    pub max_failed: Option<Quota>,
    /// `prune #true` in the `site` node: `apply` carries out the plan's removals without
    /// `--prune`.
    pub prune: bool,
    /// Secrets every service's hooks get (`secret` in the `site` node); read at apply time.
    pub secrets: Vec<Secret>,
}

/// A value read on the controller at apply time and handed to hooks as an environment
/// variable; never written into a plan, a log or an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The environment variable the hooks see.
    pub name: String,
    pub source: SecretSource,
}

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The controller's environment variable of this name.
    Env(String),
    /// A file on the controller (relative paths are resolved against the site file's directory).
    File(PathBuf),
}

/// A role that hosts play, and the services that role runs.
#[derive(Debug, Clone)]
pub struct Class {
    pub name: String,
    pub services: Vec<ServiceId>,
}

/// A service: its version, hooks, dependencies and rollout policy.
#[derive(Debug, Clone)]
pub struct Service {
    pub name: String,
    pub version: String,
    pub port: Option<u16>,
    /// The classes that run it (never empty).
    pub classes: Vec<ClassId>,
    pub needs: Vec<Need>,
    pub policy: Arc<Policy>,
    pub hooks: Hooks,
    /// Secrets only this service's hooks get (besides the site's).
    pub secrets: Vec<Secret>,
    /// The variables its hooks get from `env` nodes: the site's, then the service's own (which
    /// win), sorted by name, each name once.
    pub env: Vec<(String, String)>,
    /// Files delivered to each of its hosts before `install` (or `reload`).
    pub files: Vec<File>,
}

/// A `file` node: a file on the controller delivered to each host of the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// On the controller, relative to the file that named it.
    pub source: PathBuf,
    /// Absolute path on the host.
    pub to: String,
    /// `None`: 0644, or 0600 for a template that uses `secrets`.
    pub mode: Option<u32>,
    /// `template=#true`: the source's text, rendered per host with minijinja.
    pub template: Option<Arc<Template>>,
}

/// A template file's text, read and syntax-checked when the site is loaded.
#[derive(Debug, PartialEq, Eq)]
pub struct Template {
    pub text: String,
    /// Whether it uses the `secrets` variable (its output is then secret: mode 0600, never
    /// logged, its digest keyed like a secret's).
    pub secret: bool,
}

impl File {
    /// The mode the file gets on the host.
    pub fn mode(&self) -> u32 {
        self.mode.unwrap_or(match &self.template {
            Some(t) if t.secret => 0o600,
            _ => 0o644,
        })
    }
}

/// A dependency on another service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub service: ServiceId,
    /// Runtime: this many of the needed service's hosts must be at their new version and healthy
    /// before this service starts.
    pub healthy: Option<Quota>,
    /// Data: this service's hooks get the needed service's addresses; no ordering.
    pub addressable: Option<Quota>,
    /// `drain=#true`: before a wave of the needed service stops its hosts, this service's
    /// hosts drop them from its configuration, and list them again once their steps ended
    /// (done anyway when their address or port changes).
    pub drain: bool,
}

/// The switch-over hooks of a service; each is optional.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    pub stop: Option<Hook>,
    pub install: Option<Hook>,
    pub migrate: Option<Hook>,
    pub start: Option<Hook>,
    pub check: Option<Check>,
    pub rollback: Option<Hook>,
    /// A reconfigure runs this (files → `reload` → `check`) instead of the whole switch-over.
    pub reload: Option<Hook>,
    /// Run after `stop` when the service leaves a host (a removal, `--prune`); what runs then
    /// is the text the host recorded, not the site's.
    pub remove: Option<Hook>,
}

/// A shell command run with `/bin/sh -c` on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub command: String,
    /// Kill the hook after this long (none: no limit).
    pub timeout: Option<Duration>,
}

/// A health check, retried every `interval` until it passes or `timeout` runs out; with
/// `stable`, run again every `interval` once it passed, and healthy only once it passed
/// throughout that long (a failure meanwhile fails the step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub command: String,
    pub timeout: Duration,
    pub interval: Duration,
    /// Zero: healthy at the first pass.
    pub stable: Duration,
}

/// How a service's hosts are rolled out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub batch: Quota,
    pub max_failed: Quota,
    /// The wave's failure budget: once more of a wave's hosts than this have failed, no new
    /// step of that wave starts. A share is of the wave's hosts. `None`: no wave budget.
    pub wave_max_failed: Option<Quota>,
    pub canary: u64,
    pub pause: Pause,
    pub spread: Option<String>,
    /// `file:line` of the `spread` node, for a tag found on no host once the hosts are known.
    pub spread_at: Option<String>,
    pub on_failure: OnFailure,
    /// Whether the next wave's hosts may take a freed slot before the open wave has ended.
    pub flow: Flow,
    /// A service that starts no step and ends none for this long is stopped as failed.
    pub progress_deadline: Option<Duration>,
}

impl Default for Policy {
    /// The built-in policy for a site that names none: a quarter of the hosts at a time,
    /// no failure tolerated, roll back on failure.
    fn default() -> Self {
        Policy {
            name: "default".into(),
            batch: Quota::Percent(2500),
            max_failed: Quota::Count(0),
            wave_max_failed: None,
            canary: 0,
            pause: Pause::Wait(Duration::ZERO),
            spread: None,
            spread_at: None,
            on_failure: OnFailure::Rollback,
            flow: Flow::Slots,
            progress_deadline: None,
        }
    }
}

/// When a service's next hosts may start before its open wave has ended (the policy's
/// `flow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flow {
    /// `batch` is a concurrency limit, as Nomad's `max_parallel`: a freed slot goes to the
    /// next host at once, the failure budgets checked before each new host starts.
    #[default]
    Slots,
    /// A later wave takes a freed slot only while the failure budgets would hold even if every
    /// step still running failed (so with `max-failed 0`, never).
    Budget,
    /// Each wave waits for the whole one before it.
    Waves,
}

impl OnFailure {
    pub const ALL: [(&'static str, OnFailure); 4] = [
        ("rollback", OnFailure::Rollback),
        ("stop", OnFailure::Stop),
        ("continue", OnFailure::Continue),
        ("revert", OnFailure::Revert),
    ];
}

impl Flow {
    pub const ALL: [(&'static str, Flow); 3] = [
        ("slots", Flow::Slots),
        ("budget", Flow::Budget),
        ("waves", Flow::Waves),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Flow::Slots => "slots",
            Flow::Budget => "budget",
            Flow::Waves => "waves",
        }
    }
}

/// What happens between waves. In a saved plan, as written in a policy: a duration (`"30s"`)
/// or `"confirm"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    Wait(Duration),
    /// Ask on a terminal; refuse without one.
    Confirm,
}

impl Pause {
    /// Whether waves follow one another at once.
    pub fn is_none(&self) -> bool {
        *self == Pause::Wait(Duration::ZERO)
    }
}

impl std::fmt::Display for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pause::Wait(d) => f.write_str(&super::format_duration(*d)),
            Pause::Confirm => f.write_str("confirm"),
        }
    }
}

impl serde::Serialize for Pause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Pause {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "confirm" => Ok(Pause::Confirm),
            t => super::parse_duration(t).map(Pause::Wait).map_err(|e| {
                serde::de::Error::custom(format!(
                    "pause {t:?}: {e} (a duration such as \"30s\", or \"confirm\")"
                ))
            }),
        }
    }
}

/// What a failed host does to the rest of the service's rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Run `rollback` on the failed host; start no new wave once more hosts than
    /// `max-failed` allows have failed.
    Rollback,
    /// Leave the failed host exactly as it failed (no `rollback`, for inspection) and start
    /// no new wave after the first failure, whatever the budget.
    Stop,
    /// Run `rollback` on the failed host and keep starting waves whatever fails;
    /// `max-failed` is only reported.
    Continue,
    /// As `Rollback`, and once `max-failed` is spent every host of the service this run
    /// switched is switched back to what it ran before (last switched first, `batch` at a
    /// time); then the run stops.
    Revert,
}

/// Where the hosts are and how to reach them.
#[derive(Debug, Clone)]
pub struct Platform {
    pub name: String,
    pub file: PathBuf,
    pub transport: Transport,
    /// Where each host records what it runs.
    pub state_dir: String,
    /// How many generations of each service's file contents a host keeps in its state
    /// directory (`keep-generations`, 1 to 100): the current one and those it replaced.
    pub keep_generations: usize,
    pub inventory: InventorySpec,
    /// What a class that resolves to no hosts is.
    pub on_empty: OnEmpty,
    /// Where the fleet's state is kept besides each host (`store "etcd"`); `None`: the hosts'
    /// own files only.
    pub store: Option<StoreSpec>,
}

/// `keep-generations` when the platform does not say.
pub const DEFAULT_GENERATIONS: usize = 3;

/// `store "etcd"`: the fleet's lock and state on an etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec {
    /// `http://host:port` or `https://host:port`, at least one.
    pub endpoints: Vec<String>,
    /// Every key is under `<prefix>/<site>/`.
    pub prefix: String,
    /// The lock's lease: a controller that stops renewing it loses the lock after this long.
    pub lock_ttl: Duration,
    pub tls: Option<StoreTls>,
    pub auth: Option<StoreAuth>,
}

/// TLS to etcd: the CA that signed its certificates, and the controller's own certificate and
/// key when etcd asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreTls {
    pub ca: PathBuf,
    pub client: Option<(PathBuf, PathBuf)>,
}

/// etcd's own users: the password is read from the environment variable at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreAuth {
    pub user: String,
    pub password_env: String,
}

/// A class that resolves to no hosts: an error (the default) or a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEmpty {
    Error,
    Warn,
}

/// How commands reach a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Ssh(SshOptions),
    /// Each host is a directory under `root` on this machine.
    Local {
        root: PathBuf,
    },
}

/// Options of the ssh transport; unset ones come from the user's ssh_config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SshOptions {
    pub user: Option<String>,
    pub port: Option<u16>,
    pub identity: Option<PathBuf>,
    pub known_hosts: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub connect_timeout: Duration,
    /// From a link's second command on, send commands to one shell kept open on the host
    /// instead of a session each (`keep-shell`, on unless `#false`).
    pub keep_shell: bool,
    /// Keep each host's connection open this long after a command ends (`persist`, as
    /// OpenSSH's ControlPersist), for the next command to use; zero (the default): closed at
    /// the end of each command.
    pub persist: Duration,
    /// Accept and record the key of a host not yet in known_hosts (OpenSSH's
    /// `StrictHostKeyChecking accept-new`); a changed key is still refused. Never set from a
    /// file: only `deploy apply --accept-new-host-keys` turns it on, for one run.
    pub accept_new_host_keys: bool,
    /// Files of at least this many bytes go to the host over a connection of their own
    /// (`direct-above`), not through its master; `None`: every file through the master.
    pub direct_above: Option<u64>,
}

/// Where class → hosts comes from.
#[derive(Debug, Clone)]
pub enum InventorySpec {
    /// Hosts written in the platform file or a hosts file beside it.
    Static { hosts: Vec<HostSpec> },
    /// Running EC2 instances, per class by tags.
    Ec2(Ec2Spec),
    /// A program that prints the hosts as JSON.
    Command(CommandSpec),
}

/// The `ec2` backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ec2Spec {
    /// `None`: from the AWS configuration (AWS_REGION, the profile).
    pub region: Option<String>,
    /// `None`: AWS_ENDPOINT_URL, else AWS itself.
    pub endpoint: Option<String>,
    pub profile: Option<String>,
    pub address: AddressField,
    /// Per class, the tags (key, value) its instances all carry.
    pub classes: Vec<(ClassId, Vec<(String, String)>)>,
}

/// Which field of an instance is its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressField {
    PrivateIp,
    PublicIp,
    Ipv6,
    PrivateDns,
    PublicDns,
}

impl AddressField {
    pub const NAMES: [(&'static str, AddressField); 5] = [
        ("private-ip", AddressField::PrivateIp),
        ("public-ip", AddressField::PublicIp),
        ("ipv6", AddressField::Ipv6),
        ("private-dns", AddressField::PrivateDns),
        ("public-dns", AddressField::PublicDns),
    ];
}

/// The `command` backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Where it runs: the platform file's directory.
    pub dir: PathBuf,
    pub timeout: Duration,
}

/// One host of a static inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub name: String,
    pub address: String,
    pub class: ClassId,
    /// Every other property: zone, rack, …
    pub tags: BTreeMap<String, String>,
}

impl Platform {
    /// The state directory as the transport sees it: on the local transport, a path inside
    /// the host's directory.
    pub fn host_state_dir(&self) -> String {
        match self.transport {
            Transport::Local { .. } => self.state_dir.trim_start_matches('/').to_string(),
            Transport::Ssh(_) => self.state_dir.clone(),
        }
    }
}

impl Platform {
    /// A path on a host as the transport sees it: on the local transport, inside the host's
    /// directory.
    pub fn host_path(&self, path: &str) -> String {
        match self.transport {
            Transport::Local { .. } => path.trim_start_matches('/').to_string(),
            Transport::Ssh(_) => path.to_string(),
        }
    }
}

impl Site {
    /// The service of this name.
    pub fn service(&self, name: &str) -> Option<ServiceId> {
        self.services.position(|s| s.name == name)
    }

    /// The class of this name.
    pub fn class(&self, name: &str) -> Option<ClassId> {
        self.classes.position(|c| c.name == name)
    }
}

#[cfg(test)]
mod pause_tests {
    use super::Pause;
    use std::time::Duration;

    #[test]
    fn a_saved_pause_reads_back_and_a_bad_one_is_an_error_not_a_confirmation() {
        for p in [
            Pause::Wait(Duration::ZERO),
            Pause::Wait(Duration::from_millis(1500)),
            Pause::Confirm,
        ] {
            let text = serde_json::to_string(&p).expect("serialises");
            assert_eq!(serde_json::from_str::<Pause>(&text).expect("reads"), p);
        }
        assert_eq!(
            serde_json::to_string(&Pause::Confirm).unwrap(),
            "\"confirm\""
        );
        let err = serde_json::from_str::<Pause>("\"confrim\"").expect_err("refused");
        assert!(err.to_string().contains("\"confrim\""), "{err}");
    }
}
