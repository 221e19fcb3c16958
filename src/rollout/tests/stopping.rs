//! Interrupted runs on the fake transport: a first signal lets running steps finish and starts
//! nothing more; a second one kills the running hooks and records their steps as interrupted.

use super::*;
use crate::rollout::{Cancel, Level};

/// api on app1..app6 (fresh), two hosts per wave, each `install` taking 300 ms; `signals`
/// interrupts arrive 100 ms in (while wave 1 installs), and `later` ones 100 ms after that.
async fn interrupted(signals: usize, later: usize) -> Ran {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\nclass \"web\" {{ service \"web\" }}\n{}{}",
        svc("api", "policy \"p.kdl\""),
        svc("web", "needs \"api\"")
    );
    let mut hs = hosts("app", "app", 6);
    hs.extend(hosts("web", "web", 1));
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", "batch 2")], &[]);
    assert_eq!(fx.waves("api").len(), 3);
    let cancel = Cancel::new();
    let signal = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..signals {
            signal.escalate("SIGINT");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..later {
            signal.escalate("SIGTERM");
        }
    });
    let rules = Rules::default().sleep(None, "hook install api", 300);
    fx.run_cancel(rules, 64, true, cancel).await
}

fn interruptions(ran: &Ran) -> Vec<(bool, usize, String)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::Interrupted(Interruption {
                abort,
                running,
                reason,
            }) => Some((*abort, *running, reason.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_first_signal_lets_running_steps_finish_and_starts_nothing_more() {
    let ran = interrupted(1, 0).await;
    assert_eq!(interruptions(&ran), [(false, 2, "SIGINT".to_string())]);
    // Wave 1 ran to its end, every hook of it; nothing else started.
    for h in ["app1", "app2"] {
        let stages: Vec<String> = ran
            .hooks_on("api", h)
            .iter()
            .map(|c| c.hook().unwrap().0.to_string())
            .collect();
        assert_eq!(stages, ["install", "start", "check"], "{h}");
        assert!(ran.step_finished("api", h).2, "{h}");
    }
    assert_eq!(ran.touched("api"), names(&["app1", "app2"]));
    assert!(ran.touched("web").is_empty());
    assert_eq!(ran.counts(), (2, 0, 5));
    assert!(!ran.summary.converged());
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Interrupted, 2, 0, 4));
    assert_eq!(ran.outcome("web"), (ServiceOutcome::Interrupted, 0, 0, 1));
    // The interruption is told before either running step ends.
    let said = ran
        .events
        .iter()
        .position(|(_, _, e)| matches!(e, EventKind::Interrupted { .. }))
        .unwrap();
    let first_end = ran
        .events
        .iter()
        .position(|(_, _, e)| matches!(e, EventKind::StepFinished { .. }))
        .unwrap();
    assert!(said < first_end);
    // No kill was sent.
    let pid_files = format!("\"$d\"/{}.pid", crate::state::lock::hooks_tag());
    assert!(ran.cmds().iter().all(|c| !c.script.contains(&pid_files)));
}

#[tokio::test]
async fn a_second_signal_kills_running_hooks_and_records_the_steps_interrupted() {
    let ran = interrupted(1, 1).await;
    assert_eq!(
        interruptions(&ran),
        [
            (false, 2, "SIGINT".to_string()),
            (true, 2, "SIGTERM".to_string())
        ]
    );
    let pid_files = format!("\"$d\"/{}.pid", crate::state::lock::hooks_tag());
    for h in ["app1", "app2"] {
        let cmds: Vec<Cmd> = ran.cmds().into_iter().filter(|c| c.host == h).collect();
        assert!(
            cmds.iter().any(|c| c.script.contains(&pid_files)),
            "{h}: its hooks' process groups were killed"
        );
        // install was the last hook; no start, no rollback; the step is interrupted.
        let hooks: Vec<&str> = cmds.iter().filter_map(|c| c.hook()).map(|h| h.0).collect();
        assert_eq!(hooks, ["install"], "{h}");
        let state = cmds
            .iter()
            .rfind(|c| c.hook().is_none() && c.script.contains("state.json"))
            .expect("state written");
        assert!(
            state.script.contains(r#""hook":"interrupted""#)
                && state.script.contains(r#""version":"1.0""#),
            "{h}: {}",
            state.script
        );
        let finished = ran
            .events
            .iter()
            .find_map(|(_, _, e)| match e {
                EventKind::StepFinished {
                    result:
                        StepEnd {
                            host,
                            failed_hook,
                            reason,
                            ..
                        },
                    ..
                } if host == h => Some((failed_hook.clone(), reason.clone())),
                _ => None,
            })
            .unwrap();
        assert_eq!(finished.0.as_deref(), Some("interrupted"));
        assert!(finished.1.unwrap().contains("install interrupted"));
    }
    assert_eq!(ran.counts(), (0, 2, 5));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Interrupted, 0, 2, 4));
}

#[tokio::test]
async fn two_signals_at_once_abort_as_well() {
    let ran = interrupted(2, 0).await;
    let said = interruptions(&ran);
    assert_eq!(said.last().map(|s| s.0), Some(true), "{said:?}");
    assert_eq!(ran.counts(), (0, 2, 5));
}

#[tokio::test]
async fn an_interrupt_before_the_run_starts_nothing() {
    let body = format!("class \"app\" {{ service \"api\" }}\n{}", svc("api", ""));
    let fx = fixture(&body, &host_refs(&hosts("app", "app", 2)), &[], &[]);
    let cancel = Cancel::new();
    cancel.raise(Level::Stop, "SIGINT");
    let ran = fx.run_cancel(Rules::default(), 64, true, cancel).await;
    assert!(ran.cmds().is_empty());
    assert_eq!(ran.counts(), (0, 0, 2));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Interrupted, 0, 0, 2));
}

#[tokio::test]
async fn a_wave_left_open_by_a_stop_still_ends() {
    // api needs worker (1 healthy), so api's step on app2 follows worker's there. worker@app2
    // is slow; api opens its wave of app1 and app2 once worker@app1 is done, and app2 waits.
    // A signal comes while api@app1 installs: once it ends, api ends interrupted with app2
    // never started, and its open wave is said to end, as every wave that starts is.
    let body = format!(
        "class \"app\" {{ service \"worker\"; service \"api\" }}\n{}{}",
        svc("worker", "policy \"one.kdl\""),
        svc("api", "needs \"worker\" healthy=1; policy \"two.kdl\"")
    );
    let hs = hosts("app", "app", 2);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("one.kdl", "batch 1"), ("two.kdl", "batch 2")],
        &[],
    );
    let cancel = Cancel::new();
    let signal = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        signal.escalate("SIGINT");
    });
    let rules = Rules::default()
        .sleep(Some("app1"), "hook install api", 1000)
        .sleep(Some("app2"), "hook install worker", 2000);
    let ran = fx.run_cancel(rules, 64, true, cancel).await;
    let (outcome, succeeded, _, not_started) = ran.outcome("api");
    assert_eq!(
        (outcome, succeeded, not_started),
        (ServiceOutcome::Interrupted, 1, 1)
    );
    let waves = |kind: fn(&EventKind) -> Option<(&str, usize)>| -> Vec<(String, usize)> {
        ran.events
            .iter()
            .filter_map(|(_, _, e)| kind(e).map(|(s, w)| (s.to_string(), w)))
            .collect()
    };
    let mut started = waves(|e| match e {
        EventKind::WaveStarted { service, wave, .. } => Some((service, *wave)),
        _ => None,
    });
    let mut finished = waves(|e| match e {
        EventKind::WaveFinished { service, wave, .. } => Some((service, *wave)),
        _ => None,
    });
    started.sort();
    finished.sort();
    assert!(started.contains(&("api".to_string(), 1)), "{started:?}");
    assert_eq!(started, finished);
}
