//! `deploy verify`: run every service's check on every host now, concurrently.

use super::hook::{service_env, step_env};
use super::hook_run::{self, Ran};
use crate::plan::Plan;
use crate::secrets::Secrets;
use crate::site::Site;
use crate::transport::{Link, Target, Transport};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckResult {
    pub host: String,
    pub service: String,
    pub ok: bool,
    pub detail: String,
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
    let gate = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (h, host) in plan.hosts.iter().enumerate() {
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
            check_host(&site, &plan, h, &*transport, &target, &secrets).await
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.extend(done.unwrap_or_default());
    }
    out.sort_by(|a, b| (&a.host, &a.service).cmp(&(&b.host, &b.service)));
    out
}

async fn check_host<T: Transport>(
    site: &Site,
    plan: &Plan,
    h: usize,
    transport: &T,
    target: &Target,
    secrets: &Secrets,
) -> Vec<CheckResult> {
    let host = &plan.hosts[h];
    let services: Vec<_> = plan.services.iter().filter(|s| s.runs_on(host)).collect();
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
        let (ok, detail) = match hook_run::run(&link, &call).await {
            Ran::Done(Ok(o)) if o.success() => (true, "check passed".into()),
            Ran::Done(Ok(o)) => (
                false,
                format!(
                    "check exited {}: {}",
                    o.code.map_or("by signal".into(), |c| c.to_string()),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            ),
            Ran::Done(Err(e)) => (false, e.to_string()),
            Ran::TimedOut { after, killed } => {
                (false, Ran::timeout_reason("check", after, &killed))
            }
        };
        out.push(CheckResult {
            host: target.name.clone(),
            service: s.name.clone(),
            ok,
            detail,
        });
    }
    // `apply` removes its pid file with the host's lock; `verify` takes no lock, so it removes
    // its own (one file per run and host, which would otherwise pile up with every verify).
    if ran_any {
        let file = crate::transport::quote(&hook_run::pid_file(&state_dir));
        let _ = link.run(&format!("rm -f -- {file}")).await;
    }
    link.close().await;
    out
}
