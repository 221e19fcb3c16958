//! Fast unit tests of the scheduler, over a fake transport that records every command: one
//! command per host, same-host order, runtime conditions, waves, failure budgets, blocking,
//! pauses, the connection pool and the hooks' environment.

use super::{
    run, Event, EventKind, Gate, Interruption, RevertEnd, RevertIntent, Rollout, ServiceOutcome,
    Sink, StepBlocked, StepEnd, StepIntent, Summary,
};
use crate::plan::{self, Plan, Selection};
use crate::site::{self, Site};
use crate::state::{Observed, ServiceRecord};
use crate::transport::{quote, Kept, Link, Output, Target, Transport, TransportError};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

mod draining;
mod fleets;
mod flow;
mod ideal;
mod planning;
mod pool;
mod reading;
mod reverting;
mod rounds;
mod stopping;
mod unread;

// Failure budgets per wave and per run, on the same fake transport.
#[path = "budget_tests.rs"]
mod budget_tests;

// ---------------------------------------------------------------------------------------------
// The fake transport

/// One sequence shared by commands and events, so that both can be ordered on one line.
#[derive(Default)]
struct Clock(AtomicU64);

impl Clock {
    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// A command a link ran.
#[derive(Debug, Clone)]
struct Cmd {
    host: String,
    script: String,
    start: u64,
    end: u64,
    started: Instant,
}

impl Cmd {
    /// `(hook, service)` of a hook command (`hook <hook> <service>`, maybe followed by a state
    /// write); `None` for state writes alone.
    fn hook(&self) -> Option<(&str, &str)> {
        let (_, command) = self.script.split_once("/bin/sh -c 'hook ")?;
        command.split_once('\'')?.0.split_once(' ')
    }

    /// Whether the command writes the host's state file (alone, or after a hook).
    fn writes_state(&self) -> bool {
        self.script.contains("state.json.tmp")
    }

    fn is(&self, hook: &str, service: &str) -> bool {
        self.hook() == Some((hook, service))
    }

    fn of(&self, service: &str) -> bool {
        self.hook().is_some_and(|(_, s)| s == service)
    }
}

/// `script` without the records it writes: their JSON holds the texts of every hook of the
/// service (`hooks`, `removal`), which are not what a rule means to match.
fn without_records(script: &str) -> String {
    let mut out = String::with_capacity(script.len());
    let mut rest = script;
    while let Some(at) = rest.find("printf '%s\\n' ") {
        out.push_str(&rest[..at]);
        rest = rest[at..].find(" > ").map_or("", |end| &rest[at + end..]);
    }
    out.push_str(rest);
    out
}

/// How the fake answers a command: every rule whose host (if any) and text match applies.
#[derive(Clone)]
struct Rule {
    host: Option<String>,
    contains: String,
    sleep: Duration,
    code: Option<i32>,
    /// The command panics (a bug in deploy, as the step's task would meet it).
    panics: bool,
    /// The command ends only once every command given the same barrier has come to it.
    together: Option<Arc<tokio::sync::Barrier>>,
}

#[derive(Default)]
struct Counters {
    cmds: Vec<Cmd>,
    running: HashMap<String, usize>,
    max_per_host: HashMap<String, usize>,
    running_all: usize,
    max_all: usize,
    connects: BTreeMap<String, usize>,
    open: usize,
    max_open: usize,
    closed: usize,
    dropped_unclosed: usize,
    /// When each link's close ended, by host.
    closes: Vec<(String, Instant)>,
    /// The chains of commands links were given ([`Link::chain`]): host, and each script.
    chains: Vec<(String, Vec<String>)>,
}

struct Inner {
    clock: Arc<Clock>,
    rules: Vec<Rule>,
    counters: Mutex<Counters>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Fake(Arc<Inner>);

struct FakeLink {
    host: String,
    inner: Arc<Inner>,
    closed: bool,
}

/// A command in flight; recorded when it ends, however it ends (a hook timeout drops it).
struct InFlight<'a> {
    link: &'a FakeLink,
    script: String,
    start: u64,
    started: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let end = self.link.inner.clock.tick();
        let mut c = self.link.inner.lock();
        if let Some(n) = c.running.get_mut(&self.link.host) {
            *n -= 1;
        }
        c.running_all -= 1;
        c.cmds.push(Cmd {
            host: self.link.host.clone(),
            script: std::mem::take(&mut self.script),
            start: self.start,
            end,
            started: self.started,
        });
    }
}

impl Transport for Fake {
    type Link = FakeLink;
    async fn connect(&self, target: &Target) -> Result<FakeLink, TransportError> {
        {
            let mut c = self.0.lock();
            *c.connects.entry(target.name.clone()).or_default() += 1;
            c.open += 1;
            c.max_open = c.max_open.max(c.open);
        }
        // Connecting takes a moment.
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(FakeLink {
            host: target.name.clone(),
            inner: self.0.clone(),
            closed: false,
        })
    }
}

impl Link for FakeLink {
    async fn chain(&self, commands: Vec<crate::transport::Command>) -> crate::transport::Chain {
        let scripts = commands.iter().map(|c| c.script.clone()).collect();
        self.inner.lock().chains.push((self.host.clone(), scripts));
        crate::transport::Chain::later(commands)
    }

    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        let text = without_records(script);
        let matching: Vec<&Rule> = self
            .inner
            .rules
            .iter()
            .filter(|r| r.host.as_ref().is_none_or(|h| *h == self.host))
            .filter(|r| text.contains(&r.contains))
            .collect();
        let sleep = matching.iter().map(|r| r.sleep).max().unwrap_or_default();
        let code = matching.iter().find_map(|r| r.code).unwrap_or(0);
        assert!(!matching.iter().any(|r| r.panics), "told to panic");
        let _in_flight = {
            let start = self.inner.clock.tick();
            let mut c = self.inner.lock();
            let n = c.running.entry(self.host.clone()).or_default();
            *n += 1;
            let n = *n;
            let max = c.max_per_host.entry(self.host.clone()).or_default();
            *max = (*max).max(n);
            c.running_all += 1;
            c.max_all = c.max_all.max(c.running_all);
            InFlight {
                link: self,
                script: script.to_string(),
                start,
                started: Instant::now(),
            }
        };
        tokio::time::sleep(sleep).await;
        if let Some(barrier) = matching.iter().find_map(|r| r.together.as_ref()) {
            barrier.wait().await;
        }
        tokio::task::yield_now().await;
        Ok(Output {
            code: Some(code),
            stdout: Vec::new(),
            stderr: if code == 0 {
                Vec::new()
            } else {
                b"told to fail\n".to_vec()
            },
        })
    }

    /// Closing takes the sleep of a rule matching `<close>` (an ssh master's exit).
    async fn close(mut self) {
        self.closed = true;
        let sleep = self
            .inner
            .rules
            .iter()
            .filter(|r| r.host.as_ref().is_none_or(|h| *h == self.host))
            .filter(|r| r.contains == "<close>")
            .map(|r| r.sleep)
            .max()
            .unwrap_or_default();
        tokio::time::sleep(sleep).await;
        let mut c = self.inner.lock();
        c.open -= 1;
        c.closed += 1;
        c.closes.push((self.host.clone(), Instant::now()));
    }
}

impl Drop for FakeLink {
    fn drop(&mut self) {
        if !self.closed {
            let mut c = self.inner.lock();
            c.open -= 1;
            c.dropped_unclosed += 1;
        }
    }
}

/// The rules a fake transport is built with.
#[derive(Default)]
struct Rules(Vec<Rule>);

impl Rules {
    /// Commands containing `text` (on `host`, or on every host) exit 1.
    fn fail(mut self, host: Option<&str>, text: &str) -> Self {
        self.0.push(Rule {
            host: host.map(str::to_string),
            contains: text.into(),
            sleep: Duration::ZERO,
            code: Some(1),
            panics: false,
            together: None,
        });
        self
    }

    /// Commands containing `text` (on `host`, or on every host) take `ms` milliseconds.
    fn sleep(mut self, host: Option<&str>, text: &str, ms: u64) -> Self {
        self.0.push(Rule {
            host: host.map(str::to_string),
            contains: text.into(),
            sleep: Duration::from_millis(ms),
            code: None,
            panics: false,
            together: None,
        });
        self
    }

    /// The commands of each `(host, text)` end at the same moment.
    fn together(mut self, commands: &[(&str, &str)]) -> Self {
        let barrier = Arc::new(tokio::sync::Barrier::new(commands.len()));
        for (host, text) in commands {
            self.0.push(Rule {
                host: Some(host.to_string()),
                contains: text.to_string(),
                sleep: Duration::ZERO,
                code: None,
                panics: false,
                together: Some(barrier.clone()),
            });
        }
        self
    }

    /// Commands containing `text` on `host` panic.
    fn panic(mut self, host: &str, text: &str) -> Self {
        self.0.push(Rule {
            host: Some(host.into()),
            contains: text.into(),
            sleep: Duration::ZERO,
            code: None,
            panics: true,
            together: None,
        });
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Sink and gate

struct Collect {
    clock: Arc<Clock>,
    events: Mutex<Vec<(u64, Instant, EventKind)>>,
}

impl Sink for Collect {
    fn emit(&self, event: Event) {
        let seq = self.clock.tick();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push((
            seq,
            Instant::now(),
            event.kind,
        ));
    }
}

struct Answer {
    yes: bool,
    asked: Mutex<Vec<(String, usize)>>,
    /// A signal comes while the question is asked, leaving it unanswered.
    signal: Option<super::Cancel>,
}

impl Gate for Answer {
    fn confirm(&self, service: &str, wave: usize) -> bool {
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((service.to_string(), wave));
        if let Some(cancel) = &self.signal {
            cancel.escalate("SIGINT");
            return false;
        }
        self.yes
    }
}

// ---------------------------------------------------------------------------------------------
// Sites and plans

/// A service whose every hook is `hook <hook> <name>`, with a quick check.
fn svc(name: &str, extra: &str) -> String {
    format!(
        r#"service "{name}" {{
    {extra}
    install "hook install {name}"
    stop "hook stop {name}"
    migrate "hook migrate {name}"
    start "hook start {name}"
    check "hook check {name}" timeout="1s" interval="100ms"
    rollback "hook rollback {name}"
}}
"#
    )
}

/// Class `db` running `db` and class `app` running `api`, each service with its `extra` lines.
fn db_and_api(db: &str, api: &str) -> String {
    format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\n{}{}",
        svc("db", db),
        svc("api", api)
    )
}

/// Class `app` running `api` and `worker`, each service with its `extra` lines.
fn api_and_worker(api: &str, worker: &str) -> String {
    format!(
        "class \"app\" {{ service \"api\"; service \"worker\" }}\n{}{}",
        svc("api", api),
        svc("worker", worker)
    )
}

struct Fixture {
    dir: tempfile::TempDir,
    site: Arc<Site>,
    plan: Arc<Plan>,
    desired: Arc<crate::desired::Desired>,
    /// [`Rollout::release`] for the runs.
    release: Option<String>,
    /// A `pause "confirm"` question is met with a signal.
    signal_at_confirm: bool,
    /// [`Rollout::lock_at_step`] for the runs (the fixture's [`unread::FakeLock`]).
    lock_at_step: Option<Arc<unread::FakeLock>>,
    /// [`Rollout::planning`] for the next run (`tests/planning.rs`).
    planning: Mutex<Option<super::Planning>>,
}

/// The address of the `i`th host given to [`fixture`].
fn address(i: usize) -> String {
    format!("10.0.0.{}", i + 1)
}

/// Writes a site (`body`: classes and services; every service uses `default.kdl` unless it
/// names another of `policies`), a local platform with `hosts` (name, class), and plans it with
/// `running` (host, service, version) observed and every other host fresh.
fn fixture(
    body: &str,
    hosts: &[(&str, &str)],
    policies: &[(&str, &str)],
    running: &[(&str, &str, &str)],
) -> Fixture {
    fixture_unread(body, hosts, policies, running, &[])
}

/// [`fixture`], with the hosts named in `unread` left unread when planned (what they run,
/// `running` says, is for a lock at their step to find: [`Fixture::lock_at_step`]).
fn fixture_unread(
    body: &str,
    hosts: &[(&str, &str)],
    policies: &[(&str, &str)],
    running: &[(&str, &str, &str)],
    unread: &[&str],
) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: String| {
        std::fs::write(dir.path().join(name), text).expect("write fixture");
    };
    write(
        "site.kdl",
        format!(
            "site \"t\" {{\n    version \"1.0\"\n    platform \"platform.kdl\"\n    policy \"default.kdl\"\n}}\n{body}"
        ),
    );
    let inventory: String = hosts
        .iter()
        .enumerate()
        .map(|(i, (name, class))| {
            format!(
                "        host \"{name}\" address=\"{}\" class=\"{class}\" zone=\"z{}\"\n",
                address(i),
                i % 2
            )
        })
        .collect();
    write(
        "platform.kdl",
        format!(
            "platform \"fake\" {{\n    transport \"local\"\n    state-dir \"/var/lib/drover\"\n    inventory \"static\" {{\n{inventory}    }}\n}}\n"
        ),
    );
    write(
        "default.kdl",
        "policy \"default\" { batch \"100%\" }\n".into(),
    );
    for (file, policy) in policies {
        write(file, format!("policy \"{file}\" {{ {policy} }}\n"));
    }
    let site = match site::load(&dir.path().join("site.kdl")) {
        Ok(site) => site,
        Err(e) => panic!("fixture site does not load: {:?}", e.errors),
    };
    let resolved = crate::inventory::resolve(&site).expect("inventory");
    let observed: Vec<Observed> = resolved
        .hosts
        .iter()
        .map(|h| {
            let services: BTreeMap<String, ServiceRecord> = running
                .iter()
                .filter(|(host, _, _)| **host == *h.name)
                .map(|(_, service, version)| (service.to_string(), ServiceRecord::at(*version)))
                .collect();
            if services.is_empty() {
                Observed::Fresh
            } else {
                Observed::Running { services }
            }
        })
        .collect();
    let desired = crate::desired::resolve(&site, &resolved, &Default::default()).expect("desired");
    let mut observed = observed;
    desired.stamp(&site, &mut observed);
    let mut planned = observed.clone();
    for (h, o) in resolved.hosts.iter().zip(planned.iter_mut()) {
        if unread.contains(&&*h.name) {
            *o = Observed::Unread;
        }
    }
    let plan =
        plan::plan(&site, &resolved, &planned, &desired, &Selection::default()).expect("plan");
    let truth: HashMap<String, Observed> = resolved
        .hosts
        .iter()
        .zip(observed)
        .map(|(h, o)| (h.name.to_string(), o))
        .collect();
    Fixture {
        dir,
        site: Arc::new(site),
        plan: Arc::new(plan),
        desired: Arc::new(desired),
        release: None,
        signal_at_confirm: false,
        lock_at_step: (!unread.is_empty()).then(|| {
            Arc::new(unread::FakeLock {
                truth,
                refuse: Mutex::default(),
                asked: Mutex::default(),
                stop_at: Mutex::default(),
            })
        }),
        planning: Mutex::default(),
    }
}

impl Fixture {
    /// The fixture's site planned for `selection` with each host running what `truth` says
    /// (by host id), but those named in `unread`, left unread.
    fn plan_unread(&self, truth: &[Observed], unread: &[&str], selection: &Selection) -> Plan {
        let resolved = crate::inventory::resolve(&self.site).expect("inventory");
        let observed: Vec<Observed> = resolved
            .hosts
            .iter()
            .zip(truth)
            .map(|(h, o)| match unread.contains(&&*h.name) {
                true => Observed::Unread,
                false => o.clone(),
            })
            .collect();
        plan::plan(&self.site, &resolved, &observed, &self.desired, selection).expect("plan")
    }

    fn service(&self, name: &str) -> &plan::ServicePlan {
        self.plan
            .services
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no service {name} in the plan"))
    }

    /// Hosts of each wave of `service`.
    fn waves(&self, name: &str) -> Vec<Vec<String>> {
        self.service(name)
            .waves
            .iter()
            .map(|w| w.steps.iter().map(|s| s.host.to_string()).collect())
            .collect()
    }

    async fn run(&self, rules: Rules, max_connections: usize, confirm: bool) -> Ran {
        self.run_cancel(rules, max_connections, confirm, super::Cancel::new())
            .await
    }

    /// [`Fixture::run`], with a handle to interrupt it (`tests/stopping.rs`).
    async fn run_cancel(
        &self,
        rules: Rules,
        max_connections: usize,
        confirm: bool,
        cancel: super::Cancel,
    ) -> Ran {
        self.run_with(rules, max_connections, confirm, cancel, &[])
            .await
    }

    /// [`Fixture::run_cancel`] through the link pool of a fleet over the cap
    /// ([`crate::transport::Kept`]), with links to `kept` connected and parked before the
    /// rollout, as the lock leaves them (`Kept::keep_for_steps`).
    async fn run_with(
        &self,
        rules: Rules,
        max_connections: usize,
        confirm: bool,
        cancel: super::Cancel,
        kept: &[&str],
    ) -> Ran {
        let clock = Arc::new(Clock::default());
        let inner = Arc::new(Inner {
            clock: clock.clone(),
            rules: rules.0,
            counters: Mutex::default(),
        });
        let sink = Arc::new(Collect {
            clock,
            events: Mutex::default(),
        });
        let gate = Arc::new(Answer {
            yes: confirm,
            asked: Mutex::default(),
            signal: self.signal_at_confirm.then(|| cancel.clone()),
        });
        let transport = Arc::new(Kept::new(Fake(inner.clone()), usize::MAX, max_connections));
        transport.keep_for_steps(kept.iter().map(|h| h.to_string()));
        for host in kept {
            let target = Target {
                name: host.to_string(),
                address: "127.0.0.1".into(),
            };
            let link = transport.connect(&target).await.expect("connects");
            transport.park(host, link).await;
        }
        let rollout = Rollout {
            plan: self.plan.clone(),
            site: self.site.clone(),
            transport: transport.clone(),
            sink: sink.clone(),
            gate: gate.clone(),
            run_id: "test-run".into(),
            log_dir: self.dir.path().join("logs"),
            max_connections,
            secrets: Default::default(),
            desired: self.desired.clone(),
            cancel,
            release: self.release.clone(),
            guard: None,
            lock_at_step: self
                .lock_at_step
                .clone()
                .map(|l| l as Arc<dyn super::LockAtStep<FakeLink>>),
            held_to_end: None,
            planning: self.planning.lock().unwrap().take(),
        };
        // Only a deadlock guard: generous, so a loaded CI machine never trips it.
        let summary = tokio::time::timeout(Duration::from_secs(60), run(rollout))
            .await
            .expect("the rollout finishes (no deadlock)");
        let ended = Instant::now();
        // Let tasks the pool spawned (closing evicted links) run.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // What the session closes at its end: links kept for steps that never came.
        transport.close_all().await;
        {
            let c = inner.lock();
            assert_eq!(
                (c.open, c.dropped_unclosed),
                (0, 0),
                "every link is closed at the end"
            );
        }
        let events = std::mem::take(&mut *sink.events.lock().unwrap());
        let asked = std::mem::take(&mut *gate.asked.lock().unwrap());
        Ran {
            summary,
            events,
            fake: inner,
            asked,
            ended,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What a run left behind

struct Ran {
    summary: Summary,
    events: Vec<(u64, Instant, EventKind)>,
    fake: Arc<Inner>,
    asked: Vec<(String, usize)>,
    ended: Instant,
}

impl Ran {
    fn cmds(&self) -> Vec<Cmd> {
        let mut cmds = self.fake.lock().cmds.clone();
        cmds.sort_by_key(|c| c.start);
        cmds
    }

    /// The chains of hooks `host` was sent, each as its hooks' names.
    fn chains_on(&self, host: &str) -> Vec<Vec<String>> {
        let c = self.fake.lock();
        c.chains
            .iter()
            .filter(|(h, _)| h == host)
            .map(|(_, scripts)| {
                scripts
                    .iter()
                    .map(|script| {
                        let cmd = Cmd {
                            host: host.to_string(),
                            script: script.clone(),
                            start: 0,
                            end: 0,
                            started: Instant::now(),
                        };
                        cmd.hook().map_or(String::new(), |(h, _)| h.to_string())
                    })
                    .collect()
            })
            .collect()
    }

    /// Hook commands of `service` on `host`, in order.
    fn hooks_on(&self, service: &str, host: &str) -> Vec<Cmd> {
        self.cmds()
            .into_iter()
            .filter(|c| c.host == host && c.of(service))
            .collect()
    }

    /// Hosts on which `service` ran any hook.
    fn touched(&self, service: &str) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .cmds()
            .into_iter()
            .filter(|c| c.of(service))
            .map(|c| c.host)
            .collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }

    fn hosts_with(&self, hook: &str, service: &str) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .cmds()
            .into_iter()
            .filter(|c| c.is(hook, service))
            .map(|c| c.host)
            .collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }

    fn first_hook(&self, service: &str, host: &str) -> Option<Cmd> {
        self.hooks_on(service, host).into_iter().next()
    }

    /// `(seq, time, host, ok)` of every finished step of `service`, in order.
    fn steps_finished(&self, service: &str) -> Vec<(u64, Instant, String, bool)> {
        self.events
            .iter()
            .filter_map(|(seq, at, e)| match e {
                EventKind::StepFinished {
                    result:
                        StepEnd {
                            service: s,
                            host,
                            ok,
                            ..
                        },
                    ..
                } if s == service => Some((*seq, *at, host.clone(), *ok)),
                _ => None,
            })
            .collect()
    }

    fn step_finished(&self, service: &str, host: &str) -> (u64, Instant, bool) {
        self.steps_finished(service)
            .into_iter()
            .find(|(_, _, h, _)| h == host)
            .map(|(seq, at, _, ok)| (seq, at, ok))
            .unwrap_or_else(|| panic!("{service} never finished on {host}"))
    }

    /// Services that ended because their steps waited for steps that could never run (the
    /// engine's stall guard): a plan whose waits go round.
    fn stalled(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|(_, _, e)| match e {
                EventKind::ServiceFinished {
                    service,
                    reason: Some(r),
                    ..
                } if r.contains("can never run") => Some(service.clone()),
                _ => None,
            })
            .collect()
    }

    /// `(outcome, succeeded, failed, not_started)` of the service's end.
    fn outcome(&self, service: &str) -> (ServiceOutcome, usize, usize, usize) {
        self.events
            .iter()
            .find_map(|(_, _, e)| match e {
                EventKind::ServiceFinished {
                    service: s,
                    outcome,
                    succeeded,
                    failed,
                    not_started,
                    ..
                } if s == service => Some((*outcome, *succeeded, *failed, *not_started)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{service} never finished"))
    }

    fn counts(&self) -> (usize, usize, usize) {
        (
            self.summary.succeeded,
            self.summary.failed,
            self.summary.not_started,
        )
    }

    fn failed_hosts(&self) -> Vec<(String, String)> {
        self.summary
            .failures
            .iter()
            .map(|f| (f.host.clone(), f.service.clone()))
            .collect()
    }

    /// The most hosts of `service` at once between their first hook and their step's end.
    fn max_hosts_in_flight(&self, service: &str) -> usize {
        let mut points: Vec<(u64, i32)> = Vec::new();
        for (end, _, host, _) in self.steps_finished(service) {
            if let Some(first) = self.first_hook(service, &host) {
                points.push((first.start, 1));
                points.push((end, -1));
            }
        }
        points.sort();
        let (mut now, mut max) = (0, 0);
        for (_, d) in points {
            now += d;
            max = max.max(now);
        }
        usize::try_from(max).unwrap_or(0)
    }
}

fn hosts(prefix: &str, class: &'static str, n: usize) -> Vec<(String, &'static str)> {
    (1..=n).map(|i| (format!("{prefix}{i}"), class)).collect()
}

fn host_refs<'a>(list: &'a [(String, &'static str)]) -> Vec<(&'a str, &'static str)> {
    list.iter().map(|(h, c)| (h.as_str(), *c)).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. One command per host

#[tokio::test]
async fn a_host_runs_one_command_at_a_time_even_with_two_services() {
    let body = api_and_worker("", "");
    let hs = hosts("app", "app", 3);
    let fx = fixture(&body, &host_refs(&hs), &[], &[]);
    assert!(
        fx.service("worker").waves[0]
            .steps
            .iter()
            .all(|s| s.after.is_empty()),
        "api and worker are independent: only the host's one-at-a-time rule orders them"
    );
    let rules = Rules::default().sleep(None, "/bin/sh -c 'hook", 3).sleep(
        Some("app3"),
        "hook start api",
        40,
    );
    let ran = fx.run(rules, 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.counts(), (6, 0, 0));
    let c = ran.fake.lock();
    for (host, _) in &hs {
        assert_eq!(
            c.max_per_host.get(host),
            Some(&1),
            "{host} ran two commands at once"
        );
    }
    assert!(c.max_all >= 2, "hosts work in parallel");
    drop(c);
    // Not vacuous: worker runs on one host while api still runs on another.
    let cmds = ran.cmds();
    let overlap = cmds.iter().filter(|a| a.of("worker")).any(|w| {
        cmds.iter()
            .filter(|a| a.of("api") && a.host != w.host)
            .any(|a| a.start < w.end && w.start < a.end)
    });
    assert!(overlap, "worker and api overlap across hosts");
}

#[tokio::test]
async fn a_step_whose_task_panics_fails_and_is_counted_once() {
    let body = api_and_worker("", "");
    let hs = hosts("app", "app", 3);
    let fx = fixture(&body, &host_refs(&hs), &[], &[]);
    let rules = Rules::default().panic("app2", "hook install api");
    let ran = fx.run(rules, 64, true).await;
    // api on app2 failed, as a failed hook would; the rest ran (worker needs nothing of api).
    assert_eq!(ran.counts(), (5, 1, 0), "{:?}", ran.summary);
    let finished = ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::StepFinished {
            result:
                StepEnd {
                    service,
                    host,
                    failed_hook,
                    ..
                },
            ..
        } if service == "api" && host == "app2" => Some(failed_hook.clone()),
        _ => None,
    });
    assert_eq!(finished, Some(Some("panic".to_string())));
    let ended = |name: &str| {
        ran.events.iter().any(
            |(_, _, e)| matches!(e, EventKind::ServiceFinished { service, .. } if service == name),
        )
    };
    assert!(ended("api") && ended("worker"), "every service ends");
}

#[tokio::test]
async fn steps_that_wait_for_each_other_in_a_saved_plan_run_without_the_wait_that_goes_round() {
    // A saved plan edited by hand (the planner says such waits in the plan): api on app1
    // waits for worker on app2, which waits for api on app1. The engine drops the wait for
    // the later step (worker's), says so, and the run converges.
    let body = api_and_worker("", "");
    let hs = hosts("app", "app", 2);
    let mut fx = fixture(&body, &host_refs(&hs), &[], &[]);
    let mut plan = (*fx.plan).clone();
    let wait = |service: &str, host: &str| crate::plan::HostStep {
        service: Arc::from(service),
        host: Arc::from(host),
    };
    for s in &mut plan.services {
        let (host, other) = if s.name == "api" {
            ("app1", wait("worker", "app2"))
        } else {
            ("app2", wait("api", "app1"))
        };
        for st in s.waves.iter_mut().flat_map(|w| &mut w.steps) {
            if &*st.host == host {
                st.waits.push(other.clone());
            }
        }
    }
    fx.plan = Arc::new(plan);
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.stalled().is_empty(), "{:?}", ran.events);
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    let dropped: Vec<String> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::WaitDropped { why, .. } => Some(why.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        dropped,
        [
            "api on app1 does not wait for worker on app2: worker on app2 waits for api on app1. \
          So api on app1 may be given app2 as a host of worker before worker's step on app2 \
          has ended: app2 may not serve worker yet"
        ]
    );
    let (worker_done, ..) = ran.step_finished("worker", "app2");
    let (api_done, ..) = ran.step_finished("api", "app1");
    assert!(api_done < ran.first_hook("worker", "app2").expect("ran").start);
    assert!(api_done < worker_done);
}

// ---------------------------------------------------------------------------------------------
// 2. Same-host `after`

#[tokio::test]
async fn a_step_waits_for_the_services_it_needs_on_the_same_host() {
    let body = api_and_worker("policy \"one.kdl\"", "needs \"api\" healthy=1");
    let hs = hosts("app", "app", 3);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("one.kdl", "batch 1; pause \"60ms\"")],
        &[],
    );
    for st in &fx.service("worker").waves[0].steps {
        assert_eq!(st.after, [std::sync::Arc::from("api")], "{}", st.host);
    }
    let ran = fx
        .run(
            Rules::default().sleep(None, "/bin/sh -c 'hook", 2),
            64,
            true,
        )
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    for (host, _) in &hs {
        let check = ran
            .hooks_on("api", host)
            .into_iter()
            .rfind(|c| c.is("check", "api"))
            .expect("api checked");
        let first = ran.first_hook("worker", host).expect("worker ran");
        assert!(
            first.start > check.end,
            "worker's first hook on {host} came before api's check passed there"
        );
    }
    // The graph is not lock-step: worker started on app1 before api reached app3.
    let worker_app1 = ran.first_hook("worker", "app1").unwrap();
    let api_app3 = ran.first_hook("api", "app3").unwrap();
    assert!(worker_app1.start < api_app3.start);
}

// ---------------------------------------------------------------------------------------------
// 3. Runtime conditions

#[tokio::test]
async fn dependents_wait_for_the_needed_count_of_healthy_hosts() {
    let body = format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\nclass \"lb\" {{ service \"lb\" }}\n{}{}{}",
        svc("db", "policy \"one.kdl\""),
        svc("api", "needs \"db\"; policy \"one.kdl\""),
        svc("lb", "needs \"api\" healthy=\"50%\"")
    );
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 4));
    hs.extend(hosts("lb", "lb", 1));
    let fx = fixture(&body, &host_refs(&hs), &[("one.kdl", "batch 1")], &[]);
    let waits = |s: &str| {
        fx.service(s)
            .waits_for
            .iter()
            .map(|c| (c.service.clone(), c.count, c.of))
            .collect::<Vec<_>>()
    };
    assert_eq!(waits("api"), [("db".to_string(), 2, 2)]);
    assert_eq!(waits("lb"), [("api".to_string(), 2, 4)]);
    let rules =
        Rules::default()
            .sleep(None, "/bin/sh -c 'hook", 1)
            .sleep(None, "hook start api", 150);
    let ran = fx.run(rules, 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);

    let db_done: Vec<u64> = ran.steps_finished("db").iter().map(|s| s.0).collect();
    assert_eq!(db_done.len(), 2);
    let first = |service: &str| {
        ran.cmds()
            .into_iter()
            .find(|c| c.of(service))
            .unwrap_or_else(|| panic!("{service} ran nothing"))
    };
    assert!(
        first("api").start > db_done[1],
        "api started before both db hosts were healthy"
    );

    let api_done: Vec<u64> = ran
        .steps_finished("api")
        .iter()
        .filter(|s| s.3)
        .map(|s| s.0)
        .collect();
    assert_eq!(api_done.len(), 4);
    let lb_first = first("lb").start;
    assert!(
        lb_first > api_done[1],
        "lb started before 2 of the 4 api hosts were healthy"
    );
    assert!(
        lb_first < api_done[2],
        "lb waited for more api hosts than healthy=\"50%\" asks"
    );
    let (lb_end, _, _) = ran.step_finished("lb", "lb1");
    assert!(
        lb_end < api_done[3],
        "lb finished while api was still rolling: a graph, not lock-step"
    );
    let waiting: Vec<String> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::ServiceWaiting { service, .. } => Some(service.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(waiting, ["api", "lb"]);
}

// ---------------------------------------------------------------------------------------------
// 4. Waves

#[tokio::test]
async fn waves_hold_the_batch_and_the_canary_goes_alone() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"canary.kdl\"")
    );
    let hs = hosts("app", "app", 5);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("canary.kdl", "batch 2; canary 1")],
        &[],
    );
    assert_eq!(
        fx.waves("api"),
        [vec!["app1"], vec!["app2", "app3"], vec!["app4", "app5"]]
    );
    assert_eq!(fx.service("api").policy.batch_hosts, 2);
    let rules = Rules::default()
        .sleep(None, "/bin/sh -c 'hook", 3)
        .sleep(Some("app2"), "hook start api", 20)
        .sleep(Some("app5"), "hook install api", 20);
    let ran = fx.run(rules, 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(
        ran.max_hosts_in_flight("api"),
        2,
        "never more than batch hosts switching, and the batch is used"
    );
    let (canary_end, _, _) = ran.step_finished("api", "app1");
    for host in ["app2", "app3", "app4", "app5"] {
        let first = ran.first_hook("api", host).unwrap();
        assert!(
            first.start > canary_end,
            "{host} started before the canary finished"
        );
    }
    // After the canary, a batch is a concurrency limit: app3's slot goes to wave 3 while
    // the slow app2 still starts.
    let (slow_end, _, _) = ran.step_finished("api", "app2");
    assert!(ran.first_hook("api", "app4").unwrap().start < slow_end);
    let canary: Vec<(usize, bool, Vec<String>)> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::WaveStarted {
                wave,
                canary,
                hosts,
                ..
            } => Some((*wave, *canary, hosts.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(canary[0], (1, true, vec!["app1".to_string()]));
    assert!(canary[1..].iter().all(|(_, c, _)| !c));
}

/// api on app1..app6 under `policy`, two hosts a wave; app1's `start` is slow.
async fn slow_first_host(policy: &str, rules: Rules) -> (Fixture, Ran) {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 6);
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", policy)], &[]);
    assert!(fx.waves("api").len() >= 3, "{:?}", fx.waves("api"));
    let rules = rules
        .sleep(None, "/bin/sh -c 'hook", 3)
        .sleep(Some("app1"), "hook start api", 120);
    let ran = fx.run(rules, 64, true).await;
    (fx, ran)
}

#[tokio::test]
async fn without_a_pause_a_free_slot_goes_to_the_next_wave_at_once() {
    // Even if app1 failed, 2 failed hosts would not exceed the budget: the waves flow.
    let (_, ran) = slow_first_host("batch 2; max-failed 2", Rules::default()).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.max_hosts_in_flight("api"), 2, "never more than batch");
    let (slow_end, _, _) = ran.step_finished("api", "app1");
    // Waves 2 and 3 went through app2's slot while app1 was still starting.
    for host in ["app3", "app4", "app5", "app6"] {
        let (end, _, _) = ran.step_finished("api", host);
        assert!(end < slow_end, "{host} waited for the slow host");
    }
    // Each wave is still told, in order of opening.
    let opened: Vec<usize> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::WaveStarted { wave, .. } => Some(*wave),
            _ => None,
        })
        .collect();
    assert_eq!(opened, [1, 2, 3]);
    let finished = ran
        .events
        .iter()
        .filter(|(_, _, e)| matches!(e, EventKind::WaveFinished { .. }))
        .count();
    assert_eq!(finished, 3);
}

#[tokio::test]
async fn a_pause_a_spread_or_a_budget_at_stake_makes_the_next_wave_wait_for_the_whole_one() {
    // Each policy makes every wave wait for the whole of the one before, however slow.
    let waits = |fx: &Fixture, ran: &Ran, why: &str| {
        let waves = fx.waves("api");
        for pair in waves.windows(2) {
            let ended = pair[0]
                .iter()
                .map(|h| ran.step_finished("api", h).0)
                .max()
                .expect("a wave has hosts");
            for host in &pair[1] {
                let first = ran.first_hook("api", host).expect("ran");
                assert!(
                    first.start > ended,
                    "{why}: {host} started before {:?} ended",
                    pair[0]
                );
            }
        }
    };
    for (policy, why) in [
        ("batch 2; max-failed 2; pause \"1ms\"", "pause"),
        ("batch 2; max-failed 2; spread \"zone\"", "spread"),
        // Today's rule kept as a choice: a failure of app1 would exceed max-failed 0.
        ("batch 2; flow \"budget\"", "flow budget, max-failed"),
        (
            "batch 2; max-failed 2; on-failure \"stop\"; flow \"budget\"",
            "flow budget, on-failure stop",
        ),
        ("batch 2; max-failed 2; flow \"waves\"", "flow waves"),
    ] {
        let (fx, ran) = slow_first_host(policy, Rules::default()).await;
        assert!(ran.summary.converged(), "{why}: {:?}", ran.summary);
        waits(&fx, &ran, why);
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Failure budgets and on-failure

/// api on app1..app4, one host per wave, upgrading from 0.9; `fail` hosts fail their check.
async fn upgrade_with(on_failure: &str, max_failed: u32, fail: &[&str]) -> Ran {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 4);
    let running: Vec<(&str, &str, &str)> =
        hs.iter().map(|(h, _)| (h.as_str(), "api", "0.9")).collect();
    let policy = format!("batch 1; max-failed {max_failed}; on-failure \"{on_failure}\"");
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", &policy)], &running);
    assert_eq!(fx.waves("api").len(), 4);
    let mut rules = Rules::default();
    for h in fail {
        rules = rules.fail(Some(h), "hook check api");
    }
    fx.run(rules, 64, true).await
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn rollback_rolls_back_and_halts_once_the_budget_is_exceeded() {
    let ran = upgrade_with("rollback", 1, &["app2", "app3"]).await;
    assert_eq!(ran.counts(), (1, 2, 1));
    assert!(!ran.summary.converged());
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Halted, 1, 2, 1));
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app2", "app3"]));
    assert!(
        ran.touched("api").iter().all(|h| h != "app4"),
        "app4 was started"
    );
    assert_eq!(
        ran.failed_hosts(),
        [
            ("app2".to_string(), "api".to_string()),
            ("app3".to_string(), "api".to_string())
        ],
        "failures are the failed steps, not the hosts never started"
    );
    // The rolled-back host records the old version and the failed check.
    let last_state = ran
        .cmds()
        .into_iter()
        .rfind(|c| c.host == "app2" && c.hook().is_none())
        .expect("app2's state written");
    assert!(
        last_state.script.contains(r#""version":"0.9""#),
        "{}",
        last_state.script
    );
    assert!(last_state.script.contains(r#""outcome":"failure""#));
}

#[tokio::test]
async fn rollback_goes_on_while_the_budget_holds() {
    let ran = upgrade_with("rollback", 1, &["app2"]).await;
    assert_eq!(ran.counts(), (3, 1, 0));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Failed, 3, 1, 0));
    assert!(!ran.summary.converged());
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app2"]));
}

#[tokio::test]
async fn stop_halts_after_the_first_failure_without_rolling_back() {
    let ran = upgrade_with("stop", 1, &["app2"]).await;
    assert_eq!(ran.counts(), (1, 1, 2));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Halted, 1, 1, 2));
    assert!(ran.hosts_with("rollback", "api").is_empty());
    assert_eq!(ran.touched("api"), names(&["app1", "app2"]));
    assert_eq!(
        ran.failed_hosts(),
        [("app2".to_string(), "api".to_string())]
    );
}

#[tokio::test]
async fn continue_rolls_back_and_ignores_the_budget() {
    let ran = upgrade_with("continue", 0, &["app2", "app3"]).await;
    assert_eq!(ran.counts(), (2, 2, 0));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Failed, 2, 2, 0));
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app2", "app3"]));
    assert_eq!(ran.touched("api"), names(&["app1", "app2", "app3", "app4"]));
    assert!(!ran.summary.converged());
}

#[tokio::test]
async fn a_clean_upgrade_converges() {
    let ran = upgrade_with("rollback", 0, &[]).await;
    assert_eq!(ran.counts(), (4, 0, 0));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Done, 4, 0, 0));
    assert!(ran.summary.converged());
    assert!(ran.summary.failures.is_empty());
    // An upgrade runs every hook but rollback, in order.
    let hooks: Vec<String> = ran
        .hooks_on("api", "app1")
        .iter()
        .map(|c| c.hook().unwrap().0.to_string())
        .collect();
    assert_eq!(hooks, ["stop", "install", "migrate", "start", "check"]);
    // No command of its own for the state file: `start` and `check` write it when they pass.
    let on_app1: Vec<(Option<String>, bool)> = ran
        .cmds()
        .into_iter()
        .filter(|c| c.host == "app1")
        .map(|c| (c.hook().map(|(h, _)| h.to_string()), c.writes_state()))
        .collect();
    let writes: Vec<(Option<String>, bool)> = ["stop", "install", "migrate", "start", "check"]
        .iter()
        .map(|h| (Some(h.to_string()), matches!(*h, "start" | "check")))
        .collect();
    assert_eq!(on_app1, writes);
    // The hooks went to the host in two chains (a round trip each): those before the last
    // stage, then the last stage with the check's first attempt.
    assert_eq!(
        ran.chains_on("app1"),
        [vec!["stop", "install", "migrate"], vec!["start", "check"]]
    );
}

#[tokio::test]
async fn a_chain_stops_at_its_first_failed_hook_and_the_check_is_not_retried_for_it() {
    let hooks_when = |hook: &'static str| async move {
        let body = format!(
            "class \"app\" {{ service \"api\" }}\n{}",
            svc("api", "policy \"p.kdl\"")
        );
        let hs = hosts("app", "app", 1);
        let running: Vec<(&str, &str, &str)> =
            hs.iter().map(|(h, _)| (h.as_str(), "api", "0.9")).collect();
        let policy = "batch 1; on-failure \"rollback\"";
        let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", policy)], &running);
        let rules = Rules::default().fail(Some("app1"), &format!("hook {hook} api"));
        let ran = fx.run(rules, 64, true).await;
        assert_eq!(ran.counts(), (0, 1, 0), "{hook} fails the step");
        let names: Vec<String> = ran
            .hooks_on("api", "app1")
            .iter()
            .map(|c| c.hook().unwrap().0.to_string())
            .collect();
        (names, ran.chains_on("app1"))
    };
    // `install` fails: `migrate` and `start`, chained after it, never run; rollback does.
    let (hooks, _) = hooks_when("install").await;
    assert_eq!(hooks, ["stop", "install", "rollback"]);
    // `start` fails: the check chained after it never runs, and is not tried again.
    let (hooks, chains) = hooks_when("start").await;
    assert_eq!(hooks, ["stop", "install", "migrate", "start", "rollback"]);
    assert_eq!(chains[1], ["start", "check"]);
}

// ---------------------------------------------------------------------------------------------
// 6. Blocking

#[tokio::test]
async fn dependents_of_a_halted_service_are_blocked() {
    let body = format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\"; service \"worker\" }}\n{}{}{}",
        svc("db", "policy \"stop.kdl\""),
        svc("api", "needs \"db\" healthy=1"),
        svc("worker", "needs \"api\"")
    );
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 2));
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("stop.kdl", "batch 1; on-failure \"stop\"")],
        &[],
    );
    let ran = fx
        .run(
            Rules::default().fail(Some("db1"), "hook check db"),
            64,
            true,
        )
        .await;
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Halted, 0, 1, 1));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Blocked, 0, 0, 2));
    assert_eq!(ran.outcome("worker"), (ServiceOutcome::Blocked, 0, 0, 2));
    assert!(ran.touched("api").is_empty() && ran.touched("worker").is_empty());
    assert!(ran.touched("db") == names(&["db1"]));
    assert_eq!(ran.counts(), (0, 1, 5));
    assert!(!ran.summary.converged());
    assert_eq!(ran.failed_hosts(), [("db1".to_string(), "db".to_string())]);
}

#[tokio::test]
async fn a_partly_healthy_need_that_holds_does_not_block() {
    let body = db_and_api("policy \"cont.kdl\"", "needs \"db\" healthy=1");
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 2));
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("cont.kdl", "batch 1; on-failure \"continue\"")],
        &[],
    );
    let ran = fx
        .run(
            Rules::default().fail(Some("db1"), "hook check db"),
            64,
            true,
        )
        .await;
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Failed, 1, 1, 0));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Done, 2, 0, 0));
    assert_eq!(ran.counts(), (3, 1, 0));
    let (db2_end, _, _) = ran.step_finished("db", "db2");
    let api_first = ran.cmds().into_iter().find(|c| c.of("api")).unwrap();
    assert!(api_first.start > db2_end);
}

#[tokio::test]
async fn a_step_is_blocked_on_a_host_where_a_service_it_follows_failed() {
    let body = api_and_worker("policy \"cont.kdl\"", "needs \"api\" healthy=1");
    let hs = hosts("app", "app", 3);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("cont.kdl", "batch 1; on-failure \"continue\"")],
        &[],
    );
    let ran = fx
        .run(
            Rules::default().fail(Some("app2"), "hook check api"),
            64,
            true,
        )
        .await;
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Failed, 2, 1, 0));
    let worker = ran.outcome("worker");
    assert_eq!((worker.1, worker.2, worker.3), (2, 0, 1));
    assert_eq!(ran.touched("worker"), names(&["app1", "app3"]));
    let blocked: Vec<(String, String)> = ran
        .events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::StepBlocked(StepBlocked { service, host, .. }) => {
                Some((service.clone(), host.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(blocked, [("worker".to_string(), "app2".to_string())]);
    assert_eq!(ran.counts(), (4, 1, 1));
    assert_eq!(
        ran.failed_hosts(),
        [("app2".to_string(), "api".to_string())]
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Pauses

#[tokio::test]
async fn a_pause_delays_the_next_wave_and_not_the_end() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"slow.kdl\"")
    );
    let hs = hosts("app", "app", 3);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("slow.kdl", "batch 1; pause \"150ms\"")],
        &[],
    );
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    let pause = Duration::from_millis(150);
    for (before, after) in [("app1", "app2"), ("app2", "app3")] {
        let (_, done, _) = ran.step_finished("api", before);
        let next = ran.first_hook("api", after).unwrap();
        assert!(
            next.started.duration_since(done) >= pause,
            "{after} started {:?} after {before} finished",
            next.started.duration_since(done)
        );
    }
    let (_, last, _) = ran.step_finished("api", "app3");
    assert!(
        ran.ended.duration_since(last) < pause,
        "no pause after the last wave: the run ended {:?} after it",
        ran.ended.duration_since(last)
    );
    assert!(ran.asked.is_empty());
}

#[tokio::test]
async fn confirm_asks_before_each_later_wave_and_no_halts() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"ask.kdl\"")
    );
    let hs = hosts("app", "app", 3);
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("ask.kdl", "batch 1; pause \"confirm\"")],
        &[],
    );
    let no = fx.run(Rules::default(), 64, false).await;
    assert_eq!(no.asked, [("api".to_string(), 2)]);
    assert_eq!(no.outcome("api"), (ServiceOutcome::Halted, 1, 0, 2));
    assert_eq!(no.touched("api"), names(&["app1"]));
    assert_eq!(no.counts(), (1, 0, 2));
    assert!(!no.summary.converged());

    let yes = fx.run(Rules::default(), 64, true).await;
    assert_eq!(yes.asked, [("api".to_string(), 2), ("api".to_string(), 3)]);
    assert!(yes.summary.converged());

    // A signal while the question is asked: the run is interrupted, nothing was refused.
    let fx = Fixture {
        signal_at_confirm: true,
        ..fx
    };
    let signal = fx.run(Rules::default(), 64, true).await;
    assert_eq!(
        signal.outcome("api"),
        (ServiceOutcome::Interrupted, 1, 0, 2)
    );
}

// ---------------------------------------------------------------------------------------------
// 8. The connection pool

fn pool_fixture() -> Fixture {
    let body = format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\"; service \"worker\"; service \"cache\" }}\n{}{}{}{}",
        svc("db", "policy \"one.kdl\""),
        svc("api", "needs \"db\" healthy=1"),
        svc("worker", "needs \"api\" healthy=1; policy \"one.kdl\""),
        svc("cache", "")
    );
    let mut hs = hosts("db", "db", 2);
    hs.extend(hosts("app", "app", 3));
    fixture(&body, &host_refs(&hs), &[("one.kdl", "batch 1")], &[])
}

/// Three hosts of one service, one at a time.
fn one_at_a_time() -> Fixture {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"one.kdl\"")
    );
    let hs = hosts("app", "app", 3);
    fixture(&body, &host_refs(&hs), &[("one.kdl", "batch 1")], &[])
}

#[tokio::test]
async fn one_connection_is_enough_and_never_exceeded() {
    let fx = pool_fixture();
    let ran = fx
        .run(Rules::default().sleep(None, "/bin/sh -c 'hook", 1), 1, true)
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.counts(), (11, 0, 0));
    let c = ran.fake.lock();
    assert_eq!(c.max_open, 1, "more than one link open at once");
    assert_eq!(c.open, 0, "links left open at the end");
    assert_eq!(c.dropped_unclosed, 0, "links dropped without close");
}

#[tokio::test]
async fn one_connection_with_waves_of_one_host() {
    // The next wave's host is connected ahead of need: that must not starve the current one.
    let fx = one_at_a_time();
    let ran = fx.run(Rules::default(), 1, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.fake.lock().max_open, 1);
}

#[tokio::test]
async fn links_the_lock_kept_serve_their_steps_and_count_against_the_cap() {
    // Three hosts, one at a time, under a cap of two, the lock having kept the links of the
    // first two: each host is connected once in all, never more than two links open.
    let fx = one_at_a_time();
    let ran = fx
        .run_with(
            Rules::default(),
            2,
            true,
            super::Cancel::new(),
            &["app1", "app2"],
        )
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    {
        let c = ran.fake.lock();
        assert!(c.max_open <= 2, "{} links open at once", c.max_open);
        let once: BTreeMap<String, usize> = ["app1", "app2", "app3"]
            .into_iter()
            .map(|h| (h.to_string(), 1))
            .collect();
        assert_eq!(c.connects, once);
    }

    // Five hosts of four services under a cap of two, with the links kept for hosts whose
    // steps come last: a step that needs the room closes one of them; the cap holds.
    for kept in [["app3", "app2"], ["db2", "app3"]] {
        let ran = pool_fixture()
            .run_with(
                Rules::default().sleep(None, "/bin/sh -c 'hook", 1),
                2,
                true,
                super::Cancel::new(),
                &kept,
            )
            .await;
        assert!(ran.summary.converged(), "{:?}", ran.summary);
        let c = ran.fake.lock();
        assert!(
            c.max_open <= 2,
            "{kept:?}: {} links open at once",
            c.max_open
        );
    }
}

#[tokio::test]
async fn a_slow_close_does_not_hold_up_the_next_host() {
    // Closing a finished host's link takes 300 ms (an ssh master's exit on a loaded
    // controller); the scheduler hands links back in the background, so the next host of the
    // batch-1 rollout starts at once, before that close has ended.
    let fx = one_at_a_time();
    let ran = fx
        .run(Rules::default().sleep(None, "<close>", 300), 8, true)
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    let c = ran.fake.lock();
    assert_eq!((c.closed, c.open, c.dropped_unclosed), (3, 0, 0));
    let order: Vec<&str> = ["app1", "app2", "app3"]
        .into_iter()
        .filter(|h| c.cmds.iter().any(|cmd| cmd.host == *h))
        .collect();
    assert_eq!(order.len(), 3, "every host ran its step");
    // The host that finished first, and the one after it.
    let first_start = |h: &str| {
        c.cmds
            .iter()
            .filter(|cmd| cmd.host == h)
            .map(|cmd| cmd.started)
            .min()
            .unwrap()
    };
    let mut by_start: Vec<&str> = order.clone();
    by_start.sort_by_key(|h| first_start(h));
    let (done, next) = (by_start[0], by_start[1]);
    let closed_at = c
        .closes
        .iter()
        .find(|(h, _)| h == done)
        .map(|(_, t)| *t)
        .unwrap();
    assert!(
        first_start(next) < closed_at,
        "{next} waited for {done}'s link to close before it started"
    );
}

#[tokio::test]
async fn each_host_is_connected_once_and_closed_at_the_end() {
    let fx = pool_fixture();
    let ran = fx
        .run(
            Rules::default().sleep(None, "/bin/sh -c 'hook", 1),
            64,
            true,
        )
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    let c = ran.fake.lock();
    let expected: BTreeMap<String, usize> = ["db1", "db2", "app1", "app2", "app3"]
        .iter()
        .map(|h| (h.to_string(), 1))
        .collect();
    assert_eq!(c.connects, expected, "one link per host for all its steps");
    assert_eq!(c.open, 0);
    assert_eq!(c.closed, 5);
    assert_eq!(c.dropped_unclosed, 0);
    drop(c);
    for h in ["app1", "app2", "app3"] {
        for s in ["api", "worker", "cache"] {
            assert!(ran.first_hook(s, h).is_some(), "{s} on {h}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 9. The hooks' environment

/// The words of the hook's variable assignments and command, as the shell sees them (run
/// through `/bin/sh` in `dir`). The hook's `DEPLOY_…='…' … /bin/sh -c '…'` ends the script,
/// after the lines that record its process group.
fn env_words(script: &str, dir: &std::path::Path) -> Vec<String> {
    let at = script.find("; DEPLOY_").expect("variable assignments");
    let rest = &script[at + "; ".len()..];
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("printf '%s\\0' {rest}"))
        .current_dir(dir)
        .output()
        .expect("sh runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .split('\0')
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn hooks_get_needed_addresses_and_versions_quoted() {
    let evil_new = "2.0'$(touch pwned)`touch pwned2`";
    let evil_old = "1.0'; touch pwned3; '$HOME";
    let body = format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\nclass \"lb\" {{ service \"lb\" }}\n\
         service \"db\" {{\n    port 5432\n    start \"hook start db\"\n}}\n\
         service \"lb\" {{\n    start \"hook start lb\"\n}}\n{}",
        svc(
            "api",
            &format!(
                "version \"{}\"; port 8080; needs \"db\"; needs \"lb\" addressable=\"all\"",
                evil_new.replace('\\', "\\\\").replace('"', "\\\"")
            )
        )
    );
    let hs = [
        ("app1", "app"),
        ("app2", "app"),
        ("db1", "db"),
        ("db2", "db"),
        ("lb1", "lb"),
    ];
    let fx = fixture(&body, &hs, &[], &[("app1", "api", evil_old)]);
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    // Hosts are planned in name order: app1, app2, db1, db2, lb1.
    let db = format!("{}:5432 {}:5432", address(2), address(3));
    let lb = address(4);
    let scratch = tempfile::tempdir().expect("tempdir");
    for (host, old) in [("app1", evil_old), ("app2", "")] {
        let hooks = ran.hooks_on("api", host);
        assert!(!hooks.is_empty());
        for cmd in &hooks {
            let want = [
                format!("DEPLOY_NEEDS_DB={db}"),
                format!("DEPLOY_NEEDS_LB={lb}"),
                format!("DEPLOY_OLD_VERSION={old}"),
                format!("DEPLOY_NEW_VERSION={evil_new}"),
                format!("DEPLOY_HOST={host}"),
                "DEPLOY_SERVICE=api".to_string(),
                "DEPLOY_PORT=8080".to_string(),
                "DEPLOY_SITE=t".to_string(),
            ];
            for w in &want {
                let (k, v) = w.split_once('=').expect("K=v");
                assert!(
                    cmd.script.contains(&format!("{k}={}", quote(v))),
                    "{host}: {w} is not one quoted word in {}",
                    cmd.script
                );
            }
            let words = env_words(&cmd.script, scratch.path());
            for w in &want {
                assert!(
                    words.contains(w),
                    "{host}: the shell does not see {w}: {words:?}"
                );
            }
            let vars: Vec<&String> = words.iter().take_while(|w| *w != "/bin/sh").collect();
            assert!(vars.iter().all(|w| w.starts_with("DEPLOY_")), "{words:?}");
        }
    }
    let stages: Vec<String> = ran
        .hooks_on("api", "app2")
        .iter()
        .map(|c| c.hook().unwrap().0.to_string())
        .collect();
    assert_eq!(
        stages,
        ["install", "start", "check"],
        "a fresh host skips stop and migrate"
    );
    for f in ["pwned", "pwned2", "pwned3"] {
        assert!(!scratch.path().join(f).exists(), "{f}: a value ran as code");
    }
    // A service that needs nothing gets no DEPLOY_NEEDS_ variables.
    let db_start = ran.first_hook("db", "db1").unwrap();
    assert!(!db_start.script.contains("DEPLOY_NEEDS_"));
}

// ---------------------------------------------------------------------------------------------
// The lock's release with a host's last command

#[tokio::test]
async fn a_host_gives_its_lock_back_with_its_last_passing_command_only() {
    let body = api_and_worker("", "");
    let hs = hosts("app", "app", 3);
    let running: Vec<(&str, &str, &str)> = hs
        .iter()
        .flat_map(|(h, _)| [(h.as_str(), "api", "0.9"), (h.as_str(), "worker", "0.9")])
        .collect();
    let mut fx = fixture(&body, &host_refs(&hs), &[], &running);
    fx.release = Some("GIVE-BACK".into());
    let rules = Rules::default().fail(Some("app2"), "hook check worker");
    let ran = fx.run(rules, 64, true).await;
    let mut released = ran.summary.released.clone();
    released.sort();
    assert_eq!(released, ["app1", "app3"], "{:?}", ran.summary);
    for (host, _) in &hs {
        let cmds: Vec<Cmd> = ran.cmds().into_iter().filter(|c| c.host == *host).collect();
        let giving: Vec<&Cmd> = cmds
            .iter()
            .filter(|c| c.script.contains("GIVE-BACK"))
            .collect();
        if host == "app2" {
            // Its last step failed: the lock stays for the release after the rollout.
            assert!(
                cmds.iter()
                    .filter(|c| c.is("check", "worker"))
                    .all(|c| c.script.contains("GIVE-BACK")),
                "each check attempt of the last step carries it"
            );
            assert!(!released.contains(host));
            continue;
        }
        assert_eq!(giving.len(), 1, "{host}: given back once: {cmds:?}");
        let last = cmds.last().expect("commands");
        assert!(
            std::ptr::eq(giving[0], last) && last.script.contains("/bin/sh -c 'hook check"),
            "{host}: in its last command, a passing check: {}",
            last.script
        );
        // After the state write, and only if it succeeded.
        let text = &last.script;
        let write = text.find("mv -f").expect("the state write");
        assert!(text.find("GIVE-BACK").expect("release") > write);
        assert!(text.contains("&& { trap - EXIT; GIVE-BACK; }"), "{text}");
    }
}

/// `--repair` plans a repair only where a check ran and failed (or timed out): a check that
/// could not be run (no connection, a broken one) says nothing of the service.
#[tokio::test]
async fn a_dependent_that_needs_every_host_healthy_waits_for_a_repair() {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\nclass \"lb\" {{ service \"lb\" }}\n{}{}",
        svc("api", ""),
        svc("lb", "needs \"api\" healthy=\"all\"")
    );
    let hosts = [("app1", "app"), ("app2", "app"), ("lb1", "lb")];
    // api converged on both hosts; lb1 fresh.
    let running = [("app1", "api", "1.0"), ("app2", "api", "1.0")];
    let fx = fixture(&body, &hosts, &[], &running);
    let resolved = crate::inventory::resolve(&fx.site).expect("inventory");
    let mut truth: Vec<Observed> = fx.plan.hosts.iter().map(|h| h.observed.clone()).collect();
    fx.desired.stamp(&fx.site, &mut truth);
    let mut selection = Selection::default();
    selection.repair.insert(
        (
            fx.site.service("api").expect("api"),
            resolved.find("app1").expect("app1"),
        ),
        "check failed: exited 1: dead".into(),
    );
    let plan = fx.plan_unread(&truth, &[], &selection);
    let api = plan.services.iter().find(|s| s.name == "api").expect("api");
    assert_eq!(api.steps(), 1, "only app1's repair");
    let fx = Fixture {
        plan: Arc::new(plan),
        ..fx
    };
    let ran = fx.run(Rules::default(), 64, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    // lb needs every api host healthy: app1 is not until its repair's check passed.
    let (repaired, _, ok) = ran.step_finished("api", "app1");
    assert!(ok);
    let lb = ran.first_hook("lb", "lb1").expect("lb ran");
    assert!(lb.start > repaired, "lb started before app1's repair ended");
}

#[test]
fn only_a_check_that_ran_and_failed_plans_a_repair() {
    let body = format!("class \"app\" {{ service \"api\" }}\n{}", svc("api", ""));
    let fx = fixture(
        &body,
        &[("app1", "app"), ("app2", "app"), ("app3", "app")],
        &[],
        &[],
    );
    let hosts = crate::inventory::resolve(&fx.site).expect("inventory");
    let result = |host: &str, ok: bool, ran: bool| super::verify::CheckResult {
        host: host.into(),
        service: "api".into(),
        ok,
        detail: String::new(),
        why: if ran {
            "exited 1: dead".into()
        } else {
            "connection refused".into()
        },
        ran,
    };
    let results = [
        result("app1", false, true),
        result("app2", false, false),
        result("app3", true, true),
    ];
    let repairs = super::verify::repairs(&fx.site, &hosts, &results);
    let api = fx.site.service("api").expect("api");
    assert_eq!(repairs.len(), 1, "{repairs:?}");
    assert_eq!(
        repairs
            .get(&(api, hosts.find("app1").expect("app1")))
            .map(String::as_str),
        Some("check failed: exited 1: dead"),
        "{repairs:?}"
    );
}
