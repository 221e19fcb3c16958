//! What the rollout tells the world: a stream of events; renderers are consumers.

use crate::plan::Condition;
use serde::Serialize;
use std::time::SystemTime;

/// Version of the NDJSON event schema.
pub const EVENT_SCHEMA: u32 = 2;

/// One event, stamped with the time it happened.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    pub fn now(kind: EventKind) -> Event {
        Event {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            kind,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum EventKind {
    RunStarted {
        schema: u32,
        run: String,
        site: String,
        services: usize,
        hosts: usize,
        steps: usize,
        log_dir: String,
    },
    ServiceWaiting {
        service: String,
        waits_for: Vec<Condition>,
    },
    /// A service planned during the run, once every host it is planned from was read
    /// (`deploy apply --yes`, which starts the services whose hosts are read first): its
    /// steps, waves and hosts left alone. Until then it had no steps of its own. Or, when its
    /// needs held first, started under its placeholders (`unread` given): its steps those of
    /// every host it may change, `unread` of them on hosts still being read; each is decided
    /// once its host is read, and ends at once if the host needs nothing.
    ServicePlanned {
        service: String,
        waves: usize,
        steps: usize,
        skipped: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        unread: Option<usize>,
    },
    /// A host's lock was refused as it was read during the run (another run holds it):
    /// nothing more starts, and the run ends not converged.
    Refused { host: String, reason: String },
    ServiceStarted {
        service: String,
        waves: usize,
        steps: usize,
    },
    WaveStarted {
        service: String,
        wave: usize,
        canary: bool,
        hosts: Vec<String>,
    },
    StepStarted {
        service: String,
        host: String,
        from: Option<String>,
        to: String,
    },
    /// A hook is about to run on its host (written to the run journal before it runs).
    HookStarted {
        service: String,
        host: String,
        hook: String,
    },
    HookFinished {
        service: String,
        host: String,
        hook: String,
        ok: bool,
        code: Option<i32>,
        ms: u64,
    },
    StepFinished {
        service: String,
        host: String,
        ok: bool,
        failed_hook: Option<String>,
        rolled_back: bool,
        reason: Option<String>,
        log: String,
        /// The service's record as the step left it on the host (not in the NDJSON: it is
        /// the host's state file's to say; the shared store publishes it).
        #[serde(skip)]
        record: Option<Box<crate::state::ServiceRecord>>,
    },
    StepBlocked {
        service: String,
        host: String,
        reason: String,
    },
    /// An unread step ran nothing once its host was locked and read (`deploy apply` over
    /// `--max-connections`): the host already runs what the site says (`at-version`), or it
    /// could not be read (`unreachable`, with why) and is left alone.
    StepSkipped {
        service: String,
        host: String,
        skip: crate::plan::SkipReason,
        reason: Option<String>,
    },
    WaveFinished {
        service: String,
        wave: usize,
        failed: usize,
    },
    ServiceFinished {
        service: String,
        outcome: ServiceOutcome,
        reason: Option<String>,
        succeeded: usize,
        failed: usize,
        not_started: usize,
    },
    /// The run was told to stop (`abort: false`: no new step starts, running steps finish)
    /// or to abort (`abort: true`: running steps are killed and recorded as interrupted).
    Interrupted {
        abort: bool,
        /// Steps running when it happened.
        running: usize,
        /// Why: a signal, or the run journal that cannot be written.
        reason: String,
    },
    RunFinished {
        converged: bool,
        succeeded: usize,
        failed: usize,
        not_started: usize,
        /// Unread steps whose host already ran what the site says (absent when none).
        #[serde(skip_serializing_if = "is_zero")]
        skipped: usize,
        /// Hosts the run could not reach or read, before it or at an unread step (absent
        /// when none).
        #[serde(skip_serializing_if = "is_zero")]
        unreachable: usize,
        /// Hosts whose lock was refused as they were read during the run (absent when none).
        #[serde(skip_serializing_if = "is_zero")]
        refused: usize,
        ms: u64,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// How a service's rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServiceOutcome {
    /// Every planned step ran and succeeded.
    Done,
    /// Some steps failed; every wave ran.
    Failed,
    /// Waves stopped: failure budget exceeded or `on-failure "stop"`.
    Halted,
    /// Never started: a runtime dependency can no longer be met.
    Blocked,
    /// The run was interrupted: the service's steps not yet started never will be.
    Interrupted,
}

/// Where events go. The engine never prints.
pub trait Sink: Send + Sync {
    fn emit(&self, event: Event);
}

/// Asked before a wave whose policy pauses with `confirm`.
pub trait Gate: Send + Sync {
    /// Whether to start wave `wave` of `service`.
    fn confirm(&self, service: &str, wave: usize) -> bool;
}
