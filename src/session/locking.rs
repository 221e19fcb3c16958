//! Taking the site's locks (the controller's, the store's lease, each host's), reading what
//! each host runs once they are taken, carrying on an unfinished run, and waiting for the run's
//! writes to the store: the part of the [`Session`] around the locks.

use super::{Ended, RunTransport, Session, SessionError, Shared};
use crate::inventory::Hosts;
use crate::rollout::kill_script;
use crate::site::Site;
use crate::state::journal;
use crate::state::lock::{Broken, FileLock, FleetLock, Holder, Liveness, Lock, LockError};
use crate::state::store::Fingerprints;
use crate::state::Observed;
use crate::transport::{AnyTransport, Kept, Link, Target, Transport};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

impl Session {
    /// Locks the site, on the controller and on every host; then looks for an unfinished run
    /// and stops what it left running. Refuses (exit 4) when someone else holds a lock.
    ///
    /// Returns the transport the rest of the run uses: the links the lock opened stay open
    /// for it (when the fleet fits under `--max-connections`; over it, those of the hosts
    /// stepped first, the cap's worth), and are closed when the session ends.
    pub fn lock(
        &self,
        site: &Site,
        hosts: &Hosts,
        selection: &crate::plan::Selection,
        desired: &dyn Fingerprints,
    ) -> Result<RunTransport, SessionError> {
        *self.site.lock().unwrap_or_else(|p| p.into_inner()) = site.name.clone();
        let me = Holder::me(&site.name, &self.run_id);
        // What the refusal points at must be there: `deploy status` names the holder of the
        // site's lock on this controller, not those of the hosts' or the store's locks.
        let site_lock = FileLock::new(&self.root, &site.name).path;
        let refused = |e: LockError| match e {
            LockError::Held { place, holder } => SessionError::Refused {
                reason: match holder {
                    // Hosts are locked whatever the site: another site on the same hosts.
                    Some(h) if h.site != site.name => format!(
                        "another `deploy apply` is running on these hosts: {place} is locked \
                         by {}, applying site {}",
                        h.describe(),
                        h.site
                    ),
                    Some(h) => format!(
                        "another `deploy apply` of site {} is running: {place} is locked by {}",
                        site.name,
                        h.describe()
                    ),
                    None => format!(
                        "{place} is locked by a holder that cannot be read (a lock being \
                         taken, or a damaged one)"
                    ),
                },
                help: format!(
                    "wait for that run to finish{}; if it is dead and its machine cannot tell \
                     (another controller), run `deploy apply --break-lock`",
                    if place == site_lock.display().to_string() {
                        " (`deploy status` names it, under `site lock:`)"
                    } else {
                        ""
                    }
                ),
            },
            LockError::Failed { place, reason } => SessionError::Refused {
                reason: format!("cannot lock site {} ({place}): {reason}", site.name),
                help: "nothing was changed; check that the directory and the hosts' state \
                       directories are writable"
                    .into(),
            },
        };
        let file = FileLock::new(&self.root, &site.name);
        let taken = self
            .runtime
            .block_on(file.acquire(&me, self.break_lock))
            .map_err(refused)?;
        self.report_broken(&taken.broken);
        {
            let mut held = self.held();
            held.holder = me.clone();
            held.file = Some(file);
        }
        // With a store: its lease lock next, and what it says of each host.
        let opened = self.runtime.block_on(Shared::open(
            site,
            &me,
            self.break_lock,
            self.cancel.clone(),
            self.say.clone(),
        ));
        let shared = match opened {
            Ok(shared) => shared,
            Err(Ok(e)) => return Err(e),
            Err(Err(e)) => return Err(refused(e)),
        };
        let unfinished = journal::unfinished(&self.root, &site.name);
        let mut known = vec![None; hosts.hosts.len()];
        let mut fence = None;
        if let Some((shared, taken)) = shared {
            self.report_broken(&taken.broken);
            let shared = self.shared.get_or_init(|| Arc::new(shared));
            fence = shared.fence().map(|f| f.revision);
            let unpublished = self.root.join(UNPUBLISHED).join(lock_file(&site.name));
            let read_all = self.read_hosts || unpublished.exists();
            known = self
                .runtime
                .block_on(shared.converged(site, hosts, desired, read_all))?;
            // The hosts an unfinished run was busy on are read whatever the store says.
            if let Ok(Some(rec)) = &unfinished {
                for step in &rec.in_flight {
                    if let Some(h) = hosts.find(&step.host) {
                        known[h] = None;
                    }
                }
            }
        }
        let transport = self
            .transport
            .get_or_init(|| {
                Arc::new(Kept::new(
                    AnyTransport::for_platform(
                        &site.platform,
                        hosts.hosts.len(),
                        self.max_connections,
                    ),
                    hosts.hosts.len(),
                    self.max_connections,
                ))
            })
            .clone();
        // With `--yes`: the hosts read as the run goes, or at their step (`unread.rs`).
        let may_stream = self.stream
            && !self.break_lock
            && self.shared.get().is_none()
            && matches!(unfinished, Ok(None))
            && !site
                .services
                .iter()
                .any(|s| matches!(s.policy.pause, crate::site::Pause::Confirm));
        let anchor = if may_stream {
            self.leave_unread(site, hosts, selection, &mut known)
        } else {
            None
        };
        let targets = targets_where(hosts, &known, Option::is_none);
        // Every connection at once, before the lock takes its first host alone.
        self.runtime.block_on(transport.warm(&targets));
        // Over the cap, the links of the hosts stepped first are kept from their lock to their
        // steps (not when carrying on a run: every host is read again then); the transport and
        // the lock keep none under a cap of one.
        let keep = if hosts.hosts.len() > self.max_connections && matches!(unfinished, Ok(None)) {
            let reading: HashSet<&str> = targets.iter().map(|t| t.name.as_str()).collect();
            crate::plan::first_hosts(site, hosts, selection)
                .into_iter()
                .map(|h| hosts.hosts[h].name.to_string())
                .filter(|name| reading.contains(name.as_str()))
                .take(self.max_connections)
                .collect()
        } else {
            Vec::new()
        };
        transport.keep_for_steps(keep.clone());
        let state_dir = site.platform.host_state_dir();
        // Each host's state file is read in the same command that locks it.
        let mut fleet = FleetLock::new(
            transport.clone(),
            targets.clone(),
            &state_dir,
            self.max_connections,
        )
        .reading(crate::state::read_script(&state_dir))
        .fenced(fence)
        .ending_hooks(crate::rollout::kill_script)
        .keeping(keep);
        // Hosts left unread are tried with the others for the first host, taken alone: the
        // same first host for every run of the site, whatever it leaves unread.
        let unread = targets_where(hosts, &known, |k| matches!(k, Some(Observed::Unread)));
        if let (Some(anchor), false) = (&anchor, unread.is_empty()) {
            fleet = fleet.unless_first(anchor.clone(), unread);
        }
        let fleet = Arc::new(fleet);
        let taken = self
            .runtime
            .block_on(fleet.acquire(&me, self.break_lock))
            .map_err(refused)?;
        // The first host by name did not answer: this run cannot hold it, and another run
        // that finds it answering would start on it. No host was left unread then.
        if fleet.read_all() {
            self.say(&format!(
                "note: {} does not answer: every host is locked and read before the run",
                anchor.as_deref().unwrap_or("the first host")
            ));
            for k in known.iter_mut() {
                if matches!(k, Some(Observed::Unread)) {
                    *k = None;
                }
            }
            self.unread.store(0, std::sync::atomic::Ordering::SeqCst);
            self.plans_as_read
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        // Links kept from here on are those the lock parked: no stage after it parks more.
        transport.stop_keeping();
        self.report_broken(&taken.broken);
        if !taken.unreachable.is_empty() {
            let names: Vec<&str> = taken.unreachable.iter().map(|(h, _)| h.as_str()).collect();
            self.say(&format!(
                "warning: not locked, since they do not answer: {}",
                names.join(", ")
            ));
        }
        self.held().fleet = Some(fleet);
        // Left alone in this run, neither read nor changed: a host not locked (even if it
        // answers later), and one where hooks an earlier run left may still run, unchecked.
        let unlocked = taken
            .unreachable
            .into_iter()
            .map(|(name, reason)| (name, format!("not locked: {reason}")));
        let unchecked = self.carry_on(site, unfinished, &transport, &targets, &state_dir);
        for (name, reason) in unlocked.chain(unchecked) {
            if let Some(h) = hosts.find(&name) {
                known[h] = Some(Observed::Unreachable { reason });
            }
        }
        *self.known.lock().unwrap_or_else(|p| p.into_inner()) = known;
        Ok(transport)
    }

    /// What every host runs, once the site is locked: each host's state file as read in the
    /// command that locked it, and read now only for hosts not locked. When an unfinished run
    /// was carried on, its hooks may have written state files until `carry_on` stopped them:
    /// then every host is read again.
    ///
    /// With a store, only the hosts it does not show converged are read; what was read is
    /// published with the desired state the run sets out to reach.
    pub fn observe(
        &self,
        transport: &RunTransport,
        site: &Site,
        hosts: &Hosts,
        desired: &dyn Fingerprints,
    ) -> Vec<Observed> {
        let carried_on = self
            .resumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let read = {
            let held = self.held();
            let read = held.fleet.as_deref().map(FleetLock::take_reads);
            read.filter(|_| !carried_on).unwrap_or_default()
        };
        let remote = crate::state::Remote {
            transport: transport.clone(),
            state_dir: site.platform.host_state_dir(),
            max_connections: self.max_connections,
            read,
        };
        // Known without reading: hosts the store shows converged, hosts not locked.
        let known = std::mem::take(&mut *self.known.lock().unwrap_or_else(|p| p.into_inner()));
        if known.iter().all(Option::is_none) && self.shared.get().is_none() {
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
        if let Some(shared) = self.shared.get() {
            shared.started(site, hosts, desired, &observed, &was_read, &self.run_id);
        }
        observed
    }

    /// Shell text that gives this run's lock back on a host, for the rollout to end a host's
    /// last command with ([`Session::finish`] hears which hosts it was given back on).
    pub fn release_text(&self) -> Option<String> {
        let held = self.held();
        Some(held.fleet.as_ref()?.release_text(&held.holder))
    }

    /// Shell text every command of the rollout that changes a host starts with: refused there
    /// unless this run still holds the host's lock and the host has seen no newer fencing
    /// token ([`crate::state::lock::guard_script`]).
    pub fn guard_text(&self) -> Option<String> {
        let held = self.held();
        Some(held.fleet.as_ref()?.guard_text(&held.holder))
    }

    /// Before a run that left hosts unread: gives the lock back on the hosts read before it
    /// that have no step and whose services stand alone (no other service's plan was made
    /// from their state), over the links kept from their lock (otherwise the rollout closes
    /// those links for its own, and giving the lock back at the end connects again). Their
    /// services need nothing and are needed by nothing: no other step depends on their state.
    pub fn release_unstepped(&self, plan: &crate::plan::Plan) {
        if self.unread.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        let Some(transport) = self.transport.get() else {
            return;
        };
        let stepped: HashSet<&str> = plan
            .services
            .iter()
            .flat_map(|s| s.each_step())
            .map(|st| &*st.host)
            .collect();
        let alone = self.alone.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let held = self.held();
        let anchor = held.fleet.as_ref().and_then(|f| f.first_taken());
        let idle: HashSet<String> = transport
            .parked_hosts()
            .into_iter()
            .filter(|h| !stepped.contains(h.as_str()) && alone.contains(h))
            .filter(|h| anchor.as_ref() != Some(h))
            .collect();
        if let (Some(fleet), false) = (held.fleet.clone(), idle.is_empty()) {
            let me = held.holder.clone();
            drop(held);
            self.runtime.block_on(fleet.release_now(&me, &idle));
        }
    }

    /// A run that left hosts unread holds the lock of the host it took first, alone, until it
    /// ends (not given back with that host's last step): another run of the site asks for
    /// that host first and is refused, as it would be by a run that locked every host first.
    pub fn held_to_end(&self) -> Option<Arc<str>> {
        if self.unread.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return None;
        }
        let held = self.held();
        let first = held.fleet.as_ref()?.first_taken()?;
        // Its link is kept for the release at the end (the rollout hands it back after its
        // last step): no second connection for it.
        if let Some(transport) = self.transport.get() {
            transport.hold(Some(first.clone()));
        }
        Some(Arc::from(first))
    }

    /// What locks and reads the hosts left unread until their first step, for the rollout;
    /// `None` when every host was read before the run.
    pub fn lock_at_step(&self) -> Option<Arc<dyn crate::rollout::LockAtStep<RunLink>>> {
        if self.unread.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return None;
        }
        let held = self.held();
        Some(Arc::new(AtStep {
            fleet: held.fleet.clone()?,
            me: held.holder.clone(),
            say: self.say.clone(),
        }))
    }

    /// An unfinished run of this site (`unfinished`, as read once the controller's lock was
    /// taken): say where it stopped, and kill the hooks it may have left running on the hosts
    /// of its steps in flight (a run that died, rather than stopped on a signal, does not get
    /// to stop them). Returns the hosts that could not be checked, and why: this run leaves
    /// them alone.
    fn carry_on(
        &self,
        site: &Site,
        unfinished: Result<Option<journal::RunRecord>, String>,
        transport: &RunTransport,
        targets: &[Target],
        state_dir: &str,
    ) -> Vec<(String, String)> {
        let mut unchecked = Vec::new();
        let rec = match unfinished {
            Ok(Some(rec)) => rec,
            Ok(None) => return unchecked,
            Err(e) => {
                self.say(&format!(
                    "warning: the unfinished run of {} cannot be read: {e}",
                    site.name
                ));
                return unchecked;
            }
        };
        self.say(&format!("carrying on: run {}", rec.describe()));
        if rec.site_digest.as_deref().is_some_and(|d| d != site.digest) {
            self.say(
                "note: the site files changed since that run started; the new site is applied",
            );
        }
        let Some(holder) = rec
            .holder
            .clone()
            .filter(|h| h.liveness() != Liveness::Alive)
        else {
            *self.resumed.lock().unwrap_or_else(|p| p.into_inner()) = Some(rec);
            return unchecked;
        };
        let mut hosts: Vec<&Target> = rec
            .in_flight
            .iter()
            .filter_map(|s| targets.iter().find(|t| t.name == s.host))
            .collect();
        hosts.dedup_by(|a, b| a.name == b.name);
        let script = kill_script(state_dir, &holder);
        for target in hosts {
            let killed = self.runtime.block_on(async {
                let link = transport.connect(target).await.ok()?;
                let out = tokio::time::timeout(Duration::from_secs(30), link.run(&script)).await;
                match out {
                    Ok(Ok(_)) => transport.park(&target.name, link).await,
                    _ => link.close().await,
                }
                let out = out.ok()?.ok()?;
                // The count is the last line (a shell's start-up files may print before it).
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())?
                    .trim()
                    .parse::<usize>()
                    .ok()
            });
            match killed {
                Some(0) => {}
                Some(n) => self.say(&format!(
                    "stopped {n} hook{} that run {} left running on {}",
                    if n == 1 { "" } else { "s" },
                    rec.run,
                    target.name
                )),
                None => {
                    self.say(&format!(
                        "warning: could not check {} for hooks run {} left running: it is left \
                         alone in this run; stop them there before the next `deploy apply` \
                         (`ps -ef` on the host; their process group ids are in {})",
                        target.name,
                        rec.run,
                        crate::state::lock::hooks_dir(state_dir)
                    ));
                    unchecked.push((
                        target.name.clone(),
                        format!("hooks run {} left running may still run there", rec.run),
                    ));
                }
            }
        }
        *self.resumed.lock().unwrap_or_else(|p| p.into_inner()) = Some(rec);
        unchecked
    }
}

/// The session's host lock, as the rollout takes it for a host left unread until its step.
struct AtStep {
    fleet: Arc<FleetLock<Kept<AnyTransport>>>,
    me: Holder,
    /// Where a lock taken over from a dead holder is said.
    say: super::Say,
}

pub(super) type RunLink = <Kept<AnyTransport> as Transport>::Link;

impl crate::rollout::LockAtStep<RunLink> for AtStep {
    fn lock_and_read<'a>(
        &'a self,
        link: &'a RunLink,
        host: &'a Target,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Observed, String>> + Send + 'a>>
    {
        Box::pin(async move {
            let (observed, broken) = self.fleet.lock_at_step(link, host, &self.me).await?;
            for line in broken_lines(broken.as_slice()) {
                (self.say)(&line);
            }
            Ok(observed)
        })
    }
}

/// `.drover/unpublished/<site>`: a run's writes to the store did not all reach it; the next
/// apply reads every host (and publishes what it reads), then removes it.
pub(super) const UNPUBLISHED: &str = "unpublished";

fn lock_file(site: &str) -> String {
    crate::state::lock::file_name(site)
}

impl Session {
    /// With a store: waits for the run's writes; `Some(LockLost)` when the lock was lost.
    /// Writes that could not be made leave a mark that makes the next apply read every host.
    pub(super) fn finish_shared(&self) -> Option<Ended> {
        let shared = self.shared.get()?;
        if self
            .shared_done
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let site = self.site.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mark = self.root.join(UNPUBLISHED).join(lock_file(&site));
        let published = self.runtime.block_on(shared.flush());
        if published {
            let _ = std::fs::remove_file(&mark);
        } else {
            let made = crate::state::lock::create_dirs(&self.root.join(UNPUBLISHED))
                .and_then(|()| std::fs::write(&mark, &self.run_id));
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

impl Session {
    /// Locks that were taken over or broken, one line per holder.
    fn report_broken(&self, broken: &[Broken]) {
        for line in broken_lines(broken) {
            self.say(&line);
        }
        for b in broken.iter().filter(|b| b.hooks_ended > 0) {
            let (Some(holder), Some(host)) = (&b.holder, b.place.strip_prefix("host ")) else {
                continue;
            };
            let n = b.hooks_ended;
            self.say(&format!(
                "stopped {n} hook{} that run {} left running on {host}",
                if n == 1 { "" } else { "s" },
                holder.run
            ));
        }
    }
}

/// The hosts whose entry in `known` (what is known of each without reading it) is `pick`ed,
/// as targets.
fn targets_where(
    hosts: &Hosts,
    known: &[Option<Observed>],
    pick: impl Fn(&Option<Observed>) -> bool,
) -> Vec<Target> {
    hosts
        .hosts
        .iter()
        .zip(known)
        .filter(|(_, k)| pick(k))
        .map(|(h, _)| Target {
            name: h.name.to_string(),
            address: h.address.to_string(),
        })
        .collect()
}

/// What the operator is told of the locks `broken` (taken over from a dead holder, or broken
/// with `--break-lock`): a line per holder, with the places its locks were.
fn broken_lines(broken: &[Broken]) -> Vec<String> {
    let mut seen: Vec<(&Option<Holder>, bool, Vec<&str>)> = Vec::new();
    for b in broken {
        match seen
            .iter_mut()
            .find(|(h, s, _)| *h == &b.holder && *s == b.stale)
        {
            Some((_, _, places)) => places.push(&b.place),
            None => seen.push((&b.holder, b.stale, vec![&b.place])),
        }
    }
    seen.into_iter()
        .map(|(holder, stale, places)| {
            let whose = holder
                .as_ref()
                .map_or("a lock whose holder cannot be read".into(), |h| {
                    format!("the lock of {}", h.describe())
                });
            let places = if places.len() > 3 {
                format!("{}, … ({} places)", places[..3].join(", "), places.len())
            } else {
                places.join(", ")
            };
            if stale {
                format!("took over {whose}: its process is gone ({places})")
            } else {
                format!("--break-lock: broke {whose} ({places})")
            }
        })
        .collect()
}
