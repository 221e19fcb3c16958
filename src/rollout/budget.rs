//! Failure budgets above the service's own `max-failed`: per wave (the policy's
//! `wave-max-failed`) and per run (the site's `max-failed`). Pure: the scheduler asks, these
//! answer with the reason to stop, if any.

use crate::plan::{Plan, PlannedPolicy};
use crate::site::{Flow, OnFailure, Round};

/// Why no new wave of any service may start: more hosts failed in the run than the site's
/// `max-failed` allows. Applies whatever a service's `on-failure` says.
pub fn run_exceeded(plan: &Plan, failed_hosts: usize) -> Option<String> {
    let (quota, limit) = (plan.max_failed?, plan.max_failed_hosts?);
    (failed_hosts > limit).then(|| {
        format!(
            "{} failed in this run, more than the site's max-failed {quota} allows ({limit})",
            crate::words::count(failed_hosts, "host")
        )
    })
}

/// Why no new host of a service whose policy is `policy` may start once `failed` of its
/// hosts have failed: its `max-failed` is exceeded, or (`on-failure "stop"`) one has failed.
/// Never under `"continue"`.
pub fn service_exceeded(policy: &PlannedPolicy, failed: usize) -> Option<String> {
    match policy.on_failure {
        OnFailure::Stop if failed > 0 => Some(format!(
            "stopped after {failed} failed (on-failure \"stop\")"
        )),
        OnFailure::Rollback | OnFailure::Stop | OnFailure::Revert
            if failed > policy.max_failed_hosts =>
        {
            Some(format!(
                "{} failed, more than max-failed {} allows ({})",
                crate::words::count(failed, "host"),
                policy.max_failed,
                policy.max_failed_hosts
            ))
        }
        _ => None,
    }
}

/// How many of a wave of `wave_hosts` hosts may fail before its remaining steps are not
/// started; `None` when the policy has no wave budget or ignores budgets (`continue`).
pub fn wave_limit(policy: &PlannedPolicy, wave_hosts: usize) -> Option<usize> {
    if policy.on_failure == OnFailure::Continue {
        return None;
    }
    Some(policy.wave_max_failed?.of(wave_hosts, Round::Down))
}

/// Why the pending steps of wave `wave` (1-based, `wave_hosts` hosts, `failed` of them failed
/// so far) must not start.
pub fn wave_exceeded(
    policy: &PlannedPolicy,
    wave: usize,
    wave_hosts: usize,
    failed: usize,
) -> Option<String> {
    let limit = wave_limit(policy, wave_hosts)?;
    let quota = policy.wave_max_failed?;
    (failed > limit).then(|| {
        format!(
            "{failed} of the {} of wave {wave} failed, more than wave-max-failed {quota} allows ({limit})",
            crate::words::count(wave_hosts, "host")
        )
    })
}

/// How a service's next wave may open before its open one has ended (waves that flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flowing {
    /// `flow "slots"`: at most `batch` hosts switching, a freed slot going to the next host
    /// at once while at most `limit` steps have failed; checked before each new host starts.
    Slots { limit: usize },
    /// `flow "budget"`: while the failed steps plus the running ones are at most `limit`, so
    /// that the budget holds whatever the running ones do.
    Budget { limit: usize },
}

/// Whether, and under which rule, a service's waves flow. `None` when each wave waits for the
/// whole one before it: a pause or confirmation, a `spread`, `flow "waves"`, and under
/// `flow "budget"` also `on-failure "stop"` or `max-failed 0`. A limit of `usize::MAX`: under
/// `"continue"`. The scheduler also never flows past the canary.
pub fn flowing(policy: &PlannedPolicy) -> Option<Flowing> {
    if !policy.pause.is_none() || policy.spread.is_some() {
        return None;
    }
    match policy.flow {
        Flow::Waves => None,
        Flow::Slots => Some(Flowing::Slots {
            limit: match policy.on_failure {
                OnFailure::Continue => usize::MAX,
                OnFailure::Stop => 0,
                OnFailure::Rollback | OnFailure::Revert => policy.max_failed_hosts,
            },
        }),
        Flow::Budget => match policy.on_failure {
            OnFailure::Continue => Some(usize::MAX),
            OnFailure::Stop => None,
            OnFailure::Rollback | OnFailure::Revert => {
                Some(policy.max_failed_hosts).filter(|&n| n > 0)
            }
        }
        .map(|limit| Flowing::Budget { limit }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site::Quota;

    fn policy(wave: Option<Quota>, on_failure: OnFailure) -> PlannedPolicy {
        PlannedPolicy {
            name: "p".into(),
            batch: Quota::Count(4),
            batch_hosts: 4,
            max_failed: Quota::Count(0),
            max_failed_hosts: 0,
            wave_max_failed: wave,
            canary: 0,
            pause: crate::site::Pause::Wait(std::time::Duration::ZERO),
            spread: None,
            on_failure,
            flow: Flow::Slots,
            progress_deadline: None,
        }
    }

    #[test]
    fn wave_budget_is_a_share_of_the_wave_rounded_down() {
        let p = policy(Some(Quota::Percent(5000)), OnFailure::Rollback);
        assert_eq!(wave_limit(&p, 4), Some(2));
        assert_eq!(wave_limit(&p, 3), Some(1));
        assert_eq!(wave_exceeded(&p, 1, 4, 2), None);
        assert_eq!(
            wave_exceeded(&p, 2, 4, 3).as_deref(),
            Some("3 of the 4 hosts of wave 2 failed, more than wave-max-failed 50% allows (2)")
        );
    }

    #[test]
    fn continue_and_no_budget_never_cut_a_wave() {
        let p = policy(Some(Quota::Count(0)), OnFailure::Continue);
        assert_eq!(wave_exceeded(&p, 1, 4, 4), None);
        let p = policy(None, OnFailure::Stop);
        assert_eq!(wave_exceeded(&p, 1, 4, 4), None);
        let p = policy(Some(Quota::Count(0)), OnFailure::Stop);
        assert!(wave_exceeded(&p, 1, 4, 1).is_some());
    }
}
