//! Running one hook on a host: in its own process group, whose id the host records in a
//! file under the state directory, so that a hook that outlives its timeout is killed with
//! everything it started; secrets go on standard input, never on a command line.
//!
//! The script a hook runs as (shown on several lines; the parts are joined by `; `, and the
//! hook and the command after it may span lines of their own; `F` is this run's pid file on
//! the host, `<state-dir>/hooks/<controller pid>-<controller start>.pid`, one per run and host
//! since a host runs one hook at a time; `N` numbers the hook among all the hooks this process
//! runs):
//!
//! ```text
//! [ -d D/hooks ] || (umask 077 && mkdir -p D/hooks) 2>/dev/null;
//! trap 'echo "$$ N ended" >F' EXIT;
//! _b=; _s=; { read -r _b </proc/sys/kernel/random/boot_id;
//!     read -r _ _ … (21 fields) _s _ </proc/$$/stat; } 2>/dev/null;
//! { printf '%s %s\n%s %s\n' "$$" N "${_b:--}" "${_s:--}" >F; } 2>/dev/null;
//! [{ [ -e STOP ] || [ -e F's .stop ]; } && exit STOPPED;]
//! [eval "$(cat)" || exit 125; exec </dev/null;]
//! DEPLOY_…='…' … /bin/sh -c '<hook>' [|| exit $?; { <then>; } || { echo MARK >&2; exit 86; }]
//! ```
//!
//! `deploy apply` takes the host's lock first, and that makes `D/hooks`: the test in front
//! only makes it for a hook run without that lock, so a host's first hook starts no `mkdir`.
//! The pid file's second line is the host's boot id and the start time of the hook's shell (the
//! 22nd field of its `/proc/<pid>/stat`), both read by the shell's `read` (no process; the
//! shell's name, `sh`, `bash`, `zsh` or the like, holds no space, so `read` splits the fields
//! plainly), `-` where the host has none: so that a run carrying on after the host restarted,
//! or after the group's id was taken again, does not take someone else's group for a hook of
//! its own ([`super::interrupt::kill_script`]). When the hook's shell ends, the pid file is
//! marked `ended` (its first line, alone), not removed (no `rm` process per hook); the lock's
//! release at the end of the run removes it ([`crate::state::lock`]).
//! A hook may end while a process it started in the background still holds its output: the
//! command has then not ended ([`Link`]), and if it outlives its timeout, [`kill_script`]
//! still finds its group by `N`. An abort ([`super::interrupt`]) kills only groups not marked
//! `ended`, since it cannot tell a group that still runs from one that is gone.
//!
//! The shell running it leads a process group of its own (see [`Link`]), so `$$` is the
//! group's id. On timeout the controller runs [`kill_script`] over the same link: `TERM` to the
//! group, up to a second's grace, then `KILL`. The part in brackets is there when the hook
//! gets secrets: they arrive on standard input as `export NAME='…'`; the stop test is there
//! for a hook chained after another ([`Recorded`]'s `stop`, the chain's stop file), which does
//! not start once that file or the run's stop file ([`run_stop_file`]) is there.

use crate::secrets::Secrets;
use crate::transport::{env_prefix, quote, Command, Link, Output, TransportError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// A hook of a chain: the chain's stop file ([`chain_stop_file`]), made before the hook is
    /// killed on timeout so that those after it do not start.
    pub stop: Option<&'a str>,
    /// Not the first of its chain: it does not run once the chain's stop file, or the run's
    /// ([`run_stop_file`]), exists.
    pub after: bool,
}

/// The exit code of a command whose hook succeeded but whose [`Call::then`] failed …
pub const THEN_FAILED: i32 = 86;
/// … and the line it then ends its standard error with.
pub const THEN_MARK: &str = "drover: the hook succeeded; what follows it failed";

/// Whether `out` says the hook succeeded and its [`Call::then`] failed; if so, the output
/// without the marker line.
pub fn then_failed(out: &Output) -> Option<Output> {
    if out.code != Some(THEN_FAILED) {
        return None;
    }
    let text = out.stderr.strip_suffix(b"\n").unwrap_or(&out.stderr);
    let rest = text.strip_suffix(THEN_MARK.as_bytes())?;
    Some(Output {
        code: Some(0),
        stdout: out.stdout.clone(),
        stderr: rest.to_vec(),
    })
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

/// This run's pid file on a host: `<state-dir>/hooks/<controller pid>-<controller start>.pid`.
/// A host runs one hook at a time, so every hook of the run on that host uses it in turn.
pub fn pid_file(state_dir: &str) -> String {
    static START: OnceLock<u128> = OnceLock::new();
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    format!(
        "{}/{}-{start}.pid",
        crate::state::lock::hooks_dir(state_dir),
        std::process::id()
    )
}

/// Where a hook records its process group: the run's pid file, and the hook's number in it;
/// for a hook after the first of a chain, the chain's stop file.
pub struct Recorded<'a> {
    pub file: &'a str,
    pub number: u64,
    pub stop: Option<&'a str>,
}

/// Where a Linux host says which boot it is in: on the second line of a hook's pid file, so
/// that a later run can tell a group recorded before the host restarted
/// ([`super::interrupt::kill_script`]).
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The exit code of a chained hook that did not run: its chain's stop file was there.
pub const STOPPED: i32 = 124;

/// The run's stop file on a host: `<state-dir>/hooks/<controller pid>-<controller
/// start>.stop`, made by an abort's kill passes ([`super::interrupt::kill_running`]) before
/// they look for hooks to kill: no chained hook of the run starts on the host after it.
pub fn run_stop_file(state_dir: &str) -> String {
    run_stop_of(&pid_file(state_dir))
}

/// The run's stop file beside its pid file ([`run_stop_file`]).
fn run_stop_of(pid_file: &str) -> String {
    format!("{}.stop", pid_file.trim_end_matches(".pid"))
}

/// `script`, after making the stop file `stop` (whose presence keeps chained hooks from
/// starting): what every command that kills hooks of a chain runs.
pub fn stop_then(stop: &str, script: &str) -> String {
    format!("{{ : >{}; }} 2>/dev/null; {script}", quote(stop))
}

/// A new chain's stop file on a host: `<state-dir>/hooks/<controller pid>-<controller
/// start>.<n>.stop`. The hooks after the first of a chain are sent to the host before the one
/// ahead of them has ended, so a controller that leaves a chain before its end (a hook that
/// timed out, an abort) must keep the rest from starting there: each of them records its
/// process group, then exits [`STOPPED`] if this file exists ([`abandon_script`]).
pub fn chain_stop_file(state_dir: &str) -> String {
    static CHAINS: AtomicU64 = AtomicU64::new(1);
    let n = CHAINS.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}.stop", pid_file(state_dir).trim_end_matches(".pid"))
}

/// What a controller runs (in a session of its own) when it leaves a chain before its end:
/// makes the chain's stop file, then kills every hook of this process still running on the
/// host ([`super::interrupt::kill_script`]). A chained hook that recorded its group before the
/// kill reads the pid files is killed; one that records it after finds the stop file.
pub fn abandon_script(state_dir: &str, stop: &str) -> String {
    stop_then(
        stop,
        &super::interrupt::kill_script(state_dir, std::process::id()),
    )
}

/// The script a hook runs as (see the module's documentation). It ends with the hook itself,
/// `env … /bin/sh -c '<hook>'`.
pub fn script(
    env: &[(String, String)],
    command: &str,
    state_dir: &str,
    pid: &Recorded,
    stdin_secrets: bool,
    guard: Option<&str>,
) -> String {
    let dir = quote(&crate::state::lock::hooks_dir(state_dir));
    let (file, n) = (quote(pid.file), pid.number);
    let mut out = format!(
        "[ -d {dir} ] || (umask 077 && mkdir -p {dir}) 2>/dev/null; trap {} EXIT; \
         _b=; _s=; {{ read -r _b <{BOOT_ID}; read -r{fields} _s _ </proc/$$/stat; }} 2>/dev/null; \
         {{ printf '%s %s\\n%s %s\\n' \"$$\" {n} \"${{_b:--}}\" \"${{_s:--}}\" >{file}; }} 2>/dev/null; ",
        quote(&format!("{{ echo \"$$ {n} ended\" >{file}; }} 2>/dev/null")),
        fields = " _".repeat(21),
    );
    if let Some(stop) = pid.stop {
        out.push_str(&format!(
            "{{ [ -e {} ] || [ -e {} ]; }} && exit {STOPPED}; ",
            quote(stop),
            quote(&run_stop_of(pid.file))
        ));
    }
    if let Some(guard) = guard {
        out.push_str(guard);
    }
    if stdin_secrets {
        out.push_str("eval \"$(cat)\" || exit 125; exec </dev/null; ");
    }
    out.push_str(&env_prefix(env, command));
    out
}

/// What makes a hook's script go on with `then` when the hook exits 0.
pub fn followed_by(then: &str) -> String {
    format!(
        " || exit $?; {{ {then}; }} || {{ echo {} >&2; exit {THEN_FAILED}; }}",
        quote(THEN_MARK)
    )
}

/// Kills the process group that hook `number` recorded in `pid_file`, even once its shell has
/// ended (a process it left may hold its output, so its command has not ended): `TERM`, up to
/// a second for it to go, then `KILL`. Waits up to two seconds for the hook to record itself
/// (one that timed out before it even started); another hook's group is never signalled, nor
/// group 0 or 1. The file is read by the shell's `read`, without a process.
pub fn kill_script(pid_file: &str, number: u64) -> String {
    format!(
        "f={}; i=0; while :; do p=; n=; {{ read -r p n e <\"$f\"; }} 2>/dev/null; \
         [ \"$n\" = {number} ] && break; \
         [ $i -ge 20 ] && {{ echo 'no process group recorded' >&2; exit 3; }}; \
         sleep 0.1; i=$((i+1)); done; rm -f \"$f\"; \
         case $p in ''|*[!0-9]*|0|1) echo 'no process group recorded' >&2; exit 3;; esac; \
         kill -TERM \"-$p\" 2>/dev/null || exit 0; \
         i=0; while kill -0 \"-$p\" 2>/dev/null && [ $i -lt 10 ]; do sleep 0.1; i=$((i+1)); done; \
         kill -KILL \"-$p\" 2>/dev/null; exit 0",
        quote(pid_file)
    )
}

/// Kills the prepared hook ([`kill_script`]); a hook of a chain makes its chain's stop file
/// first, so that the hook after it does not start if this one ends (exit 0) meanwhile.
async fn kill<L: Link>(link: &L, prepared: &Prepared) -> Result<(), String> {
    let mut script = kill_script(&prepared.pid_file, prepared.number);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The script of a hook `hook`, followed by `then`, run by the real `/bin/sh`.
    fn run(hook: &str, then: &str) -> Output {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().display().to_string();
        let file = pid_file(&state);
        let pid = Recorded {
            file: &file,
            number: 1,
            stop: None,
        };
        let mut text = script(&[], hook, &state, &pid, false, None);
        text.push_str(&followed_by(then));
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&text)
            .current_dir(dir.path())
            .output()
            .expect("sh runs");
        Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        }
    }

    #[test]
    fn a_chained_hook_does_not_start_once_its_chain_is_stopped_and_is_killed_if_it_had() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join("hooks")).expect("hooks dir");
        let file = pid_file(&state);
        let stop = chain_stop_file(&state);
        assert!(stop.starts_with(&format!("{state}/hooks/")) && stop.ends_with(".stop"));
        assert_ne!(stop, chain_stop_file(&state), "each chain its own");
        let ran = dir.path().join("ran");
        let hook = format!("touch {}", quote(&ran.display().to_string()));
        let chained = |n| {
            let pid = Recorded {
                file: &file,
                number: n,
                stop: Some(&stop),
            };
            script(&[], &hook, &state, &pid, false, None)
        };
        let sh = |text: &str| {
            std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(text)
                .output()
                .expect("sh runs")
        };
        // Before the chain is left, the hook runs.
        assert!(sh(&chained(1)).status.success());
        assert!(ran.exists());
        std::fs::remove_file(&ran).expect("rm");
        // Left: the stop file is made, and a hook that starts after it does not run.
        let abandon = sh(&abandon_script(&state, &stop));
        assert!(abandon.status.success(), "{abandon:?}");
        let stopped = sh(&chained(2));
        assert_eq!(stopped.status.code(), Some(STOPPED));
        assert!(!ran.exists(), "a hook ran after its chain was left");
        // One that started before: its group is killed by the same script.
        std::fs::remove_file(&stop).expect("rm");
        let slow = Recorded {
            file: &file,
            number: 3,
            stop: Some(&stop),
        };
        let text = script(&[], &format!("sleep 5; {hook}"), &state, &slow, false, None);
        let mut child = std::process::Command::new("setsid")
            .args(["/bin/sh", "-c", &text])
            .spawn()
            .expect("setsid runs");
        // Once it has recorded its group (the pid file names hook 3).
        let recorded = || std::fs::read_to_string(&file).is_ok_and(|t| t.contains(" 3"));
        let mut waited = 0;
        while !recorded() && waited < 250 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            waited += 1;
        }
        assert!(recorded(), "the hook recorded its group");
        // Reaped as soon as it dies (as the host's shell would), or its group looks alive.
        let waiter = std::thread::spawn(move || child.wait());
        let abandon = sh(&abandon_script(&state, &stop));
        assert_eq!(String::from_utf8_lossy(&abandon.stdout).trim(), "1");
        let status = waiter.join().expect("joins").expect("waits");
        assert!(!status.success(), "killed");
        assert!(!ran.exists(), "the hook went on after its chain was left");
        // The run's stop file (an abort's kill passes make it) stops every chained hook too.
        std::fs::remove_file(&stop).expect("rm");
        assert!(sh(&chained(4)).status.success(), "runs again");
        std::fs::remove_file(&ran).expect("rm");
        std::fs::write(run_stop_file(&state), "").expect("run stop");
        assert_eq!(sh(&chained(5)).status.code(), Some(STOPPED));
        assert!(!ran.exists(), "a chained hook ran after the run's abort");
    }

    #[test]
    fn then_runs_only_after_a_hook_that_passed_and_its_failure_is_told_apart() {
        let passed = run("echo hook", "echo then");
        assert_eq!(passed.code, Some(0));
        assert_eq!(passed.stdout, b"hook\nthen\n");
        assert!(then_failed(&passed).is_none());

        let failed = run("echo hook; exit 3", "echo then");
        assert_eq!(
            (failed.code, failed.stdout.as_slice()),
            (Some(3), &b"hook\n"[..])
        );
        assert!(then_failed(&failed).is_none());

        let then_failed_out = run("echo hook >&2", "echo nope >&2; false");
        let hook = then_failed(&then_failed_out).expect("told apart");
        assert_eq!(hook.code, Some(0));
        assert_eq!(hook.stderr, b"hook\nnope\n");

        // A hook that itself exits 86 is the hook's failure.
        let own = run("exit 86", "true");
        assert_eq!(own.code, Some(THEN_FAILED));
        assert!(then_failed(&own).is_none());
    }
}
