//! Drover: a push-model, declarative site deployer.
//!
//! The pipeline, one module per stage: [`site`] (KDL → checked model) → [`inventory`]
//! (class → hosts) → [`desired`] (what each host must run) → [`plan`] (graph, observed state,
//! waves; pure) → [`apply`] (one apply, request to outcome) over [`session`] (signals, locks,
//! journal, resume) around `rollout` → `transport` → [`state`] → [`report`]; [`history`]
//! above [`apply`] (what each run applied, and `undo`). Pull mode: [`publish`] (a snapshot of
//! the site in etcd, above [`history`]) and [`agent`] (one host converged on it with the
//! [`apply`] stage, a service's slot in etcd held around each step). [`cli`] only parses, calls
//! the stages, and prints.

pub mod agent;
pub mod apply;
pub mod cli;
pub mod desired;
#[doc(hidden)]
pub mod fuzzing;
pub mod history;
pub mod inventory;
pub mod plan;
pub mod publish;
pub mod report;
pub mod rollout;
pub mod secrets;
pub mod session;
pub mod site;
pub mod state;
pub mod transport;
pub mod words;
