//! Running one hook on a host: in its own process group, whose id the host records in a
//! file under the state directory, so that a hook that outlives its timeout is killed with
//! everything it started; secrets go on standard input, never on a command line.
//!
//! The script a hook runs as (one line; `F` is the hook's pid file,
//! `<state-dir>/hooks/<controller pid>-<time>-<n>.pid`):
//!
//! ```text
//! [ -d D/hooks ] || (umask 077 && mkdir -p D/hooks) 2>/dev/null; trap 'rm -f F' EXIT;
//! { echo $$ >F; } 2>/dev/null; [eval "$(cat)" || exit 125; exec </dev/null;]
//! env 'DEPLOY_…=…' … /bin/sh -c '<hook>'
//! ```
//!
//! The shell running it leads a process group of its own (see [`Link`]), so `$$` is the
//! group's id. On timeout the controller runs [`kill_script`] over the same link: `TERM` to the
//! group, up to a second's grace, then `KILL`. The part in brackets is there when the hook
//! gets secrets: they arrive on standard input as `export NAME='…'`.

use crate::secrets::Secrets;
use crate::transport::{env_prefix, quote, Link, Output, TransportError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One hook to run.
pub struct Call<'a> {
    pub env: &'a [(String, String)],
    pub command: &'a str,
    /// The state directory as the transport sees it.
    pub state_dir: &'a str,
    /// The service whose hook it is (which secrets it gets).
    pub service: &'a str,
    pub secrets: &'a Secrets,
    pub timeout: Option<Duration>,
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

/// Runs the hook; on timeout, kills its process group.
pub async fn run<L: Link>(link: &L, call: &Call<'_>) -> Ran {
    let pid_file = pid_file(call.state_dir);
    let input = call.secrets.input(call.service);
    let script = script(
        call.env,
        call.command,
        call.state_dir,
        &pid_file,
        input.is_some(),
    );
    let run = async {
        match &input {
            Some(input) => link.run_input(&script, input).await,
            None => link.run(&script).await,
        }
    };
    let result = match call.timeout {
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(result) => result,
            Err(_) => {
                let killed = kill(link, &pid_file).await;
                return Ran::TimedOut { after: t, killed };
            }
        },
        None => run.await,
    };
    Ran::Done(redact(call.secrets, result))
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

/// A pid file no other hook uses: `<state-dir>/hooks/<controller pid>-<time>-<n>.pid`.
pub fn pid_file(state_dir: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}/hooks/{}-{nanos}-{n}.pid",
        state_dir.trim_end_matches('/'),
        std::process::id()
    )
}

/// The script a hook runs as (see the module's documentation). It ends with the hook itself,
/// `env … /bin/sh -c '<hook>'`.
pub fn script(
    env: &[(String, String)],
    command: &str,
    state_dir: &str,
    pid_file: &str,
    stdin_secrets: bool,
) -> String {
    let dir = quote(&format!("{}/hooks", state_dir.trim_end_matches('/')));
    let file = quote(pid_file);
    let mut out = format!(
        "[ -d {dir} ] || (umask 077 && mkdir -p {dir}) 2>/dev/null; trap {} EXIT; {{ echo $$ >{file}; }} 2>/dev/null; ",
        quote(&format!("rm -f {file}"))
    );
    if stdin_secrets {
        out.push_str("eval \"$(cat)\" || exit 125; exec </dev/null; ");
    }
    out.push_str(&env_prefix(env, command));
    out
}

/// Kills the process group recorded in `pid_file`: `TERM`, up to a second for it to go, then
/// `KILL`. Waits up to two seconds for the file (a hook that timed out before it even
/// started). Never signals group 0 or 1.
pub fn kill_script(pid_file: &str) -> String {
    format!(
        "f={}; i=0; while [ ! -s \"$f\" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done; \
         p=$(cat \"$f\" 2>/dev/null); rm -f \"$f\"; \
         case $p in ''|*[!0-9]*|0|1) echo 'no process group recorded' >&2; exit 3;; esac; \
         kill -TERM \"-$p\" 2>/dev/null || exit 0; \
         i=0; while kill -0 \"-$p\" 2>/dev/null && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; \
         kill -KILL \"-$p\" 2>/dev/null; exit 0",
        quote(pid_file)
    )
}

async fn kill<L: Link>(link: &L, pid_file: &str) -> Result<(), String> {
    match link.run(&kill_script(pid_file)).await {
        Ok(out) if out.success() => Ok(()),
        Ok(out) => Err(format!(
            "could not kill it: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("could not kill it: {e}")),
    }
}
