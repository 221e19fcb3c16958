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
/// their pid files, and prints how many groups it signalled. The run may be dead (carried on
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
pub fn kill_script(state_dir: &str, pid: u32) -> String {
    format!(
        r#"d={d}; n=0; live=; b=; {{ read -r b <{boot}; }} 2>/dev/null
for f in "$d"/{pid}-*.pid; do
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
  kill -TERM "-$p" 2>/dev/null && {{ n=$((n+1)); live="$live $p"; }}
done
i=0
while [ -n "$live" ] && [ "$i" -lt 50 ]; do
  still=
  for p in $live; do kill -0 "-$p" 2>/dev/null && still="$still $p"; done
  live=$still; [ -n "$live" ] || break
  i=$((i+1)); sleep 0.1
done
for p in $live; do kill -KILL "-$p" 2>/dev/null; done
echo "$n""#,
        d = quote(&crate::state::lock::hooks_dir(state_dir)),
        boot = super::hook_run::BOOT_ID,
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
        shell("/bin/sh", script)
    }

    /// `program -c script` in a process group of its own (any shell that may be `/bin/sh`).
    fn shell(program: &str, script: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.arg("-c").arg(script).process_group(0);
        cmd
    }

    /// [`sh`] with its output to `/dev/null`: a process left behind by a failed test does not
    /// hold the test's output open.
    fn quiet(script: &str) -> Command {
        let mut cmd = sh(script);
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
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
        let ended = spawn("4242-2-0.pid", " ended");
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
        end(ended);
    }

    /// Waits until `path` holds a line, and returns it.
    fn line_of(path: &std::path::Path) -> String {
        let t0 = Instant::now();
        loop {
            if let Ok(p) = std::fs::read_to_string(path) {
                if p.ends_with('\n') {
                    break p.trim().to_string();
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{}", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The 22nd field of `/proc/<pid>/stat`: when the process started.
    fn start_of(pid: u32) -> String {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let rest = stat.rsplit_once(") ").expect("comm").1;
        rest.split_whitespace()
            .nth(19)
            .expect("field 22")
            .to_string()
    }

    /// Kills what is left of the group led by `child` (a test's own), and reaps it.
    fn end(mut child: std::process::Child) {
        let group = format!("-{}", child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = child.wait();
    }

    /// Starts the kill script of controller 4242's hooks under `program`; [`said`] reads what
    /// it printed once it ends.
    fn start_kill(program: &str, state: &str) -> std::process::Child {
        shell(program, &kill_script(state, 4242))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("shell")
    }

    fn said(kill: std::process::Child) -> String {
        let out = kill.wait_with_output().expect("the kill script ends");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn a_group_id_taken_again_or_of_another_boot_is_left_alone() {
        for program in ["/bin/sh", "bash"] {
            taken_again_or_of_another_boot(program);
        }
    }

    fn taken_again_or_of_another_boot(program: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
        let pid_file = |name: &str| format!("{state}/hooks/{name}");
        let boot = std::fs::read_to_string(super::super::hook_run::BOOT_ID).expect("boot id");
        let boot = boot.trim().to_string();
        // Left alone: a group whose leader started at another time than the one recorded (the
        // id was taken again), and one recorded on another boot.
        let taken = quiet("sleep 300").spawn().expect("sh");
        let other_boot = quiet("sleep 300").spawn().expect("sh");
        let later = start_of(taken.id()).parse::<u64>().expect("a number") + 1;
        let files = [
            (
                "4242-1-0.pid",
                format!("{} 7\n{boot} {later}\n", taken.id()),
            ),
            (
                "4242-2-0.pid",
                format!(
                    "{} 7\nan-old-boot {}\n",
                    other_boot.id(),
                    start_of(other_boot.id())
                ),
            ),
        ];
        for (name, text) in &files {
            std::fs::write(pid_file(name), text).unwrap();
        }
        let out = said(start_kill(program, &state));
        let (mut taken, mut other_boot) = (taken, other_boot);
        let (taken_lives, other_lives) = (
            taken.try_wait().unwrap().is_none(),
            other_boot.try_wait().unwrap().is_none(),
        );
        end(taken);
        end(other_boot);
        assert_eq!(out, "0", "{program}");
        assert!(taken_lives, "{program}: a group taken again was killed");
        assert!(other_lives, "{program}: a group of another boot was killed");
        assert!(
            !std::path::Path::new(&pid_file("4242-2-0.pid")).exists(),
            "files cleared"
        );

        // Killed: the group as recorded on this boot, a file with nothing known (`-`), and a
        // file of an older deploy (one line).
        for (name, second) in [
            ("4242-3-0.pid", Some(boot.clone())),
            ("4242-4-0.pid", Some("- -".to_string())),
            ("4242-5-0.pid", None),
        ] {
            let mut hook = quiet("sleep 300; :").spawn().expect("sh");
            let second = match second {
                Some(b) if b.starts_with('-') => format!("{b}\n"),
                Some(b) => format!("{b} {}\n", start_of(hook.id())),
                None => String::new(),
            };
            std::fs::write(pid_file(name), format!("{} 7\n{second}", hook.id())).unwrap();
            let kill = start_kill(program, &state);
            // Reaped as soon as it dies (as the host's shell would), or its group looks alive.
            assert_eq!(hook.wait().unwrap().signal(), Some(15), "{program}: {name}");
            assert_eq!(said(kill), "1", "{program}: {name}");
        }

        // Killed: a group whose leader ended while what it started goes on, the leader a
        // zombie (not reaped yet: its start time is still there) or gone (reaped).
        for reaped in [false, true] {
            let child_file = dir.path().join(format!("child-{reaped}"));
            let mut leader = quiet(&format!(
                "sleep 300 >/dev/null 2>&1 & echo $! > '{}'",
                child_file.display()
            ))
            .spawn()
            .expect("sh");
            let recorded = start_of(leader.id());
            let child = line_of(&child_file);
            if reaped {
                leader.wait().expect("reaped");
            } else {
                let t0 = Instant::now();
                while alive(&leader.id().to_string()) {
                    assert!(t0.elapsed() < Duration::from_secs(5));
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            std::fs::write(
                pid_file("4242-6-0.pid"),
                format!("{} 7\n{boot} {recorded}\n", leader.id()),
            )
            .unwrap();
            let kill = start_kill(program, &state);
            let t0 = Instant::now();
            while alive(&child) && t0.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let killed = !alive(&child);
            let _ = leader.wait();
            if !killed {
                let _ = Command::new("kill").args(["-KILL", &child]).status();
            }
            assert!(
                killed,
                "{program}: the leaderless group was killed (reaped: {reaped})"
            );
            assert_eq!(said(kill), "1", "{program}: reaped: {reaped}");
        }
    }

    #[test]
    fn a_hooks_pid_file_names_its_group_its_start_and_this_boot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join("hooks")).unwrap();
        let file = super::super::hook_run::pid_file(&state);
        let pid = super::super::hook_run::Recorded {
            file: &file,
            number: 3,
            stop: None,
        };
        let said = dir.path().join("said");
        let hook = format!("echo running > '{}'; sleep 300", said.display());
        let mut wrapper = quiet(&super::super::hook_run::script(
            &[],
            &hook,
            &state,
            &pid,
            false,
            None,
        ))
        .spawn()
        .expect("sh");
        line_of(&said);
        let boot = std::fs::read_to_string(super::super::hook_run::BOOT_ID).expect("boot id");
        assert_eq!(
            std::fs::read_to_string(&file).expect("pid file"),
            format!(
                "{} 3\n{} {}\n",
                wrapper.id(),
                boot.trim(),
                start_of(wrapper.id())
            )
        );
        // And the kill of this process's hooks finds it.
        let out = sh(&kill_script(&state, std::process::id()))
            .output()
            .expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
        assert_eq!(wrapper.wait().unwrap().signal(), Some(15));
    }
}
