//! Where a Drover run's time went, from its events (`deploy apply --json`).

use super::super::stats::median;
use drover::plan::Plan;
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// A Drover run taken apart, seconds.
#[derive(Default)]
pub(super) struct Phases {
    /// Spawn → `run-started`: load, resolve, lock and read every host, plan.
    pub before: Option<f64>,
    /// `run-started` → `run-finished`.
    pub rollout: Option<f64>,
    /// The run's own steps, each as long as it took (`step-started` to `step-finished`),
    /// through the ideal schedule of its plan: what the rollout took beyond it is the
    /// scheduler's.
    pub replayed: Option<f64>,
    /// The median of what a step took beyond its host's two waits.
    pub beyond: Option<f64>,
}

/// The phases of the run whose events are `events` (NDJSON), spawned at `spawned`; `work` is
/// a host's two waits, `plan` the plan the run carried out.
pub(super) fn of(
    events: &str,
    spawned: SystemTime,
    work: impl Fn(&str) -> Option<Duration>,
    plan: Option<&Plan>,
) -> Phases {
    let events: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let time = |e: &Value| humantime::parse_rfc3339(e["time"].as_str()?).ok();
    let at = |kind: &str| events.iter().find(|e| e["event"] == kind).and_then(time);
    let secs = |a: SystemTime, b: SystemTime| b.duration_since(a).ok().map(|d| d.as_secs_f64());
    let started = at("run-started");
    let before = started.and_then(|s| secs(spawned, s));
    let rollout = started
        .zip(at("run-finished"))
        .and_then(|(a, b)| secs(a, b));
    // Each step as long as it took, by (service, host).
    let key = |e: &Value| {
        (
            e["service"].as_str().unwrap_or("").to_string(),
            e["host"].as_str().unwrap_or("").to_string(),
        )
    };
    let mut begun: HashMap<(String, String), SystemTime> = HashMap::new();
    let mut took: HashMap<(String, String), Duration> = HashMap::new();
    for e in &events {
        match (e["event"].as_str(), time(e)) {
            (Some("step-started"), Some(t)) => {
                begun.insert(key(e), t);
            }
            (Some("step-finished"), Some(t)) => {
                if let Some(d) = begun.get(&key(e)).and_then(|s| t.duration_since(*s).ok()) {
                    took.insert(key(e), d);
                }
            }
            _ => {}
        }
    }
    if took.is_empty() {
        return Phases {
            before,
            rollout,
            ..Phases::default()
        };
    }
    let beyond = median(
        took.iter()
            .filter_map(|((_, h), d)| Some(d.as_secs_f64() - work(h)?.as_secs_f64())),
    );
    let replayed = plan.map(|plan| {
        drover::rollout::ideal_makespan(plan, |s, h| {
            took.get(&(s.to_string(), h.to_string()))
                .copied()
                .unwrap_or_default()
        })
        .as_secs_f64()
    });
    Phases {
        before,
        rollout,
        replayed,
        beyond: Some(beyond),
    }
}
