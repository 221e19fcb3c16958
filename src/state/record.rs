//! The host state file: per service, its version and the last configured/validated outcome.

use crate::transport::quote;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The file, inside the platform's `state-dir`, where a host records what it runs.
pub const STATE_FILE: &str = "state.json";

/// What a host records (the whole state file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub schema: u32,
    pub services: BTreeMap<String, ServiceRecord>,
}

/// What a host records of one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// The version installed (the old one again after a successful rollback).
    pub version: String,
    /// Whether the last switch-over got through `start` (or where it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured: Option<Mark>,
    /// Whether the last `check` passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated: Option<Mark>,
    /// Everything the service was given when it was last configured (`None`: recorded by a
    /// `deploy` older than state schema 2, so its configuration is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<super::Inputs>,
    /// The hooks a removal of the service runs here, as they were when it was last configured
    /// (`None`: recorded by a `deploy` that kept none; a removal then runs no hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<super::Removal>,
    /// The texts of every hook and the variables they got when it was last configured (never a
    /// secret): what a revert switches the host back with (`None`: recorded by a `deploy` that
    /// kept none, or taken from the shared store; a revert then runs the site's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<super::RecordedHooks>,
}

impl ServiceRecord {
    /// `version` installed, nothing yet recorded of a switch-over or its inputs.
    pub fn at(version: impl Into<String>) -> ServiceRecord {
        ServiceRecord {
            version: version.into(),
            configured: None,
            validated: None,
            inputs: None,
            removal: None,
            hooks: None,
        }
    }
}

impl ServiceRecord {
    /// A service that has a version and no recorded failure.
    /// After a switch-over (`configured` recorded) that means a passed check too: a run
    /// interrupted between `start` and `check` leaves the host unhealthy until checked.
    pub fn healthy(&self) -> bool {
        let success = |m: &Option<Mark>| m.as_ref().is_some_and(|m| m.outcome == Outcome::Success);
        match &self.configured {
            None => self
                .validated
                .as_ref()
                .is_none_or(|m| m.outcome == Outcome::Success),
            Some(_) => success(&self.configured) && success(&self.validated),
        }
    }
}

/// One category's outcome: exactly one of success or failure, when, by which run, logged where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub outcome: Outcome,
    /// RFC 3339, UTC.
    pub at: String,
    pub run: String,
    /// The controller-side log of that step.
    pub log: String,
    /// The hook that failed, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Success,
    Failure,
}

/// Prints the state file, or exits 3 when there is none.
pub fn read_script(state_dir: &str) -> String {
    let file = format!("{state_dir}/{STATE_FILE}");
    format!(
        "if [ -e {f} ]; then cat {f}; else exit 3; fi",
        f = quote(&file)
    )
}

/// The exit code of [`read_script`] for a host with no state file.
pub const NO_STATE: i32 = 3;

/// Writes `record` atomically: a temporary file of this shell's own (`$$`: two writers, a run
/// and one that broke its lock, never write into one file), synced, then renamed over the old
/// one, and the directory synced (so that a crash of the host cannot bring the old record back).
pub fn write_script(state_dir: &str, record: &HostRecord) -> String {
    let json = serde_json::to_string(record).unwrap_or_default();
    let dir = quote(state_dir);
    let tmp = format!(
        "{}.\"$$\"",
        quote(&format!("{state_dir}/.{STATE_FILE}.tmp"))
    );
    let file = quote(&format!("{state_dir}/{STATE_FILE}"));
    format!(
        "umask 077 && {{ [ -d {dir} ] || mkdir -p {dir}; }} && printf '%s\\n' {} > {tmp} && {{ sync {tmp} 2>/dev/null || true; }} && mv -f {tmp} {file} && {{ sync {dir} 2>/dev/null || sync; }}",
        quote(&json)
    )
}

impl HostRecord {
    /// 2: `inputs` per service (schema 1 records are read; their configuration is unknown).
    pub const SCHEMA: u32 = 2;

    /// Parses a state file's text.
    pub fn parse(text: &[u8]) -> Result<HostRecord, String> {
        serde_json::from_slice(text).map_err(|e| format!("state file is not valid: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, dir: &std::path::Path) -> std::process::Output {
        std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .expect("sh runs")
    }

    #[test]
    fn write_then_read_roundtrips_odd_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("var lib/dr'over").display().to_string();
        assert_eq!(
            sh(&read_script(&state_dir), dir.path()).status.code(),
            Some(NO_STATE)
        );
        let mut record = HostRecord {
            schema: HostRecord::SCHEMA,
            ..Default::default()
        };
        record.services.insert(
            "api".into(),
            ServiceRecord {
                version: "1.0'$(touch pwned)`id`\n".into(),
                configured: None,
                validated: None,
                inputs: None,
                removal: None,
                hooks: None,
            },
        );
        assert!(sh(&write_script(&state_dir, &record), dir.path())
            .status
            .success());
        let out = sh(&read_script(&state_dir), dir.path());
        assert_eq!(HostRecord::parse(&out.stdout), Ok(record));
        assert!(!dir.path().join("pwned").exists());
    }
}
