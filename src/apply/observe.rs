//! What a command that plans or looks starts from: the site's hosts, and what each runs (read
//! over the platform's transport, or taken from the store where it shows a host converged).
//! `deploy plan`, `status` and `verify` call these as they are; an apply reads its hosts
//! through the session, which locks them first.

use super::ApplyError;
use crate::inventory::Hosts;
use crate::site::Site;
use crate::state::{Observe, Observed, Offline, Remote};
use crate::transport::AnyTransport;

/// The site's hosts, resolved once for the command; warnings go to `say`.
pub fn resolve(site: &Site, say: &dyn Fn(&str)) -> Result<Hosts, ApplyError> {
    let hosts = crate::inventory::resolve(site)?;
    for w in &hosts.warnings {
        say(&format!("warning: {w}"));
    }
    Ok(hosts)
}

/// The site's hosts as [`resolve`] gives them, for a command that plans: a policy's `spread`
/// tag that no host of its class carries stops it before any host is read.
pub fn resolve_for_plan(site: &Site, say: &dyn Fn(&str)) -> Result<Hosts, ApplyError> {
    let hosts = resolve(site, say)?;
    crate::plan::check_spread(site, &hosts).map_err(crate::plan::PlanError::from)?;
    Ok(hosts)
}

fn runtime() -> Result<tokio::runtime::Runtime, ApplyError> {
    crate::session::runtime().map_err(ApplyError::Runtime)
}

/// What every host runs: read over the platform's transport, or all fresh with `offline`.
pub fn observe(
    site: &Site,
    hosts: &Hosts,
    offline: bool,
    max_connections: usize,
) -> Result<Vec<Observed>, ApplyError> {
    let runtime = runtime()?;
    if offline {
        return Ok(runtime.block_on(Offline.observe(site, hosts)));
    }
    let transport = std::sync::Arc::new(AnyTransport::for_platform(
        &site.platform,
        hosts.hosts.len(),
        max_connections,
    ));
    let read = Default::default();
    Ok(runtime.block_on(observe_on(transport, site, hosts, max_connections, read)))
}

/// What every host runs: with a store (and without `read_all`, and unless a run could not
/// publish all its state), the hosts it shows converged are taken as it says, and only the
/// others are read. A stale store is said to `say`.
pub fn observe_through_store(
    site: &Site,
    hosts: &Hosts,
    desired: &crate::desired::Desired,
    read_all: bool,
    max_connections: usize,
    say: &dyn Fn(&str),
) -> Result<Vec<Observed>, ApplyError> {
    let runtime = runtime()?;
    let stale = match (&site.platform.store, read_all) {
        (Some(_), false) => crate::session::unpublished(&site.name),
        _ => None,
    };
    if let Some(run) = &stale {
        say(&format!(
            "note: {run} could not publish all its state to etcd (.drover/unpublished): the \
             store is stale, every host is read"
        ));
    }
    let view = match read_all || stale.is_some() {
        true => None,
        false => runtime
            .block_on(crate::state::store::read(site))
            .map_err(ApplyError::Store)?,
    };
    let Some(view) = view else {
        return observe(site, hosts, false, max_connections);
    };
    let known = crate::state::store::converged(&view, site, hosts, desired);
    let subset = hosts.subset(&crate::state::store::to_read(&known), site.classes.len());
    let read = observe(site, &subset, false, max_connections)?;
    Ok(crate::state::store::merge(known, read))
}

/// What every host runs, read over `transport` (which may keep the links for what follows),
/// on the caller's runtime; hosts in `read` were read already (host → the read's output).
pub async fn observe_on<T: crate::transport::Transport>(
    transport: std::sync::Arc<T>,
    site: &Site,
    hosts: &Hosts,
    max_connections: usize,
    read: std::collections::HashMap<String, crate::transport::Output>,
) -> Vec<Observed> {
    let remote = Remote {
        transport,
        state_dir: site.platform.host_state_dir(),
        max_connections,
        read,
    };
    remote.observe(site, hosts).await
}
