//! The plan: per service, its start condition and its waves of host transitions.
//!
//! A pure function of the checked site, the resolved hosts, what each host runs and what the
//! operator selected. The rollout only carries it out.

mod consistent;
mod decide;
mod drift;
mod expected;
mod host_order;
#[cfg(test)]
mod proptests;
mod removal;
mod rounds;
#[cfg(test)]
mod rounds_tests;
mod spread;
mod waves;

pub use decide::{decide, unread_waits, Decided, STATE_UNREADABLE};
pub use drift::drift;
pub use expected::{deferrable, first_hosts, may_start_early, planned_from, waits_back};
pub use host_order::RuntimeClosure;
pub use removal::{removals, Removal, Why as RemovalWhy};
pub use rounds::{go_round, said, BeforeRun, DroppedWait, Link, LinkKind, Progress, WaitKey};
pub use spread::{check as check_spread, SpreadTagError, SpreadTagErrors};

use decide::{sort, Sorted, Todo};

use crate::desired::Desired;
use crate::inventory::{HostId, Hosts};
use crate::site::{ClassId, Flow, IdVec, OnFailure, Pause, Quota, Round, ServiceId, Site};
use crate::state::Observed;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use thiserror::Error;

/// Version of the plan's JSON schema; bumped on any incompatible change.
/// 2: steps have a `kind`, `reasons` and `waits`; hosts' records have `inputs`.
pub const SCHEMA: u32 = 2;

/// Everything `deploy apply` needs to carry out a change, and everything it was derived from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub schema: u32,
    pub site: String,
    pub site_file: String,
    /// sha256 of every file the site was read from.
    pub site_digest: String,
    pub platform: String,
    /// The inventory snapshot and what each host ran when planned.
    pub hosts: Vec<PlannedHost>,
    /// In dependency order: a service after every service it needs at runtime.
    pub services: Vec<ServicePlan>,
    /// The run's failure budget (the site's `max-failed`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed: Option<Quota>,
    /// No new wave of any service starts once more hosts than this have failed in the run:
    /// `max_failed` of the plan's hosts, rounded down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed_hosts: Option<usize>,
    /// Pool waits left out because they would go round ([`go_round`]): records left by runs
    /// with `--on` or stopped partway may make a member's step wait, in turn, for the step
    /// that waits for it. Each step named here does not wait for the one it names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_waits: Vec<DroppedWait>,
    /// With `plan --diff`: per file a step would place with other content, what changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diffs: Vec<FileDiff>,
    /// Services hosts record that the site no longer runs there: always planned, carried out
    /// only when [`Plan::prune`] holds, after every step of the run has ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removals: Vec<Removal>,
    /// Whether `apply` carries out [`Plan::removals`] (`--prune`, or `prune #true` in the
    /// site).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune: bool,
}

/// How one file a step would place differs from what its host has (`deploy plan --diff`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDiff {
    pub host: String,
    pub service: String,
    pub path: String,
    /// A unified diff (the host's side first), or in brackets what it is instead:
    /// `[secret changed]`, `[binary file]`, `[larger than 256 KiB]`, `[not read: …]`.
    pub diff: String,
}

impl Plan {
    /// Hosts of `service` healthy before the run: they already run its version with no
    /// recorded failure (what its dependents' conditions count from).
    /// A host whose step is unread is not counted (its step counts it once it has read it):
    /// the host may have been read since the plan was made ([`Plan::hosts`] of a plan made
    /// during the run). Nor is a host planned for `repair`: its check failed (its step counts
    /// it once the check passes).
    pub fn healthy_before(&self, service: &ServicePlan) -> usize {
        let uncounted: BTreeSet<&str> = service
            .each_step()
            .filter(|st| matches!(st.kind, StepKind::Unread | StepKind::Repair))
            .map(|st| &*st.host)
            .collect();
        self.hosts
            .iter()
            .filter(|h| service.runs_on(h) && !uncounted.contains(&*h.name))
            .filter(|h| service.healthy_in(h.observed.service(&service.name)))
            .count()
    }

    /// How many host transitions the plan holds.
    pub fn steps(&self) -> usize {
        self.services.iter().map(ServicePlan::steps).sum()
    }

    /// The removals an apply of this plan carries out: all of them with [`Plan::prune`],
    /// otherwise none.
    pub fn removals_carried_out(&self) -> &[Removal] {
        if self.prune {
            &self.removals
        } else {
            &[]
        }
    }
}

/// A host as the inventory gave it and as it was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedHost {
    pub name: Arc<str>,
    pub address: Arc<str>,
    pub classes: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub observed: Observed,
}

/// One service's part of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePlan {
    pub name: String,
    pub version: Arc<str>,
    pub port: Option<u16>,
    pub classes: Vec<String>,
    /// All hosts that run the service, changing or not.
    pub hosts: usize,
    pub policy: PlannedPolicy,
    /// Runtime dependencies: start once each holds.
    pub waits_for: Vec<Condition>,
    /// Data dependencies: addresses handed to the hooks, no ordering.
    pub addresses_of: Vec<Condition>,
    pub waves: Vec<Wave>,
    pub skipped: Vec<Skip>,
}

impl ServicePlan {
    /// The steps of all its waves.
    pub fn steps(&self) -> usize {
        self.waves.iter().map(|w| w.steps.len()).sum()
    }

    /// Each step of its waves, in wave order.
    pub fn each_step(&self) -> impl Iterator<Item = &Step> {
        self.waves.iter().flat_map(|w| &w.steps)
    }

    /// Whether `host` is of a class that runs the service.
    pub fn runs_on(&self, host: &PlannedHost) -> bool {
        host.classes.iter().any(|c| self.classes.contains(c))
    }

    /// Whether a host whose record of the service is `record` runs its version healthy.
    pub fn healthy_in(&self, record: Option<&crate::state::ServiceRecord>) -> bool {
        record.is_some_and(|r| *r.version == *self.version && r.healthy())
    }
}

/// The service's policy with its shares turned into host counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPolicy {
    pub name: String,
    pub batch: Quota,
    /// Hosts per wave (at least 1).
    pub batch_hosts: usize,
    pub max_failed: Quota,
    /// New waves stop once more hosts than this have failed.
    pub max_failed_hosts: usize,
    /// No new step of a wave starts once more of its hosts than this share have failed
    /// (of the wave's hosts, rounded down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_max_failed: Option<Quota>,
    pub canary: u64,
    pub pause: Pause,
    pub spread: Option<String>,
    pub on_failure: OnFailure,
    /// When a later wave may take a freed slot (plans saved before it was written: `slots`).
    #[serde(default)]
    pub flow: Flow,
    /// A service that starts no step and ends none for this long is stopped as failed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::site::duration_text"
    )]
    pub progress_deadline: Option<std::time::Duration>,
}

impl PlannedPolicy {
    /// Whether a service under this policy may start before its hosts are read, each stepped
    /// once read: nothing in it is about which of its hosts change (a canary, a wave's own
    /// failure budget), as [`deferrable`] asks of a host read at its step.
    pub fn may_start_unread(&self) -> bool {
        self.canary == 0 && self.wave_max_failed.is_none()
    }
}

/// "`count` of the `of` hosts of `service`".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub service: String,
    pub count: usize,
    pub of: usize,
}

/// Hosts that switch together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wave {
    pub canary: bool,
    /// The value of the policy's `spread` tag every host of the wave shares.
    pub spread: Option<String>,
    pub steps: Vec<Step>,
}

/// One host going from one version to another, or reconfigured at the same version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub host: Arc<str>,
    /// `None`: a fresh install.
    pub from: Option<Arc<str>>,
    pub to: Arc<str>,
    pub kind: StepKind,
    /// Why a reconfigure: what differs from what the host records (`hooks: start`,
    /// `env: MODE`, `needs api: +app8 -app3`, `file: /etc/x`, `secret: TOKEN`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Which hooks the step runs; `None` for an unread step until its host is read (a plan
    /// saved without it: the switch-over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Path>,
    /// A reconfigure by switch-over of a service that has `reload`: the changed inputs a
    /// running service takes only by restarting, as the host records them (`hook:install`,
    /// `env:MODE`, `port`, `secret:TOKEN`, `key`; `configuration` when it recorded none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<String>,
    /// Services on the same host whose steps must finish first (runtime needs).
    pub after: Vec<Arc<str>>,
    /// Steps on other hosts that must have ended first: the needed services' steps on hosts
    /// this run adds to them, so that this host never lists a member before it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<HostStep>,
}

/// What a step does to its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Nothing recorded: the whole switch-over, without `stop` and `migrate`.
    Install,
    /// Another version: the whole switch-over.
    Upgrade,
    /// The desired version, but its last switch-over or check failed: the whole switch-over
    /// again.
    Retry,
    /// The desired version with other inputs: files, then `reload` (or the whole switch-over
    /// with the old version equal to the new), then `check`.
    Reconfigure,
    /// The desired version with exactly the desired inputs, healthy as recorded, but its
    /// `check` fails now (`--repair`): the whole switch-over with the old version equal to
    /// the new.
    Repair,
    /// The host was not read before the run (an apply over `--max-connections`, level 2 of
    /// "connecting each host once"): it is locked and read in the command before the step,
    /// which then becomes one of the others ([`decide`]), or nothing if the host already runs
    /// exactly what the site says.
    Unread,
}

/// Which hooks a step runs (book: "Desired state", reload or switch-over).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// `stop` (not on a fresh host), files, `install`, `migrate` (not on a fresh host),
    /// `start`, `check`: every step but a reconfigure the service takes otherwise.
    SwitchOver,
    /// Files, `reload`, `check`: a reconfigure of a service with `reload` whose every changed
    /// input a running service takes without restarting.
    Reload,
    /// No hook: a reconfigure whose only changed inputs no running process uses (the
    /// `rollback` hook); the new inputs are recorded.
    Record,
}

impl Path {
    /// The path of a step of `kind` on a host of a service that has `reload` (`has_reload`),
    /// when a running service takes the change of its inputs as `takes` says (a reconfigure;
    /// `None`: not known, the host recorded no inputs).
    pub fn of(kind: StepKind, has_reload: bool, takes: Option<crate::state::Takes>) -> Path {
        use crate::state::Takes;
        match (kind, takes) {
            (StepKind::Reconfigure, Some(Takes::Nothing)) => Path::Record,
            (StepKind::Reconfigure, Some(Takes::Reload)) if has_reload => Path::Reload,
            _ => Path::SwitchOver,
        }
    }
}

/// A service's step on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStep {
    pub service: Arc<str>,
    pub host: Arc<str>,
}

/// A host that runs the service but is left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skip {
    pub host: Arc<str>,
    pub version: Option<Arc<str>>,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// Already runs the desired version with exactly the desired inputs.
    AtVersion,
    /// Left out by `--only` or `--on`.
    NotSelected,
    /// Did not answer, or its state file could not be read: nothing is known to change.
    Unreachable,
}

/// What the operator chose to change; everything by default.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// `--only`: these services, or all.
    pub services: Option<BTreeSet<ServiceId>>,
    /// `--on`: these hosts, or all.
    pub hosts: Option<BTreeSet<HostId>>,
    /// `--repair`: the services on hosts whose `check` failed when run before planning, and
    /// why (its exit and last line): a `repair` step where they would be left alone as
    /// converged.
    pub repair: BTreeMap<(ServiceId, HostId), String>,
}

impl Selection {
    pub fn has(&self, service: ServiceId, host: HostId) -> bool {
        self.services.as_ref().is_none_or(|s| s.contains(&service))
            && self.hosts.as_ref().is_none_or(|h| h.contains(&host))
    }
}

/// What makes a plan impossible.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum PlanError {
    #[error("observed state has {got} entries for {want} hosts")]
    #[diagnostic(code(drover::plan::observed))]
    ObservedMismatch { got: usize, want: usize },
    /// A policy spreads over a tag no host of its service's class carries.
    #[error(transparent)]
    #[diagnostic(transparent)]
    SpreadTags(#[from] SpreadTagErrors),
}

/// Plans the change from what `observed` runs to what `site` and `desired` declare, for
/// `selection`.
pub fn plan(
    site: &Site,
    hosts: &Hosts,
    observed: &[Observed],
    desired: &Desired,
    selection: &Selection,
) -> Result<Plan, PlanError> {
    if observed.len() != hosts.hosts.len() {
        return Err(PlanError::ObservedMismatch {
            got: observed.len(),
            want: hosts.hosts.len(),
        });
    }
    let versions: IdVec<ServiceId, Arc<str>> = site
        .services
        .iter()
        .map(|s| Arc::from(s.version.as_str()))
        .collect();
    // First what every service does on each host, then the waves: a step may wait for another
    // service's step on another host, whichever comes first in dependency order.
    let mut changing = host_order::Changing::new(hosts.hosts.len());
    let mut sorted: IdVec<ServiceId, Option<Sorted>> = site.services.ids().map(|_| None).collect();
    for &sid in &site.order {
        let s = sort(
            site,
            hosts,
            observed,
            desired,
            selection,
            sid,
            &versions[sid],
        );
        for t in &s.todo {
            changing.add(t.host, sid);
        }
        sorted[sid] = Some(s);
    }
    let after = host_order::RuntimeClosure::new(site);
    let mut services = Vec::with_capacity(site.services.len());
    for &sid in &site.order {
        let Some(s) = sorted[sid].take() else {
            continue;
        };
        services.push(service_plan(
            site,
            hosts,
            sid,
            &versions[sid],
            s,
            &changing,
            &after,
        ));
    }
    let mut plan = Plan {
        schema: SCHEMA,
        site: site.name.clone(),
        site_file: site.file.display().to_string(),
        site_digest: site.digest.clone(),
        platform: site.platform.name.clone(),
        hosts: hosts
            .hosts
            .iter()
            .zip(observed)
            .map(|(h, o)| PlannedHost {
                name: h.name.clone(),
                address: h.address.clone(),
                classes: h
                    .classes
                    .iter()
                    .map(|c| site.classes[*c].name.clone())
                    .collect(),
                tags: h.tags.clone(),
                observed: o.clone(),
            })
            .collect(),
        services,
        max_failed: site.max_failed,
        max_failed_hosts: site
            .max_failed
            .map(|q| q.of(hosts.hosts.len(), Round::Down)),
        dropped_waits: Vec::new(),
        diffs: Vec::new(),
        removals: removal::removals(site, hosts, observed, selection),
        prune: site.prune,
    };
    plan.dropped_waits = rounds::dropped_before_run(&plan);
    Ok(plan)
}

fn service_plan(
    site: &Site,
    hosts: &Hosts,
    sid: ServiceId,
    version: &Arc<str>,
    sorted: Sorted,
    changing: &host_order::Changing,
    closure: &host_order::RuntimeClosure,
) -> ServicePlan {
    let service = &site.services[sid];
    let Sorted {
        members,
        todo,
        skipped,
    } = sorted;
    // A step waits for the needed service's steps on the hosts it adds, unless that service
    // needs this one at runtime (it could then never start first).
    let waits_of = |t: &Todo| -> Vec<HostStep> {
        let mut out = Vec::new();
        for (x, added) in &t.added {
            if *x == sid || closure.needs(*x, sid) {
                continue;
            }
            for name in added {
                if let Some(n) = hosts.find(name) {
                    if changing.has(n, *x) {
                        out.push(HostStep {
                            service: closure.name(*x),
                            host: hosts.hosts[n].name.clone(),
                        });
                    }
                }
            }
        }
        out
    };
    let waits: Vec<Vec<HostStep>> = todo.iter().map(waits_of).collect();
    // Steps that wait go in waves after every step that does not: what they wait for is
    // mostly a new host's step, which never waits in turn. A member left behind by runs with
    // `--on` or stopped partway may wait too: waits that would go round are dropped once the
    // whole plan is made ([`rounds`]), not here, so that this part stays made from the
    // service's hosts and its needs' alone ([`planned_from`]).
    let plain: Vec<HostId> = todo
        .iter()
        .zip(&waits)
        .filter(|(_, w)| w.is_empty())
        .map(|(t, _)| t.host)
        .collect();
    let waiting: Vec<HostId> = todo
        .iter()
        .zip(&waits)
        .filter(|(_, w)| !w.is_empty())
        .map(|(t, _)| t.host)
        .collect();
    let policy = &service.policy;
    let batch_hosts = policy.batch.of(members.len(), Round::Down).max(1);
    let mut groups = waves::waves(hosts, &plain, policy, batch_hosts);
    if !waiting.is_empty() {
        let later = crate::site::Policy {
            canary: if groups.is_empty() { policy.canary } else { 0 },
            ..(**policy).clone()
        };
        groups.extend(waves::waves(hosts, &waiting, &later, batch_hosts));
    }
    // `todo` is in host id order, as `members`: a step finds its entry by search.
    debug_assert!(todo.windows(2).all(|w| w[0].host < w[1].host));
    // Per class of these hosts, the services on the same host this one follows, found once.
    let mut classes_here: Vec<ClassId> = service.classes.clone();
    for &h in members
        .iter()
        .filter(|h| hosts.hosts[**h].classes.len() > 1)
    {
        classes_here.extend(&hosts.hosts[h].classes);
    }
    classes_here.sort_unstable();
    classes_here.dedup();
    let afters: Vec<(ClassId, Vec<ServiceId>)> = classes_here
        .iter()
        .map(|&c| (c, closure.after(site, c, sid)))
        .collect();
    let mut todo: Vec<Option<(Todo, Vec<HostStep>)>> =
        todo.into_iter().zip(waits).map(Some).collect();
    let hosts_of_todo: Vec<HostId> = todo
        .iter()
        .map(|t| t.as_ref().map_or(HostId::new(usize::MAX), |(t, _)| t.host))
        .collect();
    let waves = groups
        .into_iter()
        .map(|g| Wave {
            canary: g.canary,
            spread: g.spread,
            steps: g
                .hosts
                .into_iter()
                .filter_map(|h| {
                    let host = &hosts.hosts[h];
                    let of_class = |c: ClassId| {
                        afters
                            .iter()
                            .find(|(k, _)| *k == c)
                            .map_or(&[][..], |(_, a)| a.as_slice())
                    };
                    let union;
                    let mine: &[ServiceId] = match host.classes.as_slice() {
                        [one] => of_class(*one),
                        many => {
                            let mut all: Vec<ServiceId> = many
                                .iter()
                                .flat_map(|c| of_class(*c).iter().copied())
                                .collect();
                            all.sort_by_key(|t| closure.rank(*t));
                            all.dedup();
                            union = all;
                            &union
                        }
                    };
                    let mut after = Vec::new();
                    for &t in mine.iter().filter(|t| changing.has(h, **t)) {
                        if after.is_empty() {
                            // One allocation for the list, not one per doubling.
                            after.reserve_exact(mine.len());
                        }
                        after.push(closure.name(t));
                    }
                    let at = hosts_of_todo.binary_search(&h).ok()?;
                    let (t, waits) = todo[at].take()?;
                    Some(Step {
                        host: host.name.clone(),
                        from: t.from,
                        to: version.clone(),
                        kind: t.kind,
                        reasons: t.reasons,
                        path: t.path,
                        restarts: t.restarts,
                        after,
                        waits,
                    })
                })
                .collect(),
        })
        .collect();
    ServicePlan {
        name: service.name.clone(),
        version: version.clone(),
        port: service.port,
        classes: service
            .classes
            .iter()
            .map(|c| site.classes[*c].name.clone())
            .collect(),
        hosts: members.len(),
        policy: PlannedPolicy {
            name: policy.name.clone(),
            batch: policy.batch,
            batch_hosts,
            max_failed: policy.max_failed,
            max_failed_hosts: policy.max_failed.of(members.len(), Round::Down),
            wave_max_failed: policy.wave_max_failed,
            canary: policy.canary,
            pause: policy.pause,
            spread: policy.spread.clone(),
            on_failure: policy.on_failure,
            flow: policy.flow,
            progress_deadline: policy.progress_deadline,
        },
        waits_for: conditions(site, hosts, sid, |n| n.healthy),
        addresses_of: conditions(site, hosts, sid, |n| n.addressable),
        waves,
        skipped,
    }
}

/// Every host of every class that runs `sid`, in natural name order.
fn service_hosts(site: &Site, hosts: &Hosts, sid: ServiceId) -> Vec<HostId> {
    hosts.of_classes(&site.services[sid].classes)
}

fn conditions(
    site: &Site,
    hosts: &Hosts,
    sid: ServiceId,
    quota: impl Fn(&crate::site::Need) -> Option<Quota>,
) -> Vec<Condition> {
    site.services[sid]
        .needs
        .iter()
        .filter_map(|n| {
            let q = quota(n)?;
            let of = site.services[n.service]
                .classes
                .iter()
                .map(|c| hosts.by_class[*c].len())
                .sum();
            Some(Condition {
                service: site.services[n.service].name.clone(),
                count: q.of(of, Round::Up),
                of,
            })
        })
        .collect()
}
