//! What a session holds once the controller's lock is taken, and gives back when it is
//! dropped, whatever the phase and however the run ends (but a third signal): the hosts' locks,
//! the store's lease (once the run's writes to it are waited for), the links, the controller's
//! lock, in that order.

use super::locking::UNPUBLISHED;
use super::{Core, Ended, RunTransport, Shared};
use crate::state::lock::{FileLock, FleetLock, Holder, Lock, LockError};
use crate::transport::{AnyTransport, Kept};
use std::sync::Arc;

pub(super) struct Held {
    pub core: Core,
    /// The site's name.
    pub site: String,
    pub holder: Holder,
    /// The controller's lock (`None` once given back).
    pub file: Option<FileLock>,
    /// The hosts' locks, once taken.
    pub fleet: Option<Arc<FleetLock<Kept<AnyTransport>>>>,
    /// The shared store, when the platform names one (its lease lock taken).
    pub shared: Option<Arc<Shared>>,
    /// The run's writes to the store were waited for (once, by `finish` or on drop).
    pub shared_done: bool,
    /// The links of the run, once made; closed once the locks are given back.
    pub transport: Option<RunTransport>,
    /// What reads the hosts left unread as the run goes ([`super::Locked::plan_as_read`]);
    /// waited for before the locks go back.
    pub reader: Option<tokio::task::JoinHandle<()>>,
}

impl Held {
    /// Holding the controller's lock `file` as `holder`.
    pub fn new(core: Core, site: &str, holder: Holder, file: FileLock) -> Held {
        Held {
            core,
            site: site.to_string(),
            holder,
            file: Some(file),
            fleet: None,
            shared: None,
            shared_done: false,
            transport: None,
            reader: None,
        }
    }

    pub fn say(&self, text: &str) {
        self.core.say(text)
    }

    /// Waits for the reader to end (it starts nothing once the rollout is over): every host it
    /// locked is then known to the fleet's lock, which gives them back.
    pub fn reader_done(&mut self) {
        if let Some(task) = self.reader.take() {
            let _ = self.core.runtime.block_on(task);
        }
    }

    /// With a store: waits for the run's writes; `Some(LockLost)` when the lock was lost.
    /// Writes that could not be made leave a mark that makes the next apply read every host.
    pub fn finish_shared(&mut self) -> Option<Ended> {
        let shared = self.shared.clone()?;
        if std::mem::replace(&mut self.shared_done, true) {
            return None;
        }
        let root = &self.core.root;
        let mark = root
            .join(UNPUBLISHED)
            .join(crate::state::lock::file_name(&self.site));
        let published = self.core.runtime.block_on(shared.flush());
        if published {
            let _ = std::fs::remove_file(&mark);
        } else {
            let made = crate::state::lock::create_dirs(&root.join(UNPUBLISHED))
                .and_then(|()| std::fs::write(&mark, &self.core.run_id));
            if let Err(e) = made {
                self.say(&format!("warning: cannot write {}: {e}", mark.display()));
            }
            self.say(
                "warning: some of this run's state did not reach etcd; the next `deploy apply` \
                 reads every host and publishes what it finds",
            );
        }
        // Why was said when it was lost, once.
        shared.lost()?;
        self.say(
            "stopped: the site's lock in etcd was lost (said above); every step that ran is \
             recorded on its host and in the journal; run `deploy apply` again once etcd answers",
        );
        Some(Ended::LockLost)
    }
}

impl Drop for Held {
    /// Gives the locks back: the hosts' first, then the store's, then the controller's.
    fn drop(&mut self) {
        self.reader_done();
        let runtime = &self.core.runtime;
        if let Some(fleet) = self.fleet.take() {
            if let Err(LockError::Failed { reason, .. } | LockError::Held { place: reason, .. }) =
                runtime.block_on(fleet.release(&self.holder))
            {
                self.say(&format!(
                    "warning: the site's lock is left behind: {reason}; the next `deploy apply` \
                     from this machine takes it over"
                ));
            }
        }
        if let Some(shared) = self.shared.clone() {
            // What was queued for the store (a run with nothing to do publishes what it read).
            self.finish_shared();
            if let Err(LockError::Failed { reason, .. } | LockError::Held { place: reason, .. }) =
                self.core.runtime.block_on(shared.release(&self.holder))
            {
                self.say(&format!(
                    "warning: the site's lock in etcd was not given back, its lease frees it \
                     within the platform's lock-ttl; {reason}"
                ));
            }
        }
        if let Some(transport) = &self.transport {
            self.core.runtime.block_on(transport.close_all());
        }
        if let Some(file) = self.file.take() {
            if let Err(e) = self.core.runtime.block_on(file.release(&self.holder)) {
                self.say(&format!("warning: {e}"));
            }
        }
    }
}
