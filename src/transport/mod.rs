//! Reaching hosts: one [`Transport`] trait, an `ssh` and a `local` implementation.
//!
//! A transport runs shell text on a host through `/bin/sh -c` and returns its output. Every
//! value inside that text was quoted by [`quote`] when the text was built.

mod direct;
mod feed;
mod kept;
mod local;
mod persist;
mod quote;
mod reaper;
mod shell;
mod ssh;

pub use kept::Kept;
pub use local::Local;
pub use quote::{env_prefix, in_sh, quote};
pub use ssh::Ssh;

use crate::site::{Platform, Transport as TransportSpec};
use std::future::Future;
use thiserror::Error;

/// What a command left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Bytes to stream to a command's standard input.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// A file on the controller, streamed in chunks, never read whole.
    File(&'a std::path::Path),
    /// Bytes already in memory (a rendered template).
    Bytes(&'a [u8]),
}

impl Payload<'_> {
    /// A reader over the payload.
    pub async fn open(&self) -> std::io::Result<Box<dyn tokio::io::AsyncRead + Send + Unpin + '_>> {
        match self {
            Payload::File(p) => Ok(Box::new(tokio::fs::File::open(p).await?)),
            Payload::Bytes(b) => Ok(Box::new(*b)),
        }
    }
}

/// Which host to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub address: String,
}

/// Failures of the transport itself, not of the commands it runs.
#[derive(Debug, Clone, Error, miette::Diagnostic)]
pub enum TransportError {
    #[error("cannot connect to {host} ({address}): {reason}")]
    #[diagnostic(code(drover::transport::connect), help("check that the host is up, that ssh accepts the key, and that its host key is in known_hosts"))]
    Connect {
        host: String,
        address: String,
        reason: String,
    },
    /// Strict host key checking refused the host: its key is unknown or has changed.
    #[error("cannot connect to {host} ({address}): {reason}; {help}")]
    #[diagnostic(code(drover::transport::host_key))]
    HostKey {
        host: String,
        address: String,
        reason: String,
        help: String,
    },
    #[error("lost {host} while running a command: {reason}")]
    #[diagnostic(code(drover::transport::command))]
    Command { host: String, reason: String },
}

/// Opens links to hosts.
pub trait Transport: Send + Sync + 'static {
    type Link: Link;
    fn connect(
        &self,
        target: &Target,
    ) -> impl Future<Output = Result<Self::Link, TransportError>> + Send;
    /// Done with `link` for now: a transport that keeps links ([`Kept`]) holds it for the next
    /// stage that connects to `host`; by default it is closed.
    fn park(&self, host: &str, link: Self::Link) -> impl Future<Output = ()> + Send {
        let _ = host;
        link.close()
    }
    /// How many of the links this transport holds parked for later count against the cap of
    /// the stage that connects next (but those of hosts `skip` names). [`Kept`] counts them
    /// only over the cap: when the fleet fits, each host's one link fits with the others.
    fn idle(&self, skip: &dyn Fn(&str) -> bool) -> usize {
        let _ = skip;
        0
    }
    /// One of those parked links (not of a host `skip` names), given up for the caller to
    /// close when it needs the room under its cap.
    fn take_idle(&self, skip: &dyn Fn(&str) -> bool) -> Option<Self::Link> {
        let _ = skip;
        None
    }
}

/// How many connections a stage may open at once under a cap of `max`, the links `transport`
/// keeps parked counted in; when they fill the cap, one of them is closed to leave room for one.
pub async fn room<T: Transport>(transport: &T, max: usize) -> usize {
    let parked = transport.idle(&|_| false);
    if parked < max {
        return max - parked;
    }
    if let Some(link) = transport.take_idle(&|_| false) {
        link.close().await;
    }
    1
}

/// An open connection to one host; every command on that host goes through it.
///
/// `run` runs `script` with `/bin/sh -c` semantics in a process group of its own whose id is
/// the shell's `$$` (sshd makes every session its own; the `local` transport starts one), so
/// that a hook that hangs can be killed with everything it started.
pub trait Link: Send + Sync + 'static {
    fn run(&self, script: &str) -> impl Future<Output = Result<Output, TransportError>> + Send;
    /// Runs `script` with `input` on its standard input: how the hooks' secrets travel, never
    /// on a command line. The default, for links that cannot feed standard input, hands
    /// `input` to the script in a here-document (it then shows in the host's process list).
    fn run_input(
        &self,
        script: &str,
        input: &[u8],
    ) -> impl Future<Output = Result<Output, TransportError>> + Send {
        let script = here_document(script, input);
        async move { self.run(&script).await }
    }
    /// Runs `script` with `payload` streamed to its standard input, in a session of its own over
    /// the link's existing connection (never through the kept shell, never a new SSH login).
    /// The default, for test links only, reads the payload whole and calls [`Link::run_input`].
    fn send(
        &self,
        script: &str,
        payload: Payload<'_>,
    ) -> impl Future<Output = Result<Output, TransportError>> + Send {
        async move {
            let bytes = match payload {
                Payload::File(p) => std::fs::read(p).map_err(|e| TransportError::Command {
                    host: String::new(),
                    reason: format!("cannot read {}: {e}", p.display()),
                })?,
                Payload::Bytes(b) => b.to_vec(),
            };
            self.run_input(script, &bytes).await
        }
    }
    /// Starts `commands` in order, each to run only once the one before it exited 0; their
    /// outputs come from [`Link::next`], one per call, in order. Where the link keeps a shell
    /// on the host they are all sent at once (one round trip for the chain instead of one per
    /// command, `transport/shell.rs`); by default each runs when its output is asked for.
    fn chain(&self, commands: Vec<Command>) -> impl Future<Output = Chain> + Send {
        async move { Chain::later(commands) }
    }
    /// The output of the chain's next command, once it ends; `None` once the chain is over
    /// (every command collected, or the last one collected did not exit 0: those after it do
    /// not run). A caller may drop the chain before its end: commands already sent to the
    /// host still run, each only if the one before it passed.
    fn next<'a>(
        &'a self,
        chain: &'a mut Chain,
    ) -> impl Future<Output = Option<Result<Output, TransportError>>> + Send + 'a {
        chain.next_later(self)
    }
    /// Gets ready for many commands, ahead of the first: the `ssh` link opens the shell it
    /// keeps on the host (`transport/shell.rs`). By default nothing.
    fn prepare(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Whether the link still reaches its host, asked before a link that waited is used
    /// again. Only a `persist` master can go away on its own while held (OpenSSH's idle time
    /// runs whenever no command is on it); by default, yes.
    fn alive(&self) -> impl Future<Output = bool> + Send {
        async { true }
    }
    /// Takes what the link noted, since last asked, about contents it did not carry the way
    /// it was set to (a connection of its own that failed: sent over the master instead).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// One command of a [`Chain`]: shell text, and what goes on its standard input.
#[derive(Debug, Clone)]
pub struct Command {
    pub script: String,
    pub input: Option<Vec<u8>>,
}

impl Command {
    /// Runs it on `link`, with its input if it has one.
    pub async fn run<L: Link + ?Sized>(&self, link: &L) -> Result<Output, TransportError> {
        match &self.input {
            Some(input) => link.run_input(&self.script, input).await,
            None => link.run(&self.script).await,
        }
    }
}

/// Commands started by [`Link::chain`], their outputs collected by [`Link::next`].
pub struct Chain {
    /// Not sent yet: each runs when its output is asked for.
    later: std::collections::VecDeque<Command>,
    /// Sent at once to the host's kept shell, and the shell held until they are collected.
    sent: Option<ssh::Sent>,
    /// The last command collected did not exit 0: the chain is over.
    over: bool,
    /// The host was lost while the chain was being sent: what the first `next` reports.
    lost: Option<TransportError>,
}

impl Chain {
    /// A chain whose commands each run when [`Link::next`] asks for its output (what a link
    /// that keeps no shell does; test links that record chains start theirs with it).
    pub fn later(commands: Vec<Command>) -> Chain {
        Chain {
            later: commands.into(),
            sent: None,
            over: false,
            lost: None,
        }
    }

    /// Runs the next command not sent yet on `link`, unless the chain is over
    /// ([`Link::next`] for a chain that was not sent at once).
    async fn next_later<L: Link + ?Sized>(
        &mut self,
        link: &L,
    ) -> Option<Result<Output, TransportError>> {
        if self.over {
            return None;
        }
        let command = self.later.pop_front()?;
        let result = command.run(link).await;
        self.ended(&result);
        Some(result)
    }

    /// Whether commands of the chain were sent to the host and not all collected: if the
    /// caller leaves it now, the host may still run them.
    pub fn pending(&self) -> bool {
        self.sent.as_ref().is_some_and(ssh::Sent::pending)
    }

    /// Records how the command just collected ended.
    fn ended(&mut self, result: &Result<Output, TransportError>) {
        if !matches!(result, Ok(out) if out.success()) {
            self.over = true;
            self.later.clear();
            self.sent = None;
        }
    }
}

/// The last line of `text` that is not blank: what a failed command's standard error ends
/// with, its reason as a rule.
pub fn last_line(text: &str) -> Option<&str> {
    text.lines().rfind(|l| !l.trim().is_empty())
}

/// `script` run with `input` as its standard input, through a here-document.
pub fn here_document(script: &str, input: &[u8]) -> String {
    let text = String::from_utf8_lossy(input);
    let mut tag = String::from("DROVER_INPUT");
    while text.lines().any(|l| l == tag) {
        tag.push('_');
    }
    let newline = if text.ends_with('\n') || text.is_empty() {
        ""
    } else {
        "\n"
    };
    format!("exec <<'{tag}'\n{text}{newline}{tag}\n{script}")
}

/// The transport a platform names.
pub enum AnyTransport {
    Ssh(Ssh),
    Local(Local),
}

/// A link of either kind.
pub enum AnyLink {
    Ssh(ssh::SshLink),
    Local(local::LocalLink),
}

impl AnyTransport {
    /// The platform's transport, for a run on `hosts` hosts holding at most `max_connections`
    /// connections.
    pub fn for_platform(platform: &Platform, hosts: usize, max_connections: usize) -> AnyTransport {
        match &platform.transport {
            TransportSpec::Ssh(options) => {
                AnyTransport::Ssh(Ssh::new(options.clone(), hosts, max_connections))
            }
            TransportSpec::Local { root } => AnyTransport::Local(Local::new(root.clone())),
        }
    }
}

impl Transport for AnyTransport {
    type Link = AnyLink;
    async fn connect(&self, target: &Target) -> Result<AnyLink, TransportError> {
        match self {
            AnyTransport::Ssh(t) => t.connect(target).await.map(AnyLink::Ssh),
            AnyTransport::Local(t) => t.connect(target).await.map(AnyLink::Local),
        }
    }
}

impl Link for AnyLink {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        match self {
            AnyLink::Ssh(l) => l.run(script).await,
            AnyLink::Local(l) => l.run(script).await,
        }
    }
    async fn run_input(&self, script: &str, input: &[u8]) -> Result<Output, TransportError> {
        match self {
            AnyLink::Ssh(l) => l.run_input(script, input).await,
            AnyLink::Local(l) => l.run_input(script, input).await,
        }
    }
    async fn send(&self, script: &str, payload: Payload<'_>) -> Result<Output, TransportError> {
        match self {
            AnyLink::Ssh(l) => l.send(script, payload).await,
            AnyLink::Local(l) => l.send(script, payload).await,
        }
    }
    async fn chain(&self, commands: Vec<Command>) -> Chain {
        match self {
            AnyLink::Ssh(l) => l.chain(commands).await,
            AnyLink::Local(l) => l.chain(commands).await,
        }
    }
    async fn next<'a>(&'a self, chain: &'a mut Chain) -> Option<Result<Output, TransportError>> {
        match self {
            AnyLink::Ssh(l) => l.next(chain).await,
            AnyLink::Local(l) => l.next(chain).await,
        }
    }
    async fn prepare(&self) {
        if let AnyLink::Ssh(l) = self {
            l.prepare().await
        }
    }
    async fn alive(&self) -> bool {
        match self {
            AnyLink::Ssh(l) => l.alive().await,
            AnyLink::Local(l) => l.alive().await,
        }
    }
    fn notes(&self) -> Vec<String> {
        match self {
            AnyLink::Ssh(l) => l.notes(),
            AnyLink::Local(l) => l.notes(),
        }
    }
    async fn close(self) {
        match self {
            AnyLink::Ssh(l) => l.close().await,
            AnyLink::Local(l) => l.close().await,
        }
    }
}
