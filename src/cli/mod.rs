//! Command-line arguments, and which stages each subcommand connects. No orchestration here.

/// `print!`, `println!`, `eprint!` and `eprintln!` that never panic: a terminal that hung up
/// or a pipe closed early (`deploy plan | head`) must not end a command, least of all an
/// `apply` that is still recording its hosts' state. What cannot be written is dropped.
macro_rules! out {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = write!(std::io::stdout(), $($t)*); }};
}
macro_rules! outln {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = writeln!(std::io::stdout(), $($t)*); }};
}
macro_rules! err {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = write!(std::io::stderr(), $($t)*); }};
}
macro_rules! errln {
    ($($t:tt)*) => {{ use std::io::Write as _; let _ = writeln!(std::io::stderr(), $($t)*); }};
}

mod agent;
mod apply;
mod check;
mod completions;
mod graph;
mod history;
mod init;
mod man;
mod plan;
mod publish;
mod resume;
mod status;
mod undo;
mod verify;

use crate::inventory::{InventoryError, SelectError};
use crate::plan::PlanError;
use crate::site::SiteErrors;
use crate::state::StateError;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use thiserror::Error;

/// Exit codes; stable, documented in the book.
pub mod code {
    /// Everything asked for was done (or, for `check`, the site is valid).
    pub const OK: u8 = 0;
    /// The run finished but some hosts failed, or `verify` found a host off its desired state.
    pub const FAILED: u8 = 1;
    /// The command line itself is wrong (clap's own code).
    pub const USAGE: u8 = 2;
    /// The site, platform or policy files are invalid.
    pub const INVALID: u8 = 3;
    /// Refused: no confirmation, or a saved plan that drifted.
    pub const REFUSED: u8 = 4;
    /// The environment failed: inventory, transport, state or a file that cannot be written.
    pub const ENVIRONMENT: u8 = 5;
    /// `apply` stopped starting steps because the site's lock in the shared store (etcd) was
    /// lost: etcd could not renew its lease for `lock-ttl`.
    pub const LOCK_LOST: u8 = 6;
    /// Interrupted by a signal.
    pub const INTERRUPTED: u8 = crate::session::INTERRUPTED;
}

/// Drover: roll out a declared site over SSH, in dependency order, under a policy.
#[derive(Debug, Parser)]
#[command(name = "deploy", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

const EXIT_CODES: &str = "Exit codes: 0 ok, 1 some hosts failed or diverge, 2 usage, 3 invalid site, 4 refused, 5 environment error, 6 the site's lock in etcd was lost, 130 interrupted.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse and validate a site offline, reporting every problem at once.
    Check {
        /// The site file.
        site: PathBuf,
    },
    /// Resolve the inventory, read host state and show what would change.
    Plan(PlanArgs),
    /// Carry out a plan: show it, confirm, and roll it out.
    Apply(ApplyArgs),
    /// Which version runs where, failures with their logs, and hosts unaccounted for.
    Status(StatusArgs),
    /// Exit 0 only if every host runs its desired versions and its checks pass now.
    Verify(SiteArgs),
    /// The runs that changed hosts: when, who, what changed per service, how each ended.
    History {
        /// The site file.
        site: PathBuf,
        /// JSON instead of text (schema in the book).
        #[arg(long)]
        json: bool,
    },
    /// Apply an earlier run's snapshot again, as a normal run: the last converged run before
    /// the latest, or the one named.
    Undo(UndoArgs),
    /// Show classes, services and every dependency between them.
    Graph {
        /// The site file.
        site: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
        format: GraphFormat,
    },
    /// Write a small working starter site on the `local` platform, commented, into DIR.
    Init {
        /// Where to write it (created if need be); no file there is ever overwritten.
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Pull mode: write the site's snapshot to the platform's etcd for agents to converge on.
    Publish {
        /// The site file.
        site: PathBuf,
        /// One JSON object instead of a line (with --follow, then the events as NDJSON).
        #[arg(long)]
        json: bool,
        /// Then show the rollout's progress from the store, as `apply` shows it, until every
        /// host ended at the snapshot or a failure budget stopped a service; exit as `apply`.
        #[arg(long)]
        follow: bool,
    },
    /// Pull mode: converge this host on the snapshot published for its site, as it changes.
    Agent(Box<AgentArgs>),
    /// Pull mode: let the next wave of every service that waits at a `pause "confirm"` start.
    Resume {
        /// The site file (the one published: its policies say which waves wait).
        site: PathBuf,
        /// One JSON object instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Print shell completions for `deploy` to standard output.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, deploy(1), as roff: `deploy man > deploy.1`.
    Man {
        /// Write deploy.1 and a deploy-COMMAND.1 for every command into this directory instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The site file.
    pub site: PathBuf,
    /// Print the plan as JSON (schema in the book).
    #[arg(long)]
    pub json: bool,
    /// Save the exact plan (inventory snapshot and observed state included) to this file.
    #[arg(long, value_name = "PLAN")]
    pub out: Option<PathBuf>,
    /// Do not contact any host: treat every host as fresh.
    #[arg(long)]
    pub offline: bool,
    /// Open at most this many connections at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,
    /// Plan only these services (the others are listed as not selected).
    #[arg(long, value_name = "SERVICE", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Plan only the hosts selected: `class:app,!host:app3`, `tag:zone=eu-1a`, … (the others are
    /// listed as not selected)
    #[arg(long, value_name = "SELECTOR")]
    pub on: Vec<String>,
    /// With a store (etcd): read every host, not only those whose recorded state differs
    /// from the site.
    #[arg(long)]
    pub read_hosts: bool,
    /// Run the check of every converged host first, and plan a `repair` (the whole
    /// switch-over at the same version) where it fails.
    #[arg(long)]
    pub repair: bool,
    /// Show, for each file a step would place with other content, a unified diff of what
    /// the host has against what it would get (read from the host; secrets never shown).
    #[arg(long)]
    pub diff: bool,
}

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// The site file, or a plan saved with `deploy plan --out`.
    #[arg(value_name = "SITE|PLAN")]
    pub target: std::path::PathBuf,
    /// Do not ask for confirmation (needed when not on a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Change only these services.
    #[arg(long, value_name = "SERVICE", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Change only the hosts selected: `class:app,!host:app3`, `tag:zone=eu-1a`, …
    #[arg(long, value_name = "SELECTOR")]
    pub on: Vec<String>,
    /// NDJSON events on stdout instead of progress (schema in the book).
    #[arg(long)]
    pub json: bool,
    /// Open at most this many connections at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,
    /// First contact only: accept and record the key of a host not yet in known_hosts
    /// (OpenSSH's accept-new). A changed key is still refused.
    #[arg(long)]
    pub accept_new_host_keys: bool,
    /// Break the site's lock whoever holds it, saying whose it was: only when its holder is
    /// known to be dead (a lock left by a dead process of this machine is taken over anyway).
    #[arg(long)]
    pub break_lock: bool,
    /// With a store (etcd): read every host, not only those whose recorded state differs
    /// from the site.
    #[arg(long)]
    pub read_hosts: bool,
    /// With `--yes`: lock and read every host before anything changes, as an apply that
    /// asks first does, instead of reading hosts as the run goes (a lock another run holds,
    /// or a host that does not answer, is then found before the run).
    #[arg(long)]
    pub read_first: bool,
    /// Lock and read every host, run the check of every converged one, and repair (the whole
    /// switch-over at the same version) those whose check fails.
    #[arg(long)]
    pub repair: bool,
    /// Carry out the plan's removals: services hosts record that the site no longer runs
    /// there are stopped with the hooks the hosts recorded, then their records deleted, once
    /// every other step has passed (a site with `prune #true` always does).
    #[arg(long)]
    pub prune: bool,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// etcd's endpoints, comma-separated: `http://10.0.0.11:2379,http://10.0.0.12:2379`.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// The platform's store prefix.
    #[arg(long, default_value = "/drover")]
    pub prefix: String,
    /// The site's name (as its `site` node has it).
    #[arg(long, value_name = "SITE")]
    pub site: Option<String>,
    /// This host's name, as the inventory has it.
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Where the agent keeps its journal, contents and the snapshot it works on.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/drover/agent")]
    pub state_dir: PathBuf,
    /// The host's root directory: hooks run there, the platform's state-dir is under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The TTL of the lease each slot is held by: a dead agent's slot frees within it.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub ttl: String,
    /// Where a secret the site keeps in a file is read: at its path from the site file's
    /// directory, leading `../` dropped [default: STATE-DIR/secrets].
    #[arg(long, value_name = "DIR")]
    pub secrets: Option<PathBuf>,
    /// etcd's CA certificate (TLS), as the platform's `tls ca=`.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate for etcd, with --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// etcd's user (`auth`), its password read from --password-env.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// The variable the etcd user's password is read from.
    #[arg(long, value_name = "VAR", default_value = "ETCD_PASSWORD")]
    pub password_env: String,
    /// Print a systemd unit that runs this agent, and exit.
    #[arg(long)]
    pub print_unit: bool,
    /// Benchmarks: run agents for the first N hosts of the published snapshot, as tasks of
    /// this one process (each its own connection, watch, leases, `STATE-DIR/<host>` and host
    /// directory `ROOT/<host>`); no --host.
    #[arg(long, value_name = "N", conflicts_with_all = ["host", "print_unit"])]
    pub simulate: Option<usize>,
}

#[derive(Debug, clap::Args)]
pub struct UndoArgs {
    /// The site file (its platform and policies are today's; what runs comes back).
    pub site: PathBuf,
    /// The run to go back to (as `deploy history` lists it).
    #[arg(long, value_name = "RUN")]
    pub to: Option<String>,
    /// Do not ask for confirmation (needed when not on a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// NDJSON events on stdout instead of progress (schema in the book).
    #[arg(long)]
    pub json: bool,
    /// Open at most this many connections at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,
    /// Break the site's lock whoever holds it (as `deploy apply --break-lock`).
    #[arg(long)]
    pub break_lock: bool,
    /// With a store (etcd): read every host, not only those whose recorded state differs.
    #[arg(long)]
    pub read_hosts: bool,
    /// With `--yes`: lock and read every host before anything changes.
    #[arg(long)]
    pub read_first: bool,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub site: SiteArgs,
    /// Show only the hosts selected: `class:app,!host:app3`, `tag:zone=eu-1a`, …
    #[arg(long, value_name = "SELECTOR")]
    pub on: Vec<String>,
    /// With a store (etcd): also read every host, and say where the store and the hosts
    /// disagree.
    #[arg(long)]
    pub hosts: bool,
    /// List only the failed host/service pairs, with their logs.
    #[arg(long)]
    pub failures: bool,
    /// Also run the check of every converged host service now, and show those that fail
    /// (exit 1 if one does).
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, clap::Args)]
pub struct SiteArgs {
    /// The site file.
    pub site: PathBuf,
    /// JSON instead of a table (schema in the book).
    #[arg(long)]
    pub json: bool,
    /// Open at most this many connections at once.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphFormat {
    Text,
    Dot,
}

/// Every way a command can fail, by layer.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum Error {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Site(#[from] SiteErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Desired(#[from] crate::desired::DesiredErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Session(#[from] crate::session::SessionError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(crate::state::store::StoreError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Select(#[from] SelectError),
    #[error("{reason}")]
    #[diagnostic(code(drover::cli::usage), help("{help}"))]
    Usage { reason: String, help: String },
    #[error("cannot start the async runtime: {0}")]
    #[diagnostic(code(drover::cli::runtime))]
    Runtime(std::io::Error),
    #[error("refused: deploy init would overwrite files that are already there:\n  {files}")]
    #[diagnostic(
        code(drover::cli::init_exists),
        help("nothing was written; move those files away, or write the starter into a new directory: `deploy init NEW-DIR`")
    )]
    InitExists { files: String },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Apply(crate::apply::ApplyError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    History(crate::history::HistoryError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Publish(crate::publish::PublishError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Agent(crate::agent::AgentError),
    #[error("cannot write {path}: {source}")]
    #[diagnostic(code(drover::cli::write))]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    /// The documented exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        use crate::apply::ApplyError;
        match self {
            Error::Site(_)
            | Error::Plan(PlanError::SpreadTags(_))
            | Error::Apply(ApplyError::BadPlan { .. } | ApplyError::Inconsistent { .. })
            | Error::Desired(_) => code::INVALID,
            Error::Apply(ApplyError::UnknownService { .. } | ApplyError::Usage { .. })
            | Error::Usage { .. }
            | Error::Select(_)
            | Error::History(crate::history::HistoryError::NoRun { .. }) => code::USAGE,
            Error::Publish(crate::publish::PublishError::NoStore { .. })
            | Error::Publish(crate::publish::PublishError::Unsupported { .. }) => code::INVALID,
            Error::Publish(
                crate::publish::PublishError::Refused { .. }
                | crate::publish::PublishError::TooLarge { .. },
            ) => code::REFUSED,
            Error::Publish(_) => code::ENVIRONMENT,
            Error::Agent(crate::agent::AgentError::Usage { .. }) => code::USAGE,
            Error::Agent(_) => code::ENVIRONMENT,
            Error::Apply(ApplyError::Refused { .. } | ApplyError::Drift { .. })
            | Error::InitExists { .. }
            | Error::Session(crate::session::SessionError::Refused { .. }) => code::REFUSED,
            Error::Session(_) => code::ENVIRONMENT,
            // The lower stages' errors are taken out of it (`From<ApplyError>`).
            Error::Apply(_) => code::ENVIRONMENT,
            Error::Inventory(_)
            | Error::Secret(_)
            | Error::State(_)
            | Error::Plan(_)
            | Error::Write { .. }
            | Error::Store(_)
            | Error::History(_)
            | Error::Runtime(_) => code::ENVIRONMENT,
        }
    }
}

impl From<crate::apply::ApplyError> for Error {
    /// A lower stage's error as that stage's (its exit code), the apply stage's own as such.
    fn from(e: crate::apply::ApplyError) -> Error {
        use crate::apply::ApplyError as A;
        match e {
            A::Site(e) => Error::Site(e),
            A::Inventory(e) => Error::Inventory(e),
            A::Select(e) => Error::Select(e),
            A::Plan(e) => Error::Plan(e),
            A::Secret(e) => Error::Secret(e),
            A::Desired(e) => Error::Desired(e),
            A::Session(e) => Error::Session(e),
            A::Store(e) => Error::Store(e),
            A::Runtime(e) => Error::Runtime(e),
            e => Error::Apply(e),
        }
    }
}

impl From<crate::history::HistoryError> for Error {
    /// A lower stage's error as that stage's (its exit code), the history's own as such.
    fn from(e: crate::history::HistoryError) -> Error {
        use crate::history::HistoryError as H;
        match e {
            H::Apply(e) => e.into(),
            H::Site(e) => Error::Site(e),
            H::Store(e) => Error::Store(e),
            e => Error::History(e),
        }
    }
}

impl From<crate::publish::PublishError> for Error {
    /// A lower stage's error as that stage's (its exit code), the publish stage's own as such.
    fn from(e: crate::publish::PublishError) -> Error {
        use crate::publish::PublishError as P;
        match e {
            P::Site(e) => Error::Site(e),
            P::Apply(e) => e.into(),
            P::History(e) => e.into(),
            P::Store(e) => Error::Store(e),
            e => Error::Publish(e),
        }
    }
}

impl From<crate::agent::AgentError> for Error {
    /// A lower stage's error as that stage's (its exit code), the agent's own as such.
    fn from(e: crate::agent::AgentError) -> Error {
        use crate::agent::AgentError as A;
        match e {
            A::Site(e) => Error::Site(e),
            A::Apply(e) => e.into(),
            A::History(e) => e.into(),
            A::Store(e) => Error::Store(e),
            e => Error::Agent(e),
        }
    }
}

/// The runtime that async stages (transport, rollout) run on. At least 4 workers, whatever
/// the cores: the run journal's sync blocks the worker that emits an event for a few
/// milliseconds, and on a 2-core controller that would leave nothing to start the next steps.
/// What the library has to say to the operator (warnings, notes): lines on stderr.
fn say() -> crate::apply::Say {
    std::sync::Arc::new(|text: &str| errln!("{text}"))
}

/// Runs one command; returns the exit code on success, the error otherwise.
pub fn run(cli: Cli) -> Result<u8, Error> {
    match cli.command {
        Command::Check { site } => check::run(&site),
        Command::Plan(args) => plan::run(&args),
        Command::Graph { site, format } => graph::run(&site, format),
        Command::Apply(args) => apply::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Verify(args) => verify::run(&args),
        Command::History { site, json } => history::run(&site, json),
        Command::Undo(args) => undo::run(&args),
        Command::Publish { site, json, follow } => publish::run(&site, json, follow),
        Command::Agent(args) => agent::run(&args),
        Command::Resume { site, json } => resume::run(&site, json),
        Command::Init { dir } => init::run(&dir),
        Command::Completions { shell } => completions::run(shell),
        Command::Man { out_dir } => man::run(out_dir.as_deref()),
    }
}
