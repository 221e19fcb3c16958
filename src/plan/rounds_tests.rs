//! Checks of the waits a plan drops as they would go round, by a walk of its own: the plan
//! carried out step by step as the engine may (a wave after the whole one before it, a
//! service once what it needs at runtime had its healthy hosts before the run or has ended
//! every step, since any may fail; a step after the steps it follows on its host and those it
//! waits for) ends every step, and every wait dropped would, kept with the others, leave
//! steps that can never start.

use super::{DroppedWait, Plan};
use std::collections::HashSet;

/// Steps `(service, host)` the walk of `plan` never gets to, with the pool waits of `dropped`
/// left out: empty when the whole plan can run.
pub(super) fn stuck(plan: &Plan, dropped: &[&DroppedWait]) -> Vec<(String, String)> {
    let gone: HashSet<(&str, &str, &str, &str)> = dropped
        .iter()
        .map(|d| {
            let w = &d.waits_for;
            (&*d.service, &*d.host, &*w.service, &*w.host)
        })
        .collect();
    let has_step: HashSet<(&str, &str)> = plan
        .services
        .iter()
        .flat_map(|s| s.each_step().map(move |st| (s.name.as_str(), &*st.host)))
        .collect();
    // Steps ended, or given up with their service (a start condition that can no longer hold).
    let mut ended: HashSet<(&str, &str)> = HashSet::new();
    let mut started = vec![false; plan.services.len()];
    let over = |ended: &HashSet<(&str, &str)>, s: &str, h: &str| {
        !has_step.contains(&(s, h)) || ended.contains(&(s, h))
    };
    loop {
        let mut moved = false;
        for (i, sp) in plan.services.iter().enumerate() {
            if !started[i] {
                let holds = sp.waits_for.iter().all(|c| {
                    let Some(t) = plan.services.iter().find(|t| t.name == c.service) else {
                        return true;
                    };
                    let done = t
                        .each_step()
                        .filter(|st| ended.contains(&(t.name.as_str(), &*st.host)))
                        .count();
                    // Healthy enough before the run, or every step of it over: any of them may
                    // fail, and the service then starts, or ends blocked, once it is over.
                    plan.healthy_before(t) >= c.count || done == t.steps()
                });
                if !holds {
                    continue;
                }
                started[i] = true;
                moved = true;
            }
            for wave in &sp.waves {
                let mut all = true;
                for st in &wave.steps {
                    let me = (sp.name.as_str(), &*st.host);
                    if ended.contains(&me) {
                        continue;
                    }
                    let may = st.after.iter().all(|a| over(&ended, a, &st.host))
                        && st.waits.iter().all(|w| {
                            gone.contains(&(&*sp.name, &*st.host, &*w.service, &*w.host))
                                || over(&ended, &w.service, &w.host)
                        });
                    if may {
                        ended.insert(me);
                        moved = true;
                    } else {
                        all = false;
                    }
                }
                if !all {
                    break;
                }
            }
        }
        if !moved {
            break;
        }
    }
    plan.services
        .iter()
        .flat_map(|s| s.each_step().map(move |st| (s, st)))
        .filter(|(s, st)| !ended.contains(&(s.name.as_str(), &*st.host)))
        .map(|(s, st)| (s.name.clone(), st.host.to_string()))
        .collect()
}

/// The plan runs through with its dropped waits left out, each of them a wait its step
/// holds, and each would leave steps stuck if it were kept: only waits that go round go.
pub(super) fn check(plan: &Plan) -> Result<(), String> {
    let all: Vec<&DroppedWait> = plan.dropped_waits.iter().collect();
    let left = stuck(plan, &all);
    if !left.is_empty() {
        return Err(format!("steps never started: {left:?}"));
    }
    for d in &plan.dropped_waits {
        let held = plan.services.iter().any(|s| {
            *s.name == *d.service
                && s.each_step()
                    .any(|st| st.host == d.host && st.waits.contains(&d.waits_for))
        });
        if !held {
            return Err(format!("{d:?}: not a wait of the plan"));
        }
        let others: Vec<&DroppedWait> = all.iter().copied().filter(|o| *o != d).collect();
        if stuck(plan, &others).is_empty() {
            return Err(format!("{}: dropped, yet it does not go round", d.words()));
        }
    }
    Ok(())
}
