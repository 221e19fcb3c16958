//! One host's revert as a step ([`super::reverting`]): from the inputs this run gave it back to
//! those it recorded before, with the hook texts and variables it recorded then
//! ([`crate::state::RecordedHooks`]). Its `stop` stops what runs now, so it is this run's (the
//! site's), with this run's variables. A host that recorded no texts (an older `deploy`, or a
//! record taken from the shared store) is switched back with the site's hooks and `env`, and
//! the revert says so. Secrets are the site's current ones either way: a host records none.

use super::super::hook::step_env;
use super::super::step::{ServiceJob, StepJob, StopNow};
use super::super::Cancel;
use crate::plan::{Path, PlannedHost, Step, StepKind};
use crate::site::{Hooks, OnFailure};
use crate::state::{HostRecord, Inputs, ServiceRecord};
use std::path::PathBuf;
use std::sync::Arc;

/// A revert's step, and what it says of itself.
pub(super) struct StepBack {
    pub job: StepJob,
    /// `"recorded"`: with the hooks and `env` the host recorded before this run; `"site"`:
    /// with the site's, as it recorded none.
    pub hooks: &'static str,
    /// Secrets this run changed (or took away): the revert's hooks get the site's current
    /// values.
    pub secrets: Vec<String>,
    /// The revert's first line in the step's log.
    pub said: String,
}

/// The job of a service's reverts: `base`'s, with `hooks`, `cancel`, and no `rollback` when one
/// fails.
pub(super) fn revert_job(base: &ServiceJob, hooks: Hooks, cancel: Cancel) -> ServiceJob {
    ServiceJob {
        name: base.name.clone(),
        hooks,
        on_failure: OnFailure::Stop,
        env: base.env.clone(),
        state_dir: base.state_dir.clone(),
        run: base.run.clone(),
        secrets: base.secrets.clone(),
        cancel,
        guard: base.guard.clone(),
        keep_generations: base.keep_generations,
    }
}

/// The revert of `job`'s service on `host`, whose `step` of this run switched it from `before`
/// to what `record` (the host's record now) says.
pub(super) fn step_back(
    job: &Arc<ServiceJob>,
    host: &PlannedHost,
    step: &Step,
    before: &ServiceRecord,
    record: HostRecord,
    log: PathBuf,
) -> StepBack {
    let current = record.services.get(&job.name);
    let now = current.map_or_else(|| step.to.to_string(), |r| r.version.clone());
    let (kind, path) = if now == before.version {
        (StepKind::Reconfigure, step.path.unwrap_or(Path::SwitchOver))
    } else {
        (StepKind::Upgrade, Path::SwitchOver)
    };
    // This run's variables, with the versions the other way round.
    let site_env = step_env(&job.env, host, Some(&now), &before.version);
    let (service, env, stop_now, hooks) = match &before.hooks {
        Some(recorded) => (
            Arc::new(revert_job(job, recorded.hooks(), job.cancel.clone())),
            recorded.env(&now, &before.version),
            Some(StopNow {
                hook: job.hooks.stop.clone(),
                env: site_env,
            }),
            "recorded",
        ),
        None => (job.clone(), site_env, None, "site"),
    };
    let now_inputs = current.and_then(|r| r.inputs.as_ref());
    let secrets = secrets_changed(before.inputs.as_ref(), now_inputs);
    // What the host is given once switched back: what it recorded before, but for the
    // secrets, which are the site's current ones.
    let inputs = before
        .inputs
        .clone()
        .map(|was| with_secrets_of(was, now_inputs))
        .unwrap_or_default();
    let mut said = format!(
        "== revert: {now} → {} (on-failure \"revert\"), ",
        before.version
    );
    said.push_str(match hooks {
        "recorded" => "with the hooks and env it recorded before this run",
        _ => "with the site's hooks and env: it recorded none before this run",
    });
    if !secrets.is_empty() {
        said.push_str(&format!("; {}", secrets_note(&secrets)));
    }
    let job = StepJob {
        service,
        host: host.name.to_string(),
        env,
        from: Some(now),
        to: before.version.clone(),
        kind,
        path,
        inputs,
        files: Ok(Vec::new()),
        record,
        log,
        release: None,
        reasons: Vec::new(),
        restarts: Vec::new(),
        revert: true,
        stop_now,
    };
    StepBack {
        job,
        hooks,
        secrets,
        said,
    }
}

/// `secret TOKEN changed in this run: the revert's hooks get the site's current value`.
fn secrets_note(names: &[String]) -> String {
    let (noun, value) = match names.len() {
        1 => ("secret", "value"),
        _ => ("secrets", "values"),
    };
    format!(
        "{noun} {} changed in this run: the revert's hooks get the site's current {value}",
        names.join(", ")
    )
}

/// Whether an input is a secret's (or names the key the secrets are recorded under).
fn secret_key(key: &str) -> bool {
    key.starts_with("secret:") || key == "key"
}

/// The secrets whose recorded digests differ between `before` and `now`, by name.
fn secrets_changed(before: Option<&Inputs>, now: Option<&Inputs>) -> Vec<String> {
    let (Some(before), Some(now)) = (before, now) else {
        return Vec::new();
    };
    now.changed(before)
        .into_iter()
        .filter_map(|k| k.strip_prefix("secret:"))
        .map(str::to_string)
        .collect()
}

/// `was` with the secrets' entries of `now` instead of its own.
fn with_secrets_of(mut was: Inputs, now: Option<&Inputs>) -> Inputs {
    was.0.retain(|k, _| !secret_key(k));
    if let Some(now) = now {
        was.0.extend(
            now.0
                .iter()
                .filter(|(k, _)| secret_key(k))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }
    was
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(entries: &[(&str, &str)]) -> Inputs {
        Inputs(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), Arc::from(*v)))
                .collect(),
        )
    }

    #[test]
    fn a_reverted_host_records_its_old_inputs_with_the_current_secrets() {
        let was = inputs(&[
            ("version", "1.0"),
            ("env:MODE", "old"),
            ("secret:TOKEN", "h1"),
            ("secret:GONE", "h9"),
            ("key", "k"),
        ]);
        let now = inputs(&[
            ("version", "2.0"),
            ("env:MODE", "new"),
            ("secret:TOKEN", "h2"),
            ("key", "k"),
        ]);
        assert_eq!(
            secrets_changed(Some(&was), Some(&now)),
            ["GONE".to_string(), "TOKEN".to_string()]
        );
        assert_eq!(
            with_secrets_of(was, Some(&now)),
            inputs(&[
                ("version", "1.0"),
                ("env:MODE", "old"),
                ("secret:TOKEN", "h2"),
                ("key", "k"),
            ])
        );
        assert!(secrets_changed(None, Some(&now)).is_empty());
        assert_eq!(
            secrets_note(&["TOKEN".into()]),
            "secret TOKEN changed in this run: the revert's hooks get the site's current value"
        );
    }
}
