//! Services planned during the run ([`super::super::Planning`]) on the fake transport: none of
//! their steps starts before their plan comes, they run under that plan once it does, a
//! refused lock stops what has not started, and no host's lock goes with a command while a
//! service not planned yet may still step there.

use super::*;
use crate::rollout::Planned;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

/// `db` on db1..db2 → `api` on app1..app3 (`needs "db"`); db at 0.9 everywhere; api at 1.0 on
/// app1 already, 0.9 on app2, fresh on app3. `unread`: the hosts left unread before the run.
fn tiers(unread: &[&str]) -> Fixture {
    let body = db_and_api("", "needs \"db\"");
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 3));
    fixture_unread(
        &body,
        &host_refs(&hs),
        &[],
        &[
            ("db1", "db", "0.9"),
            ("db2", "db", "0.9"),
            ("app1", "api", "1.0"),
            ("app2", "api", "0.9"),
        ],
        unread,
    )
}

/// The fixture's plan with api not planned yet, and the sender of its updates.
fn pending_api(fx: &Fixture) -> UnboundedSender<Planned> {
    let (tx, updates) = unbounded_channel();
    let pending = fx.plan.services.iter().map(|s| s.name == "api").collect();
    *fx.planning.lock().unwrap() = Some(crate::rollout::Planning { pending, updates });
    tx
}

/// The plan once every host is read: api planned (index 1).
fn read_plan() -> Planned {
    let fx = tiers(&[]);
    Planned::Plan {
        plan: fx.plan.clone(),
        ready: vec![1],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_not_planned_waits_for_its_plan_and_then_runs_under_it() {
    let fx = tiers(&["app1", "app2", "app3"]);
    // Unread, api's placeholders would step every app host.
    assert_eq!(fx.waves("api").concat(), ["app1", "app2", "app3"]);
    let tx = pending_api(&fx);
    let sent = Arc::new(Mutex::new(None));
    let at = sent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        *at.lock().unwrap() = Some(Instant::now());
        let _ = tx.send(read_plan());
    });
    let ran = fx.run(Rules::default(), 64, true).await;
    let sent = sent.lock().unwrap().expect("the plan was sent");
    let api: Vec<Cmd> = ran.cmds().into_iter().filter(|c| c.of("api")).collect();
    assert!(!api.is_empty(), "api ran once planned");
    assert!(
        api.iter().all(|c| c.started >= sent),
        "no api command before its plan came"
    );
    // Under the plan made from what the hosts run: app1 already at 1.0 is left alone.
    assert_eq!(ran.touched("api"), ["app2", "app3"]);
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Done, 2, 0, 0));
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    let planned = ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::ServicePlanned {
            service,
            steps,
            skipped,
            ..
        } => Some((service.clone(), *steps, *skipped)),
        _ => None,
    });
    assert_eq!(planned, Some(("api".to_string(), 2, 1)));
    // The run's start counts the steps known then: db's two.
    let known = ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::RunStarted { steps, .. } => Some(*steps),
        _ => None,
    });
    assert_eq!(known, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_refused_during_the_run_stops_what_has_not_started() {
    let fx = tiers(&["app1", "app2", "app3"]);
    let tx = pending_api(&fx);
    // Refused while db's steps run: they finish, and nothing more starts.
    let rules = Rules::default().sleep(None, "hook start db", 300);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tx.send(Planned::Refused {
            host: "app2".into(),
            reason: "locked by another run".into(),
        });
        let _ = tx.send(read_plan());
    });
    let ran = fx.run(rules, 64, true).await;
    assert!(ran.touched("api").is_empty(), "api never starts");
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Done, 2, 0, 0));
    let (outcome, ..) = ran.outcome("api");
    assert_eq!(outcome, ServiceOutcome::Halted);
    assert_eq!(
        ran.summary.refused,
        [("app2".to_string(), "locked by another run".to_string())]
    );
    assert!(!ran.summary.converged());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_plan_never_comes_ends_blocked() {
    let fx = tiers(&["app1", "app2", "app3"]);
    let tx = pending_api(&fx);
    drop(tx);
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.touched("api").is_empty());
    let (outcome, succeeded, _, not_started) = ran.outcome("api");
    assert_eq!((outcome, succeeded), (ServiceOutcome::Blocked, 0));
    assert!(not_started > 0);
    assert!(!ran.summary.converged());
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Done, 2, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_goes_with_a_step_while_a_service_not_planned_may_step_there() {
    // app1..app2 run api and worker, both unread; api is planned first, worker later.
    let body = api_and_worker("", "needs \"api\"");
    let hs = hosts("app", "app", 2);
    let make = |unread: &[&str]| fixture_unread(&body, &host_refs(&hs), &[], &[], unread);
    let mut fx = make(&["app1", "app2"]);
    fx.release = Some("RELEASE-LOCK".into());
    let (tx, updates) = unbounded_channel();
    *fx.planning.lock().unwrap() = Some(crate::rollout::Planning {
        pending: vec![true, true],
        updates,
    });
    let full = make(&[]).plan.clone();
    let api_first = Planned::Plan {
        plan: full.clone(),
        ready: vec![0],
    };
    let rules = Rules::default().sleep(None, "hook check api", 200);
    tx.send(api_first).expect("send");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let _ = tx.send(Planned::Plan {
            plan: full,
            ready: vec![1],
        });
    });
    let ran = fx.run(rules, 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    for host in ["app1", "app2"] {
        let cmds: Vec<Cmd> = ran.cmds().into_iter().filter(|c| c.host == host).collect();
        let releasing: Vec<&Cmd> = cmds
            .iter()
            .filter(|c| c.script.contains("RELEASE-LOCK"))
            .collect();
        // Only worker's step, the host's last, gives the lock back.
        assert_eq!(releasing.len(), 1, "{host}: {cmds:?}");
        assert!(
            releasing.iter().all(|c| !c.of("api")),
            "{host}: api's step gave the lock back while worker could still step there"
        );
    }
}
