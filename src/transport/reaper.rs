//! No ssh master of a run outlives its `deploy`. Without `persist`, OpenSSH's masters
//! (ControlPersist: they run on until told to exit) live in a directory of this process's own,
//! `run-<pid>-<random>` beside the kept masters ([`super::persist::Masters`]), watched by a
//! small shell: once this process is gone, however it ended (SIGKILL, the OOM killer, a
//! crash), the shell tells every master still there to exit and removes the directory. A
//! `deploy` that ends as usual has closed its masters already: the shell only removes the
//! empty directory. The process holds a lock on `<dir>/lock` while it lives, and `<dir>/host`
//! names its machine, by which a later `deploy` on that machine knows a directory whose
//! watcher never ran (a reboot) from one in use ([`abandoned`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// The watcher: waits for end of file on its standard input, which this process holds open
/// until it ends; then stops each master left in `$1` (`-F /dev/null`: the user's ssh_config
/// has no say in `-O exit` on a socket given by `-S`) and removes its directory. A master
/// still logging in when the process died has no socket yet: looked for again every second,
/// for a minute at most; then what has no socket is removed (such a master cannot bind its
/// socket and exits), and a directory whose master would not exit is left as it is. After a
/// usual end there is nothing left, and it ends at once.
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
for d in "$1"/.ssh-connection*; do
    [ -d "$d" ] && [ ! -S "$d/master" ] && rm -rf -- "$d"
done
rm -f -- "$1/lock" "$1/host"
rmdir -- "$1" 2>/dev/null"#;

/// The directory for this process's masters, watched from the first call on; `None` when it
/// cannot be made or watched (the openssh crate's default place is used then, unwatched).
pub fn dir() -> Option<&'static Path> {
    DIR.get_or_init(watch).as_deref()
}

fn watch() -> Option<PathBuf> {
    let base = super::persist::Masters::new()?;
    let dir = create(base.dir())?;
    let Some(()) = hold(&dir) else {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    };
    use std::os::unix::process::CommandExt;
    let spawned = std::process::Command::new("/bin/sh")
        .args(["-c", WATCHER, "sh"])
        .arg(&dir)
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Not in the terminal's process group: a Ctrl-C is for `deploy`, not for it.
        .process_group(0)
        .spawn();
    let Ok(mut watcher) = spawned else {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    };
    // The pipe's writing end stays open until this process ends (the kernel closes it then,
    // whatever the end); it is made close-on-exec, so no other child holds it.
    std::mem::forget(watcher.stdin.take());
    Some(dir)
}

/// Makes a new directory `run-<pid>-<n>` in `base`, only this user's: never one that exists.
fn create(base: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for n in 0..16u32 {
        let suffix = (seed ^ n.wrapping_mul(0x9e37_79b9)) & 0xff_ffff;
        let dir = base.join(format!("run-{}-{suffix:06x}", std::process::id()));
        if !fits(&dir) {
            return None;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Some(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(_) => return None,
        }
    }
    None
}

/// Marks `dir` as this machine's (`<dir>/host`: a home shared between machines holds theirs
/// too) and takes the lock on `<dir>/lock` for the rest of this process's life. Where the
/// file system has no locks, the directory goes unlocked: a later `deploy` cannot lock it
/// either, and leaves it alone.
fn hold(dir: &Path) -> Option<()> {
    std::fs::write(dir.join("host"), hostname()).ok()?;
    let lock = std::fs::File::create(dir.join("lock")).ok()?;
    match lock.try_lock() {
        Ok(()) => std::mem::forget(lock),
        Err(std::fs::TryLockError::WouldBlock) => return None,
        Err(std::fs::TryLockError::Error(_)) => {}
    }
    Some(())
}

/// This machine's name, as the kernel has it.
fn hostname() -> Vec<u8> {
    let mut name = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what is passed.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    if ok {
        name[..end].to_vec()
    } else {
        Vec::new()
    }
}

/// Whether `dir` (a `run-…` directory, long untouched: the caller's to tell) was left by a
/// `deploy` of this machine that is gone and whose watcher is done with it (or never ran: a
/// reboot mid-run): its lock free, and no master answering on a socket in it.
pub(super) fn abandoned(dir: &Path) -> bool {
    let here = std::fs::read(dir.join("host")).map_or(true, |h| h == hostname());
    // Read and write: NFS locks a file only so.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("lock"));
    let free = match lock {
        Ok(lock) => lock.try_lock().is_ok(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    let answering = std::fs::read_dir(dir).map_or(true, |entries| {
        entries
            .flatten()
            .any(|e| super::persist::answers(&e.path().join("master")))
    });
    here && free && !answering
}

/// Whether a master's socket in `dir` fits a socket's path on every Unix (104 bytes on macOS,
/// 108 on Linux, the NUL included): `<dir>/.ssh-connection<6>/master`, and the 17 bytes
/// OpenSSH adds to it while it binds (`.<16 random>`).
pub(super) fn fits(dir: &Path) -> bool {
    let socket = dir.as_os_str().len() + "/.ssh-connection".len() + 6 + "/master".len();
    socket + 17 < 104
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_too_long_for_openssh_is_not_used() {
        assert!(fits(Path::new(
            "/run/user/1000/drover/ssh/run-4194304-a1b2c3"
        )));
        assert!(fits(Path::new(
            "/home/alice/.cache/drover/ssh/run-4194304-a1b2c3"
        )));
        let long = format!(
            "/home/{}/.cache/drover/ssh/run-4194304-a1b2c3",
            "x".repeat(36)
        );
        assert!(!fits(Path::new(&long)));
    }

    #[test]
    fn each_directory_is_new_and_a_held_one_is_not_abandoned() {
        let base = tempfile::tempdir().expect("base");
        let a = create(base.path()).expect("a");
        let b = create(base.path()).expect("b");
        assert_ne!(a, b, "never a directory that exists");
        // Held by a live process: in use.
        let lock = std::fs::File::create(a.join("lock")).unwrap();
        lock.lock().unwrap();
        assert!(!abandoned(&a));
        drop(lock);
        // A child another test forks holds a copy of the lock until it execs: a moment.
        let given_back = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            abandoned(&a)
        });
        assert!(given_back);
        // A master answering on a socket in it: left alone; its socket once nothing listens
        // (the machine went down with the master): gone.
        std::fs::create_dir(b.join(".ssh-connectionX")).unwrap();
        let socket = b.join(".ssh-connectionX/master");
        let listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert!(!abandoned(&b));
        drop(listening);
        assert!(socket.exists());
        // (A child another test forks holds a copy of the listening socket until it execs.)
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            abandoned(&b)
        });
        assert!(gone);
        // Another machine's (a home shared between machines): never this one's to remove.
        std::fs::write(b.join("host"), "elsewhere").unwrap();
        assert!(!abandoned(&b));
    }
}
