//! One service's rollout at a published snapshot, as the published status says it: its hosts
//! (the manifest's order, natural name order), cut into pull mode's waves (the policy's canary
//! first, then batches of the policy's batch, as push cuts them), which of them ended at the
//! service's version (passed or failed), and whether its failure budget is spent. Pure: shared
//! by the agent's admission ([`crate::agent`]), `deploy resume` and `deploy publish --follow`.

use super::Manifest;
use crate::site::{OnFailure, Pause, Round, ServiceId, Site};
use crate::state::store::View;
use crate::state::Outcome;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Version of the value at `resume/<service>`.
pub const RESUME_SCHEMA: u32 = 1;

/// `resume/<service>`: `deploy resume` confirmed the service's waves before `waves` (wave
/// indices from 0, the canary's included) of snapshot `digest`. Another digest's confirms
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    pub schema: u32,
    pub digest: String,
    /// Waves `0..=waves` may start (wave 0 never waits).
    pub waves: usize,
    /// Who resumed, and when (RFC 3339).
    pub by: String,
    pub at: String,
}

/// What the published status says of one host of the service, at its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// No step ended at the version yet.
    Not,
    /// Runs the version, its check passed.
    Passed,
    /// A step to the version failed.
    Failed,
}

/// One service of a snapshot, its hosts cut into waves.
#[derive(Debug, Clone)]
pub struct Rollout {
    pub service: ServiceId,
    pub name: String,
    pub version: String,
    /// Its published hosts, in the manifest's order.
    pub hosts: Vec<String>,
    /// Hosts per wave (the plan's `batch_hosts`).
    pub batch: usize,
    /// Failed hosts tolerated before no new host is admitted (`usize::MAX`: no budget).
    pub budget: usize,
    pub canary: usize,
    pub pause: Pause,
}

impl Rollout {
    pub fn new(site: &Site, manifest: &Manifest, service: ServiceId) -> Rollout {
        let s = &site.services[service];
        let classes: Vec<&str> = s
            .classes
            .iter()
            .map(|c| site.classes[*c].name.as_str())
            .collect();
        let hosts: Vec<String> = manifest
            .hosts
            .iter()
            .filter(|h| h.classes.iter().any(|c| classes.contains(&c.as_str())))
            .map(|h| h.name.clone())
            .collect();
        let n = hosts.len();
        let p = &s.policy;
        Rollout {
            service,
            name: s.name.clone(),
            version: s.version.to_string(),
            batch: p.batch.of(n, Round::Down).max(1),
            budget: match p.on_failure {
                OnFailure::Continue => usize::MAX,
                OnFailure::Stop => 0,
                OnFailure::Rollback | OnFailure::Revert => p.max_failed.of(n, Round::Down),
            },
            canary: usize::try_from(p.canary).unwrap_or(usize::MAX).min(n),
            pause: p.pause,
            hosts,
        }
    }

    /// The wave of the host at `position` in [`Rollout::hosts`]: the canary's hosts are
    /// wave 0, then one wave per batch.
    pub fn wave_of(&self, position: usize) -> usize {
        if position < self.canary {
            return 0;
        }
        usize::from(self.canary > 0) + (position - self.canary) / self.batch
    }

    /// How many waves the service has.
    pub fn waves(&self) -> usize {
        self.hosts
            .len()
            .checked_sub(1)
            .map_or(0, |last| self.wave_of(last) + 1)
    }

    /// Where the published status has each host, in [`Rollout::hosts`]' order.
    pub fn ended(&self, view: &View) -> Vec<Ended> {
        self.hosts
            .iter()
            .map(|h| ended(view, h, &self.name, &self.version))
            .collect()
    }

    /// Failed hosts past the budget: `Some(failed)` when no new host may start.
    pub fn spent(&self, ended: &[Ended]) -> Option<usize> {
        let failed = ended.iter().filter(|e| **e == Ended::Failed).count();
        (failed > self.budget).then_some(failed)
    }

    /// The first wave some of whose hosts have not ended (canary hosts: not passed): the
    /// wave open now, or `None` when every host has ended.
    pub fn open_wave(&self, ended: &[Ended]) -> Option<usize> {
        ended
            .iter()
            .enumerate()
            .filter(|(i, e)| match e {
                Ended::Not => true,
                Ended::Failed => self.wave_of(*i) == 0 && self.canary > 0,
                Ended::Passed => false,
            })
            .map(|(i, _)| self.wave_of(i))
            .min()
    }

    /// Whether every wave before the one of the host at `position` ended (the canary's
    /// hosts passed): the moment an agent first sees this is when a timed pause starts.
    pub fn waves_before_ended(&self, view: &View, position: usize) -> bool {
        let wave = self.wave_of(position);
        let ended = self.ended(view);
        (0..self.hosts.len())
            .filter(|i| self.wave_of(*i) < wave)
            .all(|i| match ended[i] {
                Ended::Not => false,
                Ended::Failed => self.canary == 0 || self.wave_of(i) > 0,
                Ended::Passed => true,
            })
    }

    /// Why the host at `position` may not start yet by the waves (`None`: it may): under a
    /// canary, a host after it waits until every canary host passed; under a pause, a wave
    /// waits until every wave before it ended, then for the pause (`resumed`: the waves
    /// `deploy resume` confirmed at this snapshot). A timed pause is counted on the waiting
    /// agent's own clock, from `seen`: when it first saw every wave before ended
    /// ([`Rollout::waves_before_ended`]), never from another host's stamps (taken when a
    /// step's command was sent, on another clock). Without `seen` the wave waits (fails
    /// closed).
    pub fn held(
        &self,
        view: &View,
        position: usize,
        resumed: usize,
        seen: Option<Instant>,
        now: Instant,
    ) -> Option<String> {
        let wave = self.wave_of(position);
        if wave == 0 {
            return None;
        }
        let ended = self.ended(view);
        if self.canary > 0 {
            let waiting: Vec<&str> = (0..self.canary)
                .filter(|i| ended[*i] != Ended::Passed)
                .map(|i| self.hosts[i].as_str())
                .collect();
            if !waiting.is_empty() {
                return Some(format!(
                    "the canary has not passed at {}: {}",
                    self.version,
                    waiting.join(", ")
                ));
            }
        }
        if self.pause.is_none() {
            return None;
        }
        let before: Vec<usize> = (0..position).filter(|i| self.wave_of(*i) < wave).collect();
        let open: Vec<&str> = before
            .iter()
            .filter(|i| ended[**i] == Ended::Not)
            .map(|i| self.hosts[*i].as_str())
            .collect();
        if !open.is_empty() {
            return Some(format!(
                "wave {} waits for the waves before it: {} not ended at {}",
                wave + 1,
                open.join(", "),
                self.version
            ));
        }
        match self.pause {
            Pause::Confirm if resumed < wave => Some(format!(
                "wave {} waits for `deploy resume` (pause \"confirm\")",
                wave + 1
            )),
            Pause::Confirm => None,
            Pause::Wait(d) => {
                let over = seen.is_some_and(|seen| now >= seen + d);
                (!over).then(|| {
                    format!(
                        "wave {} waits for the pause of {} after wave {wave}",
                        wave + 1,
                        humantime::format_duration(d)
                    )
                })
            }
        }
    }

    /// The wave `deploy resume` would confirm now: the first wave after an ended one whose
    /// pause is `"confirm"`, not confirmed yet (`resumed`), every wave before it ended.
    pub fn awaiting_resume(&self, view: &View, resumed: usize) -> Option<usize> {
        if self.pause != Pause::Confirm {
            return None;
        }
        let ended = self.ended(view);
        if self.spent(&ended).is_some() {
            return None;
        }
        let open = self.open_wave(&ended)?;
        (open > resumed && self.hosts_of_wave_before_ended(&ended, open)).then_some(open)
    }

    fn hosts_of_wave_before_ended(&self, ended: &[Ended], wave: usize) -> bool {
        (0..self.hosts.len())
            .filter(|i| self.wave_of(*i) < wave)
            .all(|i| ended[i] != Ended::Not)
    }
}

/// Where the store has `service` on `host` at `version` (see [`Ended`]).
pub fn ended(view: &View, host: &str, service: &str, version: &str) -> Ended {
    let Some(p) = view.hosts.get(host).and_then(|e| e.services.get(service)) else {
        return Ended::Not;
    };
    let failed = [&p.configured, &p.validated]
        .into_iter()
        .flatten()
        .any(|m| m.version == version && m.mark.outcome == Outcome::Failure);
    if failed {
        return Ended::Failed;
    }
    let passed = p.running.as_ref().is_some_and(|r| r.version == version)
        && p.validated
            .as_ref()
            .is_some_and(|v| v.version == version && v.mark.outcome == Outcome::Success);
    if passed {
        Ended::Passed
    } else {
        Ended::Not
    }
}

/// The waves `resume/<service>` confirms at snapshot `digest` (0 when none, or another
/// snapshot's, or a value this deploy cannot read).
pub fn resumed(value: Option<&[u8]>, digest: &str) -> usize {
    value
        .and_then(|v| serde_json::from_slice::<Resumed>(v).ok())
        .filter(|r| r.schema == RESUME_SCHEMA && r.digest == digest)
        .map_or(0, |r| r.waves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rollout(hosts: usize, batch: usize, canary: usize, pause: Pause) -> Rollout {
        Rollout {
            service: ServiceId::new(0),
            name: "api".into(),
            version: "2".into(),
            hosts: (1..=hosts).map(|i| format!("h{i}")).collect(),
            batch,
            budget: 0,
            canary,
            pause,
        }
    }

    #[test]
    fn waves_are_the_canary_then_batches() {
        let r = rollout(7, 3, 2, Pause::Confirm);
        let waves: Vec<usize> = (0..7).map(|i| r.wave_of(i)).collect();
        assert_eq!(waves, [0, 0, 1, 1, 1, 2, 2]);
        assert_eq!(r.waves(), 3);
        let r = rollout(5, 2, 0, Pause::Confirm);
        let waves: Vec<usize> = (0..5).map(|i| r.wave_of(i)).collect();
        assert_eq!(waves, [0, 0, 1, 1, 2]);
        assert_eq!(rollout(0, 2, 1, Pause::Confirm).waves(), 0);
    }

    /// A view where each `(host, outcome, at)` ended at version 2 (published as the agent
    /// publishes a step's record).
    fn view(ended: &[(&str, Outcome, &str)]) -> View {
        use crate::state::store::{Published, RunningValue, StatusValue};
        use crate::state::Mark;
        let mut v = View::default();
        for (host, outcome, at) in ended {
            let status = StatusValue {
                schema: 1,
                version: "2".into(),
                mark: Mark {
                    outcome: *outcome,
                    at: (*at).into(),
                    run: "r".into(),
                    log: "l".into(),
                    hook: None,
                },
            };
            let running = RunningValue {
                schema: 1,
                version: if *outcome == Outcome::Success {
                    "2"
                } else {
                    "1"
                }
                .into(),
                address: "a".into(),
                fingerprint: None,
                run: "r".into(),
                at: (*at).into(),
            };
            v.hosts.entry((*host).into()).or_default().services.insert(
                "api".into(),
                Published {
                    running: Some(running),
                    configured: Some(status.clone()),
                    validated: Some(status),
                },
            );
        }
        v
    }

    const T: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn after_a_canary_the_rest_wait_until_it_passed_and_a_failed_one_holds_them() {
        let r = rollout(4, 2, 1, Pause::Wait(Duration::ZERO));
        let now = Instant::now();
        assert_eq!(
            r.held(&View::default(), 0, 0, None, now),
            None,
            "the canary goes"
        );
        let why = r.held(&View::default(), 3, 0, None, now).expect("held");
        assert!(why.contains("canary has not passed at 2: h1"), "{why}");
        let failed = view(&[("h1", Outcome::Failure, T)]);
        assert!(
            r.held(&failed, 1, 0, None, now).is_some(),
            "a failed canary holds"
        );
        let passed = view(&[("h1", Outcome::Success, T)]);
        // No pause: every other wave may go at once (the semaphore keeps the batch).
        assert_eq!(r.held(&passed, 3, 0, None, now), None);
    }

    #[test]
    fn a_confirmed_pause_lets_one_wave_go_once_the_one_before_ended() {
        let r = rollout(3, 1, 0, Pause::Confirm);
        let now = Instant::now();
        let none = View::default();
        assert_eq!(
            r.awaiting_resume(&none, 0),
            None,
            "wave 1 runs: nothing waits"
        );
        let why = r.held(&none, 1, 1, None, now).expect("held");
        assert!(why.contains("waves before it: h1 not ended"), "{why}");
        let one = view(&[("h1", Outcome::Success, T)]);
        assert_eq!(r.awaiting_resume(&one, 0), Some(1));
        assert!(r
            .held(&one, 1, 0, None, now)
            .expect("held")
            .contains("deploy resume"));
        assert_eq!(r.held(&one, 1, 1, None, now), None, "resumed");
        // Wave 3 waits for wave 2, then for a resume of its own.
        assert!(r
            .held(&one, 2, 1, None, now)
            .expect("held")
            .contains("h2 not ended"));
        // A failure past the budget (0 here): no wave awaits a resume any more.
        let spent = view(&[("h1", Outcome::Success, T), ("h2", Outcome::Failure, T)]);
        assert_eq!(r.awaiting_resume(&spent, 1), None);
        let two = view(&[("h1", Outcome::Success, T), ("h2", Outcome::Success, T)]);
        assert_eq!(r.awaiting_resume(&two, 1), Some(2));
        assert!(r.held(&two, 2, 1, None, now).is_some());
        assert_eq!(r.held(&two, 2, 2, None, now), None);
        let all = view(&[
            ("h1", Outcome::Success, T),
            ("h2", Outcome::Success, T),
            ("h3", Outcome::Success, T),
        ]);
        assert_eq!(r.awaiting_resume(&all, 2), None, "every wave ended");
    }

    #[test]
    fn a_timed_pause_runs_from_when_the_waiting_agent_first_saw_the_wave_before_ended() {
        let r = rollout(2, 1, 0, Pause::Wait(Duration::from_secs(30)));
        // h1's stamp is long past: stamps (another host's, taken when a command was sent)
        // count for nothing.
        let v = view(&[("h1", Outcome::Success, T)]);
        let seen = Instant::now();
        assert!(r.waves_before_ended(&v, 1));
        assert!(!r.waves_before_ended(&View::default(), 1));
        assert!(r.held(&v, 1, 0, Some(seen), seen).is_some());
        assert!(r
            .held(&v, 1, 0, Some(seen), seen + Duration::from_millis(29_999))
            .is_some());
        assert_eq!(
            r.held(&v, 1, 0, Some(seen), seen + Duration::from_secs(30)),
            None
        );
        // Not seen ended yet (or no parsable stamp at all): the wave waits.
        let unstamped = view(&[("h1", Outcome::Success, "not a time")]);
        let why = r
            .held(&unstamped, 1, 0, None, seen + Duration::from_secs(3600))
            .expect("held");
        assert!(why.contains("pause of 30s after wave 1"), "{why}");
    }

    #[test]
    fn a_failed_canary_is_not_the_wave_before_ended() {
        let r = rollout(3, 1, 1, Pause::Wait(Duration::from_secs(1)));
        assert!(!r.waves_before_ended(&view(&[("h1", Outcome::Failure, T)]), 1));
        assert!(r.waves_before_ended(&view(&[("h1", Outcome::Success, T)]), 1));
    }

    #[test]
    fn a_resume_of_another_snapshot_confirms_nothing() {
        let v = serde_json::to_vec(&Resumed {
            schema: RESUME_SCHEMA,
            digest: "abc".into(),
            waves: 2,
            by: "me".into(),
            at: "2026-01-01T00:00:00Z".into(),
        })
        .unwrap();
        assert_eq!(resumed(Some(&v), "abc"), 2);
        assert_eq!(resumed(Some(&v), "def"), 0);
        assert_eq!(resumed(Some(b"junk"), "abc"), 0);
        assert_eq!(resumed(None, "abc"), 0);
    }
}
