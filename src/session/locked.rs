//! The session's second phase: the site locked (on the controller, in the store, on its
//! hosts), what each host runs read or known, an unfinished run carried on. What can be done
//! before the run: read the hosts, say what was drifted or has nothing left to do, give back
//! the locks of hosts with no step, start reading the hosts left unread, and start the run's
//! journal ([`Locked::journaled`]).

use super::held::Held;
use super::locking::{AtStep, RunLink};
use super::{plan_digest, Ended, JournalSink, Journaled, RunContext, RunTransport, SessionError};
use crate::inventory::Hosts;
use crate::plan::Plan;
use crate::rollout::{Cancel, Sink};
use crate::site::Site;
use crate::state::journal::{self, Journal, RunRecord};
use crate::state::lock::FleetLock;
use crate::state::store::Fingerprints;
use crate::state::Observed;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// A session with the site's locks taken ([`super::Session::lock`]).
pub struct Locked {
    pub(super) held: Held,
    /// The unfinished run found when the locks were taken.
    pub(super) resumed: Option<RunRecord>,
    /// Hosts left unread until their first step (see [`super::Options::stream`]).
    pub(super) unread: usize,
    /// Hosts were left unread for the run to read as it goes, planning each service once its
    /// hosts are read ([`Locked::plan_as_read`]), rather than at their steps.
    pub(super) plans_as_read: bool,
    /// When streaming: the hosts that may be left unread (`plan::deferrable`).
    pub(super) alone: HashSet<String>,
    /// Per host: what the store says it runs, for hosts not read (`None`: read it); taken by
    /// [`Locked::observe`].
    pub(super) known: Vec<Option<Observed>>,
}

impl Locked {
    /// Says `text` to the operator.
    pub fn say(&self, text: &str) {
        self.held.say(text)
    }

    /// The run's id: `.drover/runs/<run>`.
    pub fn run_id(&self) -> &str {
        &self.held.core.run_id
    }

    /// The controller's directory (`.drover`, or the one [`super::Options::controller`] names).
    pub fn controller(&self) -> &std::path::Path {
        &self.held.core.root
    }

    /// The handle a signal (or the lost lock) stops the run through.
    pub fn cancel(&self) -> &Cancel {
        &self.held.core.cancel
    }

    /// Runs `work` on the session's runtime.
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.held.core.runtime.block_on(work)
    }

    pub(super) fn transport(&self) -> Option<&RunTransport> {
        self.held.transport.as_ref()
    }

    /// `Some` if a signal came before the rollout started (nothing was changed): interrupted,
    /// or the store's lock lost.
    pub fn interrupted(&self) -> Option<Ended> {
        self.held.core.cancel.stopping().then(|| {
            if self.held.shared.as_ref().and_then(|s| s.lost()).is_some() {
                self.say("stopped before anything was changed");
                return Ended::LockLost;
            }
            self.say("interrupted before anything was changed");
            Ended::Interrupted
        })
    }

    /// For a saved plan that drifted: a line saying when the drift is this plan's own,
    /// half-done by an interrupted run.
    pub fn own_drift(&self, plan: &Plan) -> Option<String> {
        let rec = self.resumed.as_ref()?;
        (rec.plan_digest.as_deref() == Some(&plan_digest(plan))).then(|| {
            format!(
                "run {} carried out part of this plan and was interrupted; to finish it, apply \
                 the site ({}): its plan starts from where the hosts are now",
                rec.run, plan.site_file
            )
        })
    }

    /// Nothing to change: an unfinished run has nothing left either (when every host
    /// answered). The locks are given back.
    pub fn nothing_to_do(mut self, every_host_answered: bool) {
        if let (Some(rec), true) = (self.resumed.take(), every_host_answered) {
            if journal::clear_unfinished(&self.held.core.root, &self.held.site).is_ok() {
                self.say(&format!(
                    "run {} has nothing left to do: it is finished",
                    rec.run
                ));
            }
        }
    }

    /// What every host runs, once the site is locked: each host's state file as read in the
    /// command that locked it, and read now only for hosts not locked. When an unfinished run
    /// was carried on, its hooks may have written state files until it was stopped: then
    /// every host is read again.
    ///
    /// With a store, only the hosts it does not show converged are read; what was read is
    /// published with the desired state the run sets out to reach.
    pub fn observe(
        &mut self,
        transport: &RunTransport,
        site: &Site,
        hosts: &Hosts,
        desired: &dyn Fingerprints,
    ) -> Vec<Observed> {
        let carried_on = self.resumed.is_some();
        let read = self.held.fleet.as_deref().map(FleetLock::take_reads);
        let read = read.filter(|_| !carried_on).unwrap_or_default();
        let remote = crate::state::Remote {
            transport: transport.clone(),
            state_dir: site.platform.host_state_dir(),
            max_connections: self.held.core.options.max_connections,
            read,
        };
        // Known without reading: hosts the store shows converged, hosts not locked.
        let known = std::mem::take(&mut self.known);
        if known.iter().all(Option::is_none) && self.held.shared.is_none() {
            return self.block_on(crate::state::Observe::observe(&remote, site, hosts));
        }
        let to_read = crate::state::store::to_read(&known);
        let subset = hosts.subset(&to_read, site.classes.len());
        let read = self.block_on(crate::state::Observe::observe(&remote, site, &subset));
        // Published as seen: the hosts read, and those that did not answer the lock.
        let was_read: Vec<bool> = known
            .iter()
            .map(|k| k.as_ref().is_none_or(|o| !o.known()))
            .collect();
        let observed = crate::state::store::merge(known, read);
        if let Some(shared) = &self.held.shared {
            let run = &self.held.core.run_id;
            shared.started(site, hosts, desired, &observed, &was_read, run);
        }
        observed
    }

    /// Before a run that left hosts unread: gives the lock back on the hosts read before it
    /// that have no step and that may be left unread, over the links kept from their lock
    /// (otherwise the rollout closes those links for its own, and giving the lock back at the
    /// end connects again), as an unread step that finds nothing to do gives its host's back
    /// at once. A service that needs one of them counts it healthy from what was read (read
    /// before the run, a dependent handed its addresses plans from it), as it counts a host
    /// whose lock its last step gave back during the run; another run of the site is kept out
    /// by the first host by name, held to the end.
    pub fn release_unstepped(&self, plan: &Plan) {
        if self.unread == 0 {
            return;
        }
        let (Some(transport), Some(fleet)) = (self.transport(), &self.held.fleet) else {
            return;
        };
        let stepped: HashSet<&str> = plan
            .services
            .iter()
            .flat_map(|s| s.each_step())
            .map(|st| &*st.host)
            .chain(plan.removals_carried_out().iter().map(|r| &*r.host))
            .collect();
        let anchor = fleet.first_taken();
        let idle: HashSet<String> = transport
            .parked_hosts()
            .into_iter()
            .filter(|h| !stepped.contains(h.as_str()) && self.alone.contains(h))
            .filter(|h| anchor.as_ref() != Some(h))
            .collect();
        if !idle.is_empty() {
            self.block_on(fleet.release_now(&self.held.holder, &idle));
        }
    }

    /// What locks and reads the hosts left unread until their first step, for the rollout;
    /// `None` when every host was read before the run.
    pub fn lock_at_step(&self) -> Option<Arc<dyn crate::rollout::LockAtStep<RunLink>>> {
        if self.unread == 0 {
            return None;
        }
        Some(Arc::new(AtStep {
            fleet: self.held.fleet.clone()?,
            me: self.held.holder.clone(),
            say: self.held.core.say.clone(),
        }))
    }

    /// Starts the run's journal: wraps `sink` with it (and, with a store, with what publishes
    /// each step's record), and records the run as the site's unfinished one until it ends.
    pub fn journaled(
        self,
        sink: Arc<dyn Sink>,
        site: &Site,
        plan: &Plan,
        log_dir: &Path,
    ) -> Result<(Journaled, Arc<dyn Sink>), SessionError> {
        let write = |source| SessionError::Write {
            path: log_dir.join(journal::JOURNAL_FILE),
            source,
        };
        let journal = Journal::create(log_dir).map_err(write)?;
        let core = &self.held.core;
        journal::set_unfinished(&core.root, &site.name, &core.run_id, journal.path())
            .map_err(write)?;
        let journal = Arc::new(JournalSink::new(
            journal,
            sink,
            core.cancel.clone(),
            RunContext {
                site_file: plan.site_file.clone(),
                site_digest: plan.site_digest.clone(),
                plan_digest: plan_digest(plan),
                holder: self.held.holder.clone(),
                resumes: self.resumed.as_ref().map(|r| r.run.clone()),
            },
        ));
        let sink = match &self.held.shared {
            Some(shared) => shared.publishing(journal.clone(), plan),
            None => journal.clone(),
        };
        Ok((
            Journaled {
                locked: self,
                journal,
            },
            sink,
        ))
    }
}
