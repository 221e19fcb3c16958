//! Taking the site's locks, one job at a time: the controller's lock, the store's lease (and
//! what it says of each host), which hosts are left unread, the hosts' locks (each host's state
//! read in the same command), and carrying on an unfinished run: [`Session::lock`], which turns
//! a begun session into a [`Locked`] one.

use super::held::Held;
use super::unread::{leave_unread, Unread};
use super::{Core, Locked, RunTransport, Session, SessionError, Shared};
use crate::inventory::Hosts;
use crate::plan::Selection;
use crate::rollout::{kill_outcome, kill_script};
use crate::site::Site;
use crate::state::journal::{self, RunRecord};
use crate::state::lock::{
    Broken, FileLock, FleetLock, Holder, Liveness, Lock, LockError, NotEnded,
};
use crate::state::store::Fingerprints;
use crate::state::Observed;
use crate::transport::{AnyTransport, Kept, Link, Target, Transport};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The unfinished run of the site, as read once the controller's lock is taken.
type Unfinished = Result<Option<RunRecord>, String>;

impl Session {
    /// Locks the site, on the controller and on every host; then looks for an unfinished run
    /// and stops what it left running. Refuses (exit 4) when someone else holds a lock.
    ///
    /// The locked session keeps the transport the rest of the run uses ([`Locked::observe`]
    /// and the rollout): the links the lock opened stay open for it (when the fleet fits under
    /// `--max-connections`; over it, those of the hosts stepped first, the cap's worth), and
    /// are closed when the session ends.
    pub fn lock(
        self,
        site: &Site,
        hosts: &Hosts,
        selection: &Selection,
        desired: &dyn Fingerprints,
    ) -> Result<(Locked, RunTransport), SessionError> {
        let me = Holder::me(&site.name, &self.core.run_id);
        let file = lock_controller(&self.core, site, &me)?;
        let mut held = Held::new(self.core, &site.name, me, file);
        // With a store: its lease lock next, and what it says of each host.
        let unfinished = journal::unfinished(&held.core.root, &site.name);
        let (mut known, fence) = open_store(&mut held, site, hosts, desired, &unfinished)?;
        let max_connections = held.core.options.max_connections;
        let transport = Arc::new(Kept::new(
            AnyTransport::for_platform(&site.platform, hosts.hosts.len(), max_connections),
            hosts.hosts.len(),
            max_connections,
        ));
        held.transport = Some(transport.clone());
        // With `--yes`: the hosts read as the run goes, or at their step (`unread.rs`).
        let options = &held.core.options;
        let may_stream = options.stream
            && !site.prune
            && !options.break_lock
            && held.shared.is_none()
            && matches!(unfinished, Ok(None))
            && !site
                .services
                .iter()
                .any(|s| matches!(s.policy.pause, crate::site::Pause::Confirm));
        let mut unread = Unread::default();
        let anchor = if may_stream {
            leave_unread(
                max_connections,
                site,
                hosts,
                selection,
                &mut known,
                &mut unread,
            )
        } else {
            None
        };
        let hosts_lock = HostsLock {
            site,
            hosts,
            selection,
            carrying_on: !matches!(unfinished, Ok(None)),
            anchor,
            fence,
        };
        let (targets, unlocked, not_ended) =
            hosts_lock.take(&mut held, &transport, &mut known, &mut unread)?;
        let mut locked = Locked {
            held,
            resumed: None,
            unread: unread.count,
            plans_as_read: unread.plans_as_read,
            alone: unread.alone,
            known: Vec::new(),
        };
        // Left alone in this run, neither read nor changed: a host not locked (even if it
        // answers later), and one where hooks an earlier run left may still run, unchecked.
        let unlocked = unlocked
            .into_iter()
            .map(|(name, reason)| (name, format!("not locked: {reason}")));
        let state_dir = site.platform.host_state_dir();
        // A host left alone for processes it could not end is not looked at again.
        let targets: Vec<Target> = targets
            .into_iter()
            .filter(|t| !not_ended.iter().any(|(h, _)| *h == t.name))
            .collect();
        let unchecked = locked.carry_on(site, unfinished, &transport, &targets, &state_dir);
        for (name, reason) in unlocked.chain(not_ended).chain(unchecked) {
            if let Some(h) = hosts.find(&name) {
                known[h.index()] = Some(Observed::Unreachable { reason });
            }
        }
        locked.known = known;
        Ok((locked, transport))
    }
}

/// Why a lock was refused, as the operator is told: `site_lock` is the controller's lock, the
/// one `deploy status` names the holder of.
fn refusal(site: &str, site_lock: &Path, e: LockError) -> SessionError {
    match e {
        LockError::Held { place, holder } => SessionError::Refused {
            reason: match holder {
                // Hosts are locked whatever the site: another site on the same hosts.
                Some(h) if h.site != site => format!(
                    "another `deploy apply` is running on these hosts: {place} is locked \
                     by {}, applying site {}",
                    h.describe(),
                    h.site
                ),
                Some(h) => format!(
                    "another `deploy apply` of site {site} is running: {place} is locked by {}",
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
            reason: format!("cannot lock site {site} ({place}): {reason}"),
            help: "nothing was changed; check that the directory and the hosts' state \
                   directories are writable"
                .into(),
        },
    }
}

/// The refusal of a lock of `site`, held or failed.
fn refused<'a>(core: &'a Core, site: &'a Site) -> impl Fn(LockError) -> SessionError + 'a {
    let site_lock = FileLock::new(&core.root, &site.name).path;
    move |e| refusal(&site.name, &site_lock, e)
}

/// The controller's lock, `.drover/locks/<site>.lock`.
fn lock_controller(core: &Core, site: &Site, me: &Holder) -> Result<FileLock, SessionError> {
    let file = FileLock::new(&core.root, &site.name);
    let taken = core
        .runtime
        .block_on(file.acquire(me, core.options.break_lock))
        .map_err(refused(core, site))?;
    report_broken(&core.say, &taken.broken);
    Ok(file)
}

/// With a store: its lease lock, and per host what it says the host runs if it need not be
/// read (`None`: read it; all `None` without a store, with `--read-hosts`, after a run that
/// could not publish everything); the hosts an unfinished run was busy on are read whatever
/// it says. Also the lease's fencing token.
fn open_store(
    held: &mut Held,
    site: &Site,
    hosts: &Hosts,
    desired: &dyn Fingerprints,
    unfinished: &Unfinished,
) -> Result<(Vec<Option<Observed>>, Option<i64>), SessionError> {
    let core = &held.core;
    let opened = core.runtime.block_on(Shared::open(
        site,
        &held.holder,
        core.options.break_lock,
        core.cancel.clone(),
        core.say.clone(),
    ));
    let shared = match opened {
        Ok(shared) => shared,
        Err(Ok(e)) => return Err(e),
        Err(Err(e)) => return Err(refused(core, site)(e)),
    };
    let mut known = vec![None; hosts.hosts.len()];
    let Some((shared, taken)) = shared else {
        if let Some(elsewhere) = &core.options.elsewhere {
            known = (elsewhere.0)(site, hosts, desired);
        }
        return Ok((known, None));
    };
    report_broken(&core.say, &taken.broken);
    let shared = Arc::new(shared);
    held.shared = Some(shared.clone());
    let core = &held.core;
    let fence = shared.fence().map(|f| f.revision);
    let unpublished = core
        .root
        .join(UNPUBLISHED)
        .join(crate::state::lock::file_name(&site.name));
    let read_all = core.options.read_hosts || unpublished.exists();
    known = core
        .runtime
        .block_on(shared.converged(site, hosts, desired, read_all))?;
    if let Ok(Some(rec)) = unfinished {
        for step in &rec.in_flight {
            if let Some(h) = hosts.find(&step.host) {
                known[h.index()] = None;
            }
        }
    }
    Ok((known, fence))
}

/// The hosts' locks, as this run takes them.
struct HostsLock<'a> {
    site: &'a Site,
    hosts: &'a Hosts,
    selection: &'a Selection,
    /// An unfinished run is carried on: every host is read again, no link kept over the cap.
    carrying_on: bool,
    /// The first host by name, when hosts were left unread: taken first, alone.
    anchor: Option<String>,
    /// The store's fencing token.
    fence: Option<i64>,
}

impl HostsLock<'_> {
    /// Locks every host to read (not known from the store), reading each one's state file in
    /// the same command; the fleet's lock is then `held`'s. Returns the hosts locked, those
    /// that did not answer (with why), and those locked where processes of another run could
    /// not be ended (with why): both are left alone.
    #[allow(clippy::type_complexity)]
    fn take(
        self,
        held: &mut Held,
        transport: &RunTransport,
        known: &mut [Option<Observed>],
        unread: &mut Unread,
    ) -> Result<(Vec<Target>, Vec<(String, String)>, Vec<(String, String)>), SessionError> {
        let (site, hosts) = (self.site, self.hosts);
        let core = &held.core;
        let max_connections = core.options.max_connections;
        let targets = targets_where(hosts, known, Option::is_none);
        // Every connection at once, before the lock takes its first host alone.
        core.runtime.block_on(transport.warm(&targets));
        // Over the cap, the links of the hosts stepped first are kept from their lock to their
        // steps (not when carrying on a run: every host is read again then); the transport and
        // the lock keep none under a cap of one.
        let keep = if hosts.hosts.len() > max_connections && !self.carrying_on {
            let reading: HashSet<&str> = targets.iter().map(|t| t.name.as_str()).collect();
            let order: Vec<String> = crate::plan::first_hosts(site, hosts, self.selection)
                .into_iter()
                .map(|h| hosts.hosts[h].name.to_string())
                .filter(|name| reading.contains(name.as_str()))
                .collect();
            super::unread::stepped_first(&order, self.anchor.clone(), max_connections)
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
            max_connections,
        )
        .reading(crate::state::read_script(&state_dir))
        .fenced(self.fence)
        .ending_hooks(crate::rollout::kill_script)
        .keeping(keep);
        // Hosts left unread are tried with the others for the first host, taken alone: the
        // same first host for every run of the site, whatever it leaves unread.
        let left = targets_where(hosts, known, |k| matches!(k, Some(Observed::Unread)));
        if let (Some(anchor), false) = (&self.anchor, left.is_empty()) {
            fleet = fleet.unless_first(anchor.clone(), left);
        }
        let fleet = Arc::new(fleet);
        let taken = core
            .runtime
            .block_on(fleet.acquire(&held.holder, core.options.break_lock))
            .map_err(refused(core, site))?;
        // The first host by name did not answer: this run cannot hold it, and another run
        // that finds it answering would start on it. No host was left unread then.
        if fleet.read_all() {
            core.say(&format!(
                "note: {} does not answer: every host is locked and read before the run",
                self.anchor.as_deref().unwrap_or("the first host")
            ));
            for k in known.iter_mut() {
                if matches!(k, Some(Observed::Unread)) {
                    *k = None;
                }
            }
            unread.count = 0;
            unread.plans_as_read = false;
        }
        // Links kept from here on are those the lock parked: no stage after it parks more.
        transport.stop_keeping();
        report_broken(&core.say, &taken.broken);
        if !taken.unreachable.is_empty() {
            let names: Vec<&str> = taken.unreachable.iter().map(|(h, _)| h.as_str()).collect();
            core.say(&format!(
                "warning: not locked, since they do not answer: {}",
                names.join(", ")
            ));
        }
        let not_ended = left_alone(&core.say, &taken.not_ended);
        held.fleet = Some(fleet);
        Ok((targets, taken.unreachable, not_ended))
    }
}

impl Locked {
    /// An unfinished run of this site (`unfinished`, as read once the controller's lock was
    /// taken): say where it stopped, and kill the hooks it may have left running on the hosts
    /// of its steps in flight (a run that died, rather than stopped on a signal, does not get
    /// to stop them). Returns the hosts that could not be checked, and why: this run leaves
    /// them alone.
    fn carry_on(
        &mut self,
        site: &Site,
        unfinished: Unfinished,
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
            self.resumed = Some(rec);
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
            let outcome = self.block_on(async {
                let link = transport.connect(target).await.ok()?;
                let out = tokio::time::timeout(Duration::from_secs(30), link.run(&script)).await;
                match out {
                    Ok(Ok(_)) => transport.park(&target.name, link).await,
                    _ => link.close().await,
                }
                let out = out.ok()?.ok()?;
                Some(kill_outcome(&out.stdout))
            });
            // Hooks it could not end: the host is left alone, said as such.
            let killed = match outcome {
                Some((count, groups)) if !groups.is_empty() => {
                    let n = NotEnded {
                        host: target.name.clone(),
                        groups,
                        run: Some(rec.run.clone()),
                    };
                    unchecked.extend(left_alone(&self.held.core.say, &[n]));
                    Some(count.unwrap_or(0))
                }
                Some((count, _)) => count,
                None => None,
            };
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
        self.resumed = Some(rec);
        unchecked
    }
}

/// The session's host lock, as the rollout takes it for a host left unread until its step.
pub(super) struct AtStep {
    pub fleet: Arc<FleetLock<Kept<AnyTransport>>>,
    pub me: Holder,
    /// Where a lock taken over from a dead holder is said.
    pub say: super::Say,
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
            let (observed, broken, not_ended) =
                self.fleet.lock_at_step(link, host, &self.me).await?;
            for line in broken_lines(broken.as_slice()) {
                (self.say)(&line);
            }
            left_alone(&self.say, not_ended.as_slice());
            Ok(observed)
        })
    }
}

/// `.drover/unpublished/<site>`: a run's writes to the store did not all reach it; the next
/// apply reads every host (and publishes what it reads), then removes it.
pub(super) const UNPUBLISHED: &str = "unpublished";

/// Says the locks that were taken over or broken, one line per holder, and the hooks their
/// runs left that were stopped.
fn report_broken(say: &super::Say, broken: &[Broken]) {
    for line in broken_lines(broken) {
        say(&line);
    }
    for b in broken.iter().filter(|b| b.hooks_ended > 0) {
        let (Some(holder), Some(host)) = (&b.holder, b.place.strip_prefix("host ")) else {
            continue;
        };
        let n = b.hooks_ended;
        say(&format!(
            "stopped {n} hook{} that run {} left running on {host}",
            if n == 1 { "" } else { "s" },
            holder.run
        ));
    }
}

/// Warns of the hosts where processes of another run could not be ended (`not_ended`), and
/// returns them with why they are left alone in this run.
fn left_alone(say: &super::Say, not_ended: &[NotEnded]) -> Vec<(String, String)> {
    not_ended
        .iter()
        .map(|n| {
            say(&n.warning());
            (n.host.clone(), n.reason())
        })
        .collect()
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
