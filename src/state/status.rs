//! `deploy status` as data: per host and service, what runs against what is desired.

use super::{Inputs, Mark, Observed, Outcome};
use crate::inventory::{HostId, Hosts};
use crate::site::{ServiceId, Site};
use serde::Serialize;

/// Version of the status JSON schema. 2: `diverged` per host and service. 3: `source` (hosts or
/// store) and `disagreements` (`--hosts` with a store).
pub const STATUS_SCHEMA: u32 = 3;

/// The site's lock on this controller, held.
#[derive(Debug, Clone, Serialize)]
pub struct SiteLock {
    pub path: String,
    /// `null`: the holder cannot be read (a lock being taken, or a damaged one).
    pub holder: Option<super::lock::Holder>,
}

/// What each service on each host must be given (the `desired` stage answers it): how the
/// recorded inputs differ, one reason each; empty when they match.
pub trait Expected {
    fn diverged(&self, service: ServiceId, host: HostId, recorded: Option<&Inputs>) -> Vec<String>;
}

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub schema: u32,
    pub site: String,
    pub hosts: Vec<HostStatus>,
    /// Hosts that did not answer, could not be read, or have no state at all.
    pub unaccounted: Vec<Unaccounted>,
    /// Host/service pairs at their desired version with no recorded failure.
    pub converged: usize,
    pub total: usize,
    /// The run of `deploy apply` that did not finish (interrupted, or its process died), from
    /// its journal on this controller; `null` when there is none.
    pub unfinished_run: Option<super::journal::RunRecord>,
    /// The site's lock on this controller while a run holds it (what a refused `deploy apply`
    /// points at); `null` when it is free.
    pub site_lock: Option<SiteLock>,
    /// Where the records came from: `hosts` (each host's state file) or `store` (etcd).
    pub source: Source,
    /// With a store and `--hosts`: where the store and the hosts' own records disagree.
    pub disagreements: Vec<super::store::Disagreement>,
    /// With a store: why it was not taken at its word for any host, when it is stale (a run's
    /// writes did not all reach it, or it did not answer `--hosts`): every host was read.
    pub stale: Option<String>,
    /// With a store: the hosts it cannot speak for (moved or replaced, or inputs that cannot
    /// be known here), read themselves, with why.
    pub read: Vec<Unaccounted>,
    /// With `--check`: the checks of the converged host services, run now (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked: Option<Checked>,
    /// When the site's latest run in its history is a `deploy undo`: the run it went back to;
    /// `null` otherwise.
    pub undone: Option<Undone>,
}

/// The run the fleet was last undone to, and the undo's own run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Undone {
    /// The run whose snapshot the undo applied.
    pub to: String,
    /// The undo's run, when it finished, and how (`converged`, `failed`, …).
    pub by: String,
    pub at: String,
    pub result: String,
}

/// `deploy status --check`: the checks of the host services at their desired version and
/// inputs, healthy as recorded, run now.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checked {
    /// How many ran.
    pub ran: usize,
    /// Those that failed: `deploy apply --repair` re-runs their switch-over.
    pub failing: Vec<FailingCheck>,
}

/// A converged host service whose check fails now.
#[derive(Debug, Clone, Serialize)]
pub struct FailingCheck {
    pub host: String,
    pub service: String,
    /// Its exit and the last line it wrote, its timeout, or why it could not run.
    pub why: String,
}

/// Where `deploy status` read what the hosts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Hosts,
    Store,
}

/// One failed category of one service on one host (`deploy status --failures`).
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub host: String,
    pub service: String,
    pub running: Option<String>,
    /// `configured` or `validated`.
    pub category: &'static str,
    #[serde(flatten)]
    pub mark: Mark,
}

impl Status {
    /// Every failed category, host by host (get_failures).
    pub fn failures(&self) -> Vec<Failure> {
        let mut out = Vec::new();
        for h in &self.hosts {
            for sv in &h.services {
                for (category, m) in [("configured", &sv.configured), ("validated", &sv.validated)]
                {
                    if let Some(m) = m.as_ref().filter(|m| m.outcome == Outcome::Failure) {
                        out.push(Failure {
                            host: h.host.clone(),
                            service: sv.service.clone(),
                            running: sv.running.clone(),
                            category,
                            mark: m.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub host: String,
    pub classes: Vec<String>,
    pub services: Vec<ServiceStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ServiceStatus {
    pub service: String,
    pub running: Option<String>,
    pub desired: String,
    pub configured: Option<Mark>,
    pub validated: Option<Mark>,
    /// The latest recorded time of either category.
    pub last_change: Option<String>,
    /// Running the desired version with exactly the desired inputs, no recorded failure.
    pub ok: bool,
    /// At the desired version, but given other inputs than the site says now: why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diverged: Vec<String>,
    /// The log of the last failure, if the last outcome was one.
    pub failure_log: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unaccounted {
    pub host: String,
    pub reason: String,
}

/// The status of every host of `hosts`, from what was observed.
pub fn status(
    site: &Site,
    hosts: &Hosts,
    observed: &[Observed],
    expected: &dyn Expected,
) -> Status {
    let mut out = Status {
        schema: STATUS_SCHEMA,
        site: site.name.clone(),
        hosts: Vec::new(),
        unaccounted: Vec::new(),
        converged: 0,
        total: 0,
        unfinished_run: None,
        site_lock: None,
        source: Source::Hosts,
        disagreements: Vec::new(),
        stale: None,
        read: Vec::new(),
        checked: None,
        undone: None,
    };
    for ((hid, h), o) in hosts.hosts.enumerate().zip(observed) {
        let reason = match o {
            Observed::Fresh => Some("no state recorded".to_string()),
            Observed::Unreachable { reason } => Some(format!("does not answer: {reason}")),
            Observed::Unreadable { reason } => Some(format!("state unreadable: {reason}")),
            Observed::Unread => Some("not read".to_string()),
            Observed::Running { .. } => None,
        };
        if let Some(reason) = reason {
            out.unaccounted.push(Unaccounted {
                host: h.name.to_string(),
                reason,
            });
        }
        let mut ids: Vec<ServiceId> = h
            .classes
            .iter()
            .flat_map(|c| site.classes[*c].services.iter().copied())
            .collect();
        ids.sort_by_key(|s| site.order.iter().position(|o| o == s));
        ids.dedup();
        let services: Vec<ServiceStatus> = ids
            .iter()
            .map(|&sid| {
                let s = &site.services[sid];
                let rec = o.service(&s.name);
                let at_version = rec.is_some_and(|r| r.version == s.version && r.healthy());
                let diverged = match rec {
                    Some(r) if at_version => expected.diverged(sid, hid, r.inputs.as_ref()),
                    _ => Vec::new(),
                };
                let ok = at_version && diverged.is_empty();
                let marks = rec
                    .map(|r| (r.configured.clone(), r.validated.clone()))
                    .unwrap_or_default();
                let failure_log = [&marks.0, &marks.1]
                    .into_iter()
                    .flatten()
                    .find(|m| m.outcome == Outcome::Failure)
                    .map(|m| m.log.clone());
                let last_change = [&marks.0, &marks.1]
                    .into_iter()
                    .flatten()
                    .map(|m| m.at.clone())
                    .max();
                ServiceStatus {
                    service: s.name.clone(),
                    running: rec.map(|r| r.version.clone()),
                    desired: s.version.clone(),
                    configured: marks.0,
                    validated: marks.1,
                    last_change,
                    ok,
                    diverged,
                    failure_log,
                }
            })
            .collect();
        out.total += services.len();
        out.converged += services.iter().filter(|s| s.ok).count();
        out.hosts.push(HostStatus {
            host: h.name.to_string(),
            classes: h
                .classes
                .iter()
                .map(|c| site.classes[*c].name.clone())
                .collect(),
            services,
        });
    }
    out
}
