//! Unread steps on the fake transport: a host left unread before the run is locked and read
//! at its step; what it runs decides the step (an upgrade from the version found, an install,
//! nothing at all); a lock refused fails the step and counts against the budgets.

use super::*;
use crate::plan::{SkipReason, StepKind};
use std::future::Future;
use std::pin::Pin;

/// The session's host lock, faked: each host's state as [`fixture_unread`] was told, and a
/// refusal for the hosts in `refuse`.
pub(super) struct FakeLock {
    pub truth: HashMap<String, Observed>,
    pub refuse: Mutex<Vec<String>>,
    /// The hosts it was asked to lock, in order.
    pub asked: Mutex<Vec<String>>,
    /// Asked to lock this host, it stops the run first (as a first Ctrl-C would then).
    pub stop_at: Mutex<Option<(String, crate::rollout::Cancel)>>,
}

impl crate::rollout::LockAtStep<FakeLink> for FakeLock {
    fn lock_and_read<'a>(
        &'a self,
        _link: &'a FakeLink,
        host: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observed, String>> + Send + 'a>> {
        Box::pin(async move {
            self.asked.lock().unwrap().push(host.name.clone());
            if let Some((at, cancel)) = &*self.stop_at.lock().unwrap() {
                if *at == host.name {
                    cancel.raise(crate::rollout::Level::Stop, "SIGINT");
                }
            }
            if self.refuse.lock().unwrap().contains(&host.name) {
                return Err("locked by another run".into());
            }
            Ok(self
                .truth
                .get(&host.name)
                .cloned()
                .unwrap_or(Observed::Fresh))
        })
    }
}

/// `api` on app1..app6, two per wave; app1 and app2 read before the run (at 0.9), the others
/// unread: app3 and app6 already at 1.0, app4 at 0.9, app5 fresh.
fn farm() -> Fixture {
    api_on(
        6,
        "batch 2; max-failed 0",
        &[
            ("app1", "api", "0.9"),
            ("app2", "api", "0.9"),
            ("app3", "api", "1.0"),
            ("app4", "api", "0.9"),
            ("app6", "api", "1.0"),
        ],
        &["app3", "app4", "app5", "app6"],
    )
}

/// `api` on app1..app`n` under `policy`; the hosts `running` it as told, those `unread` left
/// unread before the run.
fn api_on(n: usize, policy: &str, running: &[(&str, &str, &str)], unread: &[&str]) -> Fixture {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", n);
    fixture_unread(
        &body,
        &host_refs(&hs),
        &[("p.kdl", policy)],
        running,
        unread,
    )
}

/// The run's `step-skipped` events, in order: service, host and why.
fn skipped(ran: &Ran) -> Vec<(&str, &str, SkipReason)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::StepSkipped {
                service,
                host,
                skip,
                ..
            } => Some((service.as_str(), host.as_str(), *skip)),
            _ => None,
        })
        .collect()
}

/// A run of the fixture stopped (as by a first Ctrl-C) as its lock is asked for `host`.
async fn stopped_at(fx: &Fixture, host: &str) -> Ran {
    let cancel = crate::rollout::Cancel::new();
    if let Some(lock) = &fx.lock_at_step {
        *lock.stop_at.lock().unwrap() = Some((host.into(), cancel.clone()));
    }
    fx.run_cancel(Rules::default(), 64, true, cancel).await
}

/// The hosts the fixture's lock was asked to lock, sorted.
fn asked(fx: &Fixture) -> Vec<String> {
    let lock = fx.lock_at_step.as_ref().expect("a lock");
    let mut asked = lock.asked.lock().unwrap().clone();
    asked.sort();
    asked
}

#[tokio::test]
async fn an_unread_step_is_decided_by_what_its_host_runs_once_read() {
    let fx = farm();
    let kinds: Vec<(String, StepKind)> = fx
        .service("api")
        .each_step()
        .map(|st| (st.host.to_string(), st.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("app1".to_string(), StepKind::Upgrade),
            ("app2".to_string(), StepKind::Upgrade),
            ("app3".to_string(), StepKind::Unread),
            ("app4".to_string(), StepKind::Unread),
            ("app5".to_string(), StepKind::Unread),
            ("app6".to_string(), StepKind::Unread),
        ]
    );
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.summary.skipped, 2, "{:?}", ran.summary);
    // The closing counts: the hosts found converged once read are skipped ones.
    assert_eq!(
        (ran.summary.kinds.skipped, ran.summary.skips),
        (
            2,
            crate::rollout::Skips {
                converged: 2,
                ..Default::default()
            }
        )
    );
    assert_eq!(ran.counts(), (4, 0, 0));
    // Nothing ran where the host already ran 1.0.
    assert_eq!(ran.touched("api"), ["app1", "app2", "app4", "app5"]);
    // An upgrade from what app4 ran (its old version stopped first); an install on app5.
    assert_eq!(ran.hosts_with("stop", "api"), ["app1", "app2", "app4"]);
    let started: Vec<(String, Option<String>)> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::StepStarted {
                intent: StepIntent { host, from, .. },
                ..
            } => Some((host.clone(), from.clone())),
            _ => None,
        })
        .collect();
    for (host, from) in [("app4", Some("0.9")), ("app5", None)] {
        assert!(
            started
                .iter()
                .any(|(h, f)| h == host && f.as_deref() == from),
            "{host} started from {from:?}: {started:?}"
        );
    }
    assert_eq!(
        skipped(&ran),
        [
            ("api", "app3", SkipReason::AtVersion),
            ("api", "app6", SkipReason::AtVersion)
        ]
    );
    // The unread hosts were locked at their step, each once; the others were not.
    assert_eq!(asked(&fx), ["app3", "app4", "app5", "app6"]);
}

#[tokio::test]
async fn a_lock_refused_at_its_step_fails_it_and_the_budget_stops_the_rest() {
    let fx = farm();
    if let Some(lock) = &fx.lock_at_step {
        lock.refuse.lock().unwrap().push("app4".into());
    }
    let ran = fx.run(Rules::default(), 64, true).await;
    assert_eq!(
        ran.failed_hosts(),
        [("app4".to_string(), "api".to_string())]
    );
    let (outcome, _, failed, not_started) = ran.outcome("api");
    assert_eq!(
        (outcome, failed, not_started),
        (ServiceOutcome::Halted, 1, 2)
    );
    assert!(
        ran.hooks_on("api", "app4").is_empty(),
        "nothing ran on app4"
    );
    assert_eq!(
        asked(&fx),
        ["app3", "app4"],
        "only the unread hosts stepped were locked"
    );
}

#[tokio::test]
async fn a_host_with_two_unread_services_is_locked_and_read_once() {
    // app1 runs api at 1.0 already and worker at 0.9; both services stand alone.
    let fx = fixture_unread(
        &api_and_worker("", ""),
        &[("app1", "app")],
        &[],
        &[("app1", "api", "1.0"), ("app1", "worker", "0.9")],
        &["app1"],
    );
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(
        asked(&fx),
        ["app1"],
        "locked and read once for both services"
    );
    assert_eq!(ran.summary.skipped, 1);
    assert!(ran.hooks_on("api", "app1").is_empty(), "api was converged");
    // worker decided from the record read for api's step: an upgrade from 0.9.
    assert_eq!(ran.hosts_with("stop", "worker"), ["app1"]);
    let from = ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::StepStarted {
            intent: StepIntent { service, from, .. },
            ..
        } if service == "worker" => Some(from.clone()),
        _ => None,
    });
    assert_eq!(from, Some(Some("0.9".to_string())));
}

#[tokio::test]
async fn a_host_that_cannot_be_read_at_its_step_is_left_alone_as_unreachable() {
    let mut fx = farm();
    if let Some(lock) = fx.lock_at_step.as_mut().and_then(Arc::get_mut) {
        lock.truth.insert(
            "app4".into(),
            Observed::Unreachable {
                reason: "connection refused".into(),
            },
        );
    }
    let ran = fx.run(Rules::default(), 64, true).await;
    // Not converged, but no failure: the budget (max-failed 0) lets the rest go on.
    assert!(!ran.summary.converged());
    assert_eq!(ran.summary.unreachable, 1, "{:?}", ran.summary);
    assert_eq!(
        ran.summary.skips,
        crate::rollout::Skips {
            converged: 2,
            unreachable: 1,
            ..Default::default()
        },
        "app3 and app6 found converged, app4 not answering"
    );
    assert_eq!(ran.counts(), (3, 0, 0), "app1, app2 and app5 switched");
    assert!(ran.hooks_on("api", "app4").is_empty());
    assert_eq!(ran.touched("api"), ["app1", "app2", "app5"]);
}

#[tokio::test]
async fn a_host_read_as_the_run_is_stopped_is_not_started() {
    // One host at a time; app3 and app4 unread, app4 locked and read as the run is stopped.
    let fx = api_on(
        6,
        "batch 1; max-failed 0",
        &[
            ("app1", "api", "0.9"),
            ("app2", "api", "0.9"),
            ("app4", "api", "0.9"),
        ],
        &["app3", "app4", "app5", "app6"],
    );
    let ran = stopped_at(&fx, "app4").await;
    // Locked and read, then nothing: no step said to start, no hook run on it.
    assert!(
        ran.hooks_on("api", "app4").is_empty(),
        "nothing ran on app4"
    );
    assert!(
        !ran.events.iter().any(|(_, _, e)| matches!(
            e,
            EventKind::StepStarted {
                intent: StepIntent { host, .. },
                ..
            } | EventKind::StepFinished {
                result: StepEnd { host, .. },
                ..
            } if host == "app4"
        )),
        "app4 neither started nor finished"
    );
    assert_eq!(ran.touched("api"), ["app1", "app2", "app3"]);
    let (outcome, succeeded, failed, not_started) = ran.outcome("api");
    assert_eq!(
        (outcome, succeeded, failed, not_started),
        (ServiceOutcome::Interrupted, 3, 0, 3),
        "app4, app5 and app6 not started"
    );
    assert_eq!(asked(&fx), ["app3", "app4"]);
}

#[tokio::test]
async fn a_host_that_did_not_answer_at_one_step_is_left_alone_at_the_next() {
    // app1 runs api and worker, both unread; it does not answer when api's step reads it.
    let mut fx = fixture_unread(
        &api_and_worker("", ""),
        &[("app1", "app")],
        &[],
        &[("app1", "api", "0.9"), ("app1", "worker", "0.9")],
        &["app1"],
    );
    if let Some(lock) = fx.lock_at_step.as_mut().and_then(Arc::get_mut) {
        lock.truth.insert(
            "app1".into(),
            Observed::Unreachable {
                reason: "connection refused".into(),
            },
        );
    }
    let ran = fx.run(Rules::default(), 64, true).await;
    assert_eq!(asked(&fx), ["app1"], "tried once, not again for worker");
    assert!(ran.hooks_on("worker", "app1").is_empty());
    assert!(ran.hooks_on("api", "app1").is_empty());
    assert_eq!(
        skipped(&ran),
        [
            ("api", "app1", SkipReason::Unreachable),
            ("worker", "app1", SkipReason::Unreachable)
        ]
    );
    // Both services of the host counted as left alone, the host once as unreachable.
    assert_eq!(
        (ran.summary.skips.unreachable, ran.summary.unreachable),
        (2, 1)
    );
}

#[tokio::test]
async fn a_service_whose_last_step_is_not_started_as_the_run_stops_is_interrupted() {
    // Two hosts, one wave: app2 unread, locked and read as the run is stopped.
    let fx = api_on(
        2,
        "batch \"100%\"; max-failed 0",
        &[("app1", "api", "0.9"), ("app2", "api", "0.9")],
        &["app2"],
    );
    let ran = stopped_at(&fx, "app2").await;
    assert!(
        ran.hooks_on("api", "app2").is_empty(),
        "nothing ran on app2"
    );
    let (outcome, succeeded, failed, not_started) = ran.outcome("api");
    assert_eq!(
        (outcome, succeeded, failed, not_started),
        (ServiceOutcome::Interrupted, 1, 0, 1),
        "not done: app2 was not started"
    );
}
