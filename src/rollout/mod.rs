//! Carrying out a plan: services start when their runtime needs hold, waves run under their
//! policy, each host runs one step at a time. The engine never prints; it emits [`Event`]s.

mod budget;
mod cancel;
mod diff;
mod event;
mod files;
mod hook;
mod hook_run;
mod ideal;
mod interrupt;
mod links;
mod planning;
mod processes;
mod schedule;
mod step;
mod unread;
mod verify;

#[cfg(test)]
mod security_tests;
#[cfg(test)]
mod tests;

pub use budget::{flowing, Flowing};
pub use cancel::{Cancel, Level};
pub use diff::file_diffs;
pub use event::{
    Event, EventKind, Gate, HookEnd, HookStart, Interruption, Kinds, Phase, RevertEnd,
    RevertIntent, ServiceOutcome, Sink, Skips, StepBlocked, StepEnd, StepIntent, EVENT_SCHEMA,
};
pub use hook::needs_var;
pub use ideal::makespan as ideal_makespan;
pub use planning::{Planned, Planning};
pub use processes::{kill_outcome, kill_script};
pub use unread::LockAtStep;
pub use verify::{check_converged, check_status, plan_repairs, repairs, verify, CheckResult};

use crate::plan::Plan;
use crate::site::Site;
use crate::state::HostRecord;
use crate::transport::Transport;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything a rollout needs.
pub struct Rollout<T: Transport> {
    pub plan: Arc<Plan>,
    pub site: Arc<Site>,
    pub transport: Arc<T>,
    pub sink: Arc<dyn Sink>,
    pub gate: Arc<dyn Gate>,
    /// Unique per run; names the log directory and is written into host records.
    pub run_id: String,
    /// `.drover/runs/<run-id>`: one log per host and service.
    pub log_dir: PathBuf,
    pub max_connections: usize,
    /// Read at apply time; handed to hooks, redacted from logs and events.
    pub secrets: Arc<crate::secrets::Secrets>,
    /// What each host must run: the inputs a step records, the files it delivers.
    pub desired: Arc<crate::desired::Desired>,
    /// Set by whoever handles signals: stop starting steps, or abort the running ones.
    pub cancel: Cancel,
    /// Shell text that gives the run's lock back on a host: it ends the last command of a host
    /// whose last step passes (after a step that placed files, the command that lets go of
    /// what they replaced), instead of a command of its own after the rollout. Those hosts are
    /// in [`Summary::released`].
    pub release: Option<String>,
    /// Shell text every command that changes a host starts with, refused there unless this
    /// run still holds the host's lock and no newer fencing token was seen
    /// ([`crate::state::lock::guard_script`]); `None` for a run that takes no host lock.
    pub guard: Option<String>,
    /// Locks and reads the hosts the plan did not read (its [`StepKind::Unread`] steps), in
    /// the command before their first step; `None` when it read every host.
    ///
    /// [`StepKind::Unread`]: crate::plan::StepKind::Unread
    pub lock_at_step: Option<Arc<dyn LockAtStep<T::Link>>>,
    /// A host whose lock [`Rollout::release`] must not give back: the run holds it to its
    /// end (a run with unread steps, so that no other run of the site starts meanwhile).
    pub held_to_end: Option<Arc<str>>,
    /// Services planned during the run, as their hosts are read; `None` when the plan plans
    /// every service.
    pub planning: Option<Planning>,
}

/// How a run ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub succeeded: usize,
    pub failed: usize,
    /// Steps never started: halted or blocked services, hosts whose earlier step failed.
    pub not_started: usize,
    /// Hosts the plan could not reach or read (before the run, or at an unread step).
    pub unreachable: usize,
    /// Of those, hosts that answered but whose state file could not be read.
    pub unreadable: usize,
    /// Unread steps whose host was found to run what the site says already.
    pub skipped: usize,
    /// Every failed step, by host, service and log.
    pub failures: Vec<Failure>,
    /// Hosts whose lock went with their last command ([`Rollout::release`]).
    pub released: Vec<String>,
    /// `(host, why)`: hosts whose lock was refused as they were read during the run.
    pub refused: Vec<(String, String)>,
    /// The steps that succeeded, by what they did, and the hosts left alone.
    pub kinds: Kinds,
    /// The hosts left alone ([`Kinds::skipped`]), by why.
    pub skips: Skips,
    /// Services taken off hosts (the plan's removals, with `--prune`).
    pub removed: usize,
    /// The plan's removals this run did not carry out: how many, and why.
    pub removals_left: Option<(usize, String)>,
    /// Hosts switched back by `on-failure "revert"`, and those whose revert failed or never
    /// started (the run interrupted first); a failed revert is in `failures` too.
    pub reverted: usize,
    pub not_reverted: usize,
}

/// A failed step (a service's step, a dependent's reconfigure, a removal or a revert): on which
/// host, of which service, and where its log is. Ordered by host, then service, then log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Failure {
    pub host: String,
    pub service: String,
    pub log: String,
}

impl Summary {
    /// Everything planned was done and every host was reachable.
    pub fn converged(&self) -> bool {
        self.failed == 0
            && self.reverted == 0
            && self.not_reverted == 0
            && self.not_started == 0
            && self.unreachable == 0
            && self.refused.is_empty()
    }
}

/// Runs the plan to the end and reports how it went.
pub async fn run<T: Transport>(rollout: Rollout<T>) -> Summary {
    schedule::Scheduler::new(rollout).run().await
}

/// The record each host starts from: what was observed when planning.
pub fn initial_record(plan: &Plan, host: usize) -> HostRecord {
    record_of(&plan.hosts[host].observed)
}

/// The record a host starts from when it was found to run `observed`.
fn record_of(observed: &crate::state::Observed) -> HostRecord {
    match observed {
        crate::state::Observed::Running { services } => HostRecord {
            schema: HostRecord::SCHEMA,
            services: services.clone(),
        },
        _ => HostRecord {
            schema: HostRecord::SCHEMA,
            ..Default::default()
        },
    }
}
