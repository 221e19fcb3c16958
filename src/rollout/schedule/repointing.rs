//! The dependents' reconfigures of `draining.rs` carried out: the pool a dependent's host is
//! given at that moment, its inputs, files and environment, the step run on its host, and
//! what its end means for the wave that waits for it.

use super::super::event::{EventKind, Phase};
use super::super::hook::{needs_var, step_env};
use super::super::step::{self, StepJob, StepResult};
use super::draining::{listed, recorded_member, Repoint};
use super::{stopping, target, Scheduler};
use crate::desired::{Member, Pool};
use crate::plan::StepKind;
use crate::state::member_of;
use crate::transport::Transport;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A listed member's `address[:port]` (`at`) split into address and port: after the host's
/// inventory address (`known`) when it starts with it (an IPv6 address has colons of its own);
/// otherwise after the last colon, when the needed service has a port (`ported`) and what
/// follows is one; else all address.
fn split_listed<'a>(at: &'a str, known: &str, ported: bool) -> (&'a str, Option<u16>) {
    if at == known {
        return (at, None);
    }
    if let Some(port) = at
        .strip_prefix(known)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|p| p.parse().ok())
    {
        return (&at[..known.len()], Some(port));
    }
    match at.rsplit_once(':') {
        Some((address, p)) if ported => match p.parse() {
            Ok(port) => (address, Some(port)),
            Err(_) => (at, None),
        },
        _ => (at, None),
    }
}

impl<T: Transport> Scheduler<T> {
    /// The pool of `x` host `h` is given now as dependent `d`: every host of it the site
    /// lists, but those dropped; a host whose step has ended where its record says it serves;
    /// a host whose step has not ended where `h` lists it now (or not at all, if it does not).
    fn pool_now(&self, x: usize, d: usize, h: usize) -> Option<Pool> {
        let plan = &self.r.plan;
        let (xs, ds) = (&plan.services[x], &plan.services[d]);
        let dsid = self.r.site.service(&ds.name)?;
        let pools = self.r.desired.needs(dsid);
        let full = pools.get(&xs.name)?;
        let entry = listed(&self.hosts[h].record, &ds.name, &xs.name).unwrap_or("");
        let mut members = Vec::with_capacity(full.members.len());
        for m in full.members.iter() {
            let Some(&n) = self.host_index.get(&m.host) else {
                members.push(m.clone());
                continue;
            };
            if self.repoints.dropped.contains(&(x, n)) {
                continue;
            }
            if !self.stepping.contains(&(x, n)) {
                members.push(m.clone());
                continue;
            }
            if self.step_ended(x, n) {
                // Where it serves now, by its record: its step's (the site's), or where a
                // failed step that put its files back, or a revert, left it.
                let recorded = self.hosts[n]
                    .record
                    .services
                    .get(&xs.name)
                    .and_then(|r| r.inputs.as_ref());
                members.push(match recorded {
                    Some(inputs) => recorded_member(&m.host, &plan.hosts[n].address, inputs),
                    None => m.clone(),
                });
                continue;
            }
            // Not stepped yet: where it serves, as this host lists it now (its address and
            // port as listed: its record may not be read yet, or name another port).
            let Some(now) = member_of(entry, &m.host) else {
                continue;
            };
            let at = now.split_once('=').map_or(now, |(_, a)| a);
            let (address, port) = split_listed(at, &plan.hosts[n].address, xs.port.is_some());
            members.push(Member {
                host: m.host.clone(),
                address: Arc::from(address),
                port,
            });
        }
        Some(Pool::of(members))
    }

    pub(super) fn spawn_repoint(&mut self, rp: Repoint) {
        let plan = self.r.plan.clone();
        let (xs, ds) = (&plan.services[rp.x], &plan.services[rp.d]);
        let ph = &plan.hosts[rp.host];
        let log = self
            .r
            .log_dir
            .join(&*ph.name)
            .join(format!("{}.log", ds.name));
        let job = self.repoint_job(&rp, log.clone());
        let job = match job {
            Ok(Some(job)) => job,
            // It lists what it must already.
            Ok(None) => {
                self.repoints.let_go(rp.x);
                return;
            }
            Err(reason) => {
                step::log_line(&log, &format!("== {}: {reason}", xs.name));
                let result = StepResult {
                    record: self.hosts[rp.host].record.clone(),
                    failed_hook: Some("files".into()),
                    reason: Some(reason),
                    rolled_back: false,
                    released: false,
                    skipped: None,
                    not_started: false,
                    ran: None,
                };
                self.repoint_ended(rp, result);
                return;
            }
        };
        let listed: Vec<String> = job
            .inputs
            .get(&format!("needs:{}", xs.name))
            .unwrap_or("")
            .split(' ')
            .filter_map(|m| m.split_once('=').map(|(h, _)| h.to_string()))
            .collect();
        self.emit(EventKind::RepointStarted {
            service: ds.name.clone(),
            host: ph.name.to_string(),
            needs: xs.name.clone(),
            phase: rp.phase,
            hosts: rp.hosts.iter().map(|h| h.to_string()).collect(),
            listed,
        });
        self.hosts[rp.host].busy = true;
        let (links, sink, target) = (
            self.links.clone(),
            self.r.sink.clone(),
            target(&plan, rp.host),
        );
        let cancel = self.r.cancel.clone();
        let held = rp.clone();
        let task = self.repoints.tasks.spawn(async move {
            let result = match links.get(&target).await {
                Ok(link) => {
                    let state_dir = job.service.state_dir.clone();
                    let run = step::run(job, &*link, &*sink);
                    stopping::abortable(run, &*link, &state_dir, &cancel).await
                }
                Err(e) => {
                    step::log_line(&job.log, &format!("== connect: {e}"));
                    StepResult::not_connected(job.record, e.to_string())
                }
            };
            links.step_done();
            (held, result)
        });
        self.repoints.task_repoints.insert(task.id(), rp);
    }

    /// The reconfigure `rp` as a step's job: the dependent's inputs with the pool of now,
    /// at the version its host runs; `None` when the host is given that already.
    fn repoint_job(
        &self,
        rp: &Repoint,
        log: std::path::PathBuf,
    ) -> Result<Option<StepJob>, String> {
        let plan = &self.r.plan;
        let (xs, ds) = (&plan.services[rp.x], &plan.services[rp.d]);
        let ph = &plan.hosts[rp.host];
        let dsid = self
            .r
            .site
            .service(&ds.name)
            .ok_or_else(|| format!("{} is not in the site", ds.name))?;
        let record = &self.hosts[rp.host].record;
        let Some(running) = record.services.get(&ds.name) else {
            return Ok(None);
        };
        let Some(pool) = self.pool_now(rp.x, rp.d, rp.host) else {
            return Ok(None);
        };
        let mut needs: BTreeMap<String, Pool> = (*self.r.desired.needs(dsid)).clone();
        needs.insert(xs.name.clone(), pool.clone());
        let host = super::starting::planned_host(&self.r.site, ph);
        let (mut inputs, files) = self.r.desired.given_pools(
            &self.r.site,
            dsid,
            (crate::inventory::HostId::new(rp.host), &host),
            &self.r.secrets,
            Arc::new(needs),
        )?;
        let version = running.version.to_string();
        inputs
            .0
            .insert("version".into(), Arc::from(version.as_str()));
        if running.inputs.as_ref() == Some(&inputs) {
            return Ok(None);
        }
        let files = files
            .into_iter()
            .map(|mut f| {
                f.to = self.r.site.platform.host_path(&f.to);
                f
            })
            .collect();
        let job = self.svcs[rp.d].job.clone();
        let var = needs_var(&xs.name);
        let value: Vec<String> = pool
            .members
            .iter()
            .map(|m| match m.port {
                Some(p) => format!("{}:{p}", m.address),
                None => m.address.to_string(),
            })
            .collect();
        let common: Vec<(String, String)> = job
            .env
            .iter()
            .map(|(k, v)| match *k == var {
                true => (k.clone(), value.join(" ")),
                false => (k.clone(), v.clone()),
            })
            .collect();
        let path = match self.r.site.services[dsid].hooks.reload {
            Some(_) => crate::plan::Path::Reload,
            None => crate::plan::Path::SwitchOver,
        };
        let reasons = running
            .inputs
            .as_ref()
            .map(|was| inputs.reasons(was))
            .unwrap_or_default();
        Ok(Some(StepJob {
            path,
            reasons,
            // Only its pools change: a running service takes them by `reload`.
            restarts: Vec::new(),
            service: job,
            host: ph.name.to_string(),
            env: step_env(&common, ph, Some(&version), &version),
            from: Some(version.clone()),
            to: version,
            kind: StepKind::Reconfigure,
            inputs,
            files: Ok(files),
            record: record.clone(),
            log,
            release: None,
            revert: false,
            stop_now: None,
        }))
    }

    /// A reconfigure's task ended (or panicked).
    pub(super) fn repointed(
        &mut self,
        done: Result<(tokio::task::Id, (Repoint, StepResult)), tokio::task::JoinError>,
    ) {
        match done {
            Ok((id, (rp, result))) => {
                self.repoints.task_repoints.remove(&id);
                self.repoint_ended(rp, result);
            }
            Err(e) => {
                if let Some(rp) = self.repoints.task_repoints.remove(&e.id()) {
                    self.links.step_done();
                    let result = StepResult {
                        record: self.hosts[rp.host].record.clone(),
                        failed_hook: Some("panic".into()),
                        reason: Some(format!("deploy's step task ended abnormally: {e}")),
                        rolled_back: false,
                        released: false,
                        skipped: None,
                        not_started: false,
                        ran: None,
                    };
                    self.repoint_ended(rp, result);
                }
            }
        }
    }

    /// A reconfigure ended: its host is free, its record the host's. One that could not drop
    /// hosts halts their service: its wave must not stop hosts a dependent still lists.
    fn repoint_ended(&mut self, rp: Repoint, result: StepResult) {
        let plan = self.r.plan.clone();
        let (xs, ds) = (&plan.services[rp.x], &plan.services[rp.d]);
        let name = plan.hosts[rp.host].name.to_string();
        let log = self
            .r
            .log_dir
            .join(&name)
            .join(format!("{}.log", ds.name))
            .display()
            .to_string();
        self.hosts[rp.host].busy = false;
        self.hosts[rp.host].record = result.record.clone();
        self.repoints.let_go(rp.x);
        let ok = result.ok();
        self.emit(EventKind::RepointFinished {
            service: ds.name.clone(),
            host: name.clone(),
            needs: xs.name.clone(),
            phase: rp.phase,
            ok,
            reason: result.reason.clone(),
            log: log.clone(),
            record: result.record.services.get(&ds.name).cloned().map(Box::new),
        });
        if ok {
            return;
        }
        self.repoints.failures.push(super::super::Failure {
            host: name.clone(),
            service: ds.name.clone(),
            log,
        });
        // Before a revert's batch: the hosts it could not drop are not switched back.
        if rp.phase == Phase::Drop && rp.wave >= xs.waves.len() {
            self.keep_unreverted(rp.x, rp.wave, &rp.hosts);
            return;
        }
        if rp.phase == Phase::Drop
            && self.svcs[rp.x].finished.is_none()
            && self.svcs[rp.x].reverting.is_none()
        {
            let reason = format!(
                "{} on {name} could not drop {}: {}",
                ds.name,
                rp.hosts.join(", "),
                result.reason.as_deref().unwrap_or("it failed")
            );
            if self.svcs[rp.x].next_wave == rp.wave + 1 {
                self.cut_wave(rp.x, rp.wave, &reason);
            }
            self.halt(rp.x, reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_listed;

    #[test]
    fn a_listed_member_is_split_where_its_address_ends() {
        // Its inventory address, with a port or without.
        assert_eq!(
            split_listed("10.0.0.5:9000", "10.0.0.5", true),
            ("10.0.0.5", Some(9000))
        );
        assert_eq!(
            split_listed("10.0.0.5", "10.0.0.5", true),
            ("10.0.0.5", None)
        );
        assert_eq!(
            split_listed("fe80::1:9000", "fe80::1", true),
            ("fe80::1", Some(9000))
        );
        assert_eq!(split_listed("fe80::1", "fe80::1", false), ("fe80::1", None));
        // Listed at an address the inventory no longer gives it (it moved).
        assert_eq!(
            split_listed("10.0.0.9:9000", "10.0.0.5", true),
            ("10.0.0.9", Some(9000))
        );
        assert_eq!(
            split_listed("10.0.0.9", "10.0.0.5", false),
            ("10.0.0.9", None)
        );
    }
}
