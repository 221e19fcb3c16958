//! What each host runs: the record every host keeps, and how the controller reads it.

mod files;
mod inputs;
pub mod journal;
pub mod lock;
mod observe;
mod private;
mod record;
mod recorded;
mod removal;
mod status;
pub mod store;
mod unreadable;

pub use files::{
    discard_script, kept, let_go_keeping, let_go_script, place_script, receive_script, received_at,
    receives, replaced_listed, restore_script, survey_script, Placed, NOTHING_PLACED,
};
pub use inputs::{added_hosts, member_of, moved_hosts, Inputs, Takes};
pub use observe::{observed_from, Offline, Remote};
pub use private::{append_private, private_dir};
pub use record::{read_script, write_script, HostRecord, Mark, Outcome, ServiceRecord, STATE_FILE};
pub use recorded::{RecordedCheck, RecordedHooks};
pub use removal::{RecordedHook, Removal};
pub use status::{
    status, Checked, Expected, FailingCheck, Failure, HostStatus, ServiceStatus, SiteLock, Source,
    Status, Unaccounted, Undone, STATUS_SCHEMA,
};

use crate::inventory::Hosts;
use crate::site::Site;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use thiserror::Error;

/// What is known of one host before a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Observed {
    /// No state recorded: nothing deployed yet (or `--offline`).
    Fresh,
    /// The host's record, per service.
    Running {
        services: BTreeMap<String, ServiceRecord>,
    },
    /// The host did not answer.
    Unreachable { reason: String },
    /// The host answered but its state file cannot be read.
    Unreadable { reason: String },
    /// Not read before the run: an apply over `--max-connections` locks and reads it in the
    /// command before its first step, and decides then what the step does
    /// ([`crate::plan::StepKind::Unread`]).
    Unread,
}

impl Observed {
    /// The record of `service` the host keeps, if any.
    pub fn service(&self, service: &str) -> Option<&ServiceRecord> {
        match self {
            Observed::Running { services } => services.get(service),
            _ => None,
        }
    }

    /// The version of `service` the host runs, if any.
    pub fn version(&self, service: &str) -> Option<&str> {
        self.service(service).map(|r| r.version.as_str())
    }

    /// Whether the host could be read at all.
    pub fn known(&self) -> bool {
        matches!(self, Observed::Fresh | Observed::Running { .. })
    }
}

/// What went wrong with host state.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum StateError {
    #[error("cannot record the state of {host}: {reason}")]
    #[diagnostic(code(drover::state::write))]
    Write { host: String, reason: String },
}

/// Reads what every host runs; one entry per host of `hosts`, in the same order.
pub trait Observe {
    fn observe(&self, site: &Site, hosts: &Hosts) -> impl Future<Output = Vec<Observed>>;
}
