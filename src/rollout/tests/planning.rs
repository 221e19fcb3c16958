//! Services planned during the run ([`super::super::Planning`]) on the fake transport: none of
//! their steps starts before their plan comes, they run under that plan once it does, a
//! refused lock stops what has not started, and no host's lock goes with a command while a
//! service not planned yet may still step there. One whose needs hold before its plan comes
//! steps each host once it is read, and no sooner than a host read before the run would.

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
    // db still switching when the plan comes: api waits for its needs, then for nothing else.
    let rules = Rules::default().sleep(None, "hook start db", 600);
    let ran = fx.run(rules, 64, true).await;
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
    // app1..app2 run api and worker, both unread; api is planned first, worker later (its
    // canary keeps it from starting before its plan).
    let body = api_and_worker("", "needs \"api\"; policy \"canary.kdl\"");
    let hs = hosts("app", "app", 2);
    let policies = [("canary.kdl", "batch 1; canary 1")];
    let make = |unread: &[&str]| fixture_unread(&body, &host_refs(&hs), &policies, &[], unread);
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

/// The fixture's true state of `host`, as the caller reads it during the run.
fn truth(fx: &Fixture, host: &str) -> Planned {
    let lock = fx.lock_at_step.as_ref().expect("unread hosts");
    Planned::Read {
        host: host.into(),
        observed: lock.truth[host].clone(),
    }
}

/// `(seq, host, why)` of every `step-skipped` of `service`.
fn skips(ran: &Ran, service: &str) -> Vec<(u64, String, plan::SkipReason)> {
    ran.events
        .iter()
        .filter_map(|(seq, _, e)| match e {
            EventKind::StepSkipped {
                service: s,
                host,
                skip,
                ..
            } if s == service => Some((*seq, host.clone(), *skip)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_needs_hold_first_steps_each_host_once_it_is_read() {
    let fx = tiers(&["app1", "app2", "app3"]);
    let tx = pending_api(&fx);
    let reads = Arc::new(Mutex::new(Vec::new()));
    let at = reads.clone();
    let app3_down = Planned::Read {
        host: "app3".into(),
        observed: Observed::Unreachable {
            reason: "connection refused".into(),
        },
    };
    let (app2, app1) = (truth(&fx, "app2"), truth(&fx, "app1"));
    tokio::spawn(async move {
        // db is done long before app2 is read, and app1 after that; no plan ever comes.
        for (ms, read) in [(300, app2), (300, app1), (100, app3_down)] {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            at.lock().unwrap().push(Instant::now());
            let _ = tx.send(read);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(tx);
    });
    let ran = fx.run(Rules::default(), 64, true).await;
    let reads = reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 3, "every read was sent before the run ended");
    // Started once db was healthy, before its hosts were read.
    let planned = ran.events.iter().find_map(|(seq, at, e)| match e {
        EventKind::ServicePlanned {
            service,
            steps,
            unread,
            ..
        } if service == "api" => Some((*seq, *at, *steps, *unread)),
        _ => None,
    });
    let (seq, at, steps, unread) = planned.expect("api said it started");
    assert_eq!((steps, unread), (3, Some(3)));
    assert!(
        at < reads[0],
        "api started before any of its hosts was read"
    );
    let (db_done, ..) = ran.step_finished("db", "db2");
    assert!(db_done < seq);
    // app2 stepped once read, not before, and without waiting for app1 and app3.
    let app2 = ran.first_hook("api", "app2").expect("app2 stepped");
    assert!(app2.started >= reads[0], "app2 stepped before it was read");
    assert!(app2.started < reads[1], "app2 waited for app1's read");
    // app1 ran 1.0 already: nothing runs there; app3 does not answer: left alone.
    assert_eq!(ran.touched("api"), ["app2"]);
    let skipped = skips(&ran, "api");
    let names: Vec<(&str, plan::SkipReason)> =
        skipped.iter().map(|(_, h, r)| (h.as_str(), *r)).collect();
    assert_eq!(
        names,
        [
            ("app1", plan::SkipReason::AtVersion),
            ("app3", plan::SkipReason::Unreachable)
        ]
    );
    assert_eq!(ran.outcome("api").1, 1, "app2 succeeded");
    assert!(!ran.summary.converged(), "app3 was never changed");
    let lock = fx.lock_at_step.as_ref().expect("unread hosts");
    assert!(
        lock.asked.lock().unwrap().is_empty(),
        "no step locked a host the caller reads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_a_canary_waits_for_its_plan() {
    // A canary is about the hosts that change: the service is not started under placeholders.
    let body = db_and_api("", "needs \"db\"; policy \"canary.kdl\"");
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 2));
    let fx = fixture_unread(
        &body,
        &host_refs(&hs),
        &[("canary.kdl", "batch \"50%\"; canary 1")],
        &[("app1", "api", "0.9")],
        &["app1", "app2"],
    );
    let tx = pending_api(&fx);
    let (app1, app2) = (truth(&fx, "app1"), truth(&fx, "app2"));
    tokio::spawn(async move {
        let _ = tx.send(app1);
        let _ = tx.send(app2);
        tokio::time::sleep(Duration::from_millis(400)).await;
        drop(tx);
    });
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.touched("api").is_empty(), "api never started");
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Blocked);
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Done, 2, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_starts_before_its_plan_when_no_host_can_be_read() {
    // db converged, so api's needs hold at once; app1 was read before the run (a real step),
    // app2 and app3 were not, and the caller could not read them: it closed the channel.
    let body = db_and_api("", "needs \"db\"");
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 3));
    let fx = fixture_unread(
        &body,
        &host_refs(&hs),
        &[],
        &[
            ("db1", "db", "1.0"),
            ("db2", "db", "1.0"),
            ("app1", "api", "0.9"),
        ],
        &["app2", "app3"],
    );
    let tx = pending_api(&fx);
    drop(tx);
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.touched("api").is_empty(), "no api step ran unplanned");
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Blocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_left_out_and_read_during_the_run_count_as_healthy() {
    // `--on app1,app4,web1`: api's hosts app2 and app3 are left out, unread before the run,
    // and run 1.0 healthy; web needs 3 of api's 4 hosts healthy (the two api steps are not
    // enough). api needs nothing: it starts at once, app4 still to be read.
    let body = "class \"app\" { service \"api\" }\nclass \"web\" { service \"web\" }\n".to_string()
        + &svc("api", "")
        + &svc("web", "needs \"api\" healthy=\"75%\"");
    let mut hs = hosts("app", "app", 4);
    hs.extend(hosts("web", "web", 1));
    let running = [("app2", "api", "1.0"), ("app3", "api", "1.0")];
    let unread = ["app2", "app3", "app4"];
    let fx = fixture_unread(&body, &host_refs(&hs), &[], &running, &unread);
    let lock = fx.lock_at_step.as_ref().expect("unread hosts");
    let states: Vec<Observed> = fx
        .plan
        .hosts
        .iter()
        .map(|h| lock.truth[&*h.name].clone())
        .collect();
    let selection = Selection {
        services: None,
        hosts: Some(
            [0, 3, 4]
                .into_iter()
                .map(crate::inventory::HostId::new)
                .collect(),
        ),
        ..Default::default()
    };
    let plan = fx.plan_unread(&states, &unread, &selection);
    assert_eq!(plan.services[0].steps(), 2, "api steps app1 and app4 alone");
    let fx = Fixture {
        plan: Arc::new(plan),
        ..fx
    };
    let tx = pending_api(&fx);
    let reads = [truth(&fx, "app2"), truth(&fx, "app3"), truth(&fx, "app4")];
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for read in reads {
            let _ = tx.send(read);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(tx);
    });
    let ran = fx.run(Rules::default(), 64, true).await;
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Done, 2, 0, 0));
    assert_eq!(
        ran.outcome("web").0,
        ServiceOutcome::Done,
        "web found 4 healthy"
    );
    assert_eq!(ran.touched("web"), ["web1"]);
    assert!(ran.summary.converged(), "{:?}", ran.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_found_not_answering_leaves_its_later_services_skipped_not_blocked() {
    // api and worker on the same hosts, worker after api there; both start before their plan
    // (worker once api is healthy on half its hosts, app4 still being read). app2 is found
    // not answering when read: both its steps are left alone as unreachable, as they would be
    // had it been read before the run, not worker's blocked by api's.
    let body = "class \"app\" { service \"api\"; service \"worker\" }\n".to_string()
        + &svc("api", "")
        + &svc("worker", "needs \"api\" healthy=\"50%\"");
    let hs = hosts("app", "app", 4);
    let running: Vec<(&str, &str, &str)> = ["app1", "app2", "app3", "app4"]
        .into_iter()
        .flat_map(|h| [(h, "api", "0.9"), (h, "worker", "0.9")])
        .collect();
    let unread = ["app1", "app2", "app3", "app4"];
    let fx = fixture_unread(&body, &host_refs(&hs), &[], &running, &unread);
    let (tx, updates) = unbounded_channel();
    let pending = fx.plan.services.iter().map(|_| true).collect();
    *fx.planning.lock().unwrap() = Some(crate::rollout::Planning { pending, updates });
    let (app1, app3, app4) = (truth(&fx, "app1"), truth(&fx, "app3"), truth(&fx, "app4"));
    tokio::spawn(async move {
        let app2 = Planned::Read {
            host: "app2".into(),
            observed: Observed::Unreachable {
                reason: "connection refused".into(),
            },
        };
        for read in [app2, app1, app3] {
            let _ = tx.send(read);
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        let _ = tx.send(app4);
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(tx);
    });
    let ran = fx.run(Rules::default(), 64, true).await;
    let early = |service: &str| {
        ran.events.iter().any(|(_, _, e)| {
            matches!(e, EventKind::ServicePlanned { service: s, unread: Some(_), .. } if s == service)
        })
    };
    assert!(early("api") && early("worker"), "{:?}", ran.events);
    assert_eq!(ran.touched("api"), ["app1", "app3", "app4"]);
    assert_eq!(ran.touched("worker"), ["app1", "app3", "app4"]);
    for service in ["api", "worker"] {
        let skipped: Vec<(String, plan::SkipReason)> = skips(&ran, service)
            .into_iter()
            .map(|(_, h, r)| (h, r))
            .collect();
        assert_eq!(
            skipped,
            [("app2".to_string(), plan::SkipReason::Unreachable)],
            "{service}"
        );
    }
    let blocked = ran
        .events
        .iter()
        .any(|(_, _, e)| matches!(e, EventKind::StepBlocked { .. }));
    assert!(!blocked, "no step blocked: {:?}", ran.events);
    assert_eq!(ran.summary.unreachable, 1);
    assert_eq!(ran.summary.not_started, 0, "{:?}", ran.summary);
}
