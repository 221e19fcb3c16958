//! Connections that outlive one command (`persist` on the ssh transport): each host's OpenSSH
//! master is left running after the command ends, for `persist` idle time (OpenSSH's
//! ControlPersist), and the next command finds it by a key of everything that makes the
//! connection (user, address, port, identity, ssh_config, known_hosts file), so that `deploy
//! plan` then `deploy apply` pay the key exchange once. The master was made with the same
//! strict host-key checking; its socket lives in a directory only this user can enter.

use crate::site::SshOptions;
use openssh::Session;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where masters are kept and found: `$XDG_RUNTIME_DIR/drover/ssh`, else
/// `$HOME/.cache/drover/ssh`; `DROVER_SSH_DIR` instead of either.
#[derive(Debug, Clone)]
pub struct Masters {
    dir: PathBuf,
}

impl Masters {
    /// The directory, made (0700) if need be; `None` when there is no place for it.
    pub fn new() -> Option<Masters> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let dir = env("DROVER_SSH_DIR")
            .or_else(|| env("XDG_RUNTIME_DIR").map(|d| d.join("drover/ssh")))
            .or_else(|| env("HOME").map(|h| h.join(".cache/drover/ssh")))?;
        // A socket there must fit a socket's path (about 100 bytes), or no master could
        // listen: then `persist` is off rather than every connection failing.
        if !super::reaper::fits(&dir) {
            return None;
        }
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .ok()?;
        // Only a directory of this user's own, not a link to one elsewhere: the sockets found
        // in it are trusted, and what masters left in it is removed.
        let meta = std::fs::symlink_metadata(&dir).ok()?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if !meta.is_dir() || meta.uid() != unsafe { libc::geteuid() } {
            return None;
        }
        // Made earlier by someone else, or with a laxer mode: only this user may enter.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).ok()?;
        sweep(&dir, std::time::SystemTime::now() - LEFT_FOR);
        Some(Masters { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of a connection to `address`, given what [`Masters::connection`] made of the
    /// transport's options (once for every host): a short digest (socket paths are limited
    /// to about 100 bytes).
    pub fn key_of(connection: &str, address: &str) -> String {
        let digest = Sha256::digest(format!("{connection}\0{address}").as_bytes());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Everything but the address that makes a connection: user, port, and the files by
    /// their absolute paths (`ssh_config` beside one site's platform file is not another's of
    /// the same relative name), the ssh_config by its contents too (a changed `HostName` is
    /// another connection).
    pub fn connection(options: &SshOptions) -> String {
        let show = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
                .map(|p| p.display().to_string())
        };
        let config = options
            .config
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .map(|text| format!("{:x}", Sha256::digest(&text)));
        format!(
            "{:?}\0{:?}\0{:?}\0{:?}\0{:?}\0{:?}",
            options.user,
            options.port,
            show(&options.identity),
            show(&options.config),
            show(&options.known_hosts),
            config,
        )
    }

    fn record(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.master"))
    }

    /// The master kept for `key`, if it still answers; a dead one's record is removed.
    pub async fn resume(&self, key: &str) -> Option<Session> {
        let record = self.record(key);
        let ctl = PathBuf::from(std::fs::read_to_string(&record).ok()?.trim());
        if ctl.exists() {
            let session = Session::resume_mux(ctl.clone().into_boxed_path(), None);
            if session.check().await.is_ok() {
                return Some(session);
            }
            // Not ours to stop (it does not answer): leave the socket, forget the record.
            let _ = session.detach();
        }
        let _ = std::fs::remove_file(&record);
        // The directory OpenSSH's master lived in (`.ssh-connection…`), now empty or stale.
        if let Some(parent) = ctl.parent().filter(|p| p.starts_with(&self.dir)) {
            let _ = std::fs::remove_dir_all(parent);
        }
        None
    }

    /// Leaves `session`'s master running (it exits once idle for the `persist` it was made
    /// with) and records where it is for `key`.
    pub fn keep(&self, key: &str, session: Session) {
        let (ctl, _) = session.detach();
        let record = self.record(key);
        let tmp = record.with_extension("tmp");
        let written = std::fs::write(&tmp, ctl.display().to_string().as_bytes())
            .and_then(|()| std::fs::rename(&tmp, &record));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Whether a master listens on `socket`: a socket file whose master is gone (killed with the
/// machine's power, a container's end) refuses the connection.
pub(super) fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// How long a master's directory without a socket, or a record naming no socket, is left
/// alone: a master may still be logging in (its socket comes once it has), far less than this.
const LEFT_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes what masters that are gone left in `dir`, untouched since `before`: the directory
/// OpenSSH's master lived in (`.ssh-connection…`, with its log, once the master exited after
/// its idle time), and the record that named its socket. Kept masters would otherwise leave
/// one of each behind per host and `persist` period, for ever. Also a run's masters'
/// directory whose watcher never ran ([`super::reaper::abandoned`]).
fn sweep(dir: &Path, before: std::time::SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let old = |p: &Path| {
        std::fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t < before)
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let gone = old(&path)
            && if name.starts_with("run-") {
                super::reaper::abandoned(&path)
            } else if name.starts_with(".ssh-connection") {
                !answers(&path.join("master"))
            } else if name.ends_with(".master") {
                // Removed only if still the record read: a master kept meanwhile renames a
                // new one over it.
                use std::os::unix::fs::MetadataExt;
                let inode = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.ino()).ok();
                let read = inode(&path);
                let socket = std::fs::read_to_string(&path).unwrap_or_default();
                !answers(Path::new(socket.trim())) && read == inode(&path)
            } else {
                false
            };
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(&path);
        } else if gone {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of a connection to `address` with `options`.
    fn key(options: &SshOptions, address: &str) -> String {
        Masters::key_of(&Masters::connection(options), address)
    }

    #[test]
    fn what_gone_masters_left_is_removed_and_nothing_of_a_live_one() {
        let dir = tempfile::tempdir().expect("dir");
        let d = dir.path();
        // A master that exited: its directory with only its log, its record.
        std::fs::create_dir(d.join(".ssh-connectionGone01")).unwrap();
        std::fs::write(d.join(".ssh-connectionGone01/log"), "").unwrap();
        let gone = d.join(".ssh-connectionGone01/master");
        std::fs::write(d.join("aa.master"), gone.display().to_string()).unwrap();
        // One killed with its machine: its socket file left, nothing listening on it.
        std::fs::create_dir(d.join(".ssh-connectionDead01")).unwrap();
        let dead = d.join(".ssh-connectionDead01/master");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        assert!(dead.exists());
        std::fs::write(d.join("cc.master"), dead.display().to_string()).unwrap();
        // A live one: its socket, its record.
        std::fs::create_dir(d.join(".ssh-connectionLive01")).unwrap();
        let live = d.join(".ssh-connectionLive01/master");
        let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        std::fs::write(d.join("bb.master"), live.display().to_string()).unwrap();
        // A running deploy's masters' directory (its lock held), and one whose watcher never
        // ran (a reboot): only the second goes.
        std::fs::create_dir(d.join("run-1")).unwrap();
        let held = std::fs::File::create(d.join("run-1/lock")).unwrap();
        held.lock().unwrap();
        std::fs::create_dir(d.join("run-2")).unwrap();
        std::fs::write(d.join("run-2/lock"), "").unwrap();
        let names = || {
            let mut n: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        // Too recent: a master may still be logging in.
        sweep(d, std::time::SystemTime::now() - LEFT_FOR);
        assert_eq!(names().len(), 8);
        sweep(d, std::time::SystemTime::now() + LEFT_FOR);
        assert_eq!(
            names(),
            [".ssh-connectionLive01", "bb.master", "run-1"],
            "only what gone masters and a gone run left is removed"
        );
    }

    #[test]
    fn the_key_changes_with_anything_that_makes_the_connection() {
        let o = SshOptions::default();
        let k = key(&o, "10.0.0.1");
        assert_eq!(k.len(), 16);
        assert_eq!(k, key(&o, "10.0.0.1"));
        assert_ne!(k, key(&o, "10.0.0.2"));
        let user = SshOptions {
            user: Some("deploy".into()),
            ..o.clone()
        };
        assert_ne!(k, key(&user, "10.0.0.1"));
        let known = SshOptions {
            known_hosts: Some("/tmp/k".into()),
            ..o.clone()
        };
        assert_ne!(k, key(&known, "10.0.0.1"));
        // Files by their absolute paths: the same file named two ways is one key.
        let here = std::env::current_dir().unwrap();
        let relative = SshOptions {
            known_hosts: Some("k".into()),
            ..o.clone()
        };
        let absolute = SshOptions {
            known_hosts: Some(here.join("k")),
            ..o.clone()
        };
        assert_eq!(key(&relative, "10.0.0.1"), key(&absolute, "10.0.0.1"));
        // Two sites' `ssh_config` of one relative name are two files; and one file changed is
        // another connection (its `HostName` may be another machine).
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let config_in = |d: &Path, text: &str| {
            std::fs::write(d.join("ssh_config"), text).unwrap();
            SshOptions {
                config: Some(d.join("ssh_config")),
                ..o.clone()
            }
        };
        let in_a = key(
            &config_in(a.path(), "Host web1\n  HostName 10.1.0.1\n"),
            "web1",
        );
        let in_b = key(
            &config_in(b.path(), "Host web1\n  HostName 10.1.0.1\n"),
            "web1",
        );
        assert_ne!(in_a, in_b);
        let changed = key(
            &config_in(a.path(), "Host web1\n  HostName 10.9.0.9\n"),
            "web1",
        );
        assert_ne!(in_a, changed);
        // Not what only shapes commands or the first contact.
        let shell = SshOptions {
            keep_shell: !o.keep_shell,
            accept_new_host_keys: true,
            ..o.clone()
        };
        assert_eq!(k, key(&shell, "10.0.0.1"));
    }
}
