//! A plan made from the site, with its locks held: secrets, hosts and what each must run,
//! the selection, the locks, what each host runs, the plan (and `--repair`'s checks).

use super::{ApplyError, Request};
use crate::desired::Desired;
use crate::inventory::Hosts;
use crate::plan::{self, Plan};
use crate::secrets::Secrets;
use crate::session::{Locked, RunTransport, Session};
use crate::site::{self, Site, Transport};
use std::sync::Arc;

/// The site, its plan, what each host must run, the run's secrets, and the transport the
/// rollout goes on with.
pub(super) struct Ready {
    pub site: Site,
    pub plan: Plan,
    pub transport: RunTransport,
    pub desired: Desired,
    pub secrets: Secrets,
    /// The hosts and the selection a plan made during the run is made from (not for a saved
    /// plan, which is carried out as saved).
    pub planner: Option<(Hosts, plan::Selection)>,
}

/// The site's own plan, made once its hosts are locked and read.
pub(super) fn fresh(
    request: &Request,
    site: Option<Site>,
    session: Session,
) -> Result<(Locked, Ready), ApplyError> {
    let mut site = match site {
        Some(site) => site,
        None => site::load(&request.target)?,
    };
    accept_new_host_keys(&mut site, request.accept_new_host_keys);
    let only = super::selection(&site, &request.only)?;
    let on = super::selector(&request.on)?;
    let (session, l, selection) = locked(site, session, |site, hosts| {
        let mut selection = only;
        selection.hosts = super::on_hosts(on.as_ref(), site, hosts)?;
        Ok(selection)
    })?;
    let mut selection = selection;
    let mut plan = plan::plan(&l.site, &l.hosts, &l.observed, &l.desired, &selection)?;
    if request.repair {
        plan = session.block_on(crate::rollout::plan_repairs(
            Arc::new(l.site.clone()),
            &l.hosts,
            &l.observed,
            &l.desired,
            &mut selection,
            plan,
            l.transport.clone(),
            request.max_connections,
            Arc::new(l.secrets.clone()),
        ))?;
    }
    plan.prune |= request.prune;
    Ok((session, l.ready(plan, Some(selection))))
}

/// `--accept-new-host-keys`: hosts whose key is not yet in known_hosts are accepted and their
/// key recorded (OpenSSH's `accept-new`); a changed key is still refused. For first contact
/// only: without it, an unknown key fails the host with a message saying what to run.
pub(super) fn accept_new_host_keys(site: &mut Site, accept: bool) {
    if let Transport::Ssh(options) = &mut site.platform.transport {
        options.accept_new_host_keys = accept;
    }
}

/// Everything a plan is made or checked against, the locks taken.
pub(super) struct Found {
    pub site: Site,
    pub hosts: Hosts,
    pub observed: Vec<crate::state::Observed>,
    pub transport: RunTransport,
    pub desired: Desired,
    pub secrets: Secrets,
}

impl Found {
    /// `selection`: what a fresh plan was made for (`None` for a saved plan).
    pub fn ready(self, plan: Plan, selection: Option<plan::Selection>) -> Ready {
        Ready {
            site: self.site,
            plan,
            transport: self.transport,
            desired: self.desired,
            secrets: self.secrets,
            planner: selection.map(|s| (self.hosts, s)),
        }
    }
}

/// Reads the secrets (a missing one stops the run before anything runs), resolves the hosts
/// and what each must run, chooses what may change (`choose`: the session keeps the
/// connections of the hosts stepped first), takes the locks and reads what each host runs.
pub(super) fn locked(
    site: Site,
    session: Session,
    choose: impl FnOnce(&Site, &Hosts) -> Result<plan::Selection, ApplyError>,
) -> Result<(Locked, Found, plan::Selection), ApplyError> {
    let secrets = Secrets::load(&site)?;
    let hosts = super::resolve_for_plan(&site, &|text| session.say(text))?;
    let hosts = super::gone::with_gone_hosts(&site, hosts, &|text| session.say(text))?;
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let selection = choose(&site, &hosts)?;
    let (mut session, transport) = session.lock(&site, &hosts, &selection, &desired)?;
    let observed = session.observe(&transport, &site, &hosts, &desired);
    let found = Found {
        site,
        hosts,
        observed,
        transport,
        desired,
        secrets,
    };
    Ok((session, found, selection))
}
