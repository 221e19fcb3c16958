//! The journal as an event consumer: every event that matters is written to the run's journal
//! ([`crate::state::journal`]), durably, before it is passed on.

use crate::rollout::{Cancel, Event, EventKind, Level, Sink};
use crate::state::journal::{Entry, Journal};
use crate::state::lock::Holder;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What the journal records at the start of a run, besides what the events say.
pub struct RunContext {
    pub site_file: String,
    pub site_digest: String,
    pub plan_digest: String,
    pub holder: Holder,
    pub resumes: Option<String>,
}

/// A sink that journals every event that matters, durably, before passing it on. If the
/// journal cannot be written, the run is told to stop starting steps (and the error is kept
/// for the caller).
pub struct JournalSink {
    journal: Journal,
    inner: Arc<dyn Sink>,
    cancel: Cancel,
    context: RunContext,
    error: Mutex<Option<String>>,
}

impl JournalSink {
    pub fn new(
        journal: Journal,
        inner: Arc<dyn Sink>,
        cancel: Cancel,
        context: RunContext,
    ) -> Self {
        JournalSink {
            journal,
            inner,
            cancel,
            context,
            error: Mutex::new(None),
        }
    }

    /// The first failure to write the journal, if any.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn path(&self) -> &Path {
        self.journal.path()
    }

    /// The journal's entry for an event, if it has one. A step's intent and result, a hook's
    /// start and end, a step blocked, a revert's intent and result and an interruption are
    /// the event's own payload; the run's start and end, a service planned or finished and a
    /// step skipped are summed up from the event (and what the run started with).
    fn entry(&self, kind: &EventKind) -> Option<Entry> {
        Some(match kind {
            EventKind::StepStarted { intent, .. } => Entry::StepIntent(intent.clone()),
            EventKind::HookStarted(hook) => Entry::HookStarted(hook.clone()),
            EventKind::HookFinished(hook) => Entry::HookFinished(hook.clone()),
            EventKind::StepFinished { result, .. } => Entry::StepResult(result.clone()),
            EventKind::StepBlocked(blocked) => Entry::StepBlocked(blocked.clone()),
            EventKind::RevertStarted { intent, .. } => Entry::RevertIntent(intent.clone()),
            EventKind::RevertFinished { result, .. } => Entry::RevertResult(result.clone()),
            EventKind::Interrupted(why) => Entry::Interrupted(why.clone()),
            EventKind::RunStarted {
                run,
                site,
                steps,
                hosts,
                ..
            } => Entry::RunStarted {
                run: run.clone(),
                site: site.clone(),
                site_file: self.context.site_file.clone(),
                site_digest: self.context.site_digest.clone(),
                plan_digest: self.context.plan_digest.clone(),
                steps: *steps,
                hosts: *hosts,
                holder: Box::new(self.context.holder.clone()),
                resumes: self.context.resumes.clone(),
            },
            EventKind::StepSkipped {
                service,
                host,
                skip,
                reason,
            } => Entry::StepSkipped {
                service: service.clone(),
                host: host.clone(),
                skip: match skip {
                    crate::plan::SkipReason::AtVersion => "at-version",
                    crate::plan::SkipReason::NotSelected => "not-selected",
                    crate::plan::SkipReason::Unreachable => "unreachable",
                }
                .into(),
                reason: reason.clone(),
            },
            EventKind::ServiceFinished {
                service,
                outcome,
                reason,
                ..
            } => Entry::ServiceFinished {
                service: service.clone(),
                outcome: serde_json::to_value(outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                reason: reason.clone(),
            },
            EventKind::RunFinished {
                converged,
                succeeded,
                failed,
                not_started,
                ..
            } => Entry::RunFinished {
                converged: *converged,
                interrupted: self.cancel.stopping(),
                succeeded: *succeeded,
                failed: *failed,
                not_started: *not_started,
            },
            EventKind::ServicePlanned { service, steps, .. } => Entry::ServicePlanned {
                service: service.clone(),
                steps: *steps,
            },
            _ => return None,
        })
    }
}

impl Sink for JournalSink {
    fn emit(&self, event: Event) {
        if let Some(entry) = self.entry(&event.kind) {
            // A hook's start and end only tell which hook was running; the step's intent and
            // result are what a resumed run goes by, and they wait for the disk.
            let written = match entry {
                // A step that ran nothing changed nothing: no carrying on depends on it.
                Entry::HookStarted(_)
                | Entry::HookFinished(_)
                | Entry::StepSkipped { .. }
                | Entry::ServicePlanned { .. } => self.journal.note(&event.time, entry),
                _ => waiting(|| self.journal.append(&event.time, entry)),
            };
            if let Err(e) = written {
                let why = format!(
                    "the run journal {} cannot be written: {e}",
                    self.journal.path().display()
                );
                let mut error = self.error.lock().unwrap_or_else(|p| p.into_inner());
                if error.is_none() {
                    *error = Some(why.clone());
                    self.cancel.raise(Level::Stop, &why);
                }
            }
        }
        self.inner.emit(event);
    }
}

/// Waits for the journal's writer to say a line is on disk. On a worker of the runtime, the
/// worker's other tasks move to another thread meanwhile (`block_in_place`): steps go on
/// starting while the disk syncs, however few the cores ([`super::runtime`]).
fn waiting<R>(wait: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        // The writer is a thread of its own: a runtime of one thread may wait for it.
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::journal::*;

    struct Nothing;
    impl Sink for Nothing {
        fn emit(&self, _: Event) {}
    }

    fn ev(kind: EventKind) -> Event {
        Event::now(kind)
    }

    fn step(service: &str, host: &str) -> EventKind {
        EventKind::StepStarted {
            intent: StepIntent {
                service: service.into(),
                host: host.into(),
                from: Some("1.0".into()),
                to: "2.0".into(),
            },
            kind: crate::plan::StepKind::Upgrade,
            reasons: Vec::new(),
            path: crate::plan::Path::SwitchOver,
            restarts: Vec::new(),
            decided: false,
        }
    }

    fn finished(service: &str, host: &str, ok: bool) -> EventKind {
        EventKind::StepFinished {
            result: StepEnd {
                service: service.into(),
                host: host.into(),
                ok,
                failed_hook: None,
                rolled_back: false,
                reason: None,
            },
            log: String::new(),
            record: None,
        }
    }

    #[test]
    fn a_journal_tells_what_was_in_flight_and_the_pointer_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(".drover");
        let run_dir = root.join("runs").join("r1");
        let cancel = Cancel::new();
        let sink = JournalSink::new(
            Journal::create(&run_dir).unwrap(),
            Arc::new(Nothing),
            cancel.clone(),
            RunContext {
                site_file: "site.kdl".into(),
                site_digest: "s".repeat(64),
                plan_digest: "p".repeat(64),
                holder: Holder::me("shop", "r1"),
                resumes: None,
            },
        );
        set_unfinished(&root, "shop", "r1", sink.path()).unwrap();
        sink.emit(ev(EventKind::RunStarted {
            schema: 1,
            run: "r1".into(),
            site: "shop".into(),
            services: 1,
            hosts: 3,
            steps: 3,
            log_dir: String::new(),
        }));
        for h in ["a1", "a2", "a3"] {
            sink.emit(ev(step("api", h)));
        }
        sink.emit(ev(EventKind::HookStarted(HookStart {
            service: "api".into(),
            host: "a2".into(),
            hook: "migrate".into(),
        })));
        sink.emit(ev(finished("api", "a1", true)));
        sink.emit(ev(finished("api", "a3", false)));
        // The process "dies" here: no run-finished. Its holder is this (live) process.
        let rec = unfinished(&root, "shop").unwrap().expect("a pointer");
        assert_eq!(rec.run, "r1");
        assert_eq!(rec.state, "running");
        assert_eq!((rec.steps, rec.succeeded, rec.failed), (3, 1, 1));
        assert_eq!(rec.in_flight.len(), 1);
        assert_eq!(rec.in_flight[0].host, "a2");
        assert_eq!(rec.in_flight[0].hook.as_deref(), Some("migrate"));
        assert_eq!(rec.plan_digest.as_deref(), Some(&*"p".repeat(64)));

        cancel.raise(Level::Stop, "SIGINT");
        sink.emit(ev(EventKind::Interrupted(Interruption {
            abort: false,
            running: 1,
            reason: "SIGINT".into(),
        })));
        sink.emit(ev(finished("api", "a2", true)));
        sink.emit(ev(EventKind::RunFinished {
            converged: false,
            succeeded: 2,
            failed: 1,
            not_started: 0,
            skipped: 0,
            unreachable: 0,
            unreadable: 0,
            refused: 0,
            reverted: 0,
            not_reverted: 0,
            kinds: Default::default(),
            skips: Default::default(),
            ms: 1,
        }));
        let text = std::fs::read_to_string(sink.path()).unwrap();
        // A torn last line does not spoil the rest.
        let rec = read("r1", "j", &format!("{text}{{\"time\":\"x\",\"ent"));
        assert_eq!(rec.state, "interrupted");
        assert!(rec.in_flight.is_empty());
        assert_eq!((rec.succeeded, rec.failed), (2, 1));
        assert!(text.lines().all(|l| l.starts_with("{\"time\":")));
        assert!(
            text.contains("\"entry\":\"run-finished\",\"converged\":false,\"interrupted\":true")
        );
        clear_unfinished(&root, "shop").unwrap();
        assert_eq!(unfinished(&root, "shop"), Ok(None));
    }

    #[test]
    fn appends_from_many_threads_share_syncs_and_every_line_arrives_whole() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::create(&dir.path().join("r")).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let j = journal.clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        let entry = Entry::HookStarted(HookStart {
                            service: format!("s{t}"),
                            host: format!("h{i}"),
                            hook: "install".into(),
                        });
                        j.append("2026-01-01T00:00:00.000Z", entry).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = std::fs::read_to_string(journal.path()).unwrap();
        let lines: Vec<Line> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a whole line"))
            .collect();
        assert_eq!(lines.len(), 200);
    }

    #[test]
    fn a_noted_line_waits_for_the_next_synced_one_and_keeps_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::create(&dir.path().join("r")).unwrap();
        let hook = |h: &str| {
            Entry::HookStarted(HookStart {
                service: "api".into(),
                host: h.into(),
                hook: "install".into(),
            })
        };
        journal.note("t1", hook("a")).unwrap();
        assert_eq!(std::fs::read_to_string(journal.path()).unwrap(), "");
        journal.append("t2", hook("b")).unwrap();
        let text = std::fs::read_to_string(journal.path()).unwrap();
        let hosts: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["host"].to_string())
            .collect();
        assert_eq!(hosts, ["\"a\"", "\"b\""]);
    }

    #[test]
    fn a_journal_that_cannot_be_written_stops_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = Cancel::new();
        let journal = Journal::create(&dir.path().join("r")).unwrap();
        // Swap the file for one that refuses writes.
        journal.refuse_writes();
        let sink = JournalSink::new(
            journal,
            Arc::new(Nothing),
            cancel.clone(),
            RunContext {
                site_file: String::new(),
                site_digest: String::new(),
                plan_digest: String::new(),
                holder: Holder::me("s", "r"),
                resumes: None,
            },
        );
        sink.emit(ev(step("api", "a1")));
        assert_eq!(cancel.level(), Level::Stop);
        assert!(sink.error().unwrap().contains("cannot be written"));
        assert!(cancel.reason().contains("cannot be written"));
    }

    /// The sink after the journal hears of an event only once its line is in the journal's
    /// file. Here it reads the file as it hears of each step's intent.
    struct Reading {
        path: std::path::PathBuf,
        found: Mutex<Vec<bool>>,
    }
    impl Sink for Reading {
        fn emit(&self, event: Event) {
            if let EventKind::StepStarted { intent, .. } = &event.kind {
                let text = std::fs::read_to_string(&self.path).unwrap_or_default();
                let line = format!("\"host\":\"{}\",", intent.host);
                let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
                found.push(text.contains(&line));
            }
        }
    }

    /// An event that waits for the disk is passed on, and its `emit` returns, only once the
    /// journal's writer has its line in the file: intents emitted by many tasks at once (on a
    /// runtime of one worker, which each hands to another thread while it waits), and results
    /// of a megabyte each (a writer that answered before writing would be read mid-write).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_event_is_on_disk_before_it_is_passed_on_or_emit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("r1");
        let reading = Arc::new(Reading {
            path: run_dir.join(JOURNAL_FILE),
            found: Mutex::new(Vec::new()),
        });
        let sink = Arc::new(JournalSink::new(
            Journal::create(&run_dir).unwrap(),
            reading.clone(),
            Cancel::new(),
            RunContext {
                site_file: String::new(),
                site_digest: String::new(),
                plan_digest: String::new(),
                holder: Holder::me("s", "r1"),
                resumes: None,
            },
        ));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let sink = sink.clone();
                tokio::spawn(async move { sink.emit(ev(step("api", &format!("a{i}")))) })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let found = reading.found.lock().unwrap().clone();
        assert_eq!(found, [true; 16]);
        let long = "x".repeat(1 << 20);
        for i in 0..4 {
            let host = format!("a{i}");
            let mut kind = finished("api", &host, false);
            if let EventKind::StepFinished { result, .. } = &mut kind {
                result.reason = Some(long.clone());
            }
            sink.emit(ev(kind));
            let text = std::fs::read_to_string(sink.path()).unwrap();
            let last: Line = serde_json::from_str(text.lines().last().unwrap()).unwrap();
            assert!(
                matches!(&last.entry, Entry::StepResult(r) if r.host == host),
                "{:?}",
                last.entry
            );
            assert!(text.ends_with('\n'));
        }
        assert_eq!(sink.error(), None);
    }
}

#[cfg(test)]
mod revert_tests {
    use super::*;
    use crate::state::journal::*;

    struct Nothing;
    impl Sink for Nothing {
        fn emit(&self, _: Event) {}
    }

    /// A revert is journaled as a step is: a host whose revert started and did not end is in
    /// flight (a run carried on stops what it left running there), one that ended is not.
    #[test]
    fn a_revert_without_its_result_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join(".drover");
        let sink = JournalSink::new(
            Journal::create(&root.join("runs").join("r1")).unwrap(),
            Arc::new(Nothing),
            Cancel::new(),
            RunContext {
                site_file: "site.kdl".into(),
                site_digest: "s".repeat(64),
                plan_digest: "p".repeat(64),
                holder: Holder::me("shop", "r1"),
                resumes: None,
            },
        );
        for host in ["a1", "a2"] {
            sink.emit(Event::now(EventKind::RevertStarted {
                intent: RevertIntent {
                    service: "api".into(),
                    host: host.into(),
                    from: "2.0".into(),
                    to: "1.0".into(),
                },
                hooks: "recorded".into(),
                secrets: Vec::new(),
            }));
        }
        sink.emit(Event::now(EventKind::HookStarted(HookStart {
            service: "api".into(),
            host: "a2".into(),
            hook: "start".into(),
        })));
        sink.emit(Event::now(EventKind::RevertFinished {
            result: RevertEnd {
                service: "api".into(),
                host: "a1".into(),
                ok: true,
                failed_hook: None,
                reason: None,
            },
            log: String::new(),
            record: None,
        }));
        let text = std::fs::read_to_string(sink.path()).unwrap();
        assert!(text.contains("\"entry\":\"revert-intent\""), "{text}");
        let rec = read("r1", "j", &text);
        assert_eq!(
            rec.in_flight,
            [InFlight {
                service: "api".into(),
                host: "a2".into(),
                from: Some("2.0".into()),
                to: "1.0".into(),
                hook: Some("start".into()),
            }]
        );
    }
}
