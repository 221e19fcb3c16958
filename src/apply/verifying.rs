//! `deploy verify` as a library call: every host at its desired versions, and every check
//! passing now; the verdict as a typed value the caller prints.

use super::{observe, planning::readable_secrets, ApplyError, Say};
use crate::plan::{self, Selection};
use crate::rollout::{self, CheckResult};
use crate::state;
use crate::transport::AnyTransport;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

/// What `deploy verify` found. Serialized as its JSON (fields in the order it always had).
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    /// Every check run, passed or not.
    pub checks: Vec<CheckResult>,
    /// No problem at all.
    pub ok: bool,
    /// One line each, sorted: `<host> <service>: <why>`, or `<host>: <why>`.
    pub problems: Vec<String>,
    /// The JSON's schema, 1.
    pub schema: u32,
    /// How many (host, service) pairs were looked at.
    #[serde(skip)]
    pub host_services: usize,
}

/// Verifies the site at `site_path`: reads every host, runs every check.
pub fn verify(
    site_path: &Path,
    max_connections: usize,
    say: &Say,
) -> Result<Verification, ApplyError> {
    let site = crate::site::load(site_path)?;
    // The checks get the site's secrets, as during apply; one that cannot be read here is
    // taken as each host records it, as by `plan` and `status`.
    let secrets = Arc::new(readable_secrets(&site, true, say)?);
    let hosts = super::resolve(&site, &**say)?;
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let observed = observe(&site, &hosts, false, max_connections)?;
    let status = state::status(&site, &hosts, &observed, &desired);
    let plan = plan::plan(&site, &hosts, &observed, &desired, &Selection::default())?;
    let transport = Arc::new(AnyTransport::for_platform(
        &site.platform,
        hosts.hosts.len(),
        max_connections,
    ));
    let runtime = crate::session::runtime().map_err(ApplyError::Runtime)?;
    let checks = runtime.block_on(rollout::verify(
        Arc::new(site),
        Arc::new(plan),
        transport,
        max_connections,
        secrets,
    ));
    let mut problems = Vec::new();
    for h in &status.hosts {
        for s in h.services.iter().filter(|s| !s.ok) {
            let why = match s.running.as_deref() {
                _ if !s.diverged.is_empty() => {
                    format!("diverged from the site: {}", s.diverged.join("; "))
                }
                None => format!("runs nothing, desired {}", s.desired),
                Some(v) if v == s.desired => {
                    format!("runs {v}, but its last switch-over did not pass its check")
                }
                Some(v) => format!("runs {v}, desired {}", s.desired),
            };
            problems.push(format!("{} {}: {why}", h.host, s.service));
        }
    }
    for u in &status.unaccounted {
        problems.push(format!("{}: {}", u.host, u.reason));
    }
    for c in checks.iter().filter(|c| !c.ok) {
        problems.push(format!("{} {}: {}", c.host, c.service, c.detail));
    }
    problems.sort();
    problems.dedup();
    Ok(Verification {
        ok: problems.is_empty(),
        problems,
        checks,
        schema: 1,
        host_services: status.total,
    })
}
