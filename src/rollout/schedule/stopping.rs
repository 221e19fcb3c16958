//! The scheduler when a run is interrupted. On `Stop` (a first Ctrl-C) no wave opens and no
//! step starts any more: running steps go on to their end, and each service ends as soon as it
//! has no step running, what it had left counting as not started. On `Abort` (a second one)
//! each running step also kills its hooks on its host and records itself as interrupted.

use super::super::cancel::{Cancel, Level};
use super::super::event::{EventKind, Interruption, ServiceOutcome};
use super::super::processes::kill_running;
use super::Scheduler;
use crate::transport::{Link, Transport};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long an aborted step keeps killing its hooks before it just waits for them.
const KILL_GRACE: Duration = Duration::from_secs(20);

impl<T: Transport> Scheduler<T> {
    /// The run reached `level`: say so (once per level).
    pub(super) fn interrupted(&mut self, level: Level) {
        let running = self.svcs.iter().map(|s| s.running).sum();
        self.emit(EventKind::Interrupted(Interruption {
            abort: level >= Level::Abort,
            running,
            reason: self.r.cancel.reason(),
        }));
        self.wind_down();
    }

    /// While stopping: ends every service that has no step running. One whose steps all ran
    /// ends as usual; one with steps left (or never started) ends `interrupted`, those steps
    /// not started.
    pub(super) fn wind_down(&mut self) {
        self.wind_down_reverts();
        self.leave_unfinished(ServiceOutcome::Interrupted, "the run was interrupted");
    }

    /// Ends every service that has no step running and is not over yet, `outcome` for `reason`
    /// if it has steps left (or never started); those steps count as not started.
    pub(super) fn leave_unfinished(&mut self, outcome: ServiceOutcome, reason: &str) {
        for s in 0..self.svcs.len() {
            let svc = &self.svcs[s];
            // Being reverted: it ends once its reverts have (`reverting.rs`).
            if svc.finished.is_some() || svc.running > 0 || svc.reverting.is_some() {
                continue;
            }
            // Stopped at its progress deadline before: failed, for that reason.
            if let Some(why) = svc.missed.clone() {
                self.leave(s, ServiceOutcome::Failed, &why);
                continue;
            }
            self.leave(s, outcome, reason);
        }
    }

    /// Ends service `s`, which has no step running, `outcome` for `reason` if it has steps left
    /// (or never started), or if `outcome` is `Failed`; those steps count as not started.
    pub(super) fn leave(&mut self, s: usize, outcome: ServiceOutcome, reason: &str) {
        let plan = self.r.plan.clone();
        let svc = &self.svcs[s];
        let sp = &plan.services[s];
        let mut left: Vec<Arc<str>> = Vec::new();
        if svc.started {
            if svc.next_wave > 0 {
                let open = &sp.waves[svc.next_wave - 1];
                left.extend(svc.pending.iter().map(|&i| open.steps[i].host.clone()));
            }
            left.extend(
                sp.waves[svc.next_wave..]
                    .iter()
                    .flat_map(|w| &w.steps)
                    .map(|st| st.host.clone()),
            );
        } else {
            left.extend(sp.each_step().map(|st| st.host.clone()));
        }
        // Every step ran, but for unread steps left not started as the run stopped: those
        // leave the service interrupted, not done.
        let stopped_short = outcome == ServiceOutcome::Interrupted && svc.not_started > 0;
        if svc.started && left.is_empty() && !stopped_short && outcome != ServiceOutcome::Failed {
            let outcome = if svc.failed > 0 {
                ServiceOutcome::Failed
            } else {
                ServiceOutcome::Done
            };
            self.end_service(s, outcome, None);
            return;
        }
        self.give_up(s, &left);
        // Its open waves end too, each said so, before the service does.
        let failed = self.svcs[s].failed;
        for open in std::mem::take(&mut self.svcs[s].open) {
            self.emit(EventKind::WaveFinished {
                service: sp.name.clone(),
                wave: open.wave + 1,
                failed,
            });
        }
        let svc = &mut self.svcs[s];
        svc.pending.clear();
        svc.started = true;
        self.end_service(s, outcome, Some(reason.to_string()));
    }
}

/// Runs a step; if the run is aborted meanwhile, kills this process's hooks on the step's host
/// (again and again, since a hook may be just starting) until the step ends, for at most
/// [`KILL_GRACE`], and then still waits for the step, which records itself as interrupted.
pub(super) async fn abortable<L: Link, R>(
    step: impl Future<Output = R>,
    link: &L,
    state_dir: &str,
    cancel: &Cancel,
) -> R {
    tokio::pin!(step);
    tokio::select! {
        biased;
        r = &mut step => return r,
        _ = cancel.reached(Level::Abort) => {}
    }
    tokio::select! {
        r = &mut step => r,
        _ = kill_running(link, state_dir, KILL_GRACE) => step.await,
    }
}
