//! What each host runs: the host state record and how it is observed.

use crate::inventory::Hosts;
use crate::site::Site;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// What is known of one host before a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Observed {
    /// No state recorded: nothing deployed yet (or `--offline`).
    Fresh,
    /// The versions the host records, per service.
    Running {
        services: BTreeMap<String, ServiceRecord>,
    },
}

/// What a host records of one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRecord {
    pub version: String,
}

impl Observed {
    /// The version of `service` the host runs, if any.
    pub fn version(&self, service: &str) -> Option<&str> {
        match self {
            Observed::Fresh => None,
            Observed::Running { services } => services.get(service).map(|r| r.version.as_str()),
        }
    }
}

/// What went wrong reading host state.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum StateError {
    #[error("cannot read the state of host `{host}`: {reason}")]
    #[diagnostic(code(drover::state::unreadable))]
    Unreadable { host: String, reason: String },
}

/// Reads what every host runs; one entry per host of `hosts`, in the same order.
pub trait Observe {
    fn observe(&self, site: &Site, hosts: &Hosts) -> Result<Vec<Observed>, StateError>;
}

/// `--offline`: every host is treated as fresh, nothing is contacted.
pub struct Offline;

impl Observe for Offline {
    fn observe(&self, _site: &Site, hosts: &Hosts) -> Result<Vec<Observed>, StateError> {
        Ok(vec![Observed::Fresh; hosts.hosts.len()])
    }
}
