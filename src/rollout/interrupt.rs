//! Stopping running hooks when a run is aborted (a second Ctrl-C), and what an interrupted
//! step records.
//!
//! Every hook runs on its host in a process group of its own, whose id is written to a pid file
//! `<state-dir>/hooks/<controller pid>-<controller start>.pid` while it runs (`hook_run.rs`). An aborted
//! run kills, on each host with a running step, every group named by a pid file of its own
//! controller process: `TERM`, up to five seconds' grace, then `KILL`; over the host's existing
//! connection. The same script, given the pid of a run that died, clears what that run left
//! running before its steps are done again.

use super::step::{ServiceJob, StepJob};
use crate::state::Outcome;
use crate::transport::{quote, Link};
use std::time::{Duration, Instant};

/// Kills every hook process group recorded on the host by controller process `pid`, removes
/// their pid files, and prints how many groups it signalled. A group marked `ended` (its
/// hook's shell is gone, `hook_run.rs`) is left: it may be gone too, and its id reused.
pub fn kill_script(state_dir: &str, pid: u32) -> String {
    format!(
        r#"d={d}; n=0; live=
for f in "$d"/{pid}-*.pid; do
  [ -f "$f" ] || continue
  p=; e=; {{ read -r p _k e <"$f"; }} 2>/dev/null; rm -f "$f"
  [ -z "$e" ] || continue
  case $p in ''|*[!0-9]*|0|1) continue;; esac
  kill -s TERM -- "-$p" 2>/dev/null && {{ n=$((n+1)); live="$live $p"; }}
done
i=0
while [ -n "$live" ] && [ "$i" -lt 50 ]; do
  still=
  for p in $live; do kill -s 0 -- "-$p" 2>/dev/null && still="$still $p"; done
  live=$still; [ -n "$live" ] || break
  i=$((i+1)); sleep 0.1
done
for p in $live; do kill -s KILL -- "-$p" 2>/dev/null; done
echo "$n""#,
        d = quote(&crate::state::lock::hooks_dir(state_dir))
    )
}

/// Kills this process's hooks on the host behind `link`, pass after pass (a hook may write its
/// pid file just after a pass), until `grace` has passed; the caller drops it once the step is
/// over. Returns how many groups it signalled.
pub async fn kill_running<L: Link>(link: &L, state_dir: &str, grace: Duration) -> usize {
    // Each pass first makes the run's stop file: a chained hook the host's shell starts after
    // it does not run (`hook_run::run_stop_file`), one that started before is killed.
    let script = super::hook_run::stop_then(
        &super::hook_run::run_stop_file(state_dir),
        &kill_script(state_dir, std::process::id()),
    );
    let deadline = Instant::now() + grace;
    let mut killed = 0;
    while Instant::now() < deadline {
        if let Ok(Ok(out)) = tokio::time::timeout(Duration::from_secs(10), link.run(&script)).await
        {
            killed += String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<usize>()
                .unwrap_or(0);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    killed
}

/// `Some(failure)` once the run is being aborted: a hook must not start, and one that ends
/// (killed or not) ends as an interruption rather than with its own failure.
pub fn interrupted(job: &ServiceJob, hook: &str, started: bool) -> Option<(&'static str, String)> {
    job.cancel.aborting().then(|| {
        let what = if started {
            format!("{hook} interrupted: the run was aborted")
        } else {
            format!("aborted before {hook}")
        };
        ("interrupted", what)
    })
}

/// What an interrupted step records: `Some((version, configured, validated))`, or `None` when
/// no hook of it ran (nothing on the host changed: nothing is written).
///
/// - Caught before the state write after `start` (in `stop`, `install`, `migrate` or
///   `start`): the switch-over did not complete. The host is recorded at the version the step
///   started from (the new one on a fresh host) with `configured: failure`, so that the next
///   run does the whole switch-over again, from that same old version: `stop` whatever runs,
///   `install`, and `migrate` with the same `DEPLOY_OLD_VERSION` as the first time.
/// - Caught in `check`: `start` had passed and was recorded; the host runs the new version
///   and is recorded so, with `validated: failure`; the next run redoes it from the new
///   version.
pub fn interrupted_record(job: &StepJob) -> Option<(String, Option<Outcome>, Option<Outcome>)> {
    if !job.log.exists() {
        return None;
    }
    let started = job.record.services.get(&job.service.name).is_some_and(|r| {
        r.version == job.to
            && r.configured
                .as_ref()
                .is_some_and(|m| m.outcome == Outcome::Success && m.run == job.service.run)
    });
    Some(if started {
        (job.to.clone(), None, Some(Outcome::Failure))
    } else {
        (
            job.from.clone().unwrap_or_else(|| job.to.clone()),
            Some(Outcome::Failure),
            None,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;

    /// `/bin/sh -c script` in a process group of its own, as a link runs it.
    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script).process_group(0);
        cmd
    }

    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").starts_with(" Z"))
    }

    #[test]
    fn kills_the_groups_of_one_controller_and_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("st ate");
        std::fs::create_dir_all(state.join("hooks")).unwrap();
        let state = state.display().to_string();
        // Hooks as hook_run.rs runs them: pid file of the group (its id, the hook's number), a
        // child, then a wait.
        let spawn = |file: &str, mark: &str| {
            let script = format!(
                "echo \"$$ 7{mark}\" > '{state}/hooks/{file}'; sleep 300 & echo $! > '{state}/{file}.child'; sleep 300"
            );
            sh(&script).spawn().expect("sh")
        };
        let mut mine = spawn("4242-1-0.pid", "");
        let mut other = spawn("4243-1-0.pid", "");
        // Marked ended (its shell gone, as far as the file says): left alone, not counted.
        let mut ended = spawn("4242-2-0.pid", " ended");
        let t0 = Instant::now();
        let child = |file: &str| loop {
            if let Ok(p) = std::fs::read_to_string(format!("{state}/{file}.child")) {
                if !p.trim().is_empty() {
                    break p.trim().to_string();
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(10));
        };
        let (mine_child, other_child) = (child("4242-1-0.pid"), child("4243-1-0.pid"));
        let ended_child = child("4242-2-0.pid");
        let out = sh(&kill_script(&state, 4242)).output().expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
        assert_eq!(mine.wait().unwrap().signal(), Some(15));
        let t0 = Instant::now();
        while alive(&mine_child) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(&mine_child), "the hook's child went with its group");
        assert!(!std::path::Path::new(&format!("{state}/hooks/4242-1-0.pid")).exists());
        assert!(
            alive(&other_child),
            "another controller's hook is left alone"
        );
        assert!(other.try_wait().unwrap().is_none());
        assert!(alive(&ended_child), "a group marked ended is left alone");
        let out = sh(&kill_script(&state, 4242)).output().expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
        let _ = sh(&kill_script(&state, 4243)).output();
        let _ = other.wait();
        let group = format!("-{}", ended.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = ended.wait();
    }
}
