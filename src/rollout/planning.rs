//! Services planned while the run goes on ([`Planning`]): `deploy apply --yes` starts the
//! services whose hosts are read and plans the others as their hosts are read (level 1 of
//! "connecting each host once", book: design decisions). The engine is handed each new plan;
//! who reads the hosts is its caller's business (the session's).

use crate::plan::Plan;
use crate::state::Observed;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// The services of a rollout's plan not planned yet, and where their plans come from.
pub struct Planning {
    /// Per service of the plan (by its index in `Plan::services`): not planned yet. Its steps
    /// in the plan are placeholders (one per host it may change): none starts, and none of
    /// them gives a host's lock back with its last command, until a [`Planned::Plan`] plans
    /// the service, or until its needs hold first: it then starts under its placeholders,
    /// each stepped once its host is read ([`Planned::Read`]) and decided as an unread step
    /// is. The hosts left unread in the plan are the caller's to read: no step reads them.
    pub pending: Vec<bool>,
    /// New plans and refusals, in the order they were made.
    pub updates: UnboundedReceiver<Planned>,
}

/// What the caller learnt while the rollout runs.
#[derive(Debug)]
pub enum Planned {
    /// The plan made again from every host read so far: `ready` (indices in
    /// `plan.services`) are the pending services it plans now, every host they are planned
    /// from having been read. Services planned before keep the plan they run under.
    Plan { plan: Arc<Plan>, ready: Vec<usize> },
    /// A host left unread before the run was locked and read (or found not to answer): sent
    /// before any [`Planned::Plan`] made from it. A service started before it was planned
    /// steps the host from then on.
    Read { host: Arc<str>, observed: Observed },
    /// A host's lock was refused as it was read (another run holds it): nothing more starts,
    /// and the run ends not converged.
    Refused { host: String, reason: String },
}
