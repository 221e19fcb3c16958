//! The apply stage: one `deploy apply` from its request to its outcome, around the session and
//! the rollout. [`prepare`] turns a site (or a saved plan) into a plan with the session's locks
//! held; [`Prepared::run`] shows it, asks whoever drives the run ([`Operator`]), rolls it out,
//! and ends the session (journal, store, locks). Nothing here prints: the operator is told
//! through the [`Operator`] and the session's [`Say`]; what happened comes back as an
//! [`Outcome`]. The CLI is one driver of this stage.

mod gone;
mod observe;
mod planning;
mod prepare;
mod saved;
mod select;
mod status;
mod verifying;

pub use observe::{observe, observe_on, observe_through_store, resolve, resolve_for_plan};
pub use planning::{plan, readable_secrets, PlanRequest};
pub use select::{on_hosts, selection, selector};
pub use status::{status, StatusRequest};
pub use verifying::{verify, Verification};

use crate::plan::{self, Plan};
use crate::rollout::{self, Rollout, Sink, Summary};
use crate::session::{Ended, Locked, Session};
pub use crate::session::{Say, SessionError};
use crate::site::Site;
use prepare::Ready;
use std::path::PathBuf;
use std::sync::Arc;

/// What an apply is asked to do (the flags of `deploy apply`).
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The site file, or a plan saved with `deploy plan --out` (a file starting with `{`).
    pub target: PathBuf,
    /// Do not ask before the run (`--yes`).
    pub yes: bool,
    /// Change only these services (`--only`).
    pub only: Vec<String>,
    /// Change only the hosts selected (`--on`).
    pub on: Vec<String>,
    pub max_connections: usize,
    /// First contact only: accept and record a host key not yet known (`accept-new`).
    pub accept_new_host_keys: bool,
    /// Take the site's locks whatever holds them.
    pub break_lock: bool,
    /// With a store: read every host anyway.
    pub read_hosts: bool,
    /// With `yes`: lock and read every host before anything changes.
    pub read_first: bool,
    /// Run the check of every converged host, and repair those whose check fails.
    pub repair: bool,
    /// Carry out the plan's removals (`--prune`; a site with `prune #true` always does).
    pub prune: bool,
    /// What hosts run as known elsewhere, neither locked nor read (the pull agent).
    pub elsewhere: Option<crate::session::Elsewhere>,
    /// The controller's directory; `None`: `.drover` of the working directory.
    pub controller: Option<PathBuf>,
}

impl Request {
    /// Whether the target is a saved plan rather than a site.
    pub fn is_saved_plan(&self) -> bool {
        let head = std::fs::read(&self.target)
            .map(|b| b.into_iter().find(|c| !c.is_ascii_whitespace()))
            .unwrap_or(None);
        head == Some(b'{')
    }
}

/// Whoever drives the run: shown the plan, asked before it and before each wave that pauses
/// with `confirm` ([`rollout::Gate`]), told what the rollout did.
pub trait Operator: rollout::Gate {
    /// The plan, before anything changes; `pending`: per service, planned only as the run
    /// reads its hosts; `early`: what may start before its needs are met.
    fn show(&self, plan: &Plan, pending: &[bool], early: &[bool]);
    /// Whether there is someone to ask (a terminal).
    fn can_ask(&self) -> bool;
    /// Whether to carry out the plan shown (asked only when `can_ask`, without `yes`).
    fn approve(&self) -> bool;
    /// What the rollout did, before the session ends (journal closed, locks given back).
    fn ran(&self, summary: &Summary);
}

/// How an apply ended.
#[derive(Debug, Clone, PartialEq, Eq)]
// One per apply, moved once: the summary's size (its counts) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// The plan had no step: nothing ran. `unreachable`: hosts that did not answer.
    Unchanged { unreachable: usize },
    /// The rollout ran to its end. `unchanged`: its services were planned as their hosts
    /// were read, and none had anything to change after all.
    Ran { summary: Summary, unchanged: bool },
    /// It stopped early: before anything changed, or during the rollout.
    Ended(Ended),
}

/// An [`Outcome`] as its driver's exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Everything asked for was done.
    Converged,
    /// Some hosts failed or did not answer.
    Failed,
    /// Stopped early ([`Ended`]).
    Stopped(Ended),
}

impl Outcome {
    pub fn verdict(&self) -> Verdict {
        match self {
            Outcome::Unchanged { unreachable: 0 } => Verdict::Converged,
            Outcome::Unchanged { .. } => Verdict::Failed,
            Outcome::Ran { summary, .. } if summary.converged() => Verdict::Converged,
            Outcome::Ran { .. } => Verdict::Failed,
            Outcome::Ended(ended) => Verdict::Stopped(*ended),
        }
    }

    /// Nothing was changed, and nothing had to be.
    pub fn unchanged(&self) -> bool {
        matches!(
            self,
            Outcome::Unchanged { .. }
                | Outcome::Ran {
                    unchanged: true,
                    ..
                }
        )
    }
}

/// Why an apply cannot go on. Each lower stage's error as it is; the codes of this stage's own
/// are those the CLI gave them when it made these checks (stable).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ApplyError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Site(#[from] crate::site::SiteErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Select(#[from] crate::inventory::SelectError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Desired(#[from] crate::desired::DesiredErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(crate::state::store::StoreError),
    #[error("cannot start the async runtime: {0}")]
    #[diagnostic(code(drover::cli::runtime))]
    Runtime(std::io::Error),
    #[error("{reason}")]
    #[diagnostic(code(drover::cli::usage), help("{help}"))]
    Usage { reason: String, help: String },
    #[error("unknown service `{name}` in --only")]
    #[diagnostic(code(drover::cli::unknown_service), help("{help}"))]
    UnknownService { name: String, help: String },
    #[error("refused: {reason}")]
    #[diagnostic(code(drover::cli::refused), help("{help}"))]
    Refused { reason: String, help: String },
    #[error("the saved plan {plan} no longer matches the fleet:\n  {changes}")]
    #[diagnostic(
        code(drover::cli::drift),
        help("make a new plan with `deploy plan --out`, review it, and apply that")
    )]
    Drift { plan: PathBuf, changes: String },
    #[error("{path} is not a plan saved by this version of deploy: {reason}")]
    #[diagnostic(
        code(drover::cli::bad_plan),
        help("make a new plan with `deploy plan --out`")
    )]
    BadPlan { path: PathBuf, reason: String },
    #[error("the saved plan {plan} does not hold together:\n  {lines}")]
    #[diagnostic(
        code(drover::cli::inconsistent_plan),
        help(
            "a saved plan is carried out as written: make a new one with `deploy plan --out` \
             rather than editing it"
        )
    )]
    Inconsistent { plan: PathBuf, lines: String },
    #[error("cannot read {path}: {source}")]
    #[diagnostic(code(drover::cli::read))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Takes signals over, loads the site (or the saved plan, checked against the site and the
/// hosts), locks the site and reads its hosts, and plans: nothing has changed yet. What the
/// session has to say goes to `say`.
pub fn prepare(request: Request, say: Say) -> Result<Prepared, ApplyError> {
    prepare_with(request, None, say)
}

/// As [`prepare`], for a site already loaded (`deploy undo`: an earlier run's snapshot, loaded
/// by the site stage); `request.target` names the site the operator gave.
pub fn prepare_site(request: Request, site: Site, say: Say) -> Result<Prepared, ApplyError> {
    prepare_with(request, Some(site), say)
}

fn prepare_with(request: Request, site: Option<Site>, say: Say) -> Result<Prepared, ApplyError> {
    let saved = site.is_none() && request.is_saved_plan();
    let options = crate::session::Options {
        break_lock: request.break_lock,
        max_connections: request.max_connections,
        // Every host's check runs before the plan: each is locked and read first.
        read_hosts: request.read_hosts || request.repair,
        // Nothing is confirmed before the run: hosts may be read as it goes. Not when it
        // prunes: its removals are found from every host's record, read before the run.
        stream: request.yes && !request.read_first && !request.repair && !saved && !request.prune,
        elsewhere: request.elsewhere.clone(),
        controller: request.controller.clone(),
    };
    let session = Session::begin(options, say)?;
    let (session, ready) = if saved {
        saved::ready(&request, session)?
    } else {
        prepare::fresh(&request, site, session)?
    };
    Ok(Prepared {
        session,
        request,
        ready,
    })
}

/// A plan made with the site's locks held, not carried out yet.
pub struct Prepared {
    session: Locked,
    request: Request,
    ready: Ready,
}

impl Prepared {
    /// The plan this apply carries out.
    pub fn plan(&self) -> &Plan {
        &self.ready.plan
    }

    /// The site this apply carries out.
    pub fn site(&self) -> &Site {
        &self.ready.site
    }

    /// The run's id: `.drover/runs/<run>` holds its journal and logs.
    pub fn run_id(&self) -> &str {
        self.session.run_id()
    }

    /// Shows the plan to `operator`, asks it unless `yes`, rolls the plan out with its events
    /// going to `sink` (and the journal), and ends the session: the run is then finished, or
    /// recorded as the site's unfinished one, and its locks are given back.
    pub fn run<O: Operator + 'static>(
        self,
        sink: Arc<dyn Sink>,
        operator: Arc<O>,
    ) -> Result<Outcome, ApplyError> {
        let Prepared {
            mut session,
            request,
            ready,
        } = self;
        if let Some(ended) = session.interrupted() {
            return Ok(Outcome::Ended(ended));
        }
        let Ready {
            site,
            plan,
            transport,
            desired,
            secrets,
            planner,
        } = ready;
        let secrets = Arc::new(secrets);
        let (site, desired) = (Arc::new(site), Arc::new(desired));
        // Services planned as the run reads their hosts.
        let pending = planner
            .as_ref()
            .map(|(hosts, _)| session.not_planned(&site, hosts, &plan))
            .unwrap_or_default();
        let steps = plan.steps();
        let shown = if steps == 0 { &[][..] } else { &pending[..] };
        operator.show(&plan, shown, &plan::may_start_early(&site, &plan));
        // Removals left (no `--prune`) are said by the plan shown; carried out, they are the
        // run's work too.
        if steps == 0 && plan.removals_carried_out().is_empty() {
            let unreachable = plan
                .hosts
                .iter()
                .filter(|h| !h.observed.known() && h.observed != crate::state::Observed::Unread)
                // A host gone from the inventory, read for its removals only.
                .filter(|h| !h.classes.is_empty())
                .count();
            session.nothing_to_do(unreachable == 0);
            return Ok(Outcome::Unchanged { unreachable });
        }
        if let Err(e) = confirm(&request, &plan, &*operator) {
            // A signal that left the question unanswered is an interruption, not a refusal.
            return match session.interrupted() {
                Some(ended) => Ok(Outcome::Ended(ended)),
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
        let run_id = session.run_id().to_string();
        let log_dir = session.controller().join("runs").join(&run_id);
        let (session, sink) = session.journaled(sink, &site, &plan, &log_dir)?;
        let rollout = Rollout {
            transport,
            plan: plan.clone(),
            site,
            sink,
            gate: operator.clone(),
            run_id,
            log_dir,
            max_connections: request.max_connections,
            secrets,
            desired,
            cancel: session.cancel().clone(),
            release: session.release_text(),
            guard: session.guard_text(),
            lock_at_step: session.lock_at_step(),
            held_to_end: session.held_to_end(),
            planning,
        };
        let summary = session.block_on(rollout::run(rollout));
        operator.ran(&summary);
        // Planned as the hosts were read, and nothing to change after all (a step started
        // before its host was read and found it converged ran nothing).
        let ran = summary.succeeded + summary.failed + summary.not_started;
        let unchanged = planned_during && ran == 0 && summary.converged();
        if let Some(ended) = session.finish(&summary) {
            return Ok(Outcome::Ended(ended));
        }
        Ok(Outcome::Ran { summary, unchanged })
    }
}

/// Asks the operator when it can be asked; refuses without one unless `yes`.
fn confirm(request: &Request, plan: &Plan, operator: &dyn Operator) -> Result<(), ApplyError> {
    let tty = operator.can_ask();
    let confirms = plan
        .services
        .iter()
        .any(|s| s.policy.pause == crate::site::Pause::Confirm && s.waves.len() > 1);
    if confirms && !tty {
        return Err(ApplyError::Refused {
            reason: "a policy pauses with \"confirm\" and there is no terminal to ask on".into(),
            help: "run it from a terminal, or use a policy with a timed pause".into(),
        });
    }
    if request.yes {
        return Ok(());
    }
    if !tty {
        return Err(ApplyError::Refused {
            reason: "not a terminal, and --yes was not given".into(),
            help: "review `deploy plan`, then run `deploy apply --yes`".into(),
        });
    }
    if operator.approve() {
        Ok(())
    } else {
        Err(ApplyError::Refused {
            reason: "not confirmed".into(),
            help: "nothing was changed".into(),
        })
    }
}
