//! Observing hosts: `--offline` (all fresh) or reading every state file over the transport.

use super::record::{read_script, HostRecord, NO_STATE};
use super::{Observe, Observed};
use crate::inventory::Hosts;
use crate::site::Site;
use crate::transport::{Link, Output, Target, Transport, TransportError};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// `--offline`: every host is treated as fresh, nothing is contacted.
pub struct Offline;

impl Observe for Offline {
    async fn observe(&self, _site: &Site, hosts: &Hosts) -> Vec<Observed> {
        vec![Observed::Fresh; hosts.hosts.len()]
    }
}

/// Reads every host's state file, concurrently, at most `max_connections` at once, read-only.
pub struct Remote<T> {
    pub transport: Arc<T>,
    pub state_dir: String,
    pub max_connections: usize,
    /// What [`read_script`] printed on some hosts already (in the lock's command): host →
    /// output. Those hosts are not asked again.
    pub read: HashMap<String, Output>,
}

impl<T: Transport> Observe for Remote<T> {
    async fn observe(&self, _site: &Site, hosts: &Hosts) -> Vec<Observed> {
        // Links kept for later stages count against the cap (only asked when there is
        // something to read: it may close one of them).
        let unread = hosts
            .hosts
            .iter()
            .any(|h| !self.read.contains_key(&*h.name));
        let room = if unread {
            crate::transport::room(&*self.transport, self.max_connections.max(1)).await
        } else {
            1
        };
        let gate = Arc::new(Semaphore::new(room));
        let mut tasks = tokio::task::JoinSet::new();
        let mut out = vec![Observed::Fresh; hosts.hosts.len()];
        for (i, h) in hosts.hosts.enumerate() {
            if let Some(read) = self.read.get(&*h.name) {
                let observed = observed(Ok(read.clone()));
                out[i.index()] = super::unreadable::explain(observed, &self.state_dir);
                continue;
            }
            let target = Target {
                name: h.name.to_string(),
                address: h.address.to_string(),
            };
            let (transport, gate, script, dir) = (
                self.transport.clone(),
                gate.clone(),
                read_script(&self.state_dir),
                self.state_dir.clone(),
            );
            tasks.spawn(async move {
                let _permit = gate.acquire_owned().await;
                let observed = observe_one(&*transport, &target, &script).await;
                (i, super::unreadable::explain(observed, &dir))
            });
        }
        while let Some(done) = tasks.join_next().await {
            if let Ok((i, observed)) = done {
                out[i.index()] = observed;
            }
        }
        out
    }
}

async fn observe_one<T: Transport>(transport: &T, target: &Target, script: &str) -> Observed {
    let link = match transport.connect(target).await {
        Ok(link) => link,
        Err(e) => {
            return Observed::Unreachable {
                reason: e.to_string(),
            }
        }
    };
    let result = link.run(script).await;
    // Kept for the rollout when the transport keeps links (`deploy apply`).
    transport.park(&target.name, link).await;
    observed(result)
}

/// What a host runs, from what [`read_script`] printed there (`state_dir`: where it read,
/// to explain a state file it could not).
pub fn observed_from(result: Result<Output, TransportError>, state_dir: &str) -> Observed {
    super::unreadable::explain(observed(result), state_dir)
}

/// What a host runs, from the output of [`read_script`] there.
fn observed(result: Result<Output, TransportError>) -> Observed {
    match result {
        Err(e) => Observed::Unreachable {
            reason: e.to_string(),
        },
        Ok(out) if out.code == Some(NO_STATE) => Observed::Fresh,
        Ok(out) if !out.success() => Observed::Unreadable {
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        },
        Ok(out) => match HostRecord::parse(&out.stdout) {
            Ok(record) => Observed::Running {
                services: record.services,
            },
            Err(reason) => Observed::Unreadable { reason },
        },
    }
}
