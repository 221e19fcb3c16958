//! The run's removals ([`crate::plan::Removal`]), carried out once every other step of the run
//! has ended: so that the dependents' reconfigures, which drop the hosts that go from what they
//! list, have ended before any removal stops a service. A run with a step that did not pass
//! (failed, blocked, not started), or that was told to stop, carries out none: its dependents
//! may still list what would go. Each host's removals run over its link, one after the other;
//! hosts side by side, as many as the run's connections allow.

use super::super::step::removing::{self, RemovalJob, RemovalResult};
use super::{EventKind, Scheduler};
use crate::plan::Removal;
use crate::transport::Transport;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::task::JoinSet;

/// What the run's removals came to.
#[derive(Debug, Default)]
pub(super) struct Removals {
    pub removed: usize,
    pub failures: Vec<super::super::Failure>,
    pub not_started: usize,
    /// How many were left, and why.
    pub left: Option<(usize, String)>,
}

impl<T: Transport> Scheduler<T> {
    /// The hosts that have removals to carry out keep their lock after their last step: their
    /// removal's last command gives it back.
    pub(super) fn hold_for_removals(&mut self) {
        let plan = self.r.plan.clone();
        let mut hosts: Vec<usize> = plan
            .removals_carried_out()
            .iter()
            .filter_map(|r| self.host_index.get(&r.host).copied())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        for h in hosts {
            self.hosts[h].steps_left += 1;
        }
    }

    /// Why the plan's removals are not carried out by this run, if they are not.
    fn removals_held(&self) -> Option<String> {
        if !self.r.plan.prune {
            return Some(
                "pass --prune (or set `prune #true` in the site) to carry them out".into(),
            );
        }
        if self.r.cancel.stopping() {
            return Some("the run was stopped".into());
        }
        let unpassed = self
            .svcs
            .iter()
            .any(|s| s.failed > 0 || s.not_started > 0 || s.finished.is_none())
            || !self.repoints.failures.is_empty()
            || !self.refused.is_empty();
        unpassed.then(|| {
            "a step of this run did not pass: a removal waits for a run whose every step \
             passed, so that no dependent still lists what goes"
                .into()
        })
    }

    /// Carries out the plan's removals, or says why it leaves them.
    pub(super) async fn remove_all(&mut self) {
        let plan = self.r.plan.clone();
        if plan.removals.is_empty() {
            return;
        }
        if let Some(reason) = self.removals_held() {
            let count = plan.removals.len();
            self.emit(EventKind::RemovalsLeft {
                count,
                reason: reason.clone(),
            });
            self.removals.left = Some((count, reason));
            return;
        }
        let mut by_host: BTreeMap<usize, Vec<Removal>> = BTreeMap::new();
        for r in &plan.removals {
            if let Some(&h) = self.host_index.get(&r.host) {
                by_host.entry(h).or_default().push(r.clone());
            }
        }
        let mut tasks: JoinSet<(usize, RemovalResult)> = JoinSet::new();
        for (h, removals) in by_host {
            let host = &plan.hosts[h];
            let release = (self.r.held_to_end.as_deref() != Some(&*host.name))
                .then(|| self.r.release.as_deref().map(Arc::from))
                .flatten();
            let job = RemovalJob {
                host: host.name.to_string(),
                removals,
                record: self.hosts[h].record.clone(),
                state_dir: self.r.site.platform.host_state_dir(),
                guard: self.r.guard.as_deref().map(Arc::from),
                secrets: self.r.secrets.clone(),
                release,
                log_dir: self.r.log_dir.clone(),
            };
            let (links, sink, target) = (
                self.links.clone(),
                self.r.sink.clone(),
                super::target(&plan, h),
            );
            tasks.spawn(async move {
                let result = match links.get(&target).await {
                    Ok(link) => removing::remove(job, &*link, &*sink).await,
                    Err(e) => not_connected(job, &e.to_string(), &*sink),
                };
                links.release(&target.name);
                (h, result)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let Ok((h, result)) = done else {
                continue;
            };
            self.hosts[h].record = result.record;
            self.removals.removed += result.removed;
            self.removals.not_started += result.not_started;
            self.removals.failures.extend(result.failure);
            if result.released {
                self.released.push(plan.hosts[h].name.to_string());
            }
        }
    }
}

/// A host that could not be reached for its removals: the first fails, the rest not started.
fn not_connected(job: RemovalJob, reason: &str, sink: &dyn super::super::Sink) -> RemovalResult {
    let Some(first) = job.removals.first() else {
        return RemovalResult {
            record: job.record,
            removed: 0,
            failure: None,
            not_started: 0,
            released: false,
        };
    };
    let log = job
        .log_dir
        .join(&job.host)
        .join(format!("{}.log", first.service));
    sink.emit(super::Event::now(EventKind::RemovalFinished {
        service: first.service.clone(),
        host: job.host.clone(),
        why: first.why,
        ok: false,
        failed_hook: Some("connect".into()),
        reason: Some(reason.to_string()),
        log: log.display().to_string(),
        emptied: false,
    }));
    RemovalResult {
        failure: Some(super::super::Failure {
            host: job.host.clone(),
            service: first.service.clone(),
            log: log.display().to_string(),
        }),
        not_started: job.removals.len() - 1,
        record: job.record,
        removed: 0,
        released: false,
    }
}
