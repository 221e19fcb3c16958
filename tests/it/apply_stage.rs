//! The apply stage driven as a library, no CLI (`drover::apply`), on the sshd fleet:
//! `prepare`, then `Prepared::run` with an operator of the test's own, then the outcome;
//! what happened is read from the hosts' state files and hook logs.

use crate::support;

use drover::apply::{self, ApplyError, Operator, Outcome, Request, Verdict};
use drover::plan::Plan;
use drover::rollout::{Event, Gate, Sink, Summary};
use std::sync::{Arc, Mutex};
use support::shop::{Shop, Spec};

/// An operator that answers `approve` with `yes`, and remembers what it was shown and told.
struct Scripted {
    approve: bool,
    steps_shown: Mutex<Option<usize>>,
    asked: Mutex<usize>,
    ran: Mutex<Option<Summary>>,
}

impl Scripted {
    fn new(approve: bool) -> Arc<Scripted> {
        Arc::new(Scripted {
            approve,
            steps_shown: Mutex::new(None),
            asked: Mutex::new(0),
            ran: Mutex::new(None),
        })
    }
}

impl Gate for Scripted {
    fn confirm(&self, _service: &str, _wave: usize) -> bool {
        true
    }
}

impl Operator for Scripted {
    fn show(&self, plan: &Plan, _pending: &[bool], _early: &[bool]) {
        *self.steps_shown.lock().unwrap() = Some(plan.steps());
    }
    fn can_ask(&self) -> bool {
        true
    }
    fn approve(&self) -> bool {
        *self.asked.lock().unwrap() += 1;
        self.approve
    }
    fn ran(&self, summary: &Summary) {
        *self.ran.lock().unwrap() = Some(summary.clone());
    }
}

/// Counts the rollout's events.
#[derive(Default)]
struct Counted(Mutex<usize>);

impl Sink for Counted {
    fn emit(&self, _event: Event) {
        *self.0.lock().unwrap() += 1;
    }
}

fn request(yes: bool) -> Request {
    Request {
        target: "site.kdl".into(),
        yes,
        max_connections: 256,
        ..Default::default()
    }
}

fn said() -> (apply::Say, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    let say: apply::Say = Arc::new(move |text: &str| kept.lock().unwrap().push(text.into()));
    (say, lines)
}

#[test]
fn prepare_run_outcome_without_the_cli() {
    let shop = Shop::start();
    shop.write(&Spec::default());
    // The controller's directory (.drover) is the working directory's, as for `deploy`.
    std::env::set_current_dir(&shop.fleet.dir).expect("cd to the fleet");
    let hosts = shop.fleet.names();

    // Not approved: refused, nothing ran on any host, and the locks were given back.
    let (say, _) = said();
    let prepared = apply::prepare(request(false), say).expect("prepare");
    assert_eq!(
        prepared.plan().steps(),
        12,
        "a fresh fleet: a step per host"
    );
    let refuses = Scripted::new(false);
    let refused = prepared.run(Arc::new(Counted::default()), refuses.clone());
    assert!(
        matches!(refused, Err(ApplyError::Refused { .. })),
        "{refused:?}"
    );
    assert_eq!(*refuses.asked.lock().unwrap(), 1, "asked once");
    for host in &hosts {
        assert!(shop.events(host).is_empty(), "{host} ran a hook");
        assert!(shop.fleet.holder(host).is_none(), "{host} is left locked");
    }

    // Approved: the run's outcome is the hosts' state.
    let (say, _) = said();
    let prepared = apply::prepare(request(false), say).expect("prepare again");
    let approves = Scripted::new(true);
    let sink = Arc::new(Counted::default());
    let outcome = prepared.run(sink.clone(), approves.clone()).expect("run");
    assert_eq!(*approves.steps_shown.lock().unwrap(), Some(12));
    assert_eq!(*approves.asked.lock().unwrap(), 1);
    let Outcome::Ran { summary, unchanged } = &outcome else {
        panic!("not run to its end: {outcome:?}");
    };
    assert!(!unchanged);
    assert_eq!((summary.succeeded, summary.failed), (12, 0), "{summary:?}");
    assert_eq!(approves.ran.lock().unwrap().as_ref(), Some(summary));
    assert_eq!(outcome.verdict(), Verdict::Converged);
    assert!(*sink.0.lock().unwrap() > 12, "the sink heard the run");
    for host in &hosts {
        let service = match &host[..2] {
            "db" => "db",
            "ap" => "api",
            _ => "lb",
        };
        let state = shop.state(host);
        assert_eq!(state["services"][service]["version"], "1.0", "{host}");
        assert_eq!(
            state["services"][service]["validated"]["outcome"], "success",
            "{host}"
        );
        let whats: Vec<String> = shop.events(host).into_iter().map(|e| e.what).collect();
        assert_eq!(whats, ["install", "start", "checked"], "{host}");
        assert!(shop.fleet.holder(host).is_none(), "{host} is left locked");
    }

    // Again, with `yes`: nothing to change, nothing asked, no hook ran.
    let (say, _) = said();
    let prepared = apply::prepare(request(true), say).expect("prepare a third time");
    let silent = Scripted::new(false);
    let outcome = prepared
        .run(Arc::new(Counted::default()), silent.clone())
        .expect("run again");
    // (With `yes`, hosts may be read as the run goes: then it ran, and changed nothing.)
    assert!(outcome.unchanged(), "{outcome:?}");
    assert_eq!(outcome.verdict(), Verdict::Converged);
    assert_eq!(*silent.asked.lock().unwrap(), 0, "yes: not asked");
    for host in &hosts {
        assert_eq!(shop.events(host).len(), 3, "{host} ran a hook again");
    }
}
