//! `deploy publish --follow`: a published snapshot's progress, from the store, told as the
//! rollout's events (the same consumers as `apply`: bars, lines, NDJSON). One prefix watch on
//! the site's keys; on each change (changes coming together taken as one) one read of the
//! site's state, turned into events: a host's `busy/` intent for the service's version is its
//! step starting, its published status at that version its step ending. It ends once every
//! service of the snapshot ended: each of its hosts ended at the version, or its failure budget
//! is spent or its canary failed (halted), or a service it needs at runtime ended (failed,
//! halted, blocked) short of the need's `healthy=` (blocked), with none of its hosts stepping;
//! or when a newer snapshot is published, or on SIGINT/SIGTERM. Following a snapshot that was
//! current already, a host that had failed at it has ended (its agent never steps to it again).

use super::progress::{Ended, Rollout};
use super::Manifest;
use crate::plan::{Path, StepKind};
use crate::rollout::{
    Event, EventKind, Kinds, ServiceOutcome, Sink, Skips, StepEnd, StepIntent, EVENT_SCHEMA,
};
use crate::site::{Round, ServiceId, Site};
use crate::state::store::{Etcd, Keys, Store, StoreError, View};
use std::time::{Duration, Instant};

/// How a follow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    /// Every host of every service ended at its version, and passed.
    pub converged: bool,
    pub succeeded: usize,
    pub failed: usize,
    /// Steps that never ended: a budget spent, a need halted.
    pub not_started: usize,
    /// Stopped by SIGINT or SIGTERM before the end.
    pub interrupted: bool,
    /// A newer snapshot was published meanwhile (its digest).
    pub superseded: Option<String>,
}

/// A changed key's arrival, taken together with those within this.
const SETTLE: Duration = Duration::from_millis(50);

/// One service as followed.
struct Followed1 {
    rollout: Rollout,
    /// Per host: where it was when the follow began (what `ended` said, and when).
    initial: Vec<(Ended, Option<String>)>,
    started: Vec<bool>,
    reported: Vec<bool>,
    /// What each host's step was, once started.
    kinds: Vec<Option<StepKind>>,
    /// Where the last read had each host.
    last: Vec<Ended>,
    announced: bool,
    finished: Option<ServiceOutcome>,
    /// Per host: it had failed at the version of a snapshot that was current already (the
    /// agent never retries it): ended, failed, from the start.
    failed_before: Vec<bool>,
}

/// Follows snapshot `digest` of `site` to its end (see the module's text), its events to `sink`.
pub async fn follow(
    etcd: &Etcd,
    keys: &Keys,
    site: &Site,
    manifest: &Manifest,
    digest: &str,
    unchanged: bool,
    sink: &dyn Sink,
) -> Result<Followed, StoreError> {
    let began = Instant::now();
    let mut stop = Box::pin(stopped());
    // The watch first: no change between the read and the watch is missed.
    let mut watching = Some(etcd.watch(keys.root()).await?);
    let view = etcd.read(keys).await?;
    let mut services = followed(site, manifest, &view, unchanged);
    let steps: usize = services.iter().map(|s| todo(s).count()).sum();
    sink.emit(Event::now(EventKind::RunStarted {
        schema: EVENT_SCHEMA,
        run: format!("publish-{}", digest.get(..12).unwrap_or(digest)),
        site: site.name.clone(),
        services: services.len(),
        hosts: manifest.hosts.len(),
        steps,
        log_dir: "each host's agent state directory (.drover/logs)".into(),
    }));
    let mut view = view;
    loop {
        let current = etcd.value(&keys.current()).await?;
        let current = current.map(|v| String::from_utf8_lossy(&v).trim().to_string());
        let superseded = current.filter(|c| c != digest);
        step(site, &view, &mut services, sink);
        let done = services.iter().all(|s| s.finished.is_some());
        if done || superseded.is_some() {
            return Ok(finish(&services, sink, began, false, superseded));
        }
        let changed = match watching.as_mut() {
            Some(w) => tokio::select! {
                changed = w.changed() => changed,
                () = &mut stop => return Ok(finish(&services, sink, began, true, None)),
            },
            None => false,
        };
        if changed {
            // What came together is taken as one change (for at most 5 × SETTLE: a busy
            // fleet's changes never pause).
            if let Some(w) = watching.as_mut() {
                let until = Instant::now() + 5 * SETTLE;
                while Instant::now() < until {
                    if !matches!(tokio::time::timeout(SETTLE, w.changed()).await, Ok(true)) {
                        break;
                    }
                }
            }
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            watching = etcd.watch(keys.root()).await.ok();
        }
        view = etcd.read(keys).await?;
    }
}

/// Each service of `site` as the follow begins, from `view` (`unchanged`: the snapshot was
/// current already when published).
fn followed(site: &Site, manifest: &Manifest, view: &View, unchanged: bool) -> Vec<Followed1> {
    site.order
        .iter()
        .map(|&sid| {
            let rollout = Rollout::new(site, manifest, sid);
            let ended = rollout.ended(view);
            let initial = rollout
                .hosts
                .iter()
                .zip(&ended)
                .map(|(h, e)| (*e, stamp(view, h, &rollout.name)))
                .collect();
            let n = rollout.hosts.len();
            Followed1 {
                // An agent does not step again to an unchanged snapshot a host failed at:
                // that failure is this snapshot's end for the host.
                failed_before: ended
                    .iter()
                    .map(|e| unchanged && *e == Ended::Failed)
                    .collect(),
                rollout,
                initial,
                started: vec![false; n],
                reported: vec![false; n],
                kinds: vec![None; n],
                last: vec![Ended::Not; n],
                announced: false,
                finished: None,
            }
        })
        .collect()
}

/// Listens to SIGINT and SIGTERM from now on: resolves on either (never, when they cannot be
/// listened to).
fn stopped() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let signals = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        match signals {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
}

/// The hosts of `s` that had something to do at this snapshot: not passed at its version
/// when the follow began.
fn todo(s: &Followed1) -> impl Iterator<Item = usize> + '_ {
    (0..s.rollout.hosts.len()).filter(|i| s.initial[*i].0 != Ended::Passed)
}

/// When the store last stamped `service`'s status on `host` (to tell a new end from the one
/// it had).
fn stamp(view: &View, host: &str, service: &str) -> Option<String> {
    let p = view.hosts.get(host)?.services.get(service)?;
    p.validated
        .as_ref()
        .or(p.configured.as_ref())
        .map(|s| s.mark.at.clone())
}

/// What `view` says that was not said yet, as events.
fn step(site: &Site, view: &View, services: &mut [Followed1], sink: &dyn Sink) {
    for i in 0..services.len() {
        if services[i].finished.is_some() {
            continue;
        }
        let blocked = blocked_by(site, view, services, services[i].rollout.service);
        let s = &mut services[i];
        let ended = s.rollout.ended(view);
        s.last.clone_from(&ended);
        let name = s.rollout.name.clone();
        let version = s.rollout.version.clone();
        let mut busy_any = false;
        for j in todo_vec(s) {
            let host = s.rollout.hosts[j].clone();
            let entry = view.hosts.get(&host);
            let busy = entry
                .and_then(|e| e.busy.as_ref())
                .is_some_and(|b| b.service == name && b.to == version);
            busy_any |= busy;
            let new_end = ended[j] != Ended::Not
                && ((ended[j], stamp(view, &host, &name)) != s.initial[j]
                    || (s.failed_before[j] && ended[j] == Ended::Failed));
            let from = entry
                .and_then(|e| e.services.get(&name))
                .and_then(|p| p.running.as_ref())
                .map(|r| r.version.clone());
            let kind = match &from {
                None => StepKind::Install,
                Some(v) if *v == version => StepKind::Reconfigure,
                Some(_) => StepKind::Upgrade,
            };
            if !s.started[j] && (busy || new_end) {
                if !s.announced {
                    s.announced = true;
                    sink.emit(Event::now(EventKind::ServiceStarted {
                        service: name.clone(),
                        waves: s.rollout.waves(),
                        steps: todo(s).count(),
                    }));
                }
                s.started[j] = true;
                s.kinds[j] = Some(kind);
                sink.emit(Event::now(EventKind::StepStarted {
                    intent: StepIntent {
                        service: name.clone(),
                        host: host.clone(),
                        from,
                        to: version.clone(),
                    },
                    kind,
                    reasons: Vec::new(),
                    path: Path::SwitchOver,
                    restarts: Vec::new(),
                    decided: false,
                }));
            }
            if s.started[j] && !s.reported[j] && new_end && !busy {
                s.reported[j] = true;
                let p = entry.and_then(|e| e.services.get(&name));
                let failed = [
                    p.and_then(|p| p.configured.as_ref()),
                    p.and_then(|p| p.validated.as_ref()),
                ]
                .into_iter()
                .flatten()
                .find(|m| m.version == version && m.mark.outcome == crate::state::Outcome::Failure);
                let log = failed
                    .or(p.and_then(|p| p.validated.as_ref()))
                    .map(|m| m.mark.log.clone())
                    .unwrap_or_default();
                let ok = ended[j] == Ended::Passed;
                sink.emit(Event::now(EventKind::StepFinished {
                    result: StepEnd {
                        service: name.clone(),
                        host: host.clone(),
                        ok,
                        failed_hook: failed.and_then(|m| m.mark.hook.clone()),
                        rolled_back: !ok
                            && p.and_then(|p| p.running.as_ref())
                                .is_some_and(|r| r.version != version),
                        reason: failed.map(|m| {
                            format!("{} failed", m.mark.hook.as_deref().unwrap_or("a hook"))
                        }),
                    },
                    log,
                    record: None,
                }));
            }
        }
        let open = todo_vec(s).into_iter().filter(|j| !s.reported[*j]).count();
        let failed = todo_vec(s)
            .into_iter()
            .filter(|j| s.reported[*j] && ended[*j] == Ended::Failed)
            .count();
        let succeeded = todo_vec(s)
            .into_iter()
            .filter(|j| s.reported[*j] && ended[*j] == Ended::Passed)
            .count();
        let (outcome, reason) = if open == 0 {
            let outcome = if failed == 0 {
                ServiceOutcome::Done
            } else {
                ServiceOutcome::Failed
            };
            (outcome, None)
        } else if busy_any {
            continue;
        } else if let Some(n) = s.rollout.spent(&ended) {
            (
                ServiceOutcome::Halted,
                Some(format!(
                    "{n} hosts failed at {version}, more than its budget of {}",
                    s.rollout.budget
                )),
            )
        } else if let Some(why) = canary_failed(&s.rollout, &ended) {
            (ServiceOutcome::Halted, Some(why))
        } else if let Some(why) = blocked {
            (ServiceOutcome::Blocked, Some(why))
        } else {
            continue;
        };
        s.finished = Some(outcome);
        sink.emit(Event::now(EventKind::ServiceFinished {
            service: name,
            outcome,
            reason,
            succeeded,
            failed,
            not_started: open,
        }));
    }
}

/// Why the hosts after the canary never start: every canary host ended, one failed (within
/// the failure budget, agents hold the others until the canary passed).
fn canary_failed(rollout: &Rollout, ended: &[Ended]) -> Option<String> {
    let canary = &ended[..rollout.canary];
    if canary.is_empty()
        || canary.len() == rollout.hosts.len()
        || canary.contains(&Ended::Not)
        || !canary.contains(&Ended::Failed)
    {
        return None;
    }
    let failed: Vec<&str> = (0..rollout.canary)
        .filter(|i| ended[*i] == Ended::Failed)
        .map(|i| rollout.hosts[i].as_str())
        .collect();
    Some(format!(
        "the canary failed at {}: {}",
        rollout.version,
        failed.join(", ")
    ))
}

fn todo_vec(s: &Followed1) -> Vec<usize> {
    todo(s).collect()
}

/// Why `service` can no longer start: a service it needs at runtime ended (failed, halted or
/// blocked) with fewer of its hosts healthy than the need asks.
fn blocked_by(
    site: &Site,
    view: &View,
    services: &[Followed1],
    service: ServiceId,
) -> Option<String> {
    for need in &site.services[service].needs {
        if need.healthy.is_none() && need.addressable.is_some() {
            continue;
        }
        let Some(x) = services.iter().find(|s| s.rollout.service == need.service) else {
            continue;
        };
        let Some(outcome) = x.finished else {
            continue;
        };
        let of = x.rollout.hosts.len();
        let wanted = need
            .healthy
            .unwrap_or(crate::site::Quota::All)
            .of(of, Round::Up);
        let healthy = x
            .rollout
            .ended(view)
            .iter()
            .filter(|e| **e == Ended::Passed)
            .count();
        if healthy < wanted {
            return Some(format!(
                "needs {} healthy on {wanted} of {of} hosts, {healthy} are, and it ended {}",
                x.rollout.name,
                match outcome {
                    ServiceOutcome::Halted => "halted",
                    ServiceOutcome::Blocked => "blocked",
                    _ => "failed",
                }
            ));
        }
    }
    None
}

/// The run's end, said.
fn finish(
    services: &[Followed1],
    sink: &dyn Sink,
    began: Instant,
    interrupted: bool,
    superseded: Option<String>,
) -> Followed {
    let mut out = Followed {
        converged: false,
        succeeded: 0,
        failed: 0,
        not_started: 0,
        interrupted,
        superseded,
    };
    let mut kinds = Kinds::default();
    let mut skips = Skips::default();
    for s in services {
        for j in todo(s) {
            match (s.reported[j], s.last.get(j), s.kinds[j]) {
                (true, Some(Ended::Passed), kind) => {
                    out.succeeded += 1;
                    if let Some(kind) = kind {
                        kinds.add(kind);
                    }
                }
                (true, _, _) => out.failed += 1,
                (false, _, _) => out.not_started += 1,
            }
        }
        let left = s.rollout.hosts.len() - todo(s).count();
        skips.converged += left;
        kinds.skipped += left;
    }
    out.converged = !interrupted
        && out.superseded.is_none()
        && out.failed == 0
        && out.not_started == 0
        && services.iter().all(|s| s.finished.is_some());
    sink.emit(Event::now(EventKind::RunFinished {
        converged: out.converged,
        succeeded: out.succeeded,
        failed: out.failed,
        not_started: out.not_started,
        skipped: 0,
        unreachable: 0,
        unreadable: 0,
        refused: 0,
        reverted: 0,
        not_reverted: 0,
        kinds,
        skips,
        ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{History, Snapshot};
    use crate::rollout::Event;
    use crate::state::store::{Published, RunningValue, StatusValue};
    use crate::state::{Mark, Outcome};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<EventKind>>);

    impl Sink for Collect {
        fn emit(&self, event: Event) {
            self.0.lock().unwrap().push(event.kind);
        }
    }

    impl Collect {
        /// `service-finished` events: (service, outcome, reason, failed, not started).
        fn finished(&self) -> Vec<(String, ServiceOutcome, Option<String>, usize, usize)> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter_map(|k| match k {
                    EventKind::ServiceFinished {
                        service,
                        outcome,
                        reason,
                        failed,
                        not_started,
                        ..
                    } => Some((
                        service.clone(),
                        *outcome,
                        reason.clone(),
                        *failed,
                        *not_started,
                    )),
                    _ => None,
                })
                .collect()
        }
    }

    /// `db` on d1 and d2 (`on-failure "continue"`, batch 1), `web` on w1, needing `db`
    /// healthy on all its hosts.
    fn site() -> (tempfile::TempDir, Site, Manifest) {
        let dir = tempfile::tempdir().expect("tempdir");
        let w =
            |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        w(
            "platform.kdl",
            "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
             host \"d1\" address=\"10.0.0.1\" class=\"db\"\n\
             host \"d2\" address=\"10.0.0.2\" class=\"db\"\n\
             host \"w1\" address=\"10.0.0.3\" class=\"web\"\n} }",
        );
        w(
            "cont.kdl",
            "policy \"cont\" { batch 1; on-failure \"continue\"; }\n",
        );
        w(
            "site.kdl",
            "site \"shop\" { version \"2\"; platform \"platform.kdl\" }\n\
             class \"db\" { service \"db\" }\n\
             class \"web\" { service \"web\" }\n\
             service \"db\" { port 82; start \"run\"; policy \"cont.kdl\" }\n\
             service \"web\" { port 80; start \"run\"; needs \"db\" healthy=\"all\" }\n",
        );
        let site = crate::site::load(&dir.path().join("site.kdl")).expect("site");
        let hosts = crate::inventory::resolve(&site).expect("hosts");
        let snapshot = Snapshot::take(&site, &History::default().blobs()).expect("snapshot");
        let manifest = Manifest::new(&site, &hosts, snapshot);
        (dir, site, manifest)
    }

    /// `view` with `service` on `host` ended at version 2 with `outcome`.
    fn end(view: &mut View, host: &str, service: &str, outcome: Outcome) {
        let status = StatusValue {
            schema: 1,
            version: "2".into(),
            mark: Mark {
                outcome,
                at: "2026-01-01T00:00:00Z".into(),
                run: "r".into(),
                log: "l".into(),
                hook: Some("check".into()),
            },
        };
        let running = RunningValue {
            schema: 1,
            version: if outcome == Outcome::Success {
                "2"
            } else {
                "1"
            }
            .into(),
            address: "a".into(),
            fingerprint: None,
            run: "r".into(),
            at: "2026-01-01T00:00:00Z".into(),
        };
        view.hosts.entry(host.into()).or_default().services.insert(
            service.into(),
            Published {
                running: Some(running),
                configured: Some(status.clone()),
                validated: Some(status),
            },
        );
    }

    #[test]
    fn a_dependent_of_a_service_that_ended_failed_below_its_threshold_ends_blocked() {
        let (_dir, site, manifest) = site();
        let mut services = followed(&site, &manifest, &View::default(), false);
        let sink = Collect::default();
        let mut view = View::default();
        end(&mut view, "d1", "db", Outcome::Success);
        end(&mut view, "d2", "db", Outcome::Failure);
        step(&site, &view, &mut services, &sink);
        assert!(services.iter().all(|s| s.finished.is_some()), "ended");
        let finished = sink.finished();
        assert_eq!(finished[0].1, ServiceOutcome::Failed, "{finished:?}");
        let web = &finished[1];
        assert_eq!((web.0.as_str(), web.1), ("web", ServiceOutcome::Blocked));
        let why = web.2.as_deref().unwrap_or_default();
        assert!(
            why.contains("needs db healthy on 2 of 2 hosts, 1 are, and it ended failed"),
            "{why}"
        );
        assert_eq!(web.4, 1, "web1 never started");
    }

    #[test]
    fn a_host_failed_at_an_unchanged_snapshot_has_ended() {
        let (_dir, site, manifest) = site();
        let mut view = View::default();
        end(&mut view, "d1", "db", Outcome::Success);
        end(&mut view, "d2", "db", Outcome::Failure);
        end(&mut view, "w1", "web", Outcome::Success);
        // A snapshot published anew: d2's agent steps again, its end is still to come.
        let mut services = followed(&site, &manifest, &view, false);
        let sink = Collect::default();
        step(&site, &view, &mut services, &sink);
        assert!(services[0].finished.is_none());
        // Unchanged: d2's agent never steps to it again; its failure is its end.
        let mut services = followed(&site, &manifest, &view, true);
        let sink = Collect::default();
        step(&site, &view, &mut services, &sink);
        assert!(services.iter().all(|s| s.finished.is_some()), "ended");
        let finished = sink.finished();
        assert_eq!(
            (finished[0].1, finished[0].3, finished[0].4),
            (ServiceOutcome::Failed, 1, 0),
            "{finished:?}"
        );
        let out = finish(&services, &sink, Instant::now(), false, None);
        assert_eq!((out.failed, out.converged), (1, false));
    }
}
