//! [`FleetLock`]: the site's lock on every host, `<state-dir>/lock` made with `mkdir` over
//! the transport, with the scripts that take, break, fence and give it back.

use super::host_scripts::{
    acquire_script, after_taken, break_script, guard_script, mark_tag, release_body,
    release_script, FENCED, HELD,
};
use super::in_flight::NOT_ENDED;
use super::{Broken, Holder, Liveness, Lock, LockError, NotEnded, Taken};
use crate::transport::{Link, Output, Target, Transport};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

/// `<state-dir>/lock` on every host of the site.
pub struct FleetLock<T> {
    pub transport: Arc<T>,
    /// Every host of the site; taken in name order (see the documentation of [`super`]).
    pub hosts: Vec<Target>,
    pub state_dir: String,
    pub max_connections: usize,
    /// The hosts locked so far, to release.
    taken: Mutex<Vec<Target>>,
    /// The host taken first, alone (see [`Lock::acquire`]).
    first: Mutex<Option<String>>,
    /// Hosts left unread until their steps, unless the host taken first is not the one named
    /// ([`FleetLock::unless_first`]).
    unless_first: Option<(String, Vec<Target>)>,
    /// Those hosts were locked (and read) with the others.
    read_all: std::sync::atomic::AtomicBool,
    /// Hosts whose lock command was sent and whose answer was lost: it may have taken the
    /// lock there. Released too, quietly (the release removes only this run's own lock).
    unsure: Mutex<Vec<Target>>,
    /// A script run on each host in the same command as taking its lock, once taken.
    read: Option<String>,
    /// What that script printed on each host locked: host → its output.
    reads: Mutex<HashMap<String, Output>>,
    /// The run's fencing token (the etcd lock's create revision), recorded on each host as
    /// its lock is taken; a host that has seen a higher one refuses.
    fence: Option<i64>,
    /// Hosts whose links the transport keeps once their lock is taken (over the cap, the
    /// hosts stepped first, [`crate::transport::Kept::keep_for_steps`]).
    keep: HashSet<String>,
    /// The shell text that ends the hooks a controller of this pid still runs on a host
    /// (`(state_dir, pid)`), run once a lock is broken and taken, before the host is read:
    /// the run whose lock was broken then runs nothing more there ([`FleetLock::ending_hooks`]).
    end_hooks: Option<fn(&str, &Holder) -> String>,
}

/// How one host answered.
enum HostLock {
    /// Taken; a lock that was broken to take it; processes of another run left running.
    Taken(Option<Broken>, Option<NotEnded>),
    Held(Option<Holder>),
    Unreachable(String),
    Failed(String),
}

impl<T: Transport> FleetLock<T> {
    pub fn new(
        transport: Arc<T>,
        mut hosts: Vec<Target>,
        state_dir: &str,
        max_connections: usize,
    ) -> Self {
        hosts.sort_by(|a, b| a.name.cmp(&b.name));
        FleetLock {
            transport,
            hosts,
            state_dir: state_dir.trim_end_matches('/').to_string(),
            max_connections: max_connections.max(1),
            taken: Mutex::new(Vec::new()),
            first: Mutex::new(None),
            unless_first: None,
            read_all: std::sync::atomic::AtomicBool::new(false),
            unsure: Mutex::new(Vec::new()),
            read: None,
            reads: Mutex::new(HashMap::new()),
            fence: None,
            keep: HashSet::new(),
            end_hooks: None,
        }
    }

    /// Names the hosts whose links the transport keeps once locked (at most
    /// `max_connections` of them): they are locked after the others, each holding its share
    /// of the cap from then on, so that the links kept and those being used never exceed it.
    /// Under a cap of one, none is (the link kept would leave no room for the others).
    pub fn keeping(mut self, hosts: impl IntoIterator<Item = String>) -> Self {
        if self.max_connections > 1 {
            self.keep = hosts.into_iter().take(self.max_connections).collect();
        }
        self
    }

    /// Records `token` (the etcd lock's create revision) on each host as its lock is taken,
    /// and refuses a host that has recorded a higher one: a later run holds the site.
    pub fn fenced(mut self, token: Option<i64>) -> Self {
        self.fence = token;
        self
    }

    /// Once a lock held by another run is broken (stale, or `--break-lock`) and taken, ends
    /// the hooks that run's controller still runs on the host with the text `end(state_dir,
    /// its pid)` gives, in the same command, before the host is read: two runs never run hooks
    /// on one host at once. (The text comes from the rollout, which owns the hooks' processes.)
    pub fn ending_hooks(mut self, end: fn(&str, &Holder) -> String) -> Self {
        self.end_hooks = Some(end);
        self
    }

    /// Also runs `script` on each host, in the same command that takes its lock, once taken
    /// (the state file's read: one command per host less). See [`FleetLock::take_reads`].
    pub fn reading(mut self, script: String) -> Self {
        self.read = Some(script);
        self
    }

    /// What the [`FleetLock::reading`] script printed on each host locked, by host name.
    pub fn take_reads(&self) -> HashMap<String, Output> {
        std::mem::take(&mut *self.reads.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Shell text that gives `me`'s lock back on a host (and removes the run's hook pid
    /// files), for a host's last command of the run; it never fails. Hosts released that
    /// way are then handed to [`FleetLock::released`].
    pub fn release_text(&self, me: &Holder) -> String {
        release_body(&self.state_dir, &self.dir(), me)
    }

    /// Shell text every command of `me`'s run that changes a host starts with: refused unless
    /// `me` still holds the host's lock and the host has seen no newer fencing token
    /// ([`guard_script`]).
    pub fn guard_text(&self, me: &Holder) -> String {
        guard_script(&self.state_dir, &me.json(), &mark_tag(me), self.fence)
    }

    /// `unread`: hosts this run means to lock at their steps. They are tried in name order
    /// with the others for the first host, taken alone; if that is not `anchor` (the first
    /// host of the whole inventory by name, which every run of the site asks for first, did
    /// not answer), this run cannot hold it, and they are locked and read with the others,
    /// as if never left out ([`FleetLock::read_all`]).
    pub fn unless_first(mut self, anchor: String, mut unread: Vec<Target>) -> Self {
        unread.sort_by(|a, b| a.name.cmp(&b.name));
        self.unless_first = Some((anchor, unread));
        self
    }

    /// The hosts given to [`FleetLock::unless_first`] were locked and read with the others.
    pub fn read_all(&self) -> bool {
        self.read_all.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The host the lock took first, alone, once it was taken.
    pub fn first_taken(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// These hosts' locks were given back already (with their last command).
    pub fn released(&self, hosts: &[String]) {
        self.lock_taken().retain(|t| !hosts.contains(&t.name));
    }

    fn dir(&self) -> String {
        format!("{}/lock", self.state_dir)
    }

    /// Takes the lock on one host: `mkdir`; if held by a holder that is gone (or `force`),
    /// sets that lock aside (only if it is still the one seen) and takes it.
    async fn take_host(&self, target: &Target, me: &Holder, force: bool) -> HostLock {
        let link = match self.transport.connect(target).await {
            Ok(link) => link,
            Err(e) => return HostLock::Unreachable(e.to_string()),
        };
        let result = self.take_on(&link, target, me, force).await;
        match result {
            // A link whose command failed is not handed on: the next stage connects anew.
            HostLock::Unreachable(_) => link.close().await,
            _ => self.transport.park(&target.name, link).await,
        }
        result
    }

    async fn take_on(&self, link: &T::Link, target: &Target, me: &Holder, force: bool) -> HostLock {
        let place = format!("host {}", target.name);
        let read = self.read.as_deref();
        // `end`: what ends the broken holder's hooks, before the read.
        let tag = mark_tag(me);
        let acquire = |end: Option<String>| {
            acquire_script(
                &self.state_dir,
                &self.dir(),
                &me.json(),
                &tag,
                self.fence,
                end.as_deref().map(ended).as_deref(),
                read,
            )
        };
        let mut script = acquire(None);
        let mut broken: Option<Broken> = None;
        // The last command sent ends the broken holder's hooks after taking the lock.
        let mut ending = false;
        for _ in 0..3 {
            let out = match link.run(&script).await {
                Ok(out) => out,
                Err(e) => {
                    self.unsure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(target.clone());
                    return HostLock::Unreachable(e.to_string());
                }
            };
            let then_ran = read.is_some() || ending;
            if let (true, Some(b)) = (ending, broken.as_mut()) {
                b.hooks_ended = hooks_ended(&out.stderr);
            }
            // Processes of another run that could not be ended: its hooks (a lock broken),
            // or commands it had in flight.
            let run = broken
                .as_ref()
                .and_then(|b| b.holder.as_ref())
                .map(|h| h.run.clone());
            let not_ended = |out: &Output| {
                let groups = not_ended(&out.stderr);
                (!groups.is_empty()).then(|| NotEnded {
                    host: target.name.clone(),
                    groups,
                    run: run.clone(),
                })
            };
            if let Some(rest) = then_ran.then(|| after_taken(&out.stdout)).flatten() {
                let not_ended = not_ended(&out);
                if read.is_none() {
                    return HostLock::Taken(broken, not_ended);
                }
                let read = Output {
                    code: out.code,
                    stdout: rest.to_vec(),
                    stderr: out.stderr.clone(),
                };
                self.reads
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(target.name.clone(), read);
                return HostLock::Taken(broken, not_ended);
            }
            if !then_ran && out.success() {
                return HostLock::Taken(broken, not_ended(&out));
            }
            if out.code == Some(FENCED) {
                let seen = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return HostLock::Failed(format!(
                    "it has seen fencing token {seen}, newer than this run's {}: a later run \
                     took the site's lock in etcd",
                    self.fence.unwrap_or_default()
                ));
            }
            if out.code != Some(HELD) {
                let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return HostLock::Failed(format!("exit {:?}: {err}", out.code));
            }
            // The holder is the last line (a shell's start-up files may print before it).
            let seen = String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .find(|l| !l.is_empty())
                .unwrap_or_default()
                .to_string();
            let holder: Option<Holder> = serde_json::from_str(&seen).ok();
            if holder.as_ref() == Some(me) {
                return HostLock::Taken(None, None);
            }
            let stale = holder
                .as_ref()
                .is_some_and(|h| h.liveness() == Liveness::Dead);
            if !stale && !force {
                return HostLock::Held(holder);
            }
            let end = self
                .end_hooks
                .zip(holder.as_ref())
                .map(|(end, h)| end(&self.state_dir, h));
            ending = end.is_some();
            broken = Some(Broken {
                place: place.clone(),
                holder,
                stale,
                hooks_ended: 0,
            });
            script = format!("{}\n{}", break_script(&self.dir(), &seen), acquire(end));
        }
        HostLock::Failed("it keeps changing hands".into())
    }

    /// Takes `me`'s lock on a host not locked before the run, over the link its first step
    /// runs on, and reads its state in the same command (an apply over `--max-connections`
    /// that leaves hosts unread until their step). The host is released with the others.
    /// `Err`: why the lock was refused (another run holds it, …); a link that fails gives
    /// the host as unreachable. A lock whose holder is known to be dead is taken over (and
    /// said, with the state); no other is broken here, `--break-lock` or not: the operator
    /// was never shown this holder.
    pub async fn lock_at_step(
        &self,
        link: &T::Link,
        target: &Target,
        me: &Holder,
    ) -> Result<(crate::state::Observed, Option<Broken>, Option<NotEnded>), String> {
        match self.take_on(link, target, me, false).await {
            HostLock::Taken(broken, not_ended) => {
                // Once, however many of its services' steps lock it (each finds it ours).
                {
                    let mut taken = self.lock_taken();
                    if !taken.iter().any(|t| t.name == target.name) {
                        taken.push(target.clone());
                    }
                }
                let read = self
                    .reads
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&target.name);
                // Left alone: what it reads may still change.
                if let Some(n) = not_ended {
                    let reason = n.reason();
                    return Ok((
                        crate::state::Observed::Unreachable { reason },
                        broken,
                        Some(n),
                    ));
                }
                // Held by `me` already: taken without its read.
                let read = match (read, &self.read) {
                    (Some(out), _) => Ok(out),
                    (None, Some(script)) => link.run(script).await,
                    (None, None) => link.run(&crate::state::read_script(&self.state_dir)).await,
                };
                Ok((
                    crate::state::observed_from(read, &self.state_dir),
                    broken,
                    None,
                ))
            }
            HostLock::Unreachable(reason) => {
                Ok((crate::state::Observed::Unreachable { reason }, None, None))
            }
            HostLock::Held(Some(h)) if h.site != me.site => Err(format!(
                "locked by {}, applying site {}: another `deploy apply` is running on this host",
                h.describe(),
                h.site
            )),
            HostLock::Held(Some(h)) => Err(format!(
                "locked by {}: another `deploy apply` of this site is running",
                h.describe()
            )),
            HostLock::Held(None) => Err("locked by a holder that cannot be read (a lock being \
                                         taken, or a damaged one)"
                .into()),
            HostLock::Failed(reason) => Err(format!("cannot lock it: {reason}")),
        }
    }

    /// Gives `me`'s lock back now on those of `hosts` it holds (all at once); a host where
    /// that fails stays held, for [`Lock::release`] to try again.
    pub async fn release_now(&self, me: &Holder, hosts: &HashSet<String>) {
        let now: Vec<Target> = {
            let mut taken = self.lock_taken();
            let (now, keep): (Vec<Target>, Vec<Target>) =
                taken.drain(..).partition(|t| hosts.contains(&t.name));
            *taken = keep;
            now
        };
        let results = futures_all(
            now.iter()
                .map(|t| async move { (t, self.release_host(t, me).await) }),
        )
        .await;
        let failed = results
            .into_iter()
            .filter(|(_, r)| r.is_err())
            .map(|(t, _)| t.clone());
        self.lock_taken().extend(failed);
    }

    async fn release_host(&self, target: &Target, me: &Holder) -> Result<(), String> {
        let link = self
            .transport
            .connect(target)
            .await
            .map_err(|e| e.to_string())?;
        let out = link
            .run(&release_script(&self.state_dir, &self.dir(), me))
            .await;
        self.transport.park(&target.name, link).await;
        match out {
            Ok(o) if o.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    pub(super) fn lock_taken(&self) -> std::sync::MutexGuard<'_, Vec<Target>> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Releases what was taken, then turns the first refusal into the error.
    async fn give_back(&self, me: &Holder, error: LockError) -> LockError {
        let _ = self.release(me).await;
        error
    }
}

impl<T: Transport> FleetLock<T> {
    /// Locks `rest` all at once, at most the cap's worth at a time, adding to `taken`.
    async fn take_rest(
        &self,
        rest: Vec<&Target>,
        me: &Holder,
        force: bool,
        mut taken: Taken,
    ) -> Result<Taken, LockError> {
        // The hosts whose links are kept come last, each keeping its permit: the gate is
        // fair, so every other host has asked for one before them and none waits for ever.
        // Links parked by the hosts tried alone (whatever their lock's outcome) hold theirs.
        let (mut rest, keep): (Vec<&Target>, Vec<&Target>) =
            rest.into_iter().partition(|t| !self.keep.contains(&t.name));
        rest.extend(keep);
        let room = crate::transport::room(&*self.transport, self.max_connections).await;
        let gate = Arc::new(tokio::sync::Semaphore::new(room));
        let results = futures_all(rest.into_iter().map(|target| {
            let gate = gate.clone();
            async move {
                let permit = gate.acquire_owned().await;
                let result = self.take_host(target, me, force).await;
                if self.keep.contains(&target.name) {
                    if let Ok(permit) = permit {
                        permit.forget();
                    }
                }
                (target, result)
            }
        }))
        .await;
        let mut refusal = None;
        for (target, result) in results {
            let place = format!("host {}", target.name);
            match result {
                HostLock::Taken(broken, not_ended) => {
                    self.lock_taken().push(target.clone());
                    taken.broken.extend(broken);
                    taken.not_ended.extend(not_ended);
                }
                HostLock::Unreachable(reason) => {
                    taken.unreachable.push((target.name.clone(), reason));
                }
                HostLock::Held(holder) => {
                    refusal.get_or_insert(LockError::Held {
                        place,
                        holder: holder.map(Box::new),
                    });
                }
                HostLock::Failed(reason) => {
                    refusal.get_or_insert(LockError::Failed { place, reason });
                }
            }
        }
        match refusal {
            Some(error) => Err(self.give_back(me, error).await),
            None => Ok(taken),
        }
    }
}

impl<T: Transport> Lock for FleetLock<T> {
    async fn acquire(&self, me: &Holder, force: bool) -> Result<Taken, LockError> {
        let mut taken = Taken::default();
        let unread: &[Target] = self.unless_first.as_ref().map_or(&[], |(_, u)| u);
        let mut all: Vec<&Target> = self.hosts.iter().chain(unread).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let mut rest = all.into_iter();
        // The first host that answers, alone: whoever gets it may go on to the others.
        for target in rest.by_ref() {
            match self.take_host(target, me, force).await {
                HostLock::Taken(broken, not_ended) => {
                    self.lock_taken().push(target.clone());
                    *self.first.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(target.name.clone());
                    taken.broken.extend(broken);
                    taken.not_ended.extend(not_ended);
                    break;
                }
                HostLock::Unreachable(reason) => {
                    taken.unreachable.push((target.name.clone(), reason));
                }
                HostLock::Held(holder) => {
                    return Err(LockError::Held {
                        place: format!("host {}", target.name),
                        holder: holder.map(Box::new),
                    })
                }
                HostLock::Failed(reason) => {
                    return Err(LockError::Failed {
                        place: format!("host {}", target.name),
                        reason,
                    })
                }
            }
        }
        let first = self.first_taken();
        let read_all = self
            .unless_first
            .as_ref()
            .is_some_and(|(anchor, _)| first.as_ref() != Some(anchor));
        self.read_all
            .store(read_all, std::sync::atomic::Ordering::SeqCst);
        let rest: Vec<&Target> = if read_all {
            rest.collect()
        } else {
            let left: std::collections::HashSet<&str> =
                unread.iter().map(|t| t.name.as_str()).collect();
            rest.filter(|t| !left.contains(t.name.as_str())).collect()
        };
        self.take_rest(rest, me, force, taken).await
    }

    async fn release(&self, me: &Holder) -> Result<(), LockError> {
        let mut hosts: Vec<Target> = std::mem::take(&mut *self.lock_taken());
        let unsure: Vec<Target> =
            std::mem::take(&mut *self.unsure.lock().unwrap_or_else(|p| p.into_inner()));
        if hosts.is_empty() && unsure.is_empty() {
            return Ok(());
        }
        // The host every run of the site locks first, alone, is given back last: a run that
        // takes it finds none of this run's other locks left.
        let first = self.first_taken();
        let last = hosts
            .iter()
            .position(|t| Some(&t.name) == first.as_ref())
            .map(|i| hosts.remove(i));
        let room = crate::transport::room(&*self.transport, self.max_connections).await;
        let gate = Arc::new(tokio::sync::Semaphore::new(room));
        let all = hosts.iter().map(|t| (t, true));
        let mut results = futures_all(all.chain(unsure.iter().map(|t| (t, false))).map(
            |(target, held)| {
                let gate = gate.clone();
                async move {
                    let _permit = gate.acquire_owned().await;
                    (target, held, self.release_host(target, me).await)
                }
            },
        ))
        .await;
        if let Some(target) = &last {
            results.push((target, true, self.release_host(target, me).await));
        }
        // A host whose lock was never known to be taken is not said to be left behind.
        let failed: Vec<String> = results
            .into_iter()
            .filter(|(_, held, _)| *held)
            .filter_map(|(t, _, r)| r.err().map(|e| format!("{}: {e}", t.name)))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(LockError::Failed {
                place: "on hosts".into(),
                reason: format!("could not release it on {}", failed.join("; ")),
            })
        }
    }
}

/// Runs every future at once (on this task) and collects their outputs in order.
async fn futures_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// The line on standard error that says how many hooks [`FleetLock::ending_hooks`]'s text
/// ended (it prints their count last on its standard output).
const ENDED: &str = "drover: hooks ended ";

/// `end`, its output turned into one [`ENDED`] line on standard error, after the
/// [`NOT_ENDED`] line it printed on standard output, if any (the process groups it could not
/// end).
fn ended(end: &str) -> String {
    format!(
        "_n=$({{ {end}; }} 2>/dev/null); case $_n in *'{NOT_ENDED}'*) _x=${{_n#*'{NOT_ENDED}'}}; \
         printf '{NOT_ENDED}%s\\n' \"${{_x%%[!0-9 ]*}}\" >&2;; esac; \
         _n=${{_n##*[!0-9]}}; printf '{ENDED}%s\\n' \"${{_n:-0}}\" >&2"
    )
}

/// The process group ids the [`NOT_ENDED`] lines in `stderr` name, each once, in order.
fn not_ended(stderr: &[u8]) -> Vec<String> {
    let mut groups: Vec<String> = Vec::new();
    for line in String::from_utf8_lossy(stderr).lines() {
        let Some(ids) = line.strip_prefix(NOT_ENDED) else {
            continue;
        };
        for id in ids.split_whitespace() {
            if id.bytes().all(|b| b.is_ascii_digit()) && !groups.iter().any(|g| g == id) {
                groups.push(id.to_string());
            }
        }
    }
    groups
}

/// How many hooks the [`ENDED`] line in `stderr` counts (0 without one).
fn hooks_ended(stderr: &[u8]) -> usize {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(ENDED)?.trim().parse().ok())
        .unwrap_or(0)
}
