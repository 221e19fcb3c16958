//! `on-failure "revert"`: once a service's failure budget is spent (or its progress deadline
//! passed), every host whose step of it passed in this run is switched back to what it ran
//! before: last switched first (reverse wave order, and within a wave reverse host order),
//! `batch` hosts at a time, once none of the service's steps runs any more. Nothing else of the
//! run starts from then on (other services end halted once their running steps ended), and the
//! run stops when the revert is over. A service handed to dependents is switched back by
//! batches, each dropped by them first and listed again after ([`super::revert_batches`]).
//!
//! A revert is a step (`step::run`) from the inputs the host was given by this run back to those
//! it recorded before: `stop` (the new version), the files its step replaced put back (kept on
//! the host until the service's rollout is over, see `step::run`), `install`, `migrate`, `start`
//! and `check` of the old version, with `DEPLOY_OLD_VERSION` the new version and
//! `DEPLOY_NEW_VERSION` the old one; the hooks and `env` are those the host recorded before
//! this run (but `stop`, this run's; the site's when it recorded none: [`super::stepping_back`]).
//! The host's record then says the old version with its old inputs, which is
//! not what the site says: the next `deploy apply` plans the change again. A revert that fails
//! runs no `rollback` and puts nothing back (it is left as it failed, for inspection); the
//! others go on, and the run fails either way.

use super::super::event::{EventKind, RevertEnd, RevertIntent, ServiceOutcome};
use super::super::step::{self, ServiceJob, StepResult};
use super::{stepping_back, stopping, target, Scheduler};
use crate::site::OnFailure;
use crate::state::{Outcome, ServiceRecord};
use crate::transport::{Link, Transport};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::task::JoinSet;

/// A revert's task's answer: service, host, how it went (`None`: a let-go, see
/// [`Scheduler::let_go_kept`]).
pub(super) type Reverted = (usize, usize, Option<StepResult>);

/// The run's reverts.
#[derive(Default)]
pub(super) struct Reverts {
    /// Hosts with a step of a service under `on-failure "revert"`: their lock is kept to the
    /// run's end (a revert may come to them after their last step).
    pub hosts: HashSet<usize>,
    /// Services switched back by batches, their dependents reconfigured around each
    /// ([`super::revert_batches`]); decided before the run, from the records it found.
    pub batched: HashSet<usize>,
    pub tasks: JoinSet<Reverted>,
    /// Which revert each task runs: a task that panics ends without saying.
    task_reverts: HashMap<tokio::task::Id, (usize, usize)>,
    /// Why nothing more starts: a service is being reverted.
    pub stop: Option<String>,
    /// Hosts switched back, and those whose revert failed or never started.
    pub reverted: usize,
    pub not_reverted: usize,
    /// `(host, service, log)` of every revert that failed.
    pub failures: Vec<super::super::Failure>,
    /// `(service, host)`: what a step placed there replaced is let go of once the host is free.
    let_go: Vec<(usize, usize)>,
}

impl Reverts {
    /// The hosts of the plan's services under `on-failure "revert"` (and, added by
    /// [`Scheduler::hold_for_reverts`], their dependents' hosts that a revert may reconfigure).
    pub fn new(plan: &crate::plan::Plan, host_index: &HashMap<Arc<str>, usize>) -> Reverts {
        let hosts = plan
            .services
            .iter()
            .filter(|s| s.policy.on_failure == OnFailure::Revert)
            .flat_map(|s| s.each_step())
            .filter_map(|st| host_index.get(&st.host).copied())
            .collect();
        Reverts {
            hosts,
            ..Default::default()
        }
    }

    pub fn idle(&self) -> bool {
        self.tasks.is_empty() && self.let_go.is_empty()
    }
}

/// A host a step of the service switched in this run: where it stood before.
pub(super) struct Switched {
    pub wave: usize,
    pub step: usize,
    pub host: usize,
    /// The service's record on the host before the step; `None`: installed by this run.
    pub before: Option<ServiceRecord>,
}

/// A service's revert under way.
pub(super) struct Reverting {
    /// Why: its budget spent, or its deadline passed.
    reason: String,
    /// Waits for the service's running steps to end before it starts.
    begun: bool,
    /// Still to revert, the next one last.
    pub(super) queue: Vec<Switched>,
    pub(super) running: usize,
    reverted: usize,
    failed: usize,
    /// The revert's steps' job: the service's, but for a cancel of its own (the service's may
    /// have been raised at its deadline) and no `rollback` if one fails.
    job: Arc<ServiceJob>,
    /// With dependents handed its addresses: the batch under way ([`super::revert_batches`]),
    /// how many there were, and the hosts left as they are because a dependent could not
    /// drop them.
    pub(super) batch: Option<super::revert_batches::Batch>,
    pub(super) batches: usize,
    pub(super) kept: usize,
}

impl<T: Transport> Scheduler<T> {
    /// Whether a step of `s` that ended with `result` on host `h` left the host switched in
    /// this run (passed, or stopped by its deadline once its `start` had passed): with `before`,
    /// the host's record before it, kept for a revert. Only under `on-failure "revert"`.
    pub(super) fn note_switched(
        &mut self,
        (s, w, i, h): (usize, usize, usize, usize),
        result: &StepResult,
        before: Option<ServiceRecord>,
    ) {
        let sp = &self.r.plan.services[s];
        if sp.policy.on_failure != OnFailure::Revert
            || result.skipped.is_some()
            || result.not_started
        {
            return;
        }
        let started = result.record.services.get(&sp.name).is_some_and(|r| {
            r.version == *sp.waves[w].steps[i].to
                && r.configured
                    .as_ref()
                    .is_some_and(|m| m.outcome == Outcome::Success && m.run == self.r.run_id)
        });
        let switched =
            result.ok() || (result.failed_hook.as_deref() == Some("interrupted") && started);
        if switched {
            self.svcs[s].switched.push(Switched {
                wave: w,
                step: i,
                host: h,
                before,
            });
        }
    }

    /// Starts reverting `s` for `reason` (its budget spent or its deadline passed): its waves
    /// not opened never start, nothing else of the run starts any more.
    pub(super) fn revert(&mut self, s: usize, reason: String) {
        if self.svcs[s].reverting.is_some() || self.svcs[s].finished.is_some() {
            return;
        }
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let mut left: Vec<Arc<str>> = Vec::new();
        if let Some(open) = self.svcs[s].next_wave.checked_sub(1) {
            let pending = std::mem::take(&mut self.svcs[s].pending);
            left.extend(
                pending
                    .iter()
                    .map(|&i| sp.waves[open].steps[i].host.clone()),
            );
        }
        left.extend(
            sp.waves[self.svcs[s].next_wave.min(sp.waves.len())..]
                .iter()
                .flat_map(|w| &w.steps)
                .map(|st| st.host.clone()),
        );
        self.svcs[s].next_wave = sp.waves.len();
        self.give_up(s, &left);
        // Waves that will not run drop nothing.
        self.repoints.forget_undecided(s);
        let base = &self.svcs[s].job;
        let job = Arc::new(stepping_back::revert_job(
            base,
            base.hooks.clone(),
            self.r.cancel.child(),
        ));
        self.reverts
            .stop
            .get_or_insert_with(|| format!("the run stops: {} is reverted ({reason})", sp.name));
        self.svcs[s].reverting = Some(Reverting {
            reason,
            begun: false,
            queue: Vec::new(),
            running: 0,
            reverted: 0,
            failed: 0,
            job,
            batch: None,
            batches: 0,
            kept: 0,
        });
    }

    /// Once a revert stops the run: each service not over ends halted once none of its steps
    /// runs (one under `on-failure "revert"` stopped at its deadline is reverted too); each
    /// revert starts what it may, and ends its service once it is over. When to look again.
    pub(super) fn stopped_for_revert(&mut self) -> Option<tokio::time::Instant> {
        let stop = self.reverts.stop.clone()?;
        let mut wake = None;
        for s in 0..self.svcs.len() {
            if self.svcs[s].finished.is_some() || self.svcs[s].reverting.is_some() {
                continue;
            }
            // Its deadline may pass meanwhile (and, under `on-failure "revert"`, begin its
            // revert, advanced below).
            if let Some(at) = self.deadline(s) {
                wake = Some(wake.map_or(at, |w: tokio::time::Instant| w.min(at)));
            }
            let svc = &self.svcs[s];
            if svc.finished.is_none() && svc.reverting.is_none() && svc.running == 0 {
                let (outcome, why) = match svc.missed.clone() {
                    Some(why) => (ServiceOutcome::Failed, why),
                    None => (ServiceOutcome::Halted, stop.clone()),
                };
                self.leave(s, outcome, &why);
            }
        }
        for s in 0..self.svcs.len() {
            if self.svcs[s].reverting.is_some() {
                self.advance_revert(s);
            }
        }
        wake
    }

    /// Starts the reverts of `s` that may start (`batch` at a time, each once its host is
    /// free), after its running steps ended; ends the service once none is left.
    fn advance_revert(&mut self, s: usize) {
        let Some(rv) = self.svcs[s].reverting.as_ref() else {
            return;
        };
        if self.svcs[s].running > 0 {
            return;
        }
        if !rv.begun {
            self.begin_revert(s);
        }
        if self.reverts.batched.contains(&s) {
            self.batch_reverts(s);
        } else {
            self.flow_reverts(s);
        }
        let rv = self.svcs[s].reverting.as_ref();
        if rv.is_some_and(|rv| {
            rv.running == 0
                && rv.batch.is_none()
                && (rv.queue.is_empty() || self.r.cancel.stopping())
        }) {
            self.end_revert(s);
        }
    }

    /// Starts the reverts of `s` that may start: `batch` at a time, each once its host is free.
    fn flow_reverts(&mut self, s: usize) {
        let batch = self.r.plan.services[s].policy.batch_hosts.max(1);
        loop {
            let Some(rv) = self.svcs[s].reverting.as_mut() else {
                return;
            };
            if rv.running >= batch || self.r.cancel.stopping() {
                break;
            }
            match rv.queue.last() {
                Some(next) if !self.hosts[next.host].busy => {}
                _ => break,
            }
            let Some(next) = rv.queue.pop() else { break };
            rv.running += 1;
            self.spawn_revert(s, next);
        }
    }

    /// The revert of `s` begins: the hosts to switch back, last switched first, said.
    fn begin_revert(&mut self, s: usize) {
        let name = self.r.plan.services[s].name.clone();
        let mut switched = std::mem::take(&mut self.svcs[s].switched);
        switched.sort_by_key(|sw| (sw.wave, sw.step));
        let (queue, fresh): (Vec<Switched>, Vec<Switched>) =
            switched.into_iter().partition(|sw| sw.before.is_some());
        let host_name = |sw: &Switched| self.r.plan.hosts[sw.host].name.to_string();
        let hosts = queue.iter().rev().map(host_name).collect();
        let left = fresh.iter().map(host_name).collect();
        let Some(rv) = self.svcs[s].reverting.as_mut() else {
            return;
        };
        rv.begun = true;
        rv.queue = queue;
        let reason = rv.reason.clone();
        self.emit(EventKind::ServiceReverting {
            service: name,
            reason,
            hosts,
            left,
        });
    }

    /// The revert of `s` on `sw.host`, as a step from what the host runs now back to what it
    /// ran before.
    pub(super) fn spawn_revert(&mut self, s: usize, sw: Switched) {
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let h = sw.host;
        let ph = &plan.hosts[h];
        let Some(before) = sw.before else {
            return;
        };
        let Some(rv) = self.svcs[s].reverting.as_ref() else {
            return;
        };
        let record = self.hosts[h].record.clone();
        let log = self
            .r
            .log_dir
            .join(&*ph.name)
            .join(format!("{}.log", sp.name));
        let step = &sp.waves[sw.wave].steps[sw.step];
        let back = stepping_back::step_back(&rv.job, ph, step, &before, record, log);
        let job = back.job;
        step::log_line(&job.log, &back.said);
        self.emit(EventKind::RevertStarted {
            intent: RevertIntent {
                service: sp.name.clone(),
                host: ph.name.to_string(),
                from: job.from.clone().unwrap_or_default(),
                to: before.version,
            },
            hooks: back.hooks.into(),
            secrets: back.secrets,
        });
        self.hosts[h].busy = true;
        let (links, sink, target) = (self.links.clone(), self.r.sink.clone(), target(&plan, h));
        let cancel = self.r.cancel.clone();
        let task = self.reverts.tasks.spawn(async move {
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
            (s, h, Some(result))
        });
        self.reverts.task_reverts.insert(task.id(), (s, h));
    }

    /// A service under `on-failure "revert"` ended without being reverted: what its steps'
    /// placements replaced (kept for a revert) is let go of on each host it switched, as a
    /// passed step does at once under any other policy.
    pub(super) fn let_go_kept(&mut self, s: usize) {
        if self.r.plan.services[s].policy.on_failure != OnFailure::Revert
            || self.svcs[s].reverting.is_some()
        {
            return;
        }
        let hosts: Vec<usize> = self.svcs[s].switched.drain(..).map(|sw| sw.host).collect();
        self.reverts
            .let_go
            .extend(hosts.into_iter().map(|h| (s, h)));
    }

    /// Starts the let-go of every host that is free ([`Scheduler::let_go_kept`]).
    pub(super) fn start_let_go(&mut self) {
        let plan = self.r.plan.clone();
        for (s, h) in std::mem::take(&mut self.reverts.let_go) {
            if self.hosts[h].busy {
                self.reverts.let_go.push((s, h));
                continue;
            }
            self.hosts[h].busy = true;
            let secret = self.secret_files(s, h);
            let secret: Vec<&str> = secret.iter().map(String::as_str).collect();
            let job = &self.svcs[s].job;
            let script = crate::state::let_go_keeping(
                &job.state_dir,
                &job.name,
                job.keep_generations,
                &secret,
            );
            let script = format!("{}{script}", job.guard.as_deref().unwrap_or(""));
            let log = self
                .r
                .log_dir
                .join(&*plan.hosts[h].name)
                .join(format!("{}.log", job.name));
            let (links, target) = (self.links.clone(), target(&plan, h));
            let task = self.reverts.tasks.spawn(async move {
                // Best effort: a previous file left behind costs only its space until the next
                // placement of its target lets go of it.
                let said = match links.get(&target).await {
                    Ok(link) => match link.run(&script).await {
                        Ok(out) if out.success() => None,
                        Ok(out) => Some(format!("exit {:?}", out.code)),
                        Err(e) => Some(e.to_string()),
                    },
                    Err(e) => Some(e.to_string()),
                };
                if let Some(why) = said {
                    step::log_line(&log, &format!("== let go of the previous files: {why}"));
                }
                links.step_done();
                (s, h, None)
            });
            self.reverts.task_reverts.insert(task.id(), (s, h));
        }
    }

    /// Where on host `h` service `s` places files that render a secret: they keep no replaced
    /// copy beside them (as a passed step lets go of them, `step::Running::let_go`).
    fn secret_files(&self, s: usize, h: usize) -> Vec<String> {
        let Some(sid) = self.r.site.service(&self.r.plan.services[s].name) else {
            return Vec::new();
        };
        if self.r.site.services[sid].files.is_empty() {
            return Vec::new();
        }
        let host = super::starting::planned_host(&self.r.site, &self.r.plan.hosts[h]);
        let files = self
            .r
            .desired
            .deliveries(&self.r.site, sid, &host, &self.r.secrets);
        files
            .unwrap_or_default()
            .into_iter()
            .filter(|f| {
                matches!(
                    f.content,
                    crate::desired::Content::Rendered { secret: true, .. }
                )
            })
            .map(|f| self.r.site.platform.host_path(&f.to))
            .collect()
    }

    /// A revert's task ended (or panicked).
    pub(super) fn revert_ended(
        &mut self,
        done: Result<(tokio::task::Id, Reverted), tokio::task::JoinError>,
    ) {
        let (s, h, result) = match done {
            Ok((id, (_, h, None))) => {
                self.reverts.task_reverts.remove(&id);
                self.hosts[h].busy = false;
                return;
            }
            Ok((id, (s, h, Some(result)))) => {
                self.reverts.task_reverts.remove(&id);
                (s, h, result)
            }
            Err(e) => {
                let Some((s, h)) = self.reverts.task_reverts.remove(&e.id()) else {
                    return;
                };
                self.links.step_done();
                let result = StepResult {
                    record: self.hosts[h].record.clone(),
                    failed_hook: Some("panic".into()),
                    reason: Some(format!("deploy's revert task ended abnormally: {e}")),
                    rolled_back: false,
                    released: false,
                    skipped: None,
                    not_started: false,
                    ran: None,
                };
                (s, h, result)
            }
        };
        let plan = self.r.plan.clone();
        let (name, host) = (&plan.services[s].name, plan.hosts[h].name.to_string());
        let log = self.r.log_dir.join(&host).join(format!("{name}.log"));
        let log = log.display().to_string();
        self.hosts[h].busy = false;
        self.hosts[h].record = result.record.clone();
        let ok = result.ok();
        self.emit(EventKind::RevertFinished {
            result: RevertEnd {
                service: name.clone(),
                host: host.clone(),
                ok,
                failed_hook: result.failed_hook.clone(),
                reason: result.reason.clone(),
            },
            log: log.clone(),
            record: result.record.services.get(name).cloned().map(Box::new),
        });
        if ok {
            self.reverts.reverted += 1;
        } else {
            self.reverts.not_reverted += 1;
            self.reverts.failures.push(super::super::Failure {
                host,
                service: name.clone(),
                log,
            });
        }
        if let Some(rv) = self.svcs[s].reverting.as_mut() {
            rv.running -= 1;
            if ok {
                rv.reverted += 1;
            } else {
                rv.failed += 1;
            }
        }
    }

    /// Every revert of `s` ended (or the run is stopping and those left never start): the
    /// service ends `reverted`.
    fn end_revert(&mut self, s: usize) {
        let Some(rv) = self.svcs[s].reverting.take() else {
            return;
        };
        // A batch cut short: its hosts are listed again with the service's end (`list_left`).
        if let Some(b) = &rv.batch {
            for &h in b.hosts() {
                self.repoints.dropped.remove(&(s, h));
            }
        }
        // Not begun (the run stopped while its steps still ran): none of its hosts was.
        let left = match rv.begun {
            true => rv.queue.len() + rv.batch.as_ref().map_or(0, |b| b.waiting()),
            false => self.svcs[s]
                .switched
                .iter()
                .filter(|sw| sw.before.is_some())
                .count(),
        };
        self.reverts.not_reverted += left + rv.kept;
        let mut said = format!(
            "{}; {} switched back",
            rv.reason,
            crate::words::count(rv.reverted, "host")
        );
        if rv.failed > 0 {
            said.push_str(&format!(", {} failed to", rv.failed));
        }
        if rv.kept > 0 {
            said.push_str(&format!(
                ", {} not reverted as a dependent could not drop {}",
                rv.kept,
                if rv.kept == 1 { "it" } else { "them" }
            ));
        }
        if left > 0 {
            said.push_str(&format!(", {left} not reverted as the run was interrupted"));
        }
        self.end_service(s, ServiceOutcome::Reverted, Some(said));
    }

    /// While the run is stopping: reverts not started never start; a service whose reverts
    /// are all over ends.
    pub(super) fn wind_down_reverts(&mut self) {
        for s in 0..self.svcs.len() {
            if self.svcs[s]
                .reverting
                .as_ref()
                .is_some_and(|rv| rv.running == 0)
                && self.svcs[s].running == 0
            {
                self.end_revert(s);
            }
        }
    }
}
