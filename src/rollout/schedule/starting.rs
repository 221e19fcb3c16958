//! A step's start: its job built from the plan and the site (env, inputs, files, whether it
//! gives the host's lock back), and its task spawned: connect, settle an unread step, run.

use super::super::event::{Event, EventKind, StepBlocked, StepIntent};
use super::super::hook::step_env;
use super::super::step::{self, ServiceJob, StepJob, StepResult};
use super::super::unread::{self, Unread};
use super::{stopping, Ended, Scheduler, StepAt};
use crate::plan::StepKind;
use crate::transport::Transport;
use std::sync::Arc;

impl<T: Transport> Scheduler<T> {
    pub(super) fn spawn_step(&mut self, s: usize, w: usize, i: usize, h: usize) {
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let st = &sp.waves[w].steps[i];
        let host = &plan.hosts[h];
        self.hosts[h].busy = true;
        self.svcs[s].running += 1;
        if let Some(open) = self.svcs[s].open.iter_mut().find(|o| o.wave == w) {
            open.running += 1;
        }
        let sid = self.r.site.service(&sp.name);
        let inputs = sid.map_or_else(Default::default, |sid| {
            self.r.desired.inputs(sid, crate::inventory::HostId::new(h))
        });
        let files = match sid {
            Some(sid) if !self.r.site.services[sid].files.is_empty() => self.r.desired.deliveries(
                &self.r.site,
                sid,
                &planned_host(&self.r.site, host),
                &self.r.secrets,
            ),
            _ => Ok(Vec::new()),
        };
        let files = files.map(|list| {
            list.into_iter()
                .map(|mut d| {
                    d.to = self.r.site.platform.host_path(&d.to);
                    d
                })
                .collect()
        });
        let job = StepJob {
            service: self.svcs[s].job.clone(),
            host: host.name.to_string(),
            env: step_env(&self.svcs[s].job.env, host, st.from.as_deref(), &st.to),
            from: st.from.as_ref().map(|f| f.to_string()),
            to: st.to.to_string(),
            kind: st.kind,
            path: st.path.unwrap_or(crate::plan::Path::SwitchOver),
            inputs,
            files,
            record: self.hosts[h].record.clone(),
            log: self
                .r
                .log_dir
                .join(&*host.name)
                .join(format!("{}.log", sp.name)),
            reasons: st.reasons.clone(),
            restarts: st.restarts.clone(),
            // Not under `on-failure "revert"`: a revert may still come to the host once its
            // steps are over; its lock is given back after the rollout.
            release: (self.hosts[h].steps_left == 1
                && self.r.held_to_end.as_deref() != Some(&*host.name)
                && !self.reverts.hosts.contains(&h))
            .then(|| self.r.release.as_deref().map(Arc::from))
            .flatten(),
            revert: false,
            stop_now: None,
        };
        let unread = (st.kind == StepKind::Unread).then(|| Unread {
            site: self.r.site.clone(),
            desired: self.r.desired.clone(),
            plan: plan.clone(),
            service: sid,
            host: h,
            read: self.hosts[h].read,
            lock: self.r.lock_at_step.clone(),
        });
        let gone = unread
            .as_ref()
            .and_then(|_| self.left_alone(h))
            .map(str::to_string);
        let (links, sink, target) = (self.links.clone(), self.r.sink.clone(), target(&plan, h));
        // The service's own: stopping with the run, or alone (its progress deadline passed);
        // an abort of the run's kills the run's hooks on the host (`abortable`), the service's
        // alone only the step's own hook (`step::Running::hooks`).
        let cancel = self.svcs[s].job.cancel.clone();
        let run_cancel = self.r.cancel.clone();
        self.svcs[s].progressed = Some(tokio::time::Instant::now());
        let service = sp.name.clone();
        let unread_step = unread.is_some();
        // Not in the plan shown before the run: said with its kind and reasons as it starts.
        let decided = unread_step || !self.svcs[s].shown;
        let at = StepAt {
            service: s,
            wave: w,
            step: i,
        };
        let task = self.tasks.spawn(async move {
            let started = |job: &StepJob| {
                sink.emit(Event::now(EventKind::StepStarted {
                    intent: StepIntent {
                        service: service.clone(),
                        host: job.host.clone(),
                        from: job.from.clone(),
                        to: job.to.clone(),
                    },
                    kind: job.kind,
                    reasons: job.reasons.clone(),
                    path: job.path,
                    restarts: job.restarts.clone(),
                    decided,
                }))
            };
            // Said, its intent published and acknowledged (with a store), as the run was being
            // stopped (a signal, the lease lost, an intent etcd did not take): nothing has
            // touched its host, and nothing does now; said blocked, counted not started.
            let held_back = |job: &StepJob| {
                cancel.stopping().then(|| {
                    let why = format!("the run is stopping ({})", cancel.reason());
                    step::log_line(&job.log, &format!("== not started: {why}"));
                    sink.emit(Event::now(EventKind::StepBlocked(StepBlocked {
                        service: service.clone(),
                        host: job.host.clone(),
                        reason: why,
                    })));
                    StepResult::not_started(job.record.clone())
                })
            };
            // Emitted by the step itself, before its first command: the journal syncs the
            // intents of a wave's steps together instead of one after another. An unread
            // step's is emitted once its host is read: until then it is not known to run.
            if !unread_step {
                started(&job);
                if let Some(result) = held_back(&job) {
                    return Ended { at, result };
                }
            }
            if let Some(why) = gone {
                step::log_line(&job.log, &format!("== connect: {why}"));
                return Ended {
                    at,
                    result: unread::unreachable(job.record, why),
                };
            }
            let result = match links.get(&target).await {
                Ok(link) => {
                    let job = match unread {
                        Some(unread) => unread.settle(job, &*link, &target).await,
                        None => Ok(job),
                    };
                    match job {
                        // Locked and read as the run was being stopped: nothing starts now
                        // (a step already running before the stop goes on).
                        Ok(job) if unread_step && cancel.stopping() => {
                            step::log_line(&job.log, "== not started: the run is stopping");
                            StepResult::not_started(job.record)
                        }
                        Ok(job) => {
                            if unread_step {
                                started(&job);
                            }
                            match held_back(&job) {
                                Some(result) => result,
                                None => {
                                    let state_dir = job.service.state_dir.clone();
                                    let run = step::run(job, &*link, &*sink);
                                    stopping::abortable(run, &*link, &state_dir, &run_cancel).await
                                }
                            }
                        }
                        Err(ended) => ended,
                    }
                }
                Err(e) if unread_step => {
                    step::log_line(&job.log, &format!("== connect: {e}"));
                    unread::unreachable(job.record, e.to_string())
                }
                Err(e) => {
                    step::log_line(&job.log, &format!("== connect: {e}"));
                    StepResult::not_connected(job.record, e.to_string())
                }
            };
            links.step_done();
            Ended { at, result }
        });
        self.task_steps.insert(task.id(), at);
    }

    /// Why host `h`'s unread steps are left alone: it did not answer at an earlier unread
    /// step, or when it was read during the run (or its state could not be read then), and is
    /// left alone for the rest of the run, as one found so before it is.
    pub(super) fn left_alone(&self, h: usize) -> Option<&str> {
        if self.unreachable_hosts.contains(&h) {
            return Some("it did not answer at an earlier step of this run");
        }
        self.hosts[h].unread_reason.as_deref()
    }
}

/// A planned host as the inventory gave it (class names back to ids).
pub(super) fn planned_host(
    site: &crate::site::Site,
    h: &crate::plan::PlannedHost,
) -> crate::inventory::Host {
    crate::inventory::Host {
        name: h.name.clone(),
        address: h.address.clone(),
        classes: h.classes.iter().filter_map(|c| site.class(c)).collect(),
        tags: h.tags.clone(),
    }
}

/// What every step of service `s` shares: its hooks, policy, env.
pub(super) fn job_of<T: Transport>(
    r: &super::super::Rollout<T>,
    plan: &crate::plan::Plan,
    s: &crate::plan::ServicePlan,
    state_dir: &str,
    cancel: super::super::Cancel,
) -> Arc<ServiceJob> {
    let model = r.site.service(&s.name).map(|id| &r.site.services[id]);
    Arc::new(ServiceJob {
        name: s.name.clone(),
        hooks: model.map(|m| m.hooks.clone()).unwrap_or_default(),
        on_failure: s.policy.on_failure,
        env: super::super::hook::service_env(&r.site, plan, s),
        state_dir: state_dir.into(),
        keep_generations: r.site.platform.keep_generations,
        run: r.run_id.clone(),
        secrets: r.secrets.clone(),
        cancel,
        guard: r.guard.as_deref().map(Arc::from),
    })
}

pub(super) fn target(plan: &crate::plan::Plan, h: usize) -> crate::transport::Target {
    crate::transport::Target {
        name: plan.hosts[h].name.to_string(),
        address: plan.hosts[h].address.to_string(),
    }
}
