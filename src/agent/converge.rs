//! One snapshot converged on the agent's own host: for each of its services in dependency
//! order, the apply stage as push runs it (`apply::prepare_site` with `--only SERVICE --on
//! host:H --yes`: desired inputs, the plan against the host's own record, the same step with
//! hooks, files, reload, rollback and record, its journal), a slot of the service's semaphore
//! held around the step; then what the step recorded is published as push publishes it
//! (`running/`, `status/`, `hosts/`: same keys, same schema), fenced by the slot.

use super::load::Loaded;
use super::slot::{self, Admission};
use super::{Agent, AgentError};
use crate::apply::{self, Operator, Outcome, Request};
use crate::plan::Plan;
use crate::rollout::{Event, EventKind, Gate, Sink, Summary};
use crate::session::Elsewhere;
use crate::site::ServiceId;
use crate::state::store::{self, Store, StoreError, View, Write};
use crate::state::ServiceRecord;
use std::sync::{Arc, Mutex};

/// How one snapshot went on this host.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Converged {
    /// Services that had a step.
    pub stepped: usize,
    /// Of those, the ones whose step failed.
    pub failed: usize,
    /// Told to stop before the end.
    pub stopped: bool,
    /// Left before the end: a newer snapshot was published (a write refused by its fence).
    pub superseded: bool,
}

/// Converges the agent's host on `loaded` (see the module's text).
pub fn converge(agent: &Agent, loaded: &Loaded) -> Result<Converged, AgentError> {
    let site = &loaded.site;
    let refused = crate::publish::unsupported(site);
    if !refused.is_empty() {
        return Err(AgentError::Unsupported {
            lines: refused.join("\n  "),
        });
    }
    let Some(me) = loaded.manifest.hosts.iter().find(|h| h.name == agent.host) else {
        return Err(AgentError::NotInSnapshot {
            host: agent.host.clone(),
            digest: String::new(),
        });
    };
    let mine: Vec<ServiceId> = site
        .order
        .iter()
        .copied()
        .filter(|sid| {
            site.services[*sid]
                .classes
                .iter()
                .any(|c| me.classes.contains(&site.classes[*c].name))
        })
        .collect();
    let mut done = Converged::default();
    for sid in mine {
        if agent.stopping() {
            done.stopped = true;
            break;
        }
        match service(agent, loaded, sid)? {
            Step::Nothing => {}
            Step::Ran { ok } => {
                done.stepped += 1;
                done.failed += usize::from(!ok);
            }
            Step::Stopped => {
                done.stopped = true;
                break;
            }
            Step::Superseded { ran } => {
                if let Some(ok) = ran {
                    done.stepped += 1;
                    done.failed += usize::from(!ok);
                }
                done.superseded = true;
                break;
            }
        }
    }
    Ok(done)
}

enum Step {
    Nothing,
    Ran {
        ok: bool,
    },
    Stopped,
    /// A write refused: the snapshot is no longer the desired one. `ran`: the step ran (and
    /// passed or not) and its records wait to be published under the newer snapshot.
    Superseded {
        ran: Option<bool>,
    },
}

/// One service of the host: planned, admitted, planned again (with what the other hosts
/// published by then: a need met meanwhile), stepped, published.
fn service(agent: &Agent, loaded: &Loaded, sid: ServiceId) -> Result<Step, AgentError> {
    let site = &loaded.site;
    let name = &site.services[sid].name;
    let (slot, prepared) = match admitted(agent, loaded, sid)? {
        None => return Ok(Step::Nothing),
        Some(Admitted::Stopped) => return Ok(Step::Stopped),
        Some(Admitted::Stepping(both)) => *both,
    };
    agent.say(&format!("{name}: admitted, stepping"));
    // The step's intent, in etcd before its first command (as push writes it): an agent that
    // dies before publishing the step's end leaves it, and a push after it reads the host.
    let intent = store::busy(
        &agent.keys,
        &agent.host,
        name,
        &site.services[sid].version,
        &format!("agent-{}", std::process::id()),
        &now(),
    );
    // Every write of the step is fenced by the slot and by the snapshot it acts on.
    let fence = slot
        .fence
        .on_snapshot(agent.keys.current(), loaded.revision);
    match agent.block_on(agent.etcd.write(&fence, &[intent])) {
        Ok(()) => {}
        Err(e @ StoreError::Superseded { .. }) => {
            agent.block_on(slot.release());
            agent.say(&format!("{name}: not stepped: {e}"));
            return Ok(Step::Superseded { ran: None });
        }
        Err(e) => {
            agent.block_on(slot.release());
            return Err(e.into());
        }
    }
    let recorder = Arc::new(Recorder::default());
    let ran = prepared.run(recorder.clone(), Arc::new(Unattended));
    let writes = recorder.writes(agent, loaded);
    let published = agent.block_on(agent.etcd.write(&fence, &writes));
    agent.block_on(slot.release());
    let superseded = match published {
        Ok(()) => false,
        Err(e @ StoreError::Superseded { .. }) => {
            // The host records the step (its state file is the truth of the host): what it
            // records is published under the newer snapshot, before anything of it is done.
            agent.say(&format!(
                "{name}: the step's records on snapshot {} were refused: {e}; they are published again under the newer snapshot",
                loaded.digest
            ));
            agent.keep_unpublished(&loaded.digest, writes);
            true
        }
        Err(e) => {
            agent.say(&format!(
                "warning: {name}'s step is recorded on this host, not in etcd: {e}"
            ));
            false
        }
    };
    Ok(match ran? {
        Outcome::Ended(_) => Step::Stopped,
        outcome => {
            let ok = outcome.verdict() == apply::Verdict::Converged;
            if superseded {
                Step::Superseded { ran: Some(ok) }
            } else {
                Step::Ran { ok }
            }
        }
    })
}

/// How a service's wait for its slot ended (`None` from [`admitted`]: nothing to step).
enum Admitted {
    Stopped,
    Stepping(Box<(slot::Slot, apply::Prepared)>),
}

/// Plans the step, waits for its slot and plans it again, on a copy of the site's keys read
/// once and watched (both plans and the waits decide on it) for as long as that lasts, not
/// while the step runs.
fn admitted(
    agent: &Agent,
    loaded: &Loaded,
    sid: ServiceId,
) -> Result<Option<Admitted>, AgentError> {
    let site = &loaded.site;
    let name = &site.services[sid].name;
    let mut mirror = agent.block_on(agent.etcd.mirror(&agent.keys))?;
    // The host's lock goes back (the plan dropped) while the agent waits for its slot.
    let room = limits(prepare(agent, loaded, name, mirror.view())?.plan(), name);
    let Some((capacity, max_failed)) = room else {
        return Ok(None);
    };
    let admission = Admission {
        site,
        service: sid,
        hosts: &loaded.manifest,
        digest: &loaded.digest,
        capacity,
        max_failed,
    };
    let Some(slot) = agent.block_on(slot::take(agent, &admission, &mut mirror))? else {
        return Ok(Some(Admitted::Stopped));
    };
    // Planned again with what admitted it and what came since (a need met, addresses
    // published meanwhile): the changes already received taken first.
    if !agent.block_on(mirror.catch_up()) {
        match agent.block_on(agent.etcd.mirror(&agent.keys)) {
            Ok(m) => mirror = m,
            Err(e) => {
                agent.block_on(slot.release());
                return Err(e.into());
            }
        }
    }
    let prepared = match prepare(agent, loaded, name, mirror.view()) {
        Ok(p) if limits(p.plan(), name).is_some() => p,
        other => {
            agent.block_on(slot.release());
            return other.map(|_| None);
        }
    };
    Ok(Some(Admitted::Stepping(Box::new((slot, prepared)))))
}

/// The apply stage prepared for `service` on the agent's host only: the other hosts as their
/// agents published them (`view`: the site's keys as the agent's mirror has them now), only
/// this one locked and read.
fn prepare(
    agent: &Agent,
    loaded: &Loaded,
    service: &str,
    view: &View,
) -> Result<apply::Prepared, AgentError> {
    let view = Arc::new(view.clone());
    let own = agent.host.clone();
    let elsewhere = Elsewhere(Arc::new(move |site, hosts, desired| {
        let said = store::observed(&view, site, hosts, desired);
        hosts
            .hosts
            .iter()
            .zip(said.observed)
            .map(|(h, o)| (*h.name != *own).then_some(o))
            .collect()
    }));
    let request = Request {
        target: loaded.site.file.clone(),
        yes: true,
        only: vec![service.to_string()],
        on: vec![format!("host:{}", agent.host)],
        max_connections: 16,
        // Locked and read before the plan is made, as an apply that asks first does.
        read_first: true,
        elsewhere: Some(elsewhere),
        controller: Some(agent.controller()),
        ..Request::default()
    };
    Ok(apply::prepare_site(
        request,
        loaded.site.clone(),
        agent.say.clone(),
    )?)
}

/// The slot's capacity and the failure budget of `service`, as the plan computed them, when
/// the plan has a step of it.
fn limits(plan: &Plan, service: &str) -> Option<(usize, usize)> {
    let s = plan
        .services
        .iter()
        .find(|s| s.name == service && s.steps() > 0)?;
    Some((s.policy.batch_hosts, s.policy.max_failed_hosts))
}

/// The steps' records, as the rollout's events carry them.
#[derive(Default)]
struct Recorder {
    records: Mutex<Vec<(String, String, ServiceRecord)>>,
    run: Mutex<String>,
}

impl Sink for Recorder {
    fn emit(&self, event: Event) {
        match event.kind {
            EventKind::RunStarted { run, .. } => {
                *self.run.lock().unwrap_or_else(|p| p.into_inner()) = run;
            }
            EventKind::StepFinished {
                result,
                record: Some(record),
                ..
            } => {
                self.records
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((result.service, result.host, *record));
            }
            _ => {}
        }
    }
}

impl Recorder {
    /// What push publishes of each step ([`store::recorded`]) and of the host.
    fn writes(&self, agent: &Agent, loaded: &Loaded) -> Vec<Write> {
        let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let at = now();
        let site = &loaded.site;
        let me = loaded.manifest.hosts.iter().find(|h| h.name == agent.host);
        let address = me.map(|h| h.address.clone()).unwrap_or_default();
        let mut out = Vec::new();
        for (service, host, record) in self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let port = site.service(service).and_then(|s| site.services[s].port);
            let hs = store::HostService {
                service,
                host,
                address: store::with_port(&address, port),
                record,
            };
            out.extend(store::recorded(&agent.keys, &hs, &run, &at));
        }
        out.push(store::not_busy(&agent.keys, &agent.host));
        out.push(store::host_seen(
            &agent.keys,
            &agent.host,
            &address,
            me.map(|h| h.classes.clone()).unwrap_or_default(),
            None,
            &run,
            &at,
        ));
        out
    }
}

/// Time a write is stamped with.
fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// No one to ask: the agent runs unattended (a policy that would ask is refused before).
struct Unattended;

impl Gate for Unattended {
    fn confirm(&self, _service: &str, _wave: usize) -> bool {
        false
    }
}

impl Operator for Unattended {
    fn show(&self, _plan: &Plan, _pending: &[bool], _early: &[bool]) {}
    fn can_ask(&self) -> bool {
        false
    }
    fn approve(&self) -> bool {
        false
    }
    fn ran(&self, _summary: &Summary) {}
}
