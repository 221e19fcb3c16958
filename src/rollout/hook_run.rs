//! Running one hook on a host: its command built as the on-host process protocol says
//! ([`super::processes`]: its process group recorded, a chain's stop files, what follows it),
//! waited for, and its process group killed once it outlives its timeout; secrets go on
//! standard input, never on a command line.

use super::processes::{followed_by, kill_hook_script, pid_file, script, stop_then, Recorded};
use crate::secrets::Secrets;
use crate::transport::{Command, Link, Output, TransportError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One hook to run.
pub struct Call<'a> {
    /// Shell text that refuses the hook unless the run still holds the host
    /// ([`crate::state::lock::guard_script`]), run once the hook's group is recorded: a run
    /// that breaks the lock then finds the hook, or the hook finds the lock broken.
    pub guard: Option<&'a str>,
    pub env: &'a [(String, String)],
    pub command: &'a str,
    /// The state directory as the transport sees it.
    pub state_dir: &'a str,
    /// The service whose hook it is (which secrets it gets).
    pub service: &'a str,
    pub secrets: &'a Secrets,
    pub timeout: Option<Duration>,
    /// Shell text run after the hook, only if it exits 0, in the same command.
    pub then: Option<&'a str>,
    /// A hook of a chain: the chain's stop file ([`super::processes::chain_stop_file`]), made before the hook is
    /// killed on timeout so that those after it do not start.
    pub stop: Option<&'a str>,
    /// Not the first of its chain: it does not run once the chain's stop file, or the run's
    /// ([`super::processes::run_stop_file`]), exists.
    pub after: bool,
}

/// How a hook ended.
pub enum Ran {
    /// It ended by itself (or the transport failed); output and errors already redacted.
    Done(Result<Output, TransportError>),
    /// It outlived its timeout; `killed` says whether its process group was killed, or why not.
    TimedOut {
        after: Duration,
        killed: Result<(), String>,
    },
}

impl Ran {
    /// The reason a timed-out hook failed: `<hook> timed out after <d>`.
    pub fn timeout_reason(hook: &str, after: Duration, killed: &Result<(), String>) -> String {
        let after = crate::site::format_duration(after);
        match killed {
            Ok(()) => format!("{hook} timed out after {after}"),
            Err(why) => format!("{hook} timed out after {after} ({why})"),
        }
    }
}

/// A hook's command, ready to run or to [chain](Link::chain) with the hooks after it.
pub struct Prepared {
    pub command: Command,
    pid_file: String,
    number: u64,
    /// Its chain's stop file.
    stop: Option<String>,
}

/// The hook's command: its script (numbered among this process's hooks, followed by
/// [`Call::then`]) and its secrets for standard input.
pub fn prepare(call: &Call<'_>) -> Prepared {
    static HOOKS: AtomicU64 = AtomicU64::new(1);
    let number = HOOKS.fetch_add(1, Ordering::Relaxed);
    let pid_file = pid_file(call.state_dir);
    let input = call.secrets.input(call.service);
    let mut script = script(
        call.env,
        call.command,
        call.state_dir,
        &Recorded {
            file: &pid_file,
            number,
            stop: call.stop.filter(|_| call.after),
        },
        input.is_some(),
        call.guard,
    );
    if let Some(then) = call.then {
        script.push_str(&followed_by(then));
    }
    Prepared {
        command: Command { script, input },
        pid_file,
        number,
        stop: call.stop.map(str::to_string),
    }
}

/// Runs the hook; on timeout, kills its process group.
pub async fn run<L: Link>(link: &L, call: &Call<'_>) -> Ran {
    let prepared = prepare(call);
    let ran = prepared.command.run(link);
    wait(link, &prepared, call.secrets, call.timeout, ran).await
}

/// Waits for `ran`, the prepared hook's output, for at most `timeout`; past it, kills the
/// hook's process group.
pub async fn wait<L: Link>(
    link: &L,
    prepared: &Prepared,
    secrets: &Secrets,
    timeout: Option<Duration>,
    ran: impl std::future::Future<Output = Result<Output, TransportError>>,
) -> Ran {
    let result = match timeout {
        Some(t) => match tokio::time::timeout(t, ran).await {
            Ok(result) => result,
            Err(_) => {
                let killed = kill(link, prepared).await;
                return Ran::TimedOut { after: t, killed };
            }
        },
        None => ran.await,
    };
    Ran::Done(redact(secrets, result))
}

/// Output and transport errors with every secret redacted.
pub fn redact(
    secrets: &Secrets,
    result: Result<Output, TransportError>,
) -> Result<Output, TransportError> {
    if secrets.is_empty() {
        return result;
    }
    match result {
        Ok(out) => Ok(Output {
            code: out.code,
            stdout: secrets.redact(&out.stdout),
            stderr: secrets.redact(&out.stderr),
        }),
        Err(TransportError::Command { host, reason }) => Err(TransportError::Command {
            host,
            reason: secrets.redact_str(&reason),
        }),
        Err(e) => Err(e),
    }
}

/// Kills the prepared hook ([`kill_hook_script`]); a hook of a chain makes its chain's stop file
/// first, so that the hook after it does not start if this one ends (exit 0) meanwhile.
pub async fn kill<L: Link>(link: &L, prepared: &Prepared) -> Result<(), String> {
    let mut script = kill_hook_script(&prepared.pid_file, prepared.number);
    if let Some(stop) = &prepared.stop {
        script = stop_then(stop, &script);
    }
    match link.run(&script).await {
        Ok(out) if out.success() => Ok(()),
        Ok(out) => Err(format!(
            "could not kill it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("could not kill it: {e}")),
    }
}
