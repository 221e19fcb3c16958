//! A step's files: delivering them before its hooks (a revert: putting back those its step of
//! this run replaced), putting the previous ones back when it fails, and letting go of them
//! once it passed.

use super::{exit_reason, log_line, Failure, Running};
use crate::rollout::event::{Event, EventKind, HookEnd, HookStart};
use crate::transport::Link;
use std::time::Instant;

impl<L: Link> Running<'_, L> {
    /// Once the controller has seen the step pass (its record written on the host), lets go
    /// of what its placement replaced, which nothing may put back any more, and gives the
    /// host's lock back if this is its last step, in one command. Not in the command that
    /// wrote the record: had that command's answer been lost, the step would fail here with
    /// nothing left to put back. Best effort: a previous file left behind costs only its space
    /// until the next placement, and a lock not given back here is given back after the rollout.
    pub(super) async fn let_go(&mut self) {
        let svc = &self.job.service;
        // A file that renders a secret keeps no replaced copy beside it.
        let secret: Vec<&str> = match &self.job.files {
            Ok(files) => files
                .iter()
                .filter(|f| {
                    matches!(
                        f.content,
                        crate::desired::Content::Rendered { secret: true, .. }
                    )
                })
                .map(|f| f.to.as_str())
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut script =
            crate::state::let_go_keeping(&svc.state_dir, &svc.name, svc.keep_generations, &secret);
        if let Some(release) = &self.job.release {
            script = format!("{script} && {{ {release}; }}");
        }
        let script = self.guarded(script);
        let failed = match self.link.run(&script).await {
            Ok(out) if out.success() => None,
            Ok(out) => Some(exit_reason("state", &out)),
            Err(e) => Some(e.to_string()),
        };
        // The record's command did not give the lock back (see `then_release`), whatever
        // `released` says since: only this command's success does, else the release after the
        // rollout must.
        self.released = failed.is_none() && self.job.release.is_some();
        if let Some(why) = failed {
            log_line(
                &self.job.log,
                &format!("== let go of the previous files: {why}"),
            );
        }
    }

    /// The step's files: delivered, or for a revert put back ([`Running::put_back`]).
    pub(super) async fn files(&mut self) -> Result<(), Failure> {
        if self.job.revert {
            self.put_back().await
        } else {
            self.deliver().await
        }
    }

    /// A revert's files: what this run's step of the service replaced, kept on the host since
    /// (`on-failure "revert"` lets go of it only once the service's rollout is over), put back
    /// as a failed step's are. Logged and reported as a stage named `files`.
    async fn put_back(&mut self) -> Result<(), Failure> {
        let svc = self.job.service.clone();
        if let Some(aborted) = crate::rollout::interrupt::interrupted(&svc, "files", false) {
            return Err(aborted);
        }
        self.sink.emit(Event::now(EventKind::HookStarted(HookStart {
            service: svc.name.clone(),
            host: self.job.host.clone(),
            hook: "files".into(),
        })));
        let started = Instant::now();
        let script = self.guarded(crate::state::restore_script(&svc.state_dir, &svc.name));
        let failed = match self.link.run(&script).await {
            Ok(out) if out.success() => None,
            Ok(out) => Some(exit_reason("files", &out)),
            Err(e) => Some(e.to_string()),
        };
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let said = failed
            .as_deref()
            .unwrap_or("the files it ran with before are back");
        log_line(&self.job.log, &format!("== files: {said} after {ms} ms"));
        self.sink.emit(Event::now(EventKind::HookFinished(HookEnd {
            service: svc.name.clone(),
            host: self.job.host.clone(),
            hook: "files".into(),
            ok: failed.is_none(),
            code: Some(if failed.is_none() { 0 } else { 1 }),
            ms,
        })));
        match failed {
            None => Ok(()),
            Some(why) => Err(("files", why)),
        }
    }

    /// Delivers the step's files: sends the contents the host's store lacks (streamed, over
    /// the host's connection), then puts every file in place atomically. Logged and reported
    /// as a stage named `files`.
    pub(super) async fn deliver(&mut self) -> Result<(), Failure> {
        let files = match &self.job.files {
            Ok(files) if files.is_empty() => return Ok(()),
            Ok(files) => files.clone(),
            Err(reason) => {
                log_line(&self.job.log, &format!("== files: {reason}"));
                return Err(("files", reason.clone()));
            }
        };
        let svc = self.job.service.clone();
        if let Some(aborted) = crate::rollout::interrupt::interrupted(&svc, "files", false) {
            return Err(aborted);
        }
        self.sink.emit(Event::now(EventKind::HookStarted(HookStart {
            service: svc.name.clone(),
            host: self.job.host.clone(),
            hook: "files".into(),
        })));
        let started = Instant::now();
        let result = crate::rollout::files::deliver(
            self.link,
            &svc.state_dir,
            &svc.name,
            &files,
            svc.guard.as_deref().unwrap_or(""),
        )
        .await;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Even a failed placement may have put some files in place; one that found every file
        // in place already wrote no list of what it replaced (the last one is not this step's).
        self.placed = match &result {
            Ok(sent) => sent.placed > 0,
            Err((placed, _)) => *placed,
        };
        // A list left by an earlier placement whose let-go never came (its step cut off, or
        // that command lost) is let go of once this step passes, but never put back if it
        // fails: the survey cannot tell which of the two left it.
        self.lets_go = self.placed || matches!(&result, Ok(sent) if sent.listed);
        // How the transport carried the contents, when not as it was set to (passed or not).
        for note in self.link.notes() {
            log_line(
                &self.job.log,
                &format!("== files: {}", svc.secrets.redact_str(&note)),
            );
        }
        let (ok, text) = match &result {
            Ok(sent) => (true, sent.describe(files.len())),
            Err((_, reason)) => (false, reason.clone()),
        };
        log_line(
            &self.job.log,
            &format!("== files: {} after {ms} ms", svc.secrets.redact_str(&text)),
        );
        self.sink.emit(Event::now(EventKind::HookFinished(HookEnd {
            service: svc.name.clone(),
            host: self.job.host.clone(),
            hook: "files".into(),
            ok,
            code: Some(if ok { 0 } else { 1 }),
            ms,
        })));
        if ok {
            Ok(())
        } else {
            Err(("files", svc.secrets.redact_str(&text)))
        }
    }

    /// Puts back the files this step replaced; whether that worked.
    pub(super) async fn restore(&mut self) -> bool {
        let svc = self.job.service.clone();
        let script = self.guarded(crate::state::restore_script(&svc.state_dir, &svc.name));
        let ok = match self.link.run(&script).await {
            Ok(out) if out.success() => true,
            Ok(out) => {
                log_line(
                    &self.job.log,
                    &format!("== restore files: {}", exit_reason("restore", &out)),
                );
                false
            }
            Err(e) => {
                log_line(&self.job.log, &format!("== restore files: {e}"));
                false
            }
        };
        if ok {
            log_line(
                &self.job.log,
                "== restore files: the previous files are back",
            );
        }
        ok
    }
}
