//! What a step, a hook, a revert or an interruption says, once: the rollout's events carry
//! these ([`crate::rollout::EventKind`]) and the journal's entries are the same values
//! ([`super::Entry`]), so an event is journaled as it is, not copied field by field. Each
//! serializes as its fields alone (the event or entry adds its tag beside them), so the
//! journal's lines and the events' NDJSON read as they always have.

use serde::{Deserialize, Serialize};

/// A step about to change its host: from the version it runs (none: a fresh install) to `to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepIntent {
    pub service: String,
    pub host: String,
    pub from: Option<String>,
    pub to: String,
}

/// A hook about to run on its host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookStart {
    pub service: String,
    pub host: String,
    pub hook: String,
}

/// A hook that ended on its host: whether it passed, its exit code (none when it was killed
/// or never ran) and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookEnd {
    pub service: String,
    pub host: String,
    pub hook: String,
    pub ok: bool,
    pub code: Option<i32>,
    pub ms: u64,
}

/// How a step ended: the hook that failed, whether it was rolled back, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    pub service: String,
    pub host: String,
    pub ok: bool,
    pub failed_hook: Option<String>,
    pub rolled_back: bool,
    pub reason: Option<String>,
}

/// A step that will not start: a runtime need can no longer be met.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBlocked {
    pub service: String,
    pub host: String,
    pub reason: String,
}

/// `on-failure "revert"`: a host is switched back from `from` to `to`. Until its result, it
/// is in flight as a step is (a run carried on stops what it left running there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevertIntent {
    pub service: String,
    pub host: String,
    pub from: String,
    pub to: String,
}

/// How a host's revert ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevertEnd {
    pub service: String,
    pub host: String,
    pub ok: bool,
    pub failed_hook: Option<String>,
    pub reason: Option<String>,
}

/// The run was told to stop (`abort: false`: no new step starts, running steps finish) or to
/// abort (`abort: true`: running steps are killed and recorded as interrupted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interruption {
    pub abort: bool,
    /// Steps running when it happened.
    pub running: usize,
    /// Why: a signal, or the run journal that cannot be written.
    pub reason: String,
}
