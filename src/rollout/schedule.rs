//! The coordinator: decides which steps may start, launches them, and records what finished.

use super::event::{Event, EventKind, ServiceOutcome, StepBlocked};
use super::links::Links;
use super::step::{ServiceJob, StepResult};
use super::{initial_record, Rollout, Summary};
use crate::state::HostRecord;
use crate::transport::Transport;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinSet;
use tokio::time::Instant as TokioInstant;

mod deadline;
mod draining;
mod ending;
mod finishing;
mod flowing;
mod planned;
mod removing;
mod repointing;
mod revert_batches;
mod reverting;
mod rounds;
mod starting;
use starting::{job_of, target};
mod stepping_back;
mod stopping;

/// Per service: where its rollout stands.
struct Svc {
    job: Arc<ServiceJob>,
    /// Its steps are known: false while it waits to be planned ([`super::Planning`]).
    planned: bool,
    /// Planned before the run (its steps were in the plan shown): false for one planned during
    /// it, whose steps are said as they start ([`EventKind::StepStarted`]'s `decided`).
    shown: bool,
    /// Started under its placeholders before it was planned, its needs holding first.
    early: bool,
    started: bool,
    /// The next wave to open.
    next_wave: usize,
    /// Steps of the newest open wave not yet launched.
    pending: Vec<usize>,
    /// Steps launched and not finished, of every open wave.
    running: usize,
    /// The waves opened and not over, oldest first: more than one only while the service
    /// flows ([`Scheduler::flows`]).
    open: Vec<OpenWave>,
    not_before: Option<TokioInstant>,
    healthy: usize,
    succeeded: usize,
    failed: usize,
    not_started: usize,
    /// Unread steps whose host already ran what the site says.
    skipped: usize,
    /// Unread steps whose host could not be read.
    unreachable: usize,
    /// Of those, steps whose host answered but whose state file could not be read.
    unreadable: usize,
    /// Its steps that succeeded, by what they did.
    kinds: super::event::Kinds,
    finished: Option<ServiceOutcome>,
    /// When a step of it last started or ended (its policy's `progress-deadline` runs from
    /// there while a step of it runs).
    progressed: Option<TokioInstant>,
    /// Why it was stopped as failed: its progress deadline passed. Nothing of it starts any
    /// more, its running steps are aborted, and it ends `failed` once none runs.
    missed: Option<String>,
    /// Under `on-failure "revert"`: the hosts its steps switched in this run.
    switched: Vec<reverting::Switched>,
    /// Its revert, once begun.
    reverting: Option<reverting::Reverting>,
}

/// A wave opened and not over.
struct OpenWave {
    wave: usize,
    /// Its steps launched and not finished.
    running: usize,
    /// Its steps that failed (its budget: `wave-max-failed`).
    failed: usize,
}

/// Per host: one step at a time, and what happened to each service on it this run.
struct HostState {
    busy: bool,
    done: HashSet<usize>,
    broken: HashSet<usize>,
    /// Services whose step failed here (a subset of `broken`).
    failed: HashSet<usize>,
    record: HostRecord,
    steps_left: usize,
    /// Its state is known: read before the run, at its first unread step, or by the caller
    /// during the run ([`super::Planned::Read`]).
    read: bool,
    /// Left unread for the caller to read during the run ([`super::Planning`]): its unread
    /// steps wait until it has.
    awaiting: bool,
    /// Read during the run and found not to answer, or its state unreadable: its unread steps
    /// end at once, the host left alone.
    unread_reason: Option<String>,
}

/// Which step of the plan a task runs: its service, its wave and its place in the wave
/// (indices into [`super::Rollout::plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StepAt {
    service: usize,
    wave: usize,
    step: usize,
}

/// A step's task's answer: which step, and how it went.
struct Ended {
    at: StepAt,
    result: StepResult,
}

pub struct Scheduler<T: Transport> {
    r: Rollout<T>,
    links: Arc<Links<T>>,
    svcs: Vec<Svc>,
    hosts: Vec<HostState>,
    host_index: HashMap<Arc<str>, usize>,
    service_index: HashMap<String, usize>,
    tasks: JoinSet<Ended>,
    /// Which step each task runs: a task that panics ends without saying.
    task_steps: HashMap<tokio::task::Id, StepAt>,
    started: Instant,
    /// Hosts with a failed step in this run (the run's budget: the site's `max-failed`).
    failed_hosts: usize,
    /// Hosts whose lock went with their last command.
    released: Vec<String>,
    /// Hosts of unread steps that could not be read.
    unreachable_hosts: HashSet<usize>,
    /// Of those, the hosts that answered but whose state file could not be read.
    unreadable_hosts: HashSet<usize>,
    /// Where services not planned yet get their plan; `None` once it is closed.
    updates: Option<tokio::sync::mpsc::UnboundedReceiver<super::Planned>>,
    /// `(host, why)`: locks refused as hosts were read during the run.
    refused: Vec<(String, String)>,
    /// Which service (by index) has a step on which host, placeholders included: what an
    /// unread step's waits are kept to ([`crate::plan::unread_waits`]).
    stepping: HashSet<(usize, usize)>,
    /// Per service: whether it may start before it is planned ([`crate::plan::may_start_early`]).
    early: Vec<bool>,
    /// The services each service needs at runtime.
    closure: crate::plan::RuntimeClosure,
    /// Per `(service, host)` of an unread step on a host read during the run: the steps
    /// (`(service, host)`) it waits for, found once.
    unread_waits: HashMap<(usize, usize), Vec<(usize, usize)>>,
    /// Pool waits dropped because they would go round: the plan's, and those found as hosts
    /// are read during the run ([`Self::drop_rounds`]); each with the services (by index) of
    /// the round it would go: when one of them is planned during the run, the round may be
    /// gone ([`Self::replan`]).
    dropped: HashMap<crate::plan::WaitKey, Vec<usize>>,
    /// The dropped waits said already (the plan's, and each found during the run once).
    said_drops: HashSet<crate::plan::WaitKey>,
    /// Waits may have come to light since they were last looked at.
    rounds_due: bool,
    /// Per service: the services that need it, and whether each drains it (`drain=#true`).
    dependents: Vec<Vec<(usize, bool)>>,
    /// The dependents' reconfigures while a needed service's waves run.
    repoints: draining::Repoints,
    /// What the run's removals came to ([`removing`]).
    removals: removing::Removals,
    /// Services switched back under `on-failure "revert"`.
    reverts: reverting::Reverts,
}

/// What woke the coordinator.
enum Woke {
    Repointed(Result<(tokio::task::Id, (draining::Repoint, StepResult)), tokio::task::JoinError>),
    Reverted(Result<(tokio::task::Id, reverting::Reverted), tokio::task::JoinError>),
    Ended(Option<Result<(tokio::task::Id, Ended), tokio::task::JoinError>>),
    Planned(Option<super::Planned>),
    Other,
}

impl<T: Transport> Scheduler<T> {
    pub fn new(mut r: Rollout<T>) -> Self {
        let plan = r.plan.clone();
        let (pending, updates) = match r.planning.take() {
            Some(p) => (p.pending, Some(p.updates)),
            None => (Vec::new(), None),
        };
        // Hosts planned during the run are read by the caller, never by a step.
        let reads_for_us = updates.is_some();
        let host_index: HashMap<Arc<str>, usize> = plan
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.name.clone(), i))
            .collect();
        let service_index = plan
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let mut hosts: Vec<HostState> = (0..plan.hosts.len())
            .map(|i| HostState {
                busy: false,
                done: HashSet::new(),
                broken: HashSet::new(),
                failed: HashSet::new(),
                record: initial_record(&plan, i),
                steps_left: 0,
                read: plan.hosts[i].observed != crate::state::Observed::Unread,
                awaiting: reads_for_us && plan.hosts[i].observed == crate::state::Observed::Unread,
                unread_reason: None,
            })
            .collect();
        let state_dir = r.site.platform.host_state_dir();
        let svcs = plan
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| {
                // A service not planned yet counts its placeholders: no host's lock goes with
                // a command while a step may still come there.
                for st in s.each_step() {
                    if let Some(&h) = host_index.get(&st.host) {
                        hosts[h].steps_left += 1;
                    }
                }
                let planned = !pending.get(i).copied().unwrap_or(false);
                Svc {
                    job: job_of(&r, &plan, s, &state_dir, r.cancel.child()),
                    planned,
                    shown: planned,
                    early: false,
                    started: false,
                    next_wave: 0,
                    pending: Vec::new(),
                    running: 0,
                    open: Vec::new(),
                    not_before: None,
                    healthy: if planned { plan.healthy_before(s) } else { 0 },
                    succeeded: 0,
                    failed: 0,
                    not_started: 0,
                    skipped: 0,
                    unreachable: 0,
                    unreadable: 0,
                    kinds: Default::default(),
                    finished: None,
                    progressed: None,
                    missed: None,
                    switched: Vec::new(),
                    reverting: None,
                }
            })
            .collect();
        let links = Arc::new(Links::new(r.transport.clone(), r.max_connections));
        let stepping = planned::stepping(&plan, &host_index);
        let early = crate::plan::may_start_early(&r.site, &plan);
        let closure = crate::plan::RuntimeClosure::new(&r.site);
        let dependents = draining::dependents(&r.site, &plan);
        let reverts = reverting::Reverts::new(&plan, &host_index);
        let mut scheduler = Scheduler {
            r,
            links,
            svcs,
            hosts,
            host_index,
            service_index,
            tasks: JoinSet::new(),
            task_steps: HashMap::new(),
            started: Instant::now(),
            failed_hosts: 0,
            released: Vec::new(),
            unreachable_hosts: HashSet::new(),
            unreadable_hosts: HashSet::new(),
            updates,
            refused: Vec::new(),
            stepping,
            early,
            closure,
            unread_waits: HashMap::new(),
            dropped: HashMap::new(),
            said_drops: HashSet::new(),
            rounds_due: true,
            dependents,
            repoints: draining::Repoints::default(),
            removals: removing::Removals::default(),
            reverts,
        };
        scheduler.dropped = scheduler.plan_drops();
        scheduler.said_drops = scheduler.dropped.keys().copied().collect();
        for h in 0..scheduler.hosts.len() {
            if scheduler.may_repoint(h) {
                scheduler.hosts[h].steps_left += 1;
            }
        }
        scheduler.hold_for_removals();
        scheduler.hold_for_reverts();
        scheduler
    }

    fn emit(&self, kind: EventKind) {
        self.r.sink.emit(Event::now(kind));
    }

    pub async fn run(mut self) -> Summary {
        let plan = self.r.plan.clone();
        // The steps known: a service planned during the run says its own when it is.
        let steps = plan
            .services
            .iter()
            .zip(&self.svcs)
            .filter(|(_, svc)| svc.planned)
            .map(|(s, _)| s.steps())
            .sum();
        // The run's logs are the operator's alone (0700); a failure shows when a log is written.
        let _ = crate::state::private_dir(&self.r.log_dir);
        self.emit(EventKind::RunStarted {
            schema: super::EVENT_SCHEMA,
            run: self.r.run_id.clone(),
            site: plan.site.clone(),
            services: plan.services.len(),
            hosts: plan.hosts.len(),
            steps,
            log_dir: self.r.log_dir.display().to_string(),
        });
        for (s, _) in plan
            .services
            .iter()
            .zip(&self.svcs)
            .filter(|(s, svc)| svc.planned && !s.waits_for.is_empty() && !s.waves.is_empty())
        {
            self.emit(EventKind::ServiceWaiting {
                service: s.name.clone(),
                waits_for: s.waits_for.clone(),
            });
        }
        // Told to stop or abort (`stopping.rs`): said once per level, whenever it comes.
        let mut interrupts = self.r.cancel.subscribe();
        interrupts.mark_changed();
        let mut seen = super::Level::Running;
        loop {
            let level = *interrupts.borrow_and_update();
            if level > seen {
                seen = level;
                self.interrupted(level);
            }
            let wake = self.advance();
            // Services still to be planned are waited for, unless every service is over.
            let waiting = self.updates.is_some() && self.svcs.iter().any(|s| s.finished.is_none());
            if self.tasks.is_empty()
                && self.repoints.idle()
                && self.reverts.idle()
                && wake.is_none()
                && !waiting
            {
                break;
            }
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let tasks = &mut self.tasks;
            let updates = &mut self.updates;
            let repoints = &mut self.repoints.tasks;
            let reverts = &mut self.reverts.tasks;
            let woke = tokio::select! {
                done = tasks.join_next_with_id(), if !tasks.is_empty() => Woke::Ended(done),
                Some(done) = repoints.join_next_with_id(), if !repoints.is_empty() => {
                    Woke::Repointed(done)
                }
                Some(done) = reverts.join_next_with_id(), if !reverts.is_empty() => {
                    Woke::Reverted(done)
                }
                update = next_update(updates), if updates.is_some() => Woke::Planned(update),
                _ = timer => Woke::Other,
                _ = interrupts.changed() => Woke::Other,
            };
            let done = match woke {
                Woke::Ended(done) => done,
                Woke::Planned(update) => {
                    self.planned(update);
                    None
                }
                Woke::Repointed(done) => {
                    self.repointed(done);
                    None
                }
                Woke::Reverted(done) => {
                    self.revert_ended(done);
                    None
                }
                Woke::Other => None,
            };
            if let Some(done) = done {
                self.ended(done).await;
                // Every step that has ended is counted before anything new starts: a failure
                // that ended with a success is seen by the budgets.
                while let Some(done) = self.tasks.try_join_next_with_id() {
                    self.ended(done).await;
                }
            }
        }
        // Nothing runs and nothing can start: a service still not over waits for steps that
        // can never run (a saved plan whose steps wait for each other). It ends, said so.
        self.wind_down_reverts();
        self.leave_unfinished(
            ServiceOutcome::Blocked,
            "its steps wait for steps that can never run",
        );
        // Once every step has ended: the removals (`--prune`), or why they are left.
        self.remove_all().await;
        self.links.close_all().await;
        self.summary()
    }

    /// Starts what may start; returns when to look again if something waits on a timer.
    fn advance(&mut self) -> Option<TokioInstant> {
        loop {
            let wake = self.advance_steps();
            // What steps under `on-failure "revert"` kept, let go of once their service ended.
            self.start_let_go();
            // The dependents' reconfigures queued meanwhile (their host may be free now); a
            // wave they no longer hold may start.
            if !self.start_repoints() {
                return wake;
            }
        }
    }

    fn advance_steps(&mut self) -> Option<TokioInstant> {
        self.drop_rounds();
        let mut wake: Option<TokioInstant> = None;
        let mut changed = true;
        while changed {
            changed = false;
            for s in 0..self.svcs.len() {
                // Stopping, or told to meanwhile (a signal while a `pause "confirm"` question
                // waits): nothing more starts.
                if self.r.cancel.stopping() {
                    self.wind_down();
                    return None;
                }
                // A host's lock refused during the run: nothing more starts either, and what
                // was left counts as not started.
                if let Some((host, why)) = self.refused.first() {
                    let reason = format!("{host} could not be locked: {why}");
                    self.leave_unfinished(ServiceOutcome::Halted, &reason);
                    return None;
                }
                // A service is being reverted: nothing more starts but its reverts.
                if self.reverts.stop.is_some() {
                    return self.stopped_for_revert();
                }
                if self.svcs[s].finished.is_some() {
                    continue;
                }
                if let Some(at) = self.deadline(s) {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
                if self.svcs[s].missed.is_some() {
                    continue;
                }
                if !self.svcs[s].started {
                    changed |= self.try_start(s);
                    if !self.svcs[s].started || self.svcs[s].finished.is_some() {
                        continue;
                    }
                }
                if self.svcs[s].pending.is_empty()
                    && (self.svcs[s].running == 0 || self.flows(s))
                    && !self.repoints.holds(s)
                {
                    match self.svcs[s].not_before {
                        Some(at) if at > TokioInstant::now() => {
                            wake = Some(wake.map_or(at, |w| w.min(at)));
                            continue;
                        }
                        _ => changed |= self.open_wave(s),
                    }
                }
                changed |= self.launch(s);
            }
        }
        // A revert began in this pass (its service's deadline passed): it starts now.
        if self.reverts.stop.is_some() {
            return self.stopped_for_revert();
        }
        wake
    }

    /// Starts service `s` once its runtime needs hold; blocks it if they never can.
    fn try_start(&mut self, s: usize) -> bool {
        if !self.svcs[s].planned && !self.may_start_unplanned(s) {
            return false;
        }
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let mut unmet = None;
        for c in &sp.waits_for {
            let Some(&t) = self.service_index.get(&c.service) else {
                continue;
            };
            if self.svcs[t].healthy >= c.count {
                continue;
            }
            // Over, unless hosts of it still being read may be found healthy (a service
            // started before it was planned, its hosts left out by `--on`).
            if self.svcs[t].finished.is_some() && !self.being_read(t) {
                let mut reason = format!(
                    "{} has {} of the {} healthy hosts it needs",
                    c.service, self.svcs[t].healthy, c.count
                );
                // Its hosts left to be read at their steps, which never came: not known.
                let never_read = plan.services[t]
                    .each_step()
                    .filter(|st| st.kind == crate::plan::StepKind::Unread)
                    .filter(|st| {
                        self.host_index
                            .get(&st.host)
                            .is_some_and(|&n| !self.hosts[n].read)
                    })
                    .count();
                if never_read > 0 {
                    reason.push_str(&format!(
                        " known ({never_read} of its hosts were to be read at their steps, \
                         which never came)"
                    ));
                }
                self.block(s, reason);
                return true;
            }
            unmet = Some(());
        }
        if unmet.is_some() {
            return false;
        }
        if !self.svcs[s].planned {
            self.start_unplanned(s);
        }
        self.svcs[s].started = true;
        let steps = sp.steps();
        if steps > 0 {
            self.emit(EventKind::ServiceStarted {
                service: sp.name.clone(),
                waves: sp.waves.len(),
                steps,
            });
        }
        true
    }

    /// Opens the next wave of `s`, or ends the service when none is left or its policy says stop.
    fn open_wave(&mut self, s: usize) -> bool {
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let svc = &self.svcs[s];
        // `on-failure "revert"`: its budget spent, the hosts it switched are switched back
        // (its last wave too).
        if sp.policy.on_failure == crate::site::OnFailure::Revert {
            if let Some(reason) = super::budget::service_exceeded(&sp.policy, svc.failed) {
                self.revert(s, reason);
                return true;
            }
        }
        let svc = &self.svcs[s];
        if svc.next_wave >= sp.waves.len() {
            let outcome = if svc.failed > 0 {
                ServiceOutcome::Failed
            } else {
                ServiceOutcome::Done
            };
            self.end_service(s, outcome, None);
            return true;
        }
        if let Some(reason) = super::budget::run_exceeded(&plan, self.failed_hosts) {
            self.halt(s, reason);
            return true;
        }
        if let Some(reason) = super::budget::service_exceeded(&sp.policy, svc.failed) {
            self.halt(s, reason);
            return true;
        }
        let w = svc.next_wave;
        if w > 0
            && sp.policy.pause == crate::site::Pause::Confirm
            && !self.r.gate.confirm(&sp.name, w + 1)
        {
            // A signal that left the question unanswered interrupts the run (`advance` winds
            // it down next); it refuses nothing.
            if !self.r.cancel.stopping() {
                self.halt(s, format!("wave {} not confirmed", w + 1));
            }
            return true;
        }
        let wave = &sp.waves[w];
        self.emit(EventKind::WaveStarted {
            service: sp.name.clone(),
            wave: w + 1,
            canary: wave.canary,
            hosts: wave.steps.iter().map(|st| st.host.to_string()).collect(),
        });
        let svc = &mut self.svcs[s];
        svc.pending = (0..wave.steps.len()).collect();
        svc.next_wave += 1;
        svc.open.push(OpenWave {
            wave: w,
            running: 0,
            failed: 0,
        });
        // The dependents drop the hosts this wave must not find listed; its steps wait.
        self.drop_before(s, w);
        if let Some(next) = sp.waves.get(w + 1) {
            // The slots this wave's steps take (a flowing service keeps `batch` switching).
            let reserve = sp.policy.batch_hosts.max(wave.steps.len());
            for st in &next.steps {
                // Not a host the caller is reading: its link comes from that read.
                if let Some(&h) = self.host_index.get(&st.host) {
                    if !self.hosts[h].awaiting {
                        self.links.prefetch(target(&plan, h), reserve);
                    }
                }
            }
        }
        true
    }

    /// Launches every pending step of `s` whose host is free and whose same-host needs are done.
    fn launch(&mut self, s: usize) -> bool {
        if self.svcs[s].finished.is_some()
            || self.svcs[s].pending.is_empty()
            || self.repoints.holds(s)
        {
            return false;
        }
        let plan = self.r.plan.clone();
        let sp = &plan.services[s];
        let w = self.svcs[s].next_wave - 1;
        let failed = self.svcs[s].open.last().map_or(0, |o| o.failed);
        let size = sp.waves[w].steps.len();
        if let Some(reason) = super::budget::wave_exceeded(&sp.policy, w + 1, size, failed) {
            self.cut_wave(s, w, &reason);
            return true;
        }
        if let Some(reason) = self.slots_spent(s) {
            self.cut_wave(s, w, &reason);
            return true;
        }
        // A flowing service keeps `batch` hosts switching; a wave alone is never more.
        let slots = sp.policy.batch_hosts.max(size);
        let mut launched = false;
        let mut still = Vec::new();
        for i in std::mem::take(&mut self.svcs[s].pending) {
            let st = &sp.waves[w].steps[i];
            let Some(&h) = self.host_index.get(&st.host) else {
                continue;
            };
            let after: Vec<usize> = st
                .after
                .iter()
                .filter_map(|a| self.service_index.get(&**a).copied())
                .collect();
            // An unread step whose host was found not answering (or its state unreadable) is
            // left alone as such, not blocked by the service before it there, left alone the
            // same way: as every step of a host found so before the run.
            let unread = st.kind == crate::plan::StepKind::Unread;
            if unread && self.left_alone(h).is_some() {
                // Not while another step runs there: a step's end frees its host.
                if self.hosts[h].busy {
                    still.push(i);
                } else {
                    self.spawn_step(s, w, i, h);
                    launched = true;
                }
                continue;
            }
            if let Some(broken) = after.iter().find(|a| self.hosts[h].broken.contains(a)) {
                let reason = format!(
                    "{} did not switch on this host",
                    plan.services[*broken].name
                );
                self.emit(EventKind::StepBlocked(StepBlocked {
                    service: sp.name.clone(),
                    host: st.host.to_string(),
                    reason,
                }));
                self.svcs[s].not_started += 1;
                self.hosts[h].broken.insert(s);
                self.host_step_over(h);
                launched = true;
                continue;
            }
            // Its host is still being read: the step keeps its place and no slot.
            if unread && self.hosts[h].awaiting {
                still.push(i);
                continue;
            }
            // Steps on other hosts this one waits for (pool members this run adds) have ended,
            // however they ended; but for waits dropped as they would go round.
            let waited = st.waits.iter().all(|w| {
                match (
                    self.service_index.get(&*w.service),
                    self.host_index.get(&w.host),
                ) {
                    (Some(&t), Some(&n)) => self.step_ended(t, n) || self.wait_dropped(s, h, t, n),
                    _ => true,
                }
            }) && (!unread || self.unread_waited(s, h));
            if self.hosts[h].busy
                || !waited
                || !after
                    .iter()
                    .all(|&a| self.hosts[h].done.contains(&a) || self.no_step(a, h))
                || self.svcs[s].running >= slots
            {
                still.push(i);
                continue;
            }
            self.spawn_step(s, w, i, h);
            launched = true;
        }
        self.svcs[s].pending = still;
        if launched {
            self.settle(s, w);
        }
        launched
    }
}

/// The next plan or refusal, `None` once the channel is closed.
async fn next_update(
    updates: &mut Option<tokio::sync::mpsc::UnboundedReceiver<super::Planned>>,
) -> Option<super::Planned> {
    updates.as_mut()?.recv().await
}
