//! Running services' checks now, concurrently, bounded like reads: every one (`deploy
//! verify`), or those of the hosts a plan leaves alone as converged (`--repair`, `deploy status
//! --check`), with the env and secrets a check gets in a step.

use super::hook::{service_env, step_env};
use super::hook_run::{self, Ran};
use crate::desired::Desired;
use crate::inventory::{HostId, Hosts};
use crate::plan::{Plan, PlanError, Selection, SkipReason};
use crate::secrets::Secrets;
use crate::site::{ServiceId, Site};
use crate::state::{Checked, FailingCheck, Observed};
use crate::transport::{Link, Target, Transport};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckResult {
    pub host: String,
    pub service: String,
    pub ok: bool,
    pub detail: String,
    /// A failed check in a line: its exit and the last line it wrote (`exited 1: no pid`), its
    /// timeout, or why it could not run.
    #[serde(skip)]
    pub why: String,
    /// The check ran on its host (it passed, failed or timed out); false when it could not be
    /// run (no connection, the transport failed): that says nothing of the service.
    #[serde(skip)]
    pub ran: bool,
}

/// Runs the `check` hook of every service with one on every reachable host of the plan,
/// with the site's secrets; a check that outlives its timeout is killed on its host.
pub async fn verify<T: Transport>(
    site: Arc<Site>,
    plan: Arc<Plan>,
    transport: Arc<T>,
    max_connections: usize,
    secrets: Arc<Secrets>,
) -> Vec<CheckResult> {
    let every: Vec<Vec<usize>> = plan
        .hosts
        .iter()
        .map(|h| {
            (0..plan.services.len())
                .filter(|&s| plan.services[s].runs_on(h))
                .collect()
        })
        .collect();
    checks(site, plan, transport, max_connections, secrets, every).await
}

/// Runs the `check` hook of each service the plan leaves alone on a host as converged
/// (`skipped, converged`), as [`verify`] does: what `--repair` and `deploy status --check`
/// run. Over a run's transport, each host's link is handed back to it ([`Transport::park`]).
pub async fn check_converged<T: Transport>(
    site: Arc<Site>,
    plan: Arc<Plan>,
    transport: Arc<T>,
    max_connections: usize,
    secrets: Arc<Secrets>,
) -> Vec<CheckResult> {
    let index: BTreeMap<&str, usize> = plan
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (&*h.name, i))
        .collect();
    let mut converged: Vec<Vec<usize>> = vec![Vec::new(); plan.hosts.len()];
    for (s, sp) in plan.services.iter().enumerate() {
        let checked = site
            .service(&sp.name)
            .is_some_and(|id| site.services[id].hooks.check.is_some());
        if !checked {
            continue;
        }
        for k in sp
            .skipped
            .iter()
            .filter(|k| k.reason == SkipReason::AtVersion)
        {
            if let Some(&h) = index.get(&*k.host) {
                converged[h].push(s);
            }
        }
    }
    checks(site, plan, transport, max_connections, secrets, converged).await
}

/// The failed checks among `results`, as the planner takes them for `--repair`
/// ([`crate::plan::Selection::repair`]): per service and host, why. Only a check that ran and
/// failed (or timed out) plans a repair: one that could not be run (the host did not answer,
/// the connection broke) says nothing of the service, and a healthy service is not stopped
/// for it.
pub fn repairs(
    site: &Site,
    hosts: &Hosts,
    results: &[CheckResult],
) -> BTreeMap<(ServiceId, HostId), String> {
    results
        .iter()
        .filter(|c| !c.ok && c.ran)
        .filter_map(|c| {
            let key = (site.service(&c.service)?, hosts.find(&c.host)?);
            Some((key, format!("check failed: {}", c.why)))
        })
        .collect()
}

/// What `--repair` plans: the checks of the hosts `plan` leaves alone as converged run now
/// over `transport` ([`check_converged`]), and the plan made again for `selection` with a
/// `repair` step where one failed (the failures kept in `selection`). The same plan when
/// every check passes.
#[allow(clippy::too_many_arguments)]
pub async fn plan_repairs<T: Transport>(
    site: Arc<Site>,
    hosts: &Hosts,
    observed: &[Observed],
    desired: &Desired,
    selection: &mut Selection,
    plan: Plan,
    transport: Arc<T>,
    max_connections: usize,
    secrets: Arc<Secrets>,
) -> Result<Plan, PlanError> {
    let plan = Arc::new(plan);
    let results = check_converged(
        site.clone(),
        plan.clone(),
        transport,
        max_connections,
        secrets,
    );
    selection.repair = repairs(&site, hosts, &results.await);
    if selection.repair.is_empty() {
        return Ok(Arc::unwrap_or_clone(plan));
    }
    crate::plan::plan(&site, hosts, observed, desired, selection)
}

/// `deploy status --check`: the checks of the host services of `hosts` (some of `all`, whose
/// records are `observed`) at their desired version and inputs, healthy as recorded, run now
/// over `transport` as [`check_converged`] runs them; the failures with why.
#[allow(clippy::too_many_arguments)]
pub async fn check_status<T: Transport>(
    site: Arc<Site>,
    all: &Hosts,
    hosts: &Hosts,
    observed: &[Observed],
    desired: &Desired,
    transport: Arc<T>,
    max_connections: usize,
    secrets: Arc<Secrets>,
) -> Result<Checked, PlanError> {
    // Planned over every host (their addresses are in the checks' `DEPLOY_NEEDS_*`); those
    // not shown are left unread, and so not checked.
    let observed_all: Vec<Observed> = all
        .hosts
        .iter()
        .map(|h| {
            hosts
                .find(&h.name)
                .and_then(|i| observed.get(i.index()).cloned())
                .unwrap_or(Observed::Unread)
        })
        .collect();
    let plan = crate::plan::plan(&site, all, &observed_all, desired, &Selection::default())?;
    let results = check_converged(site, Arc::new(plan), transport, max_connections, secrets).await;
    Ok(Checked {
        ran: results.len(),
        failing: results
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| FailingCheck {
                host: c.host,
                service: c.service,
                why: c.why,
            })
            .collect(),
    })
}

/// Runs, on each host of the plan (by index), the checks of the services `which` lists for
/// it (by index in the plan); hosts with none are not contacted.
async fn checks<T: Transport>(
    site: Arc<Site>,
    plan: Arc<Plan>,
    transport: Arc<T>,
    max_connections: usize,
    secrets: Arc<Secrets>,
    which: Vec<Vec<usize>>,
) -> Vec<CheckResult> {
    let gate = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for ((h, host), services) in plan.hosts.iter().enumerate().zip(which) {
        let services: BTreeSet<usize> = services.into_iter().collect();
        if services.is_empty() {
            continue;
        }
        let (site, plan, transport, gate, secrets) = (
            site.clone(),
            plan.clone(),
            transport.clone(),
            gate.clone(),
            secrets.clone(),
        );
        let target = Target {
            name: host.name.to_string(),
            address: host.address.to_string(),
        };
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            check_host(&site, &plan, h, &services, &*transport, &target, &secrets).await
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.extend(done.unwrap_or_default());
    }
    out.sort_by(|a, b| (&a.host, &a.service).cmp(&(&b.host, &b.service)));
    out
}

/// Runs the checks of `which` (services of the plan, by index) on host `h`.
async fn check_host<T: Transport>(
    site: &Site,
    plan: &Plan,
    h: usize,
    which: &BTreeSet<usize>,
    transport: &T,
    target: &Target,
    secrets: &Secrets,
) -> Vec<CheckResult> {
    let host = &plan.hosts[h];
    let services: Vec<_> = which.iter().map(|&s| &plan.services[s]).collect();
    let link = match transport.connect(target).await {
        Ok(l) => l,
        Err(e) => {
            return services
                .iter()
                .map(|s| CheckResult {
                    host: target.name.clone(),
                    service: s.name.clone(),
                    ok: false,
                    detail: e.to_string(),
                    why: e.to_string(),
                    ran: false,
                })
                .collect()
        }
    };
    let mut out = Vec::new();
    let state_dir = site.platform.host_state_dir();
    let mut ran_any = false;
    for s in services {
        let Some(check) = site
            .service(&s.name)
            .and_then(|id| site.services[id].hooks.check.clone())
        else {
            continue;
        };
        let running = host.observed.version(&s.name);
        let env = step_env(
            &service_env(site, plan, s),
            host,
            running,
            running.unwrap_or(&s.version),
        );
        let call = hook_run::Call {
            guard: None,
            env: &env,
            command: &check.command,
            state_dir: &state_dir,
            service: &s.name,
            secrets,
            timeout: Some(check.timeout),
            then: None,
            stop: None,
            after: false,
        };
        ran_any = true;
        let mut ran = true;
        let (ok, detail, why) = match hook_run::run(&link, &call).await {
            Ran::Done(Ok(o)) if o.success() => (true, "check passed".into(), String::new()),
            Ran::Done(Ok(o)) => {
                let code = o.code.map_or("by signal".into(), |c| c.to_string());
                let stderr = String::from_utf8_lossy(&o.stderr);
                let stdout = String::from_utf8_lossy(&o.stdout);
                let last = [&stderr, &stdout]
                    .into_iter()
                    .find_map(|text| text.lines().rev().find(|l| !l.trim().is_empty()));
                let why = match last {
                    Some(line) => format!("exited {code}: {}", line.trim()),
                    None => format!("exited {code}"),
                };
                (
                    false,
                    format!("check exited {code}: {}", stderr.trim()),
                    why,
                )
            }
            Ran::Done(Err(e)) => {
                ran = false;
                (false, e.to_string(), e.to_string())
            }
            Ran::TimedOut { after, killed } => {
                let reason = Ran::timeout_reason("check", after, &killed);
                (false, reason.clone(), reason)
            }
        };
        out.push(CheckResult {
            host: target.name.clone(),
            service: s.name.clone(),
            ok,
            detail,
            why,
            ran,
        });
    }
    // `apply` removes its pid file with the host's lock; `verify` takes no lock, so it removes
    // its own (one file per run and host, which would otherwise pile up with every verify).
    if ran_any {
        let file = crate::transport::quote(&super::processes::pid_file(&state_dir));
        let _ = link.run(&format!("rm -f -- {file}")).await;
    }
    transport.park(&target.name, link).await;
    out
}
