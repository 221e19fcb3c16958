//! One host's step for one service: the switch-over (stop old → files → install → migrate →
//! start → check) or a reconfigure (files → reload → check), with the previous files put back
//! and rollback run on failure, and the host's record written after each stage.

mod checking;
mod log;
mod placing;
pub mod removing;

use log::exit_reason;
pub use log::log_line;

use super::event::{Event, EventKind, HookEnd, HookStart, Sink};
use super::hook_run::{self, Ran};
use crate::desired::Delivery;
use crate::plan::{Path, StepKind};
use crate::secrets::Secrets;
use crate::site::{Hook, Hooks, OnFailure};
use crate::state::lock::{GUARD_MARK, UNLOCKED_MARK};
use crate::state::{write_script, HostRecord, Inputs, Mark, Outcome, ServiceRecord};
use crate::transport::{Chain, Link, Output, TransportError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What a step needs that is the same for every host of the service.
pub struct ServiceJob {
    pub name: String,
    pub hooks: Hooks,
    pub on_failure: OnFailure,
    pub env: Vec<(String, String)>,
    pub state_dir: String,
    /// The platform's `keep-generations`: what a passed step keeps of the files it replaced.
    pub keep_generations: usize,
    pub run: String,
    /// Handed to the hooks on their standard input, redacted from their output.
    pub secrets: Arc<Secrets>,
    /// Once it aborts, no hook starts and a hook that ends is an interruption.
    pub cancel: super::Cancel,
    /// Shell text every command that changes a host starts with: refused there unless this
    /// run still holds the host ([`crate::state::lock::guard_script`]); `None` without a lock.
    pub guard: Option<Arc<str>>,
}

/// One step to carry out.
pub struct StepJob {
    pub service: Arc<ServiceJob>,
    pub host: String,
    pub env: Vec<(String, String)>,
    pub from: Option<String>,
    pub to: String,
    pub kind: StepKind,
    /// Which hooks it runs (decided with the plan, or once an unread step's host is read).
    pub path: Path,
    /// What the service is given now: recorded once it is configured.
    pub inputs: Inputs,
    /// The files to deliver, or why they cannot be.
    pub files: Result<Vec<Delivery>, String>,
    pub record: HostRecord,
    pub log: PathBuf,
    /// The host's last step: this shell text ends its last command if every hook passes (for a
    /// step that lets go of replaced files, the command after it that does).
    pub release: Option<Arc<str>>,
    /// Why a reconfigure (the plan's, or decided once an unread step's host was read).
    pub reasons: Vec<String>,
    /// A reconfigure by switch-over of a service with `reload`: the changed inputs that need
    /// a restart ([`crate::plan::Step::restarts`]).
    pub restarts: Vec<String>,
    /// A revert (`on-failure "revert"`): the files go back to those its step of this run
    /// replaced (kept on the host until now) instead of being delivered; `files` is unused.
    pub revert: bool,
    /// A revert with the hooks the host recorded before this run (the job's): the `stop` that
    /// stops what runs now instead (this run's, the site's) and the variables it gets. `None`:
    /// `stop` is the job's, with the job's variables.
    pub stop_now: Option<StopNow>,
}

/// The `stop` of a revert that runs the hooks its host recorded before ([`StepJob::stop_now`]).
#[derive(Clone)]
pub struct StopNow {
    pub hook: Option<Hook>,
    pub env: Vec<(String, String)>,
}

/// How it went; `record` is the host's record as now written.
pub struct StepResult {
    pub record: HostRecord,
    pub failed_hook: Option<String>,
    pub reason: Option<String>,
    pub rolled_back: bool,
    /// [`StepJob::release`] ran.
    pub released: bool,
    /// An unread step that ran nothing once its host was read: why (`AtVersion`: it already
    /// runs what the site says; `Unreachable`: it could not be read, and why).
    pub skipped: Option<(crate::plan::SkipReason, Option<String>)>,
    /// An unread step whose host was locked and read as the run was being stopped: nothing
    /// ran, and it counts as not started (its lock is given back with the run's).
    pub not_started: bool,
    /// What the step ran as (an unread step: what it was decided to be once its host was
    /// read); `None` when it ran nothing.
    pub ran: Option<StepKind>,
}

impl StepResult {
    pub fn ok(&self) -> bool {
        self.failed_hook.is_none()
    }

    /// A step that could not connect to its host: failed, nothing ran, its record as it was.
    pub fn not_connected(record: HostRecord, reason: String) -> StepResult {
        StepResult {
            record,
            failed_hook: Some("connect".into()),
            reason: Some(reason),
            rolled_back: false,
            released: false,
            skipped: None,
            not_started: false,
            ran: None,
        }
    }

    /// A step held back as the run was being stopped: nothing ran, counted not started.
    pub fn not_started(record: HostRecord) -> StepResult {
        StepResult {
            record,
            failed_hook: None,
            reason: None,
            rolled_back: false,
            released: false,
            skipped: None,
            not_started: true,
            ran: None,
        }
    }
}

/// Runs the step over `link`.
pub async fn run<L: Link>(job: StepJob, link: &L, sink: &dyn Sink) -> StepResult {
    let previous = job
        .record
        .services
        .get(&job.service.name)
        .and_then(|r| r.inputs.clone());
    let mut step = Running {
        job,
        link,
        sink,
        released: false,
        placed: false,
        lets_go: false,
        previous,
        last_started: Instant::now(),
        passed: false,
    };
    match step.switch().await {
        Ok(()) => {
            // Under `on-failure "revert"` what the placement replaced is kept until the
            // service's rollout is over: a revert puts it back.
            if step.lets_go && step.job.service.on_failure != OnFailure::Revert {
                step.let_go().await;
            }
            StepResult {
                record: step.job.record,
                failed_hook: None,
                reason: None,
                rolled_back: false,
                released: step.released,
                skipped: None,
                not_started: false,
                ran: Some(step.job.kind),
            }
        }
        Err((hook, reason)) => step.fail(hook, reason).await,
    }
}

struct Running<'a, L> {
    job: StepJob,
    link: &'a L,
    sink: &'a dyn Sink,
    /// The host's lock was given back: by the command that wrote the last record, or (a step
    /// that lets go of replaced files) by the one that let go of them.
    released: bool,
    /// This step put files in place (a failure puts the previous ones back).
    placed: bool,
    /// Once it passes, the step lets go of what a placement replaced: its own, or one an
    /// earlier step left listed when it placed nothing itself.
    lets_go: bool,
    /// The inputs the host recorded before this step.
    previous: Option<Inputs>,
    /// When the hook being run started (as far as the controller can tell).
    last_started: Instant,
    /// The last hook that ended passed (and its record, if any, was written).
    passed: bool,
}

type Failure = (&'static str, String);

/// One hook to run, and the record its command writes if it passes.
struct HookCall<'h> {
    name: &'static str,
    command: &'h str,
    timeout: Option<Duration>,
    /// Written in the same command once the hook passes, and then the host's record.
    then: Option<HostRecord>,
    /// With `then`: give the host's lock back too, if this is its last step.
    last: bool,
    /// Its variables, when not the step's ([`StepJob::stop_now`]).
    env: Option<&'h [(String, String)]>,
}

impl<L: Link> Running<'_, L> {
    async fn switch(&mut self) -> Result<(), Failure> {
        let hooks = self.job.service.hooks.clone();
        let stop_now = self.job.stop_now.clone();
        let (stop, stop_env) = match &stop_now {
            Some(now) => (now.hook.as_ref(), Some(now.env.as_slice())),
            None => (hooks.stop.as_ref(), None),
        };
        let fresh = self.job.from.is_none();
        // Nothing running uses what changed: only the new inputs are recorded.
        if self.job.path == Path::Record {
            let configured = self.marked(Some(Outcome::Success), None, None);
            let validated = self.marked_on(configured, None, Some(Outcome::Success), None);
            return self.write(validated, true).await;
        }
        let reload = self.job.path == Path::Reload && hooks.reload.is_some();
        let stages: Vec<(&'static str, &Hook)> = [
            ("stop", stop, !fresh && !reload),
            ("install", hooks.install.as_ref(), !reload),
            ("migrate", hooks.migrate.as_ref(), !fresh && !reload),
            ("start", hooks.start.as_ref(), !reload),
            ("reload", hooks.reload.as_ref(), reload),
        ]
        .into_iter()
        .filter_map(|(name, hook, applies)| hook.filter(|_| applies).map(|h| (name, h)))
        .collect();
        // Files go in right after `stop` (the old version no longer runs), before `install`
        // or `reload`.
        let files_at = stages.iter().position(|(n, _)| *n != "stop");
        // The last stage writes the record (configured) in the same command, when it succeeds.
        // Hooks that follow each other with nothing in between go to the host as one chain
        // (one round trip): the stages before the files, those after them, and the last stage
        // with the check's first attempt.
        // (A record's marks are stamped when its command is sent: the last stage starts a
        // chain of its own so that they are not stamped before the stages ahead of it ran.)
        let last = stages.len().checked_sub(1);
        let no_files = !self.job.revert && matches!(&self.job.files, Ok(files) if files.is_empty());
        let mut chain: Vec<HookCall> = Vec::new();
        for (i, (name, hook)) in stages.iter().enumerate() {
            if files_at == Some(i) && !no_files {
                self.hooks(std::mem::take(&mut chain)).await?;
                self.files().await?;
            }
            if Some(i) == last {
                self.hooks(std::mem::take(&mut chain)).await?;
            }
            chain.push(HookCall {
                name,
                command: &hook.command,
                timeout: hook.timeout,
                then: (Some(i) == last).then(|| self.marked(Some(Outcome::Success), None, None)),
                last: false,
                env: stop_env.filter(|_| *name == "stop"),
            });
        }
        if files_at.is_none() {
            self.hooks(std::mem::take(&mut chain)).await?;
            self.files().await?;
        }
        if stages.is_empty() {
            self.write(self.marked(Some(Outcome::Success), None, None), false)
                .await?;
        }
        let Some(check) = &hooks.check else {
            self.hooks(chain).await?;
            let validated = self.marked(None, Some(Outcome::Success), None);
            return self.write(validated, true).await;
        };
        // The check's time runs from its first attempt's start (known once the hook before it
        // in the chain has ended).
        let mut deadline = None;
        loop {
            let left = deadline.map_or(check.timeout, |d: Instant| {
                d.saturating_duration_since(Instant::now())
            });
            // Each attempt writes the record (validated) in the same command if it passes: the
            // record as the hook before it in the chain will have left it.
            // With `stable`, not before it has passed throughout that long.
            let base = chain.iter().rev().find_map(|c| c.then.clone());
            let base = base.unwrap_or_else(|| self.job.record.clone());
            let stable = !check.stable.is_zero();
            chain.push(HookCall {
                name: "check",
                command: &check.command,
                timeout: Some(left.max(Duration::from_millis(1))),
                then: (!stable)
                    .then(|| self.marked_on(base.clone(), None, Some(Outcome::Success), None)),
                last: true,
                env: None,
            });
            let attempt = self.hooks(std::mem::take(&mut chain)).await;
            let deadline = *deadline.get_or_insert(self.last_started + check.timeout);
            match attempt {
                Ok(()) if stable => return self.hold(check, base).await,
                Ok(()) => return Ok(()),
                // Another attempt must have at least an interval's time, or the last
                // failure would be a meaningless timeout instead of the check's own error.
                Err(e) if e.0 != "check" || Instant::now() + check.interval * 2 >= deadline => {
                    return Err(e)
                }
                // Refused by the host: this run no longer holds it. No attempt will do better.
                Err(e) if e.1.contains(GUARD_MARK) || e.1.contains(UNLOCKED_MARK) => return Err(e),
                Err(_) => tokio::time::sleep(check.interval).await,
            }
        }
    }

    /// Runs `calls` one after another, each only if the one before it passed: as one chain
    /// (one round trip to the host, [`Link::chain`]), each still reported as it ends.
    async fn hooks(&mut self, calls: Vec<HookCall<'_>>) -> Result<(), Failure> {
        let svc = self.job.service.clone();
        let Some(first) = calls.first() else {
            return Ok(());
        };
        if let Some(aborted) = super::interrupt::interrupted(&svc, first.name, false) {
            return Err(aborted);
        }
        let stop = (calls.len() > 1).then(|| super::processes::chain_stop_file(&svc.state_dir));
        let mut prepared = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let then_script = call.then.as_ref().map(|r| {
                self.guarded(self.then_release(write_script(&svc.state_dir, r), call.last))
            });
            prepared.push(hook_run::prepare(&hook_run::Call {
                guard: svc.guard.as_deref(),
                env: call.env.unwrap_or(&self.job.env),
                command: call.command,
                state_dir: &svc.state_dir,
                service: &svc.name,
                secrets: &svc.secrets,
                timeout: call.timeout,
                then: then_script.as_deref(),
                stop: stop.as_deref(),
                after: i > 0,
            }));
        }
        let mut chain = match stop {
            Some(_) => {
                let commands = prepared.iter().map(|p| p.command.clone()).collect();
                Some(self.link.chain(commands).await)
            }
            None => None,
        };
        let result = self.chained(&calls, &prepared, chain.as_mut()).await;
        // Left before its end (a hook timed out, or the run is aborted): the hooks already
        // sent must not start on the host, nor go on running there.
        if let (Some(stop), Some(chain)) = (&stop, &chain) {
            if chain.pending() {
                let script = super::processes::abandon_script(&svc.state_dir, stop);
                let ran = tokio::time::timeout(Duration::from_secs(30), self.link.run(&script));
                let said = match ran.await {
                    Ok(Ok(out)) if out.success() => {
                        "the rest of its chain stopped on the host".into()
                    }
                    Ok(Ok(out)) => exit_reason("stopping the rest of its chain", &out),
                    Ok(Err(e)) => format!("stopping the rest of its chain: {e}"),
                    Err(_) => "stopping the rest of its chain: no answer in 30 s".into(),
                };
                log_line(&self.job.log, &format!("== chain: {said}"));
            }
        }
        result
    }

    /// Collects the outputs of `calls`, from `chain` or (alone) by running it; see
    /// [`Running::hooks`].
    async fn chained(
        &mut self,
        calls: &[HookCall<'_>],
        prepared: &[hook_run::Prepared],
        mut chain: Option<&mut Chain>,
    ) -> Result<(), Failure> {
        let svc = self.job.service.clone();
        let link = self.link;
        let mut aborted = None;
        for (call, prepared) in calls.iter().zip(prepared) {
            // Aborting: a later hook of the chain may already run on the host. It is waited for
            // all the same: the abort's kill passes kill it, or it does not start (the run's
            // stop file), or it ended first, and then what it wrote is the host's record.
            self.sink.emit(Event::now(EventKind::HookStarted(HookStart {
                service: svc.name.clone(),
                host: self.job.host.clone(),
                hook: call.name.into(),
            })));
            self.last_started = Instant::now();
            // Boxed: the link's future is large, and would be copied up the stack here.
            let ran = Box::pin(async {
                match chain.as_deref_mut() {
                    Some(chain) => link.next(chain).await.unwrap_or_else(|| {
                        Err(TransportError::Command {
                            host: self.job.host.clone(),
                            reason: "the hook before it in the chain did not pass".into(),
                        })
                    }),
                    None => prepared.command.run(link).await,
                }
            });
            let ran = hook_run::wait(link, prepared, &svc.secrets, call.timeout, ran);
            // The service alone stopped (its progress deadline): this hook's process group is
            // killed on the host (and its chain's stop file made), and its end waited for. Not
            // the run's stop file: the host's other services' steps go on.
            let stop = async {
                svc.cancel.reached_alone(super::Level::Abort).await;
                let _ = hook_run::kill(link, prepared).await;
                std::future::pending::<std::convert::Infallible>().await
            };
            let ran = tokio::select! {
                ran = ran => ran,
                never = stop => match never {},
            };
            let result = self.ended(call, ran);
            if self.released {
                return Ok(());
            }
            match result {
                Ok(()) => {}
                // It passed as the run was aborted: the next hook of the chain is waited for.
                Err(e) if e.0 == "interrupted" && self.passed => {
                    aborted.get_or_insert(e);
                }
                Err(e) => return Err(aborted.unwrap_or(e)),
            }
        }
        aborted.map_or(Ok(()), Err)
    }

    /// Runs one hook alone (`rollback`); see [`Running::ended`].
    async fn hook(
        &mut self,
        name: &'static str,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<(), Failure> {
        let call = HookCall {
            name,
            command,
            timeout,
            then: None,
            last: false,
            env: None,
        };
        self.hooks(vec![call]).await
    }

    /// What a hook's end means: its output goes to the step's log. With `then`, the same
    /// command wrote that record once the hook succeeded, and the record becomes the host's;
    /// with `last` too, it then gave the host's lock back if this is the host's last step.
    fn ended(&mut self, call: &HookCall<'_>, ran: Ran) -> Result<(), Failure> {
        let name = call.name;
        let then = call.then.as_ref();
        let release = self
            .job
            .release
            .clone()
            .filter(|_| call.last && then.is_some());
        // A hook that outlives its timeout is killed with its process group on the host.
        let (result, timed_out): (Result<Output, TransportError>, Option<String>) = match ran {
            Ran::Done(result) => (result, None),
            Ran::TimedOut { after, killed } => {
                let reason = Ran::timeout_reason(name, after, &killed);
                let out = Output {
                    code: None,
                    stdout: Vec::new(),
                    stderr: format!("{reason}\n").into_bytes(),
                };
                (Ok(out), Some(reason))
            }
        };
        let ms = u64::try_from(self.last_started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // The hook succeeded and the record that follows it was not written.
        let (result, state_failed) = match result {
            Ok(out) => match super::processes::then_failed(&out) {
                Some(hook_out) => (Ok(hook_out), Some(exit_reason("state", &out))),
                None => (Ok(out), None),
            },
            Err(e) => (Err(e), None),
        };
        let (code, ok, reason) = match (&result, timed_out) {
            (_, Some(reason)) => (None, false, reason),
            (Ok(out), None) => (out.code, out.success(), exit_reason(name, out)),
            (Err(e), None) => (None, false, e.to_string()),
        };
        self.log(name, &result, ms);
        self.sink.emit(Event::now(EventKind::HookFinished(HookEnd {
            service: self.job.service.name.clone(),
            host: self.job.host.clone(),
            hook: name.into(),
            ok,
            code,
            ms,
        })));
        if let Some(reason) = state_failed {
            log_line(&self.job.log, &format!("== state: {reason}"));
            return Err(("state", reason));
        }
        self.passed = ok;
        if let (true, Some(record)) = (ok, then) {
            self.job.record = record.clone();
            self.released = release.is_some();
        }
        // The host's last command gave its lock back: nothing more is done there.
        if self.released {
            return Ok(());
        }
        if let Some(aborted) = super::interrupt::interrupted(&self.job.service, name, true) {
            return Err(aborted);
        }
        if ok {
            Ok(())
        } else {
            Err((name, reason))
        }
    }

    /// Updates this service's record and writes the host's state file.
    async fn mark(
        &mut self,
        configured: Option<Outcome>,
        validated: Option<Outcome>,
        failed: Option<(&str, String)>,
    ) -> Result<(), Failure> {
        let record = self.marked(configured, validated, failed);
        self.write(record, false).await
    }

    /// The host's record with this service's marks updated (pure).
    fn marked(
        &self,
        configured: Option<Outcome>,
        validated: Option<Outcome>,
        failed: Option<(&str, String)>,
    ) -> HostRecord {
        self.marked_on(self.job.record.clone(), configured, validated, failed)
    }

    /// `record` with this service's marks updated (pure).
    fn marked_on(
        &self,
        mut record: HostRecord,
        configured: Option<Outcome>,
        validated: Option<Outcome>,
        failed: Option<(&str, String)>,
    ) -> HostRecord {
        let mark = |outcome: Outcome| Mark {
            outcome,
            at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            run: self.job.service.run.clone(),
            log: self.job.log.display().to_string(),
            hook: failed
                .as_ref()
                .map(|(h, _)| h.to_string())
                .filter(|_| outcome == Outcome::Failure),
        };
        let version = failed
            .as_ref()
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| self.job.to.clone());
        let entry = record
            .services
            .entry(self.job.service.name.clone())
            .or_insert_with(|| ServiceRecord::at(version.clone()));
        entry.version = version;
        if let Some(c) = configured {
            entry.configured = Some(mark(c));
            entry.validated = None;
            if c == Outcome::Success {
                entry.inputs = Some(self.job.inputs.clone());
                // What a revert will switch the host back with, after a later step; and what
                // a removal will run here, should the service leave the host.
                let recorded =
                    crate::state::RecordedHooks::of(&self.job.service.hooks, &self.job.env);
                entry.removal = Some(recorded.removal());
                entry.hooks = Some(recorded);
            }
        }
        if let Some(v) = validated {
            entry.validated = Some(mark(v));
        }
        record.schema = HostRecord::SCHEMA;
        record
    }

    /// `script` followed, when it succeeds and `last` holds, by giving the host's lock back
    /// (the host's last step only; a step that lets go of replaced files gives it back in
    /// [`Running::let_go`] instead). Clears the hook wrapper's exit trap first: the release
    /// removes the pid file that trap would empty (`hook_run.rs`).
    fn then_release(&self, script: String, last: bool) -> String {
        match self
            .job
            .release
            .as_deref()
            .filter(|_| last && !self.lets_go)
        {
            Some(release) => format!("{script} && {{ trap - EXIT; {release}; }}"),
            None => script,
        }
    }

    /// `script` behind the run's guard ([`ServiceJob::guard`]), if it has one.
    pub(super) fn guarded(&self, script: String) -> String {
        match &self.job.service.guard {
            Some(guard) => format!("{guard}{script}"),
            None => script,
        }
    }

    /// Makes `record` the host's, and writes it on the host (then, with `last`, gives the
    /// host's lock back if this is its last step).
    async fn write(&mut self, record: HostRecord, last: bool) -> Result<(), Failure> {
        self.job.record = record;
        let script = write_script(&self.job.service.state_dir, &self.job.record);
        let script = self.guarded(self.then_release(script, last));
        match self.link.run(&script).await {
            Ok(out) if out.success() => {
                self.released = last && self.job.release.is_some();
                Ok(())
            }
            Ok(out) => Err(("state", exit_reason("state", &out))),
            Err(e) => Err(("state", e.to_string())),
        }
    }

    /// After a failed hook: roll back where the policy and hooks allow, record the failure.
    async fn fail(mut self, hook: &'static str, reason: String) -> StepResult {
        let svc = self.job.service.clone();
        let may_roll_back = self.job.from.is_some()
            && !matches!(hook, "stop" | "interrupted")
            && svc.on_failure != OnFailure::Stop;
        let mut rolled_back = false;
        // The previous files go back first, so that `rollback` finds them.
        let restored = self.placed
            && !matches!(hook, "interrupted")
            && svc.on_failure != OnFailure::Stop
            && self.restore().await;
        if restored {
            let previous = self.previous.clone();
            if let Some(r) = self.job.record.services.get_mut(&svc.name) {
                r.inputs = previous;
            }
        }
        if let (true, Some(rollback)) = (may_roll_back, &svc.hooks.rollback) {
            rolled_back = self
                .hook("rollback", &rollback.command, rollback.timeout)
                .await
                .is_ok();
        }
        // What the host now has: the old version after a clean rollback or a failed `stop`.
        let version = match (&self.job.from, rolled_back || hook == "stop") {
            (Some(old), true) => old.clone(),
            _ => self.job.to.clone(),
        };
        let (configured, validated) = if hook == "check" {
            (None, Some(Outcome::Failure))
        } else {
            (Some(Outcome::Failure), None)
        };
        // Interrupted: recorded so that the next run redoes the step (`interrupt.rs`).
        let marked = if hook == "interrupted" {
            match super::interrupt::interrupted_record(&self.job) {
                Some((v, c, k)) => {
                    log_line(&self.job.log, &format!("== interrupted: {reason}"));
                    self.mark(c, k, Some((hook, v))).await
                }
                None => Ok(()),
            }
        } else if hook != "state" {
            self.mark(configured, validated, Some((hook, version)))
                .await
        } else {
            Ok(())
        };
        // The host refused the record: this run no longer holds it (its lock broken by
        // another run, which also ended this step's hook there, or a newer fencing token).
        // That is the reason, not what it did to the hook.
        let reason = match marked {
            Err((_, why)) if !reason.contains(GUARD_MARK) && !reason.contains(UNLOCKED_MARK) => {
                match [GUARD_MARK, UNLOCKED_MARK].iter().find_map(|m| why.find(m)) {
                    Some(at) => format!("{} ({hook}: {reason})", &why[at..]),
                    None => reason,
                }
            }
            _ => reason,
        };
        StepResult {
            record: self.job.record,
            failed_hook: Some(hook.into()),
            reason: Some(reason),
            rolled_back,
            released: false,
            skipped: None,
            not_started: false,
            ran: Some(self.job.kind),
        }
    }
}
