//! No ssh master of a run outlives its `deploy`. Without `persist`, OpenSSH's masters
//! (ControlPersist: they run on until told to exit) live in a directory of this process's own,
//! `run-<pid>` beside the kept masters ([`super::persist::Masters`]), watched by a small shell:
//! once this process is gone, however it ended (SIGKILL, the OOM killer, a crash), the shell
//! tells every master still there to exit and removes the directory. A `deploy` that ends as
//! usual has closed its masters already: the shell only removes the empty directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// The watcher: waits for end of file on its standard input, which this process holds open
/// until it ends; then stops each master left in `$1` (`-F /dev/null`: the user's ssh_config
/// has no say in `-O exit` on a socket given by `-S`) and removes its directory. A master
/// still logging in when the process died has no socket yet: looked for again every second,
/// for a minute at most. After a usual end there is nothing left, and it ends at once.
const WATCHER: &str = r#"read _
n=0
while [ "$n" -lt 60 ]; do
    left=0
    for d in "$1"/.ssh-connection*; do
        [ -d "$d" ] || continue
        if [ -S "$d/master" ] && ssh -F /dev/null -o BatchMode=yes -S "$d/master" -O exit _ >/dev/null 2>&1; then
            rm -rf -- "$d"
        else
            left=1
        fi
    done
    [ "$left" = 0 ] && break
    sleep 1
    n=$((n + 1))
done
rm -rf -- "$1""#;

/// The directory for this process's masters, watched from the first call on; `None` when it
/// cannot be made or watched (OpenSSH's default place is used then, as before).
pub fn dir() -> Option<&'static Path> {
    DIR.get_or_init(watch).as_deref()
}

fn watch() -> Option<PathBuf> {
    let base = super::persist::Masters::new()?;
    let dir = base.dir().join(format!("run-{}", std::process::id()));
    if !fits(&dir) {
        return None;
    }
    // A directory of a process that had this pid before: its watcher has run, or never will.
    let _ = std::fs::remove_dir_all(&dir);
    use std::os::unix::fs::DirBuilderExt;
    use std::os::unix::process::CommandExt;
    std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
    let spawned = std::process::Command::new("/bin/sh")
        .args(["-c", WATCHER, "sh"])
        .arg(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Not in the terminal's process group: a Ctrl-C is for `deploy`, not for it.
        .process_group(0)
        .spawn();
    let Ok(mut watcher) = spawned else {
        let _ = std::fs::remove_dir(&dir);
        return None;
    };
    // The pipe's writing end stays open until this process ends (the kernel closes it then,
    // whatever the end); it is made close-on-exec, so no other child holds it.
    std::mem::forget(watcher.stdin.take());
    Some(dir)
}

/// Whether a master's socket in `dir` fits a socket's path on every Unix (104 bytes on macOS,
/// 108 on Linux, the NUL included): `<dir>/.ssh-connection<6>/master`, and the 17 bytes
/// OpenSSH adds to it while it binds (`.<16 random>`).
fn fits(dir: &Path) -> bool {
    let socket = dir.as_os_str().len() + "/.ssh-connection".len() + 6 + "/master".len();
    socket + 17 < 104
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_too_long_for_openssh_is_not_used() {
        assert!(fits(Path::new("/run/user/1000/drover/ssh/run-4194304")));
        assert!(fits(Path::new("/home/alice/.cache/drover/ssh/run-4194304")));
        let long = format!("/home/{}/.cache/drover/ssh/run-4194304", "x".repeat(40));
        assert!(!fits(Path::new(&long)));
    }
}
