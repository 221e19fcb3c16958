//! The on-host process protocol: how a run's hooks record their process groups on a host,
//! how the hooks of a chain are kept from starting, how a hook's exit tells its own failure
//! from that of what follows it, and how hooks are killed: one on its timeout
//! ([`kill_hook_script`]), every hook of this run on an abort ([`kill_running`]), of a chain
//! left before its end ([`abandon_script`]), and of another run ([`kill_script`]: one that
//! died, before its steps are done again, or whose lock was broken, as the lock is taken).
//!
//! Every file of a run is named by its tag ([`crate::state::lock::hooks_tag`], `<controller
//! pid>-<controller start>`, which the run's lock also records), so that no run ends or cleans
//! up another's hooks, even one of the same pid on another machine.
//!
//! The script a hook runs as (shown on several lines; the parts are joined by `; `, and the
//! hook and the command after it may span lines of their own; `F` is this run's pid file on
//! the host, `<state-dir>/hooks/<tag>.pid`, one per run and host
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
//! its own ([`kill_script`]). When the hook's shell ends, the pid file is
//! marked `ended` (its first line, alone), not removed (no `rm` process per hook); the lock's
//! release at the end of the run removes it ([`crate::state::lock`]).
//! A hook may end while a process it started in the background still holds its output: the
//! command has then not ended ([`Link`]), and if it outlives its timeout, [`kill_script`]
//! still finds its group by `N`. An abort ([`kill_running`]) kills only groups not marked
//! `ended`, since it cannot tell a group that still runs from one that is gone.
//!
//! The shell running it leads a process group of its own (see [`Link`]), so `$$` is the
//! group's id. On timeout the controller runs [`kill_script`] over the same link: `TERM` to the
//! group, up to a second's grace, then `KILL`. The part in brackets is there when the hook
//! gets secrets: they arrive on standard input as `export NAME='…'`; the stop test is there
//! for a hook chained after another ([`Recorded`]'s `stop`, the chain's stop file), which does
//! not start once that file or the run's stop file ([`run_stop_file`]) is there.

use crate::state::lock::{group_runs, hooks_dir, hooks_tag, Holder, NOT_ENDED};
use crate::transport::{env_prefix, quote, Link, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The exit code of a command whose hook succeeded but whose what follows it ([`followed_by`]) failed …
pub const THEN_FAILED: i32 = 86;
/// … and the line it then ends its standard error with.
pub const THEN_MARK: &str = "drover: the hook succeeded; what follows it failed";

/// Whether `out` says the hook succeeded and its what follows it ([`followed_by`]) failed; if so, the output
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

/// This run's pid file on a host: `<state-dir>/hooks/<tag>.pid`. A host runs one hook at a
/// time, so every hook of the run on that host uses it in turn.
pub fn pid_file(state_dir: &str) -> String {
    format!("{}/{}.pid", hooks_dir(state_dir), hooks_tag())
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
/// ([`kill_script`]).
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The exit code of a chained hook that did not run: its chain's stop file was there.
pub const STOPPED: i32 = 124;

/// The run's stop file on a host: `<state-dir>/hooks/<tag>.stop`, made by an abort's kill
/// passes ([`kill_running`]) before
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

/// A new chain's stop file on a host: `<state-dir>/hooks/<tag>.<n>.stop`. The hooks after the first of a chain are sent to the host before the one
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
/// host ([`kill_script`]). A chained hook that recorded its group before the
/// kill reads the pid files is killed; one that records it after finds the stop file.
pub fn abandon_script(state_dir: &str, stop: &str) -> String {
    stop_then(stop, &kill_run_script(state_dir, &own_pid_files()))
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
pub fn kill_hook_script(pid_file: &str, number: u64) -> String {
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

/// Kills every hook process group recorded on the host by the run that holds or held the lock
/// `holder`, removes their pid files, and prints how many groups it ended, after the groups it
/// could not end, if any ([`kill_run_script`], [`kill_outcome`]). The run may be dead (carried on
/// after a crash), and a group id it recorded may be someone else's by now, so a group is left
/// alone when:
/// - it is marked `ended` (its hook's shell is gone, `hook_run.rs`): it may be gone too;
/// - its pid file was written on another boot of the host (the boot id on its second line is
///   not the host's now): every process of that boot is gone;
/// - a process of that id is there (running, or a zombie) and started at another time than
///   the hook's shell did (the start time on the second line, the 22nd field of
///   `/proc/<pid>/stat`): the id was taken again since.
///
/// A group whose leader is gone while others of it live on is killed: its id cannot have been
/// taken while the group lasts (but for a group made after the hook's, whose own leader also
/// ended: a pid namespace restarted under the same kernel, which keeps its boot id; or, on the
/// same boot, a hook's shell killed before its exit trap could mark it, and its id taken since
/// by a group that lost its leader too). A pid file of an older `deploy` (one line), or of a
/// host with no boot id or `/proc` (`-`), is taken at its word for what it lacks. Every test
/// is the shell's own (`read`, `case`, the fields cut by parameter expansion, not by word
/// splitting, which `zsh` does not do), no program: it holds under any `/bin/sh` (`dash`,
/// `bash`, busybox `ash`, `zsh`, `ksh`), which is what runs it, a session of its own included
/// (`transport::in_sh`).
pub fn kill_script(state_dir: &str, holder: &Holder) -> String {
    kill_run_script(state_dir, &holder.hook_files().pids)
}

/// This run's pid files, as a glob pattern under the hooks directory.
fn own_pid_files() -> String {
    format!("{}.pid", hooks_tag())
}

/// [`kill_script`] for the pid files `pids` (a glob pattern of digits, `-`, `.` and `*`).
///
/// Its output ends with the number of groups it ended; before it, when some could not be
/// ended, a line [`NOT_ENDED`] with their ids: a group it may not signal (another user's:
/// the run logged in as someone else) whose processes still run, or one that still runs a
/// second after its `KILL` (stuck in the kernel). Whether a group runs is read from every
/// process's `/proc/<pid>/stat` (its group, and not a zombie), whoever's it is
/// ([`group_runs`]).
fn kill_run_script(state_dir: &str, pids: &str) -> String {
    format!(
        r#"d={d}; n=0; live=; stuck=; b=; {{ read -r b <{boot}; }} 2>/dev/null
for f in "$d"/{pids}; do
  [ -f "$f" ] || continue
  p=; e=; hb=; hs=; {{ {{ read -r p _k e; read -r hb hs _r; }} <"$f"; }} 2>/dev/null; rm -f "$f"
  [ -z "$e" ] || continue
  case $p in ''|*[!0-9]*|0|1) continue;; esac
  case $hb in ''|-) ;; *) [ -n "$b" ] && [ "$hb" != "$b" ] && continue;; esac
  s=; {{ read -r s <"/proc/$p/stat"; }} 2>/dev/null; s=${{s##*') '}}
  case $hs in ''|-) ;; *)
    [ -z "$s" ] || {{ j=0; while [ $j -lt 19 ] && [ "${{s#* }}" != "$s" ]; do s=${{s#* }}; j=$((j+1)); done
      [ $j = 19 ] && [ "${{s%% *}}" = "$hs" ]; }} || continue;;
  esac
  if kill -TERM "-$p" 2>/dev/null; then n=$((n+1)); live="$live $p"
  elif {runs}; then stuck="$stuck $p"; fi
done
i=0
while [ -n "$live" ] && [ "$i" -lt 50 ]; do
  still=
  for p in $live; do kill -0 "-$p" 2>/dev/null && still="$still $p"; done
  live=$still; [ -n "$live" ] || break
  i=$((i+1)); sleep 0.1
done
for p in $live; do kill -KILL "-$p" 2>/dev/null; done
i=0
while [ -n "$live" ] && [ "$i" -lt 10 ]; do
  still=
  for p in $live; do {runs} && still="$still $p"; done
  live=$still; [ -n "$live" ] || break
  i=$((i+1)); sleep 0.1
done
for p in $live; do n=$((n-1)); done
stuck="$stuck$live"
[ -z "$stuck" ] || echo "{NOT_ENDED}$stuck"
echo "$n""#,
        d = quote(&hooks_dir(state_dir)),
        boot = BOOT_ID,
        runs = group_runs("p"),
    )
}

/// The number of groups a kill script's output ends with ([`kill_run_script`]), and the
/// groups its [`NOT_ENDED`] line names (a shell's start-up files may print before them).
pub fn kill_outcome(stdout: &[u8]) -> (Option<usize>, Vec<String>) {
    let text = String::from_utf8_lossy(stdout);
    let count = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| l.trim().parse().ok());
    let stuck = text
        .lines()
        .filter_map(|l| l.strip_prefix(NOT_ENDED))
        .flat_map(|ids| ids.split_whitespace().map(str::to_string))
        .collect();
    (count, stuck)
}

/// Kills this process's hooks on the host behind `link`, pass after pass (a hook may write its
/// pid file just after a pass), until `grace` has passed; the caller drops it once the step is
/// over. Returns how many groups it signalled.
pub async fn kill_running<L: Link>(link: &L, state_dir: &str, grace: Duration) -> usize {
    // Each pass first makes the run's stop file: a chained hook the host's shell starts after
    // it does not run ([`run_stop_file`]), one that started before is killed.
    let script = stop_then(
        &run_stop_file(state_dir),
        &kill_run_script(state_dir, &own_pid_files()),
    );
    let deadline = Instant::now() + grace;
    let mut killed = 0;
    while Instant::now() < deadline {
        if let Ok(Ok(out)) = tokio::time::timeout(Duration::from_secs(10), link.run(&script)).await
        {
            killed += kill_outcome(&out.stdout).0.unwrap_or(0);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    killed
}

#[cfg(test)]
#[path = "processes_tests.rs"]
mod tests;
