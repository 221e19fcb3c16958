//! The session's third phase: the run under way, its events journaled. What the rollout is
//! handed (its cancel handle, the shell text that guards and gives back each host's lock, what
//! locks the hosts left unread), and how the run is finished ([`Journaled::finish`]).

use super::locking::RunLink;
use super::{Ended, JournalSink, Locked};
use crate::rollout::{Cancel, Level, Summary};
use crate::state::journal;
use std::sync::Arc;

/// A session whose run has started its journal ([`Locked::journaled`]).
pub struct Journaled {
    pub(super) locked: Locked,
    pub(super) journal: Arc<JournalSink>,
}

impl Journaled {
    /// The run's id: `.drover/runs/<run>`.
    pub fn run_id(&self) -> &str {
        self.locked.run_id()
    }

    /// The handle a signal (or the lost lock) stops the run through.
    pub fn cancel(&self) -> &Cancel {
        self.locked.cancel()
    }

    /// Runs `work` on the session's runtime.
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.locked.block_on(work)
    }

    /// What locks and reads the hosts left unread until their first step.
    pub fn lock_at_step(&self) -> Option<Arc<dyn crate::rollout::LockAtStep<RunLink>>> {
        self.locked.lock_at_step()
    }

    /// Shell text that gives this run's lock back on a host, for the rollout to end a host's
    /// last command with ([`Journaled::finish`] hears which hosts it was given back on).
    pub fn release_text(&self) -> Option<String> {
        let held = &self.locked.held;
        Some(held.fleet.as_ref()?.release_text(&held.holder))
    }

    /// Shell text every command of the rollout that changes a host starts with: refused there
    /// unless this run still holds the host's lock and the host has seen no newer fencing
    /// token ([`crate::state::lock::guard_script`]).
    pub fn guard_text(&self) -> Option<String> {
        let held = &self.locked.held;
        Some(held.fleet.as_ref()?.guard_text(&held.holder))
    }

    /// A run that left hosts unread holds the lock of the host it took first, alone, until it
    /// ends (not given back with that host's last step): another run of the site asks for
    /// that host first and is refused, as it would be by a run that locked every host first.
    pub fn held_to_end(&self) -> Option<Arc<str>> {
        if self.locked.unread == 0 {
            return None;
        }
        let first = self.locked.held.fleet.as_ref()?.first_taken()?;
        // Its link is kept for the release at the end (the rollout hands it back after its
        // last step): no second connection for it.
        if let Some(transport) = self.locked.transport() {
            transport.hold(Some(first.clone()));
        }
        Some(Arc::from(first))
    }

    /// After the rollout: `Some` when it was interrupted, its journal failed or the store's
    /// lock was lost; otherwise the run is finished and no longer the site's unfinished one.
    /// The locks are given back.
    pub fn finish(mut self, summary: &Summary) -> Option<Ended> {
        let held = &mut self.locked.held;
        held.reader_done();
        if let Some(fleet) = &held.fleet {
            fleet.released(&summary.released);
        }
        if let Some(ended) = held.finish_shared() {
            return Some(ended);
        }
        if let Some(error) = self.journal.error() {
            held.say(&format!("error: {error}; the run stopped starting steps"));
            return Some(Ended::JournalFailed);
        }
        if held.core.cancel.level() == Level::Running {
            if let Err(e) = journal::clear_unfinished(&held.core.root, &held.site) {
                held.say(&format!("warning: cannot mark the run finished: {e}"));
            }
            return None;
        }
        held.say(&format!(
            "interrupted: {} ok, {} failed, {} not started; journal {}. Run `deploy apply` \
             again to carry on; `deploy status` shows where it stopped.",
            summary.succeeded,
            summary.failed,
            summary.not_started,
            self.journal.path().display()
        ));
        Some(Ended::Interrupted)
    }
}
