//! The `ssh` transport: one OpenSSH master per host, every command multiplexed over it.

use super::direct::Open;
use super::persist::Masters;
use super::shell::{self, Shell, ShellError};
use super::{Chain, Command, Link, Output, Target, Transport, TransportError};
use crate::site::SshOptions;
use openssh::{KnownHosts, Session, SessionBuilder, Stdio};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Reaches hosts with the user's OpenSSH: ssh_config, agent, known_hosts and ProxyJump apply.
pub struct Ssh {
    options: SshOptions,
    /// Where masters outlive the command (`persist`): `None` when it is off.
    masters: Option<Masters>,
    /// What makes every host's connection, digested once for the masters' keys
    /// ([`Masters::connection`]); empty when `persist` is off.
    connection: String,
    /// The options again, shared by the links, when large files go over connections of their
    /// own (`direct-above`); `None` when that is off.
    direct: Option<Arc<SshOptions>>,
    /// Room for connections of their own within the run's cap.
    open: Arc<Open>,
}

impl Ssh {
    /// The transport of a run on `hosts` hosts holding at most `max_connections` ssh
    /// connections at once: the link pool keeps the masters within it, one per host at most,
    /// and connections of their own for large files get what the cap leaves beyond that.
    pub fn new(options: SshOptions, hosts: usize, max_connections: usize) -> Self {
        let masters = persists(&options, hosts, max_connections)
            .then(Masters::new)
            .flatten();
        if masters.is_none() {
            // Watched from now on, before this run starts any other process.
            let _ = super::reaper::dir();
        }
        let connection = match masters {
            Some(_) => Masters::connection(&options),
            None => String::new(),
        };
        Ssh {
            connection,
            direct: options.direct_above.map(|_| Arc::new(options.clone())),
            options,
            masters,
            open: Open::new(hosts, max_connections),
        }
    }

    fn builder(&self) -> SessionBuilder {
        let o = &self.options;
        let mut b = SessionBuilder::default();
        // A host whose key is unknown is refused unless the operator accepts new keys for
        // this run (`--accept-new-host-keys`); a changed key is refused either way.
        let check = if o.accept_new_host_keys {
            KnownHosts::Add
        } else {
            KnownHosts::Strict
        };
        let (connect, alive) = timeouts(o);
        b.known_hosts_check(check)
            .connect_timeout(connect)
            .server_alive_interval(alive);
        if let Some(user) = &o.user {
            b.user(user.clone());
        }
        if let Some(port) = o.port {
            b.port(port);
        }
        if let Some(key) = &o.identity {
            b.keyfile(key);
        }
        if let Some(config) = &o.config {
            b.config_file(config);
        }
        if let Some(known) = &o.known_hosts {
            b.user_known_hosts_file(known);
        }
        if let Some(masters) = &self.masters {
            let secs = usize::try_from(o.persist.as_secs().max(1)).unwrap_or(usize::MAX);
            if let Some(secs) = std::num::NonZeroUsize::new(secs) {
                b.control_directory(masters.dir())
                    .control_persist(openssh::ControlPersist::IdleFor(secs));
            }
        } else if let Some(dir) = super::reaper::dir() {
            // Masters that must not outlive this process: stopped by its watcher if it dies.
            b.control_directory(dir);
        }
        b
    }
}

/// Whether masters outlive the command (`persist`): only where every host fits under the
/// cap. Over it, links are closed to make room, and a kept master would go on running beyond
/// the cap.
fn persists(options: &SshOptions, hosts: usize, max_connections: usize) -> bool {
    !options.persist.is_zero() && hosts <= max_connections
}

impl Ssh {
    /// A failed connection; an unknown or changed host key gets its own error, which says
    /// what to run.
    fn connect_error(&self, target: &Target, reason: &str) -> TransportError {
        let refused = ["Host key verification failed", "host key is known for"];
        if !refused.iter().any(|r| reason.contains(r))
            && !reason.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
        {
            return TransportError::Connect {
                host: target.name.clone(),
                address: target.address.clone(),
                reason: reason.to_string(),
            };
        }
        let changed = reason.contains("HAS CHANGED");
        let port = self
            .options
            .port
            .map_or(String::new(), |p| format!("-p {p} "));
        let file = self.options.known_hosts.as_ref().map_or_else(
            || "~/.ssh/known_hosts".to_string(),
            |f| f.display().to_string(),
        );
        let help = if changed {
            format!(
                "the key {} presents is not the one recorded for it: find out why before \
                 anything else; if the host was really reinstalled, remove its old key with \
                 `ssh-keygen -R {} -f {file}` and add the new one",
                target.name, target.address
            )
        } else {
            format!(
                "check the host's key and add it: `ssh-keyscan {port}{} >> {file}` (compare \
                 the fingerprint with the host's own), or, for a first contact only, run \
                 `deploy apply --accept-new-host-keys` to record the keys of hosts not yet known",
                target.address
            )
        };
        TransportError::HostKey {
            host: target.name.clone(),
            address: target.address.clone(),
            reason: if changed {
                "its host key has changed".into()
            } else {
                "its host key is not in known_hosts".into()
            },
            help,
        }
    }
}

/// `ConnectTimeout` and `ServerAliveInterval` for `options`, the master's and a connection of
/// its own's alike. OpenSSH counts whole seconds; less than one would mean no timeout at all.
/// A host that stops answering mid-run (no reset, just silence) is given up after three
/// unanswered keep-alives, about one connect-timeout: its commands fail then instead of
/// hanging.
pub(super) fn timeouts(options: &SshOptions) -> (Duration, Duration) {
    let one = Duration::from_secs(1);
    (
        options.connect_timeout.max(one),
        (options.connect_timeout / 3).max(one),
    )
}

/// A multiplexed session to one host. Its first command runs in a session of its own; from
/// the second on (from the first, once [`Link::prepare`]d), commands go to a shell kept open
/// on the host ([`super::shell`]), unless one is already running there (a hook being killed)
/// or the host cannot keep one.
/// A link's master that outlives the command (`persist`).
struct Persisted {
    masters: Masters,
    key: String,
    /// The master's idle time: it exits once no channel has been open on it this long.
    idle: Duration,
    /// When the master was last known to have its whole idle time ahead (made, or a command
    /// just opened a channel on it).
    since: std::sync::Mutex<std::time::Instant>,
}

pub struct SshLink {
    host: String,
    session: Arc<Session>,
    shell: Arc<Mutex<Slot>>,
    /// With `persist`: where its master is left when the link closes, and how long it lives.
    kept: Option<Box<Persisted>>,
    /// The transport's options and the host's address, for contents sent over a connection
    /// of their own (`direct-above`); `None` when that is off.
    direct: Option<(Arc<SshOptions>, String)>,
    /// A connection of its own failed on this link: the rest go over the master (a host that
    /// refuses a second login would otherwise make every large file wait for it again).
    direct_failed: std::sync::atomic::AtomicBool,
    /// The transport's room for connections of their own: one takes it while it lasts.
    open: Arc<Open>,
    /// What [`Link::notes`] hands out next.
    notes: std::sync::Mutex<Vec<String>>,
}

/// A chain's commands sent to the kept shell, not all collected yet: the shell is held (other
/// commands meanwhile go to sessions of their own, as while any command runs there).
pub struct Sent {
    slot: OwnedMutexGuard<Slot>,
    numbers: VecDeque<u64>,
}

impl Sent {
    /// Commands sent and not collected yet.
    pub fn pending(&self) -> bool {
        !self.numbers.is_empty()
    }
}

/// Where the link's next command goes.
enum Slot {
    /// No command ran yet: the next runs in a session of its own.
    Fresh,
    /// The next command opens the shell.
    Idle,
    Open(Shell),
    /// The host cannot keep a shell, or the platform says `keep-shell=#false`: a session per
    /// command.
    Off,
}

impl Transport for Ssh {
    type Link = SshLink;
    async fn connect(&self, target: &Target) -> Result<SshLink, TransportError> {
        let key = self
            .masters
            .as_ref()
            .map(|m| (m, Masters::key_of(&self.connection, &target.address)));
        let resumed = match &key {
            Some((masters, key)) => masters.resume(key).await,
            None => None,
        };
        // A resumed master's idle time may be nearly spent: asked again before first use.
        let now = std::time::Instant::now();
        let since = match resumed {
            Some(_) => now.checked_sub(self.options.persist).unwrap_or(now),
            None => now,
        };
        let kept = key.map(|(masters, key)| {
            Box::new(Persisted {
                masters: masters.clone(),
                key,
                idle: self.options.persist,
                since: std::sync::Mutex::new(since),
            })
        });
        let session = match resumed {
            Some(session) => session,
            None => self
                .builder()
                .connect_mux(&target.address)
                .await
                .map_err(|e| self.connect_error(target, &flatten(&e)))?,
        };
        Ok(SshLink {
            host: target.name.clone(),
            session: Arc::new(session),
            shell: Arc::new(Mutex::new(match self.options.keep_shell {
                true => Slot::Fresh,
                false => Slot::Off,
            })),
            kept,
            direct: self
                .direct
                .as_ref()
                .map(|options| (options.clone(), target.address.clone())),
            direct_failed: false.into(),
            open: self.open.clone(),
            notes: Default::default(),
        })
    }
}

impl SshLink {
    fn note(&self, text: String) {
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(text);
    }

    /// Runs `script` in the kept shell when it is free, else in a session of its own.
    async fn command(&self, script: &str, input: Option<&[u8]>) -> Result<Output, TransportError> {
        let Ok(mut slot) = self.shell.try_lock() else {
            return self.once(script, input).await;
        };
        // A command was cut off (a timeout): that shell may still run it.
        if matches!(&*slot, Slot::Open(shell) if shell.out_of_step()) {
            *slot = Slot::Idle;
        }
        match *slot {
            // The first command runs on its own; the next opens the shell.
            Slot::Fresh => *slot = Slot::Idle,
            Slot::Idle => *slot = self.opened().await,
            Slot::Open(_) | Slot::Off => {}
        }
        let Slot::Open(shell) = &mut *slot else {
            drop(slot);
            return self.once(script, input).await;
        };
        match shell.run(script, input).await {
            Ok(out) => Ok(out),
            Err(ShellError::Unavailable(_)) => {
                *slot = Slot::Off;
                drop(slot);
                self.once(script, input).await
            }
            // This command alone goes to a session; the shell stays for the next.
            Err(ShellError::Unsuitable(_)) => {
                drop(slot);
                self.once(script, input).await
            }
            Err(ShellError::Lost(reason)) => {
                *slot = Slot::Idle;
                Err(TransportError::Command {
                    host: self.host.clone(),
                    reason,
                })
            }
        }
    }

    /// The slot once the kept shell is started: open, or off if it cannot be.
    async fn opened(&self) -> Slot {
        match self.open().await {
            Ok(shell) => Slot::Open(shell),
            Err(_) => Slot::Off,
        }
    }

    /// Starts the kept shell.
    async fn open(&self) -> Result<Shell, openssh::Error> {
        let token = shell::token();
        let text = super::in_sh(&shell::loop_script(&token));
        let mut child = Session::to_raw_command(self.session.clone(), text)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await?;
        let missing = || openssh::Error::ChildIo(std::io::Error::other("pipe not opened"));
        let stdin = child.stdin().take().ok_or_else(missing)?;
        let stdout = child.stdout().take().ok_or_else(missing)?;
        let stderr = child.stderr().take().ok_or_else(missing)?;
        Ok(Shell::new(
            token,
            Box::new(stdin),
            Box::new(stdout),
            Box::new(stderr),
            Box::new(child),
        ))
    }

    /// Runs `script` in a session of its own.
    async fn once(&self, script: &str, input: Option<&[u8]>) -> Result<Output, TransportError> {
        use tokio::io::AsyncWriteExt;
        let error = |e: openssh::Error| TransportError::Command {
            host: self.host.clone(),
            reason: flatten(&e),
        };
        let mut command = self.session.raw_command(super::in_sh(script));
        let Some(input) = input else {
            let out = command.stdin(Stdio::null()).output().await.map_err(error)?;
            return Ok(Output {
                code: out.status.code(),
                stdout: out.stdout,
                stderr: out.stderr,
            });
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await
            .map_err(error)?;
        let stdin = child.stdin().take();
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A script that exits without reading its input is not an error here.
                let _ = stdin.write_all(input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, out) = tokio::join!(write, child.wait_with_output());
        let out = out.map_err(error)?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }
}

impl Link for SshLink {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        self.command(script, None).await
    }

    fn notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    async fn run_input(&self, script: &str, input: &[u8]) -> Result<Output, TransportError> {
        self.command(script, Some(input)).await
    }

    async fn send(
        &self,
        script: &str,
        payload: super::Payload<'_>,
    ) -> Result<Output, TransportError> {
        let error = |reason: String| TransportError::Command {
            host: self.host.clone(),
            reason,
        };
        // A large file goes over a connection of its own (`direct-above`); if that cannot be
        // made (or is lost), over the master as any other, from its first byte, and so do the
        // link's later ones.
        use std::sync::atomic::Ordering::Relaxed;
        if let (Some((options, address)), super::Payload::File(path)) = (&self.direct, payload) {
            if super::direct::goes_direct(options, path) {
                if self.direct_failed.load(Relaxed) {
                    self.note(format!(
                        "{} sent over the master: a connection of its own failed earlier on this link",
                        path.display()
                    ));
                } else if let Some(_counted) = self.open.take() {
                    // Under the cap only: with no room left, over the master.
                    match super::direct::send(options, address, script, path).await {
                        Ok(out) => return Ok(out),
                        Err(why) => {
                            self.direct_failed.store(true, Relaxed);
                            self.note(format!("{why}; sent over the master instead"));
                        }
                    }
                }
            }
        }
        // A file is handed to the master itself as the session's standard input (the mux
        // passes the descriptor): the master reads it from disk, and no byte of it passes
        // through this process.
        let (stdin, input) = match payload {
            super::Payload::File(path) => {
                let file = std::fs::File::open(path)
                    .map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
                let empty: Box<dyn tokio::io::AsyncRead + Send + Unpin> =
                    Box::new(tokio::io::empty());
                (Stdio::from(std::os::fd::OwnedFd::from(file)), empty)
            }
            super::Payload::Bytes(_) => (
                Stdio::piped(),
                payload.open().await.map_err(|e| error(e.to_string()))?,
            ),
        };
        let mut child = self
            .session
            .raw_command(super::in_sh(script))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await
            .map_err(|e| error(flatten(&e)))?;
        let (stdin, stdout, stderr) = (
            child.stdin().take(),
            child.stdout().take(),
            child.stderr().take(),
        );
        let (out, err) = super::feed::feed(stdin, stdout, stderr, input)
            .await
            .map_err(|e| error(e.to_string()))?;
        let status = child.wait().await.map_err(|e| error(flatten(&e)))?;
        Ok(Output {
            code: status.code(),
            stdout: out,
            stderr: err,
        })
    }

    /// Sends the whole chain to the kept shell when it is free (opening it if need be); else,
    /// or if the shell cannot take these commands, each runs when asked for.
    async fn chain(&self, commands: Vec<Command>) -> Chain {
        let Ok(mut slot) = self.shell.clone().try_lock_owned() else {
            return Chain::later(commands);
        };
        if matches!(&*slot, Slot::Open(shell) if shell.out_of_step()) {
            *slot = Slot::Idle;
        }
        if matches!(*slot, Slot::Fresh | Slot::Idle) {
            *slot = self.opened().await;
        }
        let Slot::Open(shell) = &mut *slot else {
            return Chain::later(commands);
        };
        let framed: Vec<(&str, Option<&[u8]>)> = commands
            .iter()
            .map(|c| (c.script.as_str(), c.input.as_deref()))
            .collect();
        match shell.submit(&framed).await {
            Ok(numbers) => Chain {
                later: VecDeque::new(),
                sent: Some(Sent {
                    slot,
                    numbers: numbers.into(),
                }),
                over: false,
                lost: None,
            },
            Err(ShellError::Unsuitable(_)) => Chain::later(commands),
            Err(ShellError::Unavailable(_)) => {
                *slot = Slot::Off;
                Chain::later(commands)
            }
            Err(ShellError::Lost(reason)) => {
                *slot = Slot::Idle;
                let mut chain = Chain::later(Vec::new());
                chain.over = true;
                chain.lost = Some(TransportError::Command {
                    host: self.host.clone(),
                    reason,
                });
                chain
            }
        }
    }

    async fn next<'a>(&'a self, chain: &'a mut Chain) -> Option<Result<Output, TransportError>> {
        if let Some(lost) = chain.lost.take() {
            return Some(Err(lost));
        }
        let Some(sent) = chain.sent.as_mut() else {
            return chain.next_later(self).await;
        };
        let n = sent.numbers.pop_front()?;
        let Slot::Open(shell) = &mut *sent.slot else {
            chain.sent = None;
            return None;
        };
        let result = match shell.collect(n).await {
            Ok(Some(out)) => Ok(out),
            Ok(None) => Err(TransportError::Command {
                host: self.host.clone(),
                reason: "the host skipped a command of a chain whose previous one passed".into(),
            }),
            Err(e) => {
                *sent.slot = Slot::Idle;
                chain.sent = None;
                chain.over = true;
                return Some(Err(TransportError::Command {
                    host: self.host.clone(),
                    reason: e.to_string(),
                }));
            }
        };
        if !matches!(&result, Ok(out) if out.success()) {
            // The host skips the rest: read their markers so that the shell stays in step.
            for n in std::mem::take(&mut sent.numbers) {
                if shell.collect(n).await.is_err() {
                    *sent.slot = Slot::Idle;
                    break;
                }
            }
        }
        if sent.numbers.is_empty() {
            chain.sent = None;
        }
        chain.ended(&result);
        Some(result)
    }

    /// A master made without `persist` lives until the link closes. With it, the master
    /// exits once idle (no channel open) for `persist`: known alive for half of that since it
    /// was made or last asked, else asked with a command, which opens a channel and so starts
    /// its idle time again (`check` would not: a master about to exit would still answer it).
    async fn alive(&self) -> bool {
        let Some(kept) = &self.kept else {
            return true;
        };
        let lock = || kept.since.lock().unwrap_or_else(|p| p.into_inner());
        if lock().elapsed() < kept.idle / 2 {
            return true;
        }
        let asked = std::time::Instant::now();
        let answered = self.run(":").await.is_ok_and(|o| o.success());
        if answered {
            *lock() = asked;
        }
        answered
    }

    async fn prepare(&self) {
        let mut slot = self.shell.lock().await;
        if matches!(*slot, Slot::Fresh | Slot::Idle) {
            *slot = self.opened().await;
        }
        // Its first line read now, with the connections made, not ahead of the first command.
        if let Slot::Open(shell) = &mut *slot {
            if shell.wait_ready().await.is_err() {
                *slot = Slot::Off;
            }
        }
    }

    async fn close(self) {
        // The shell ends when its standard input closes; then the session is ours alone.
        drop(self.shell);
        if let Ok(session) = Arc::try_unwrap(self.session) {
            match self.kept {
                // `persist`: the master stays for the next command.
                Some(kept) => kept.masters.keep(&kept.key, session),
                None => {
                    let _ = session.close().await;
                }
            }
        }
    }
}

/// The error and its causes on one line.
fn flatten(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_persist_only_where_the_fleet_fits_under_the_cap() {
        let persist = SshOptions {
            persist: Duration::from_secs(300),
            ..SshOptions::default()
        };
        assert!(persists(&persist, 10, 10));
        assert!(
            !persists(&persist, 11, 10),
            "over the cap, closing must close"
        );
        assert!(!persists(&SshOptions::default(), 1, 10), "off by default");
    }
}
