//! What the rollout tells the world: a stream of events; renderers are consumers.

use crate::plan::Condition;
pub use crate::state::journal::{
    HookEnd, HookStart, Interruption, RevertEnd, RevertIntent, StepBlocked, StepEnd, StepIntent,
};
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
    /// A pool wait dropped during the run because it would go round (found once hosts read
    /// during the run made it known; those found when planning are in the plan): the step of
    /// `service` on `host` does not wait for `waits_for`, and `why` says the round.
    WaitDropped {
        service: String,
        host: String,
        waits_for: crate::plan::HostStep,
        why: String,
    },
    /// A host's lock was refused as it was read during the run (another run holds it):
    /// nothing more starts, and the run ends not converged.
    Refused {
        host: String,
        reason: String,
    },
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
    /// A step about to change its host (its intent, as the run journal records it, then
    /// what it does).
    StepStarted {
        #[serde(flatten)]
        intent: StepIntent,
        /// What the step does: `install`, `upgrade`, `retry`, `reconfigure`, … (for a host
        /// read at its step, what was decided once it was read).
        kind: crate::plan::StepKind,
        /// Why a reconfigure (as in the plan; absent when none).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        reasons: Vec<String>,
        /// Which hooks it runs, as in the plan: `switch-over`, `reload` or `record`.
        path: crate::plan::Path,
        /// A reconfigure by switch-over of a service with `reload`: the changed inputs that
        /// need a restart, as in the plan (absent when none).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        restarts: Vec<String>,
        /// Decided during the run, once its host was read at its step (`deploy apply --yes`
        /// over `--max-connections`, or a service planned as its hosts are read): the plan
        /// shown before the run did not hold this step's kind and reasons (absent when false).
        #[serde(skip_serializing_if = "is_false")]
        decided: bool,
    },
    /// A hook is about to run on its host (written to the run journal before it runs).
    HookStarted(HookStart),
    HookFinished(HookEnd),
    /// How a step ended (its result, as the run journal records it), and its log.
    StepFinished {
        #[serde(flatten)]
        result: StepEnd,
        log: String,
        /// The service's record as the step left it on the host (not in the NDJSON: it is
        /// the host's state file's to say; the shared store publishes it).
        #[serde(skip)]
        record: Option<Box<crate::state::ServiceRecord>>,
    },
    StepBlocked(StepBlocked),
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
    /// A dependent's host is reconfigured with a pool of the service it needs other than the
    /// site's, while a wave of that service runs: `drop` before the wave stops `hosts` (their
    /// address or port changes, or the need says `drain=#true`), `list` once their steps
    /// ended. `listed`: the hosts of `needs` it is given now.
    RepointStarted {
        service: String,
        host: String,
        needs: String,
        phase: Phase,
        hosts: Vec<String>,
        listed: Vec<String>,
    },
    RepointFinished {
        service: String,
        host: String,
        needs: String,
        phase: Phase,
        ok: bool,
        reason: Option<String>,
        log: String,
        /// The dependent's record as the reconfigure left it on the host (not in the NDJSON).
        #[serde(skip)]
        record: Option<Box<crate::state::ServiceRecord>>,
    },
    /// A service's removal from a host starts (`--prune`): its recorded `stop` and `remove`
    /// hooks run, then its record is deleted.
    RemovalStarted {
        service: String,
        host: String,
        version: String,
        why: crate::plan::RemovalWhy,
    },
    RemovalFinished {
        service: String,
        host: String,
        why: crate::plan::RemovalWhy,
        ok: bool,
        failed_hook: Option<String>,
        reason: Option<String>,
        log: String,
        /// The host records no service any more (the store forgets a host gone from the
        /// inventory then).
        #[serde(skip)]
        emptied: bool,
    },
    /// The plan's removals the run did not carry out, and why (no `--prune`, a step that did
    /// not pass, the run stopped).
    RemovalsLeft {
        count: usize,
        reason: String,
    },
    /// `on-failure "revert"`: the service's failure budget is spent (or its progress deadline
    /// passed), its running steps have ended, and the hosts this run switched are switched
    /// back, in the order of `hosts` (last switched first); `left`: hosts it installed, which
    /// ran nothing before and are left as they are. Nothing else of the run starts any more.
    ServiceReverting {
        service: String,
        reason: String,
        hosts: Vec<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        left: Vec<String>,
    },
    /// A host's revert starts: from the version it runs now back to the one it ran before.
    RevertStarted {
        #[serde(flatten)]
        intent: RevertIntent,
        /// `"recorded"`: with the hooks and `env` the host recorded before this run; `"site"`:
        /// with the site's, as it recorded none (an older `deploy`, or taken from the store).
        hooks: String,
        /// Secrets this run changed: the revert's hooks get the site's current values.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        secrets: Vec<String>,
    },
    RevertFinished {
        #[serde(flatten)]
        result: RevertEnd,
        log: String,
        /// The service's record as the revert left it on the host (not in the NDJSON).
        #[serde(skip)]
        record: Option<Box<crate::state::ServiceRecord>>,
    },
    /// The run was told to stop or to abort ([`Interruption`]).
    Interrupted(Interruption),
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
        /// Of those, hosts that answered but whose state file could not be read (absent when
        /// none).
        #[serde(default, skip_serializing_if = "is_zero")]
        unreadable: usize,
        /// Hosts whose lock was refused as they were read during the run (absent when none).
        #[serde(skip_serializing_if = "is_zero")]
        refused: usize,
        /// Hosts switched back by `on-failure "revert"` (absent when none).
        #[serde(skip_serializing_if = "is_zero")]
        reverted: usize,
        /// Hosts it did not switch back: their revert failed, or the run was interrupted
        /// first (absent when none).
        #[serde(skip_serializing_if = "is_zero")]
        not_reverted: usize,
        /// The steps that succeeded, by what they did, and the hosts left alone
        /// ([`Kinds::skipped`]).
        kinds: Kinds,
        /// The hosts left alone ([`Kinds::skipped`]), by why.
        skips: Skips,
        ms: u64,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Steps that succeeded, counted by what they did (an unread step by what it was decided to
/// be once its host was read), and the hosts the run left alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Kinds {
    pub installed: usize,
    pub upgraded: usize,
    pub retried: usize,
    pub reconfigured: usize,
    pub repaired: usize,
    /// A service's hosts the run left alone, each once per service, however it was found
    /// ([`Skips::total`]): skipped in the plan (before the run, or as it was made during the
    /// run) or at an unread step once its host was read. Not steps that succeeded: not in
    /// `succeeded`, nor in [`Kinds::text`].
    pub skipped: usize,
}

impl Kinds {
    /// Counts one succeeded step of `kind` (an unread step that ran nothing is not one).
    pub fn add(&mut self, kind: crate::plan::StepKind) {
        use crate::plan::StepKind;
        match kind {
            StepKind::Install => self.installed += 1,
            StepKind::Upgrade => self.upgraded += 1,
            StepKind::Retry => self.retried += 1,
            StepKind::Reconfigure => self.reconfigured += 1,
            StepKind::Repair => self.repaired += 1,
            StepKind::Unread => {}
        }
    }

    /// Adds `other`'s counts.
    pub fn add_all(&mut self, other: &Kinds) {
        self.installed += other.installed;
        self.upgraded += other.upgraded;
        self.retried += other.retried;
        self.reconfigured += other.reconfigured;
        self.repaired += other.repaired;
        self.skipped += other.skipped;
    }

    /// `2 installed, 1 reconfigured` (kinds with none left out), or `None` when none.
    pub fn text(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.installed, "installed"),
            (self.upgraded, "upgraded"),
            (self.retried, "retried"),
            (self.reconfigured, "reconfigured"),
            (self.repaired, "repaired"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, word)| format!("{n} {word}"))
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// A service's hosts the run left alone, each once per service, by why: found converged (in
/// the plan, or once read at an unread step), not answering, answering with a state file that
/// cannot be read, or left out by `--on` (the plan's `skipped`, with what the run found).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Skips {
    pub converged: usize,
    pub unreachable: usize,
    pub unreadable: usize,
    pub not_selected: usize,
}

impl Skips {
    /// Every host left alone: [`Kinds::skipped`].
    pub fn total(&self) -> usize {
        self.converged + self.unreachable + self.unreadable + self.not_selected
    }

    /// Counts one host of a service left alone for `reason` (`unreadable`: it answered, but
    /// its state file could not be read).
    pub fn add(&mut self, reason: crate::plan::SkipReason, unreadable: bool) {
        use crate::plan::SkipReason;
        match reason {
            SkipReason::AtVersion => self.converged += 1,
            SkipReason::NotSelected => self.not_selected += 1,
            SkipReason::Unreachable if unreadable => self.unreadable += 1,
            SkipReason::Unreachable => self.unreachable += 1,
        }
    }
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
    /// Its failure budget was spent (or its progress deadline passed) under
    /// `on-failure "revert"`: the hosts it switched were switched back, and the run stopped.
    Reverted,
}

/// What a dependent's reconfigure during a needed service's wave does ([`EventKind::RepointStarted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Drops the wave's hosts before they stop.
    Drop,
    /// Lists them again, at their current address, once their steps ended.
    List,
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
