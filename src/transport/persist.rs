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
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .ok()?;
        // Made earlier by someone else, or with a laxer mode: only this user may enter.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).ok()?;
        Some(Masters { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of a connection to `address` with `options`: a short digest (socket paths are
    /// limited to about 100 bytes).
    pub fn key(options: &SshOptions, address: &str) -> String {
        let show = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let text = format!(
            "{:?}\0{address}\0{:?}\0{:?}\0{:?}\0{:?}",
            options.user,
            options.port,
            show(&options.identity),
            show(&options.config),
            show(&options.known_hosts),
        );
        let digest = Sha256::digest(text.as_bytes());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_changes_with_anything_that_makes_the_connection() {
        let o = SshOptions::default();
        let k = Masters::key(&o, "10.0.0.1");
        assert_eq!(k.len(), 16);
        assert_eq!(k, Masters::key(&o, "10.0.0.1"));
        assert_ne!(k, Masters::key(&o, "10.0.0.2"));
        let user = SshOptions {
            user: Some("deploy".into()),
            ..o.clone()
        };
        assert_ne!(k, Masters::key(&user, "10.0.0.1"));
        let known = SshOptions {
            known_hosts: Some("/tmp/k".into()),
            ..o.clone()
        };
        assert_ne!(k, Masters::key(&known, "10.0.0.1"));
        // Not what only shapes commands or the first contact.
        let shell = SshOptions {
            keep_shell: !o.keep_shell,
            accept_new_host_keys: true,
            ..o.clone()
        };
        assert_eq!(k, Masters::key(&shell, "10.0.0.1"));
    }
}
