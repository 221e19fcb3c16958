//! `deploy plan` as a library call: a site → its hosts → what each runs (through the store
//! where it vouches for them) → the plan, with repairs and file diffs when asked. Nothing here
//! prints: warnings go to the caller's [`Say`].

use super::{observe, observe_through_store, on_hosts, selection, selector, ApplyError, Say};
use crate::plan::{self, Plan};
use crate::secrets::{SecretError, Secrets};
use crate::site::Site;
use crate::transport::AnyTransport;
use std::path::PathBuf;
use std::sync::Arc;

/// What a plan is asked for (the flags of `deploy plan`).
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    pub site: PathBuf,
    /// Plan only these services (`--only`).
    pub only: Vec<String>,
    /// Plan only the hosts selected (`--on`).
    pub on: Vec<String>,
    /// Contact no host: every host taken as fresh.
    pub offline: bool,
    /// With a store: read every host anyway.
    pub read_hosts: bool,
    /// Run every converged host's check and plan a repair where it fails.
    pub repair: bool,
    /// Read each file a step would place from its host, for a diff.
    pub diff: bool,
    pub max_connections: usize,
}

/// The plan of `request`'s site, as `deploy plan` shows it.
pub fn plan(request: &PlanRequest, say: &Say) -> Result<Plan, ApplyError> {
    if (request.repair || request.diff) && request.offline {
        return Err(ApplyError::Usage {
            reason: "--repair and --diff read the hosts, and --offline contacts none".into(),
            help: "drop one of them".into(),
        });
    }
    let site = crate::site::load(&request.site)?;
    let mut selection = selection(&site, &request.only)?;
    let on = selector(&request.on)?;
    let mut hosts = super::resolve_for_plan(&site, &**say)?;
    if !request.offline {
        hosts = super::gone::with_gone_hosts(&site, hosts, &**say)?;
    }
    selection.hosts = on_hosts(on.as_ref(), &site, &hosts)?;
    let secrets = Arc::new(readable_secrets(&site, false, say)?);
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let max = request.max_connections;
    let observed = if request.offline {
        observe(&site, &hosts, true, max)?
    } else {
        observe_through_store(&site, &hosts, &desired, request.read_hosts, max, &**say)?
    };
    let mut plan = plan::plan(&site, &hosts, &observed, &desired, &selection)?;
    if !(request.repair || request.diff) {
        return Ok(plan);
    }
    let transport = Arc::new(AnyTransport::for_platform(
        &site.platform,
        hosts.hosts.len(),
        max,
    ));
    let runtime = crate::session::runtime().map_err(ApplyError::Runtime)?;
    let site = Arc::new(site);
    if request.repair {
        plan = runtime.block_on(crate::rollout::plan_repairs(
            site.clone(),
            &hosts,
            &observed,
            &desired,
            &mut selection,
            plan,
            transport.clone(),
            max,
            secrets.clone(),
        ))?;
    }
    if request.diff {
        plan.diffs = runtime.block_on(crate::rollout::file_diffs(
            site, &hosts, &desired, &plan, transport, max, &secrets,
        ));
    }
    Ok(plan)
}

/// The secrets a command that only looks can read (`plan`, `status`, `verify`): one that
/// cannot be read is said once, and taken as each host records it (`apply` reads them all, or
/// stops); `verify`'s checks run without it (`checks`), and need the fingerprint key.
pub fn readable_secrets(site: &Site, checks: bool, say: &Say) -> Result<Secrets, SecretError> {
    let (secrets, errors) = Secrets::load_available(site);
    let also = if checks {
        ", and the checks run without it"
    } else {
        ""
    };
    for e in errors {
        match e {
            SecretError::Key { .. } if checks => return Err(e),
            SecretError::Key { .. } => say(&format!(
                "warning: {e}; whether the secrets changed is not shown (`deploy apply` needs the key)"
            )),
            _ => say(&format!(
                "warning: {e}; it is taken as each host records it{also} (`deploy apply` reads every secret)"
            )),
        }
    }
    Ok(secrets)
}
