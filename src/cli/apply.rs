//! `deploy apply`: site (or saved plan) → plan → confirmation → rollout → summary.

use super::{code, ApplyArgs, Error};
use crate::desired::Desired;
use crate::plan::{self, Plan};
use crate::report;
use crate::rollout::{self, Gate, Rollout, Sink};
use crate::secrets::Secrets;
use crate::session::{Ended, RunTransport, Session};
use crate::site::{self, Site};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

pub fn run(args: &ApplyArgs) -> Result<u8, Error> {
    // Signals, the site's locks (released when `session` drops), the journal: the session
    // stage (`src/session/`); what it has to say goes to stderr.
    let options = crate::session::Options {
        break_lock: args.break_lock,
        max_connections: args.max_connections,
        // Every host's check runs before the plan: each is locked and read first.
        read_hosts: args.read_hosts || args.repair,
        // Nothing is confirmed before the run: hosts may be read as it goes.
        stream: args.yes && !args.read_first && !args.repair && !is_saved_plan(&args.target),
    };
    let session = Session::begin(options, std::sync::Arc::new(|text: &str| errln!("{text}")))?;
    let Ready {
        site,
        plan,
        transport,
        desired,
        secrets,
        planner,
    } = if is_saved_plan(&args.target) {
        saved(args, &session)?
    } else {
        fresh(args, &session)?
    };
    if let Some(ended) = session.interrupted() {
        return Ok(exit(ended));
    }
    let secrets = Arc::new(secrets);
    let (site, desired) = (Arc::new(site), Arc::new(desired));
    // Services planned as the run reads their hosts.
    let pending = planner
        .as_ref()
        .map(|(hosts, _)| session.not_planned(&site, hosts, &plan))
        .unwrap_or_default();
    let steps = plan.steps();
    if !args.json {
        let shown = if steps == 0 { &[][..] } else { &pending[..] };
        let early = plan::may_start_early(&site, &plan);
        out!("{}", report::plan_text_with(&plan, shown, &early));
    }
    let unreachable = plan
        .hosts
        .iter()
        .filter(|h| !h.observed.known() && h.observed != crate::state::Observed::Unread)
        .count();
    if steps == 0 {
        session.nothing_to_do(unreachable == 0);
        if !args.json {
            outln!("Nothing to change.");
        }
        return Ok(if unreachable > 0 {
            code::FAILED
        } else {
            code::OK
        });
    }
    if let Err(e) = confirm(args, &plan) {
        // A signal that left the question unanswered is an interruption, not a refusal.
        return match session.interrupted() {
            Some(ended) => Ok(exit(ended)),
            None => Err(e),
        };
    }
    session.release_unstepped(&plan);
    // The hosts left unread are read from here on, as the run goes.
    let planning = planner.and_then(|(hosts, selection)| {
        let planner = crate::session::Planner {
            site: site.clone(),
            hosts: Arc::new(hosts),
            desired: desired.clone(),
            selection,
        };
        session.plan_as_read(planner, &plan, pending)
    });
    let planned_during = planning.is_some();
    let plan = Arc::new(plan);
    let run_id = session.run_id.clone();
    let log_dir = Path::new(".drover").join("runs").join(&run_id);
    let sink: Arc<dyn Sink> = if args.json {
        Arc::new(report::Ndjson)
    } else if std::io::stderr().is_terminal() {
        Arc::new(report::Bars::new())
    } else {
        Arc::new(report::Lines)
    };
    let sink = session.journaled(sink, &site, &plan, &log_dir)?;
    let rollout = Rollout {
        transport,
        plan: plan.clone(),
        site,
        sink,
        gate: Arc::new(TerminalGate),
        run_id,
        log_dir,
        max_connections: args.max_connections,
        secrets,
        desired,
        cancel: session.cancel.clone(),
        release: session.release_text(),
        guard: session.guard_text(),
        lock_at_step: session.lock_at_step(),
        held_to_end: session.held_to_end(),
        planning,
    };
    let summary = session.block_on(rollout::run(rollout));
    if !args.json {
        for (host, service, log) in &summary.failures {
            errln!("failed: {service} on {host}, log: {log}");
        }
        for (host, why) in &summary.refused {
            errln!(
                "refused: {host} could not be locked as it was read during the run ({why}); \
                 what ran is recorded; run `deploy apply` again once the other run is over"
            );
        }
    }
    // Planned as the hosts were read, and nothing to change after all (a step started before
    // its host was read and found it converged ran nothing).
    let ran = summary.succeeded + summary.failed + summary.not_started;
    if planned_during && ran == 0 && summary.converged() && !args.json {
        outln!("Nothing to change.");
    }
    if let Some(ended) = session.finish(&summary) {
        return Ok(exit(ended));
    }
    Ok(if summary.converged() {
        code::OK
    } else {
        code::FAILED
    })
}

/// The site, its plan, what each host must run, the run's secrets, and the transport the
/// rollout goes on with.
struct Ready {
    site: Site,
    plan: Plan,
    transport: RunTransport,
    desired: Desired,
    secrets: Secrets,
    /// The hosts and the selection a plan made during the run is made from (not for a saved
    /// plan, which is carried out as saved).
    planner: Option<(crate::inventory::Hosts, plan::Selection)>,
}

fn fresh(args: &ApplyArgs, session: &Session) -> Result<Ready, Error> {
    let mut site = site::load(&args.target)?;
    super::safety::accept_new_host_keys(&mut site, args.accept_new_host_keys);
    let only = super::plan::selection(&site, &args.only)?;
    let on = super::plan::selector(&args.on)?;
    let (l, selection) = locked(site, session, |site, hosts| {
        let mut selection = only;
        selection.hosts = super::plan::on_hosts(on.as_ref(), site, hosts)?;
        Ok(selection)
    })?;
    let mut selection = selection;
    let mut plan = plan::plan(&l.site, &l.hosts, &l.observed, &l.desired, &selection)?;
    if args.repair {
        plan = session.block_on(rollout::plan_repairs(
            Arc::new(l.site.clone()),
            &l.hosts,
            &l.observed,
            &l.desired,
            &mut selection,
            plan,
            l.transport.clone(),
            args.max_connections,
            Arc::new(l.secrets.clone()),
        ))?;
    }
    Ok(l.ready(plan, Some(selection)))
}

/// Everything a plan is made or checked against, the locks taken.
struct Locked {
    site: Site,
    hosts: crate::inventory::Hosts,
    observed: Vec<crate::state::Observed>,
    transport: RunTransport,
    desired: Desired,
    secrets: Secrets,
}

impl Locked {
    /// `selection`: what a fresh plan was made for (`None` for a saved plan).
    fn ready(self, plan: Plan, selection: Option<plan::Selection>) -> Ready {
        Ready {
            site: self.site,
            plan,
            transport: self.transport,
            desired: self.desired,
            secrets: self.secrets,
            planner: selection.map(|s| (self.hosts, s)),
        }
    }
}

/// Reads the secrets (a missing one stops the run before anything runs), resolves the hosts
/// and what each must run, chooses what may change (`choose`: the session keeps the
/// connections of the hosts stepped first), takes the locks and reads what each host runs.
fn locked(
    site: Site,
    session: &Session,
    choose: impl FnOnce(&Site, &crate::inventory::Hosts) -> Result<plan::Selection, Error>,
) -> Result<(Locked, plan::Selection), Error> {
    let secrets = Secrets::load(&site)?;
    let hosts = super::resolve_for_plan(&site)?;
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let selection = choose(&site, &hosts)?;
    let transport = session.lock(&site, &hosts, &selection, &desired)?;
    let observed = session.observe(&transport, &site, &hosts, &desired);
    let locked = Locked {
        site,
        hosts,
        observed,
        transport,
        desired,
        secrets,
    };
    Ok((locked, selection))
}

/// The hosts a saved plan has steps on.
fn stepped(plan: &Plan, hosts: &crate::inventory::Hosts) -> plan::Selection {
    let ids = plan
        .services
        .iter()
        .flat_map(|s| s.each_step())
        .filter_map(|step| hosts.find(&step.host))
        .collect();
    plan::Selection {
        hosts: Some(ids),
        ..Default::default()
    }
}

/// A saved plan is carried out as saved, once the site, inventory and host state are shown
/// to be what they were when it was made.
fn saved(args: &ApplyArgs, session: &Session) -> Result<Ready, Error> {
    if !args.only.is_empty() {
        return Err(Error::Usage {
            reason: "--only does not apply to a saved plan".into(),
            help: "the plan already says what changes: make it with `deploy plan --only … --out`"
                .into(),
        });
    }
    if args.repair {
        return Err(Error::Usage {
            reason: "--repair does not apply to a saved plan".into(),
            help: "the plan already says which hosts are repaired: make it with `deploy plan \
                   --repair --out`"
                .into(),
        });
    }
    if !args.on.is_empty() {
        return Err(Error::Usage {
            reason: "--on does not apply to a saved plan".into(),
            help:
                "the plan already says which hosts change: make it with `deploy plan --on … --out`"
                    .into(),
        });
    }
    let text = std::fs::read(&args.target).map_err(|e| Error::Read {
        path: args.target.clone(),
        source: e,
    })?;
    let plan: Plan = serde_json::from_slice(&text).map_err(|e| Error::BadPlan {
        path: args.target.clone(),
        reason: e.to_string(),
    })?;
    if plan.schema != plan::SCHEMA {
        return Err(Error::BadPlan {
            path: args.target.clone(),
            reason: format!("plan schema {} is not {}", plan.schema, plan::SCHEMA),
        });
    }
    // Before any host is contacted: the rollout trusts the plan's steps to hold together.
    let inconsistent = |lines: Vec<String>| Error::Inconsistent {
        plan: args.target.clone(),
        lines: lines.join("\n  "),
    };
    let wrong = plan.inconsistencies();
    if !wrong.is_empty() {
        return Err(inconsistent(wrong));
    }
    let mut site = site::load(Path::new(&plan.site_file))?;
    super::safety::accept_new_host_keys(&mut site, args.accept_new_host_keys);
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
    let (l, _) = locked(site, session, |_, hosts| Ok(stepped(&plan, hosts)))?;
    let (hosts, observed) = (&l.hosts, &l.observed);
    let class_names: Vec<String> = l.site.classes.iter().map(|c| c.name.clone()).collect();
    drift.extend(plan::drift(&plan.hosts, hosts, observed, &class_names));
    if !drift.is_empty() {
        drift.extend(session.own_drift(&plan));
        return Err(Error::Drift {
            plan: args.target.clone(),
            changes: drift.join("\n  "),
        });
    }
    Ok(l.ready(plan, None))
}

fn is_saved_plan(path: &Path) -> bool {
    let head = std::fs::read(path)
        .map(|b| b.into_iter().find(|c| !c.is_ascii_whitespace()))
        .unwrap_or(None);
    head == Some(b'{')
}

/// The exit code of a run that ended early.
fn exit(ended: Ended) -> u8 {
    match ended {
        Ended::Interrupted => code::INTERRUPTED,
        Ended::JournalFailed => code::ENVIRONMENT,
        Ended::LockLost => code::LOCK_LOST,
    }
}

/// Asks on a terminal, refuses without one unless `--yes`.
fn confirm(args: &ApplyArgs, plan: &Plan) -> Result<(), Error> {
    let tty = std::io::stdin().is_terminal();
    let confirms = plan
        .services
        .iter()
        .any(|s| s.policy.pause == crate::site::Pause::Confirm && s.waves.len() > 1);
    if confirms && !tty {
        return Err(Error::Refused {
            reason: "a policy pauses with \"confirm\" and there is no terminal to ask on".into(),
            help: "run it from a terminal, or use a policy with a timed pause".into(),
        });
    }
    if args.yes {
        return Ok(());
    }
    if !tty {
        return Err(Error::Refused {
            reason: "not a terminal, and --yes was not given".into(),
            help: "review `deploy plan`, then run `deploy apply --yes`".into(),
        });
    }
    if ask("Apply this plan?") {
        Ok(())
    } else {
        Err(Error::Refused {
            reason: "not confirmed".into(),
            help: "nothing was changed".into(),
        })
    }
}

fn ask(question: &str) -> bool {
    err!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let answer = crate::session::read_answer();
    if answer.is_empty() {
        errln!();
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Confirms `pause "confirm"` waves on the terminal.
struct TerminalGate;

impl Gate for TerminalGate {
    fn confirm(&self, service: &str, wave: usize) -> bool {
        ask(&format!("Start wave {wave} of {service}?"))
    }
}
