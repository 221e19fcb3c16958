//! A step's end: its task's answer (or its panic) counted, its host's record and budget
//! updated, its host's link handed back when the host has no step left.

use super::super::step::StepResult;
use super::{Ended, Scheduler, StepAt};
use crate::plan::{SkipReason, StepKind};
use crate::rollout::event::{EventKind, StepEnd};
use crate::transport::Transport;

impl<T: Transport> Scheduler<T> {
    /// A step's task ended.
    pub(super) async fn ended(
        &mut self,
        done: Result<(tokio::task::Id, Ended), tokio::task::JoinError>,
    ) {
        match done {
            Ok((id, Ended { at, result })) => {
                self.task_steps.remove(&id);
                self.finish_step(at, result).await;
            }
            // A step whose task panicked failed: recorded as such, its host no further stepped,
            // never lost from the counts.
            Err(e) => {
                if let Some(at) = self.task_steps.remove(&e.id()) {
                    let result = self.panicked(at, &e);
                    self.links.step_done();
                    self.finish_step(at, result).await;
                }
            }
        }
    }

    /// What a step whose task panicked ended with: failed, its host's record as the step
    /// found it (the host's own may be newer: it is read again by the next apply).
    fn panicked(&self, at: StepAt, e: &tokio::task::JoinError) -> StepResult {
        let host = &self.r.plan.services[at.service].waves[at.wave].steps[at.step].host;
        let record = self
            .host_index
            .get(host)
            .map(|&h| self.hosts[h].record.clone())
            .unwrap_or_default();
        StepResult {
            record,
            failed_hook: Some("panic".into()),
            reason: Some(format!("deploy's step task ended abnormally: {e}")),
            rolled_back: false,
            released: false,
            skipped: None,
            not_started: false,
            ran: None,
        }
    }

    /// A step's task answered: its event, then the counts. An unread step that ran nothing
    /// once its host was read is counted apart, neither succeeded nor failed; a host found
    /// at the desired state counts as healthy.
    async fn finish_step(&mut self, at: StepAt, result: StepResult) {
        let StepAt {
            service: s,
            wave: w,
            step: i,
        } = at;
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let st = &sp.waves[w].steps[i];
        let Some(&h) = self.host_index.get(&st.host) else {
            return;
        };
        let skipped = result.skipped.clone();
        let ok = result.ok();
        let ran = result.ran;
        match skipped.clone() {
            // Never said to have started: nothing to say of its end either.
            _ if result.not_started => {}
            Some((skip, reason)) => self.emit(EventKind::StepSkipped {
                service: sp.name.clone(),
                host: st.host.to_string(),
                skip,
                reason,
            }),
            None => self.emit(EventKind::StepFinished {
                result: StepEnd {
                    service: sp.name.clone(),
                    host: st.host.to_string(),
                    ok,
                    failed_hook: result.failed_hook.clone(),
                    rolled_back: result.rolled_back,
                    reason: result.reason.clone(),
                },
                log: self
                    .r
                    .log_dir
                    .join(&*st.host)
                    .join(format!("{}.log", sp.name))
                    .display()
                    .to_string(),
                record: result.record.services.get(&sp.name).cloned().map(Box::new),
            }),
        }
        if result.released {
            self.released.push(st.host.to_string());
        }
        // A host refused the step's commands: another run holds it now (it broke this run's
        // lock, or etcd gave it the site with a newer fencing token). Nothing more starts.
        if result
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(crate::state::lock::GUARD_MARK))
        {
            self.r.cancel.raise(
                super::super::cancel::Level::Stop,
                "fenced: another run holds a host of this run",
            );
        }
        let host = &mut self.hosts[h];
        host.busy = false;
        // What the service ran there before (a host read only at this step: not known).
        let before = match host.read {
            true => host.record.services.get(&sp.name).cloned(),
            false => None,
        };
        // An unread step's host was read in the command before its hooks (whatever they
        // did); not when its lock was refused, it could not be read, nor when the task
        // panicked (perhaps before the read, and the record it hands back is the one from
        // before): a later step reads it again.
        if st.kind == StepKind::Unread
            && !matches!(result.failed_hook.as_deref(), Some("lock" | "panic"))
            && !matches!(skipped, Some((SkipReason::Unreachable, _)))
        {
            host.read = true;
            self.rounds_due = true;
        }
        host.record = result.record.clone();
        self.note_switched((s, w, i, h), &result, before);
        let host = &mut self.hosts[h];
        let svc = &mut self.svcs[s];
        svc.running -= 1;
        svc.progressed = Some(tokio::time::Instant::now());
        if let Some(open) = svc.open.iter_mut().find(|o| o.wave == w) {
            open.running -= 1;
            open.failed += usize::from(!ok);
        }
        match skipped {
            _ if result.not_started => svc.not_started += 1,
            Some((SkipReason::Unreachable, why)) => {
                svc.unreachable += 1;
                host.broken.insert(s);
                self.unreachable_hosts.insert(h);
                if why.is_some_and(|w| w.starts_with(crate::plan::STATE_UNREADABLE)) {
                    svc.unreadable += 1;
                    self.unreadable_hosts.insert(h);
                }
            }
            Some(_) => {
                svc.skipped += 1;
                svc.healthy += 1;
                host.done.insert(s);
            }
            None if ok => {
                svc.succeeded += 1;
                if let Some(kind) = ran {
                    svc.kinds.add(kind);
                }
                // A host reconfigured at its version was counted healthy already (a
                // repaired one was not: its check failed).
                if st.kind != StepKind::Reconfigure {
                    svc.healthy += 1;
                }
                host.done.insert(s);
            }
            None => {
                svc.failed += 1;
                if host.failed.is_empty() {
                    self.failed_hosts += 1;
                }
                host.broken.insert(s);
                host.failed.insert(s);
            }
        }
        if self.host_step_over(h) {
            self.links.release(&plan.hosts[h].name);
        }
        self.settle(s, w);
    }

    /// One step of host `h` is over (done, failed or blocked); whether it has none left.
    pub(super) fn host_step_over(&mut self, h: usize) -> bool {
        let host = &mut self.hosts[h];
        host.steps_left = host.steps_left.saturating_sub(1);
        host.steps_left == 0
    }
}
