//! `on-failure "revert"` on the fake transport: once the budget is spent, the hosts this run
//! switched are switched back, last first, `batch` at a time, each as a switch-over from the new
//! version to the old one with the files put back; a revert that fails does not stop the
//! others; nothing else of the run starts once a revert began.

use super::*;

/// api on app1..app5 (and `worker` on work1..work2 after it, if `worker`), one host per wave
/// (`batch`), upgrading 0.9 → 1.0 under `on-failure "revert"`, max-failed 0; app4 fails its
/// check; `rules` add to that.
async fn revert_run(batch: u32, worker: bool, rules: Rules) -> Ran {
    let mut body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let mut hs = hosts("app", "app", 5);
    if worker {
        body.push_str(&format!(
            "class \"work\" {{ service \"worker\" }}\n{}",
            svc("worker", "policy \"w.kdl\"")
        ));
        hs.extend(hosts("work", "work", 2));
    }
    let running: Vec<(&str, &str, &str)> = hs
        .iter()
        .map(|(h, c)| {
            (
                h.as_str(),
                if *c == "app" { "api" } else { "worker" },
                "0.9",
            )
        })
        .collect();
    let policy = format!("batch {batch}; max-failed 0; on-failure \"revert\"");
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("p.kdl", &policy), ("w.kdl", "batch 1")],
        &running,
    );
    let rules = rules.fail(Some("app4"), "hook check api");
    fx.run(rules, 64, true).await
}

/// `(host, from, to)` of every revert of `service` as it started, in order.
fn reverts(ran: &Ran, service: &str) -> Vec<(String, String, String)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::RevertStarted {
                intent:
                    RevertIntent {
                        service: s,
                        host,
                        from,
                        to,
                    },
                ..
            } if s == service => Some((host.clone(), from.clone(), to.clone())),
            _ => None,
        })
        .collect()
}

/// `(host, ok)` of every revert of `service` as it ended, in order.
fn reverted(ran: &Ran, service: &str) -> Vec<(String, bool)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::RevertFinished {
                result:
                    RevertEnd {
                        service: s,
                        host,
                        ok,
                        ..
                    },
                ..
            } if s == service => Some((host.clone(), *ok)),
            _ => None,
        })
        .collect()
}

/// The hooks `host` ran for `service` after its step ended, each as its name.
fn hooks_after_step(ran: &Ran, service: &str, host: &str) -> Vec<String> {
    let (end, ..) = ran.step_finished(service, host);
    ran.cmds()
        .into_iter()
        .filter(|c| c.host == host && c.start > end)
        .filter_map(|c| {
            c.hook()
                .filter(|(_, s)| *s == service)
                .map(|(h, _)| h.to_string())
        })
        .collect()
}

#[tokio::test]
async fn revert_switches_back_the_hosts_switched_last_first_then_the_run_stops() {
    let ran = revert_run(1, false, Rules::default()).await;
    let back: Vec<(String, String, String)> = ["app3", "app2", "app1"]
        .iter()
        .map(|h| (h.to_string(), "1.0".to_string(), "0.9".to_string()))
        .collect();
    assert_eq!(reverts(&ran, "api"), back);
    assert_eq!(
        reverted(&ran, "api"),
        [("app3", true), ("app2", true), ("app1", true)].map(|(h, ok)| (h.to_string(), ok))
    );
    // Each revert is a switch-over to the old version: stop, files, install, migrate, start,
    // check, with the versions the other way round.
    for host in ["app1", "app2", "app3"] {
        assert_eq!(
            hooks_after_step(&ran, "api", host),
            ["stop", "install", "migrate", "start", "check"],
            "{host}"
        );
        let install = ran
            .cmds()
            .into_iter()
            .rfind(|c| c.host == host && c.is("install", "api"))
            .expect("install");
        assert!(
            install
                .script
                .contains(&format!("DEPLOY_NEW_VERSION={}", quote("0.9")))
                && install
                    .script
                    .contains(&format!("DEPLOY_OLD_VERSION={}", quote("1.0"))),
            "{}",
            install.script
        );
        // The host records the old version, switched back by this run.
        let last = ran
            .cmds()
            .into_iter()
            .rfind(|c| c.host == host && c.writes_state())
            .expect("state written");
        assert!(
            last.script.contains(r#""version":"0.9""#),
            "{}",
            last.script
        );
        assert!(
            !last.script.contains(r#""outcome":"failure""#),
            "{}",
            last.script
        );
    }
    // The failed host was rolled back by its own step; app5 was never touched.
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app4"]));
    assert!(ran.touched("api").iter().all(|h| h != "app5"));
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Reverted);
    assert_eq!((ran.summary.reverted, ran.summary.not_reverted), (3, 0));
    assert!(!ran.summary.converged());
}

#[tokio::test]
async fn a_revert_that_fails_leaves_its_host_and_the_others_go_on() {
    let fail_back = format!("DEPLOY_NEW_VERSION={}", quote("0.9"));
    let rules = Rules::default().fail(Some("app2"), &fail_back);
    let ran = revert_run(1, false, rules).await;
    assert_eq!(
        reverted(&ran, "api"),
        [("app3", true), ("app2", false), ("app1", true)].map(|(h, ok)| (h.to_string(), ok))
    );
    assert_eq!((ran.summary.reverted, ran.summary.not_reverted), (2, 1));
    assert!(ran
        .summary
        .failures
        .iter()
        .any(|f| f.host == "app2" && f.service == "api"));
    // A failed revert runs no rollback: it is left as it failed.
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app4"]));
    assert!(!ran.summary.converged());
}

#[tokio::test]
async fn reverts_go_batch_at_a_time_and_nothing_else_starts_meanwhile() {
    // Two hosts switching at once: app1, app2 pass; app3 passes and app4 fails (its check
    // tried for its whole timeout), while app5 took the slot app3 freed and passed.
    let ran = revert_run(
        2,
        true,
        Rules::default().sleep(None, "hook start worker", 1500),
    )
    .await;
    let order: Vec<String> = reverts(&ran, "api").into_iter().map(|(h, ..)| h).collect();
    assert_eq!(order, names(&["app5", "app3", "app2", "app1"]));
    // worker needs nothing: it started with api (its start slow), and ends halted by the revert
    // once its running step ended; no new worker step starts after the revert began.
    let began = ran
        .events
        .iter()
        .find(|(_, _, e)| matches!(e, EventKind::ServiceReverting { .. }))
        .map(|(seq, ..)| *seq)
        .expect("the revert began");
    let late = ran.events.iter().any(|(seq, _, e)| {
        *seq > began && matches!(e, EventKind::StepStarted { intent: StepIntent { service, .. }, .. } if service == "worker")
    });
    assert!(!late, "a worker step started after the revert began");
    assert_eq!(ran.outcome("worker"), (ServiceOutcome::Halted, 1, 0, 1));
    assert!(ran.max_hosts_in_flight("api") <= 2);
}

#[tokio::test]
async fn a_service_stopped_at_its_progress_deadline_is_reverted_too() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 4);
    let running: Vec<(&str, &str, &str)> =
        hs.iter().map(|(h, _)| (h.as_str(), "api", "0.9")).collect();
    let policy = "batch 1; max-failed 1; on-failure \"revert\"; progress-deadline \"300ms\"";
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", policy)], &running);
    // app3's check hangs (within its own timeout): no step starts or ends for longer than the
    // deadline, with the budget not spent.
    let rules = Rules::default().sleep(Some("app3"), "hook check api", 800);
    let ran = fx.run(rules, 64, true).await;
    let order: Vec<String> = reverts(&ran, "api").into_iter().map(|(h, ..)| h).collect();
    // app3 was stopped in its check, after its `start` passed: it runs the new version, and
    // is switched back first.
    assert_eq!(order, names(&["app3", "app2", "app1"]));
    assert!(reverted(&ran, "api").iter().all(|(_, ok)| *ok));
    let (outcome, ..) = ran.outcome("api");
    assert_eq!(outcome, ServiceOutcome::Reverted);
    let reason = ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::ServiceReverting { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("progress-deadline")),
        "{reason:?}"
    );
    assert!(ran.touched("api").iter().all(|h| h != "app4"));
}

#[tokio::test]
async fn a_clean_run_under_revert_lets_go_of_what_it_kept_once_the_service_is_done() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 3);
    let running: Vec<(&str, &str, &str)> =
        hs.iter().map(|(h, _)| (h.as_str(), "api", "0.9")).collect();
    let policy = "batch 1; max-failed 0; on-failure \"revert\"";
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", policy)], &running);
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Done);
    assert!(reverts(&ran, "api").is_empty());
    // Each host's kept files are let go of after the last step of the service ended, not
    // after its own step: a revert could have needed them until then.
    let (last_end, ..) = ran.step_finished("api", "app3");
    for (host, _) in &hs {
        let let_go: Vec<u64> = ran
            .cmds()
            .into_iter()
            .filter(|c| {
                &c.host == host && c.script.contains("files/prev/api") && c.hook().is_none()
            })
            .map(|c| c.start)
            .collect();
        assert_eq!(let_go.len(), 1, "{host}: {let_go:?}");
        assert!(let_go[0] > last_end, "{host}");
    }
}

/// The `hooks` field and the secrets of every revert of `service` as it started, by host.
fn reverts_with(ran: &Ran, service: &str) -> Vec<(String, String)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::RevertStarted {
                intent: RevertIntent {
                    service: s, host, ..
                },
                hooks,
                ..
            } if s == service => Some((host.clone(), hooks.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_revert_runs_the_hooks_and_env_the_host_recorded_before_or_says_it_had_none() {
    // As `revert_run`, the site's api with `MODE=new`; app1 and app3 recorded 0.9's hooks
    // (`hook <name> api-was`) and `MODE=old`, app2 recorded none (an older deploy).
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"\n    env \"MODE\" \"new\"")
    );
    let hs = hosts("app", "app", 5);
    let running: Vec<(&str, &str, &str)> =
        hs.iter().map(|(h, _)| (h.as_str(), "api", "0.9")).collect();
    let policy = "batch 1; max-failed 0; on-failure \"revert\"";
    let mut fx = fixture(&body, &host_refs(&hs), &[("p.kdl", policy)], &running);
    let sid = fx.site.service("api").expect("api");
    let mut was = fx.site.services[sid].hooks.clone();
    for h in [
        &mut was.stop,
        &mut was.install,
        &mut was.migrate,
        &mut was.start,
    ]
    .into_iter()
    .flatten()
    {
        h.command.push_str("-was");
    }
    if let Some(c) = &mut was.check {
        c.command.push_str("-was");
    }
    let env = [("DEPLOY_SERVICE", "api"), ("MODE", "old")].map(|(k, v)| (k.into(), v.into()));
    let recorded = crate::state::RecordedHooks::of(&was, &env);
    let plan = Arc::make_mut(&mut fx.plan);
    for host in plan
        .hosts
        .iter_mut()
        .filter(|h| ["app1", "app3"].contains(&&*h.name))
    {
        if let Observed::Running { services } = &mut host.observed {
            if let Some(api) = services.get_mut("api") {
                api.hooks = Some(recorded.clone());
            }
        }
    }
    let ran = fx
        .run(
            Rules::default().fail(Some("app4"), "hook check api"),
            64,
            true,
        )
        .await;
    assert_eq!(
        reverts_with(&ran, "api"),
        [("app3", "recorded"), ("app2", "site"), ("app1", "recorded")]
            .map(|(h, w)| (h.to_string(), w.to_string()))
    );
    assert_eq!(
        reverted(&ran, "api"),
        [("app3", true), ("app2", true), ("app1", true)].map(|(h, ok)| (h.to_string(), ok))
    );
    let mode = |v: &str| format!("MODE={}", quote(v));
    for host in ["app1", "app2", "app3"] {
        let (end, ..) = ran.step_finished("api", host);
        let back: Vec<Cmd> = ran
            .cmds()
            .into_iter()
            .filter(|c| c.host == host && c.start > end)
            .collect();
        let ran_hook = |text: &str, env: &str| {
            back.iter()
                .any(|c| c.script.contains(&quote(text)) && c.script.contains(env))
        };
        // `stop` stops what runs now: the site's, with this run's variables, either way.
        assert!(ran_hook("hook stop api", &mode("new")), "{host}: {back:?}");
        let recorded = host != "app2";
        for hook in ["install", "migrate", "start", "check"] {
            let (text, env) = match recorded {
                true => (format!("hook {hook} api-was"), mode("old")),
                false => (format!("hook {hook} api"), mode("new")),
            };
            assert!(ran_hook(&text, &env), "{host} {hook}: {back:?}");
            if recorded {
                let site = format!("hook {hook} api");
                assert!(!ran_hook(&site, "MODE"), "{host} {hook}: {back:?}");
            }
        }
        // The host records 0.9's texts again (the site's, after a revert with them).
        let last = back
            .iter()
            .rfind(|c| c.writes_state())
            .expect("state written");
        assert_eq!(
            last.script.contains("hook start api-was"),
            recorded,
            "{}",
            last.script
        );
    }
}
