//! A saved plan (`deploy plan --out`) is carried out as saved, once the site, the inventory
//! and the hosts' state are shown to be what they were when it was made.

use super::prepare::{accept_new_host_keys, locked, Ready};
use super::{ApplyError, Request};
use crate::inventory::Hosts;
use crate::plan::{self, Plan};
use crate::session::{Locked, Session};
use crate::site;
use std::path::Path;

/// The saved plan, checked, with the hosts it has steps on locked and read.
pub(super) fn ready(request: &Request, session: Session) -> Result<(Locked, Ready), ApplyError> {
    refuse_selections(request)?;
    let target = &request.target;
    let text = std::fs::read(target).map_err(|e| ApplyError::Read {
        path: target.clone(),
        source: e,
    })?;
    let plan: Plan = serde_json::from_slice(&text).map_err(|e| ApplyError::BadPlan {
        path: target.clone(),
        reason: e.to_string(),
    })?;
    if plan.schema != plan::SCHEMA {
        return Err(ApplyError::BadPlan {
            path: target.clone(),
            reason: format!("plan schema {} is not {}", plan.schema, plan::SCHEMA),
        });
    }
    // Before any host is contacted: the rollout trusts the plan's steps to hold together.
    let inconsistent = |lines: Vec<String>| ApplyError::Inconsistent {
        plan: target.clone(),
        lines: lines.join("\n  "),
    };
    let wrong = plan.inconsistencies();
    if !wrong.is_empty() {
        return Err(inconsistent(wrong));
    }
    let mut site = site::load(Path::new(&plan.site_file))?;
    accept_new_host_keys(&mut site, request.accept_new_host_keys);
    let mut drift = Vec::new();
    // The same site files: the plan's services must still be the site's (else it was edited).
    if site.digest == plan.site_digest {
        let wrong = plan.differences_from(&site);
        if !wrong.is_empty() {
            return Err(inconsistent(wrong));
        }
    } else {
        drift.push(format!(
            "the site files changed since the plan was made ({})",
            plan.site_file
        ));
    }
    let (session, l, _) = locked(site, session, |_, hosts| Ok(stepped(&plan, hosts)))?;
    let (hosts, observed) = (&l.hosts, &l.observed);
    let class_names: Vec<String> = l.site.classes.iter().map(|c| c.name.clone()).collect();
    drift.extend(plan::drift(&plan.hosts, hosts, observed, &class_names));
    if !drift.is_empty() {
        drift.extend(session.own_drift(&plan));
        return Err(ApplyError::Drift {
            plan: target.clone(),
            changes: drift.join("\n  "),
        });
    }
    let mut plan = plan;
    plan.prune |= request.prune;
    Ok((session, l.ready(plan, None)))
}

/// `--only`, `--repair` and `--on` say what a plan is made for: a saved one already says.
fn refuse_selections(request: &Request) -> Result<(), ApplyError> {
    if !request.only.is_empty() {
        return Err(ApplyError::Usage {
            reason: "--only does not apply to a saved plan".into(),
            help: "the plan already says what changes: make it with `deploy plan --only … --out`"
                .into(),
        });
    }
    if request.repair {
        return Err(ApplyError::Usage {
            reason: "--repair does not apply to a saved plan".into(),
            help: "the plan already says which hosts are repaired: make it with `deploy plan \
                   --repair --out`"
                .into(),
        });
    }
    if !request.on.is_empty() {
        return Err(ApplyError::Usage {
            reason: "--on does not apply to a saved plan".into(),
            help:
                "the plan already says which hosts change: make it with `deploy plan --on … --out`"
                    .into(),
        });
    }
    Ok(())
}

/// The hosts a saved plan has steps (or removals) on.
fn stepped(plan: &Plan, hosts: &Hosts) -> plan::Selection {
    let ids = plan
        .services
        .iter()
        .flat_map(|s| s.each_step())
        .map(|step| &step.host)
        .chain(plan.removals.iter().map(|r| &r.host))
        .filter_map(|host| hosts.find(host))
        .collect();
    plan::Selection {
        hosts: Some(ids),
        ..Default::default()
    }
}
