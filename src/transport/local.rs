//! The `local` transport: each host is a directory on this machine; commands run in it.

use super::{Link, Output, Target, Transport, TransportError};
use std::path::PathBuf;
use std::process::Stdio;

/// The variables of `deploy`'s environment a command on a local host is given: what a login
/// has (sshd sets `PATH`, `HOME`, `USER`, `LOGNAME` and `SHELL`, and passes the locale), and
/// where temporary files go.
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "TERM",
];

/// Hosts are directories under `root`.
pub struct Local {
    root: PathBuf,
}

impl Local {
    pub fn new(root: PathBuf) -> Self {
        Local { root }
    }
}

/// A host directory.
pub struct LocalLink {
    host: String,
    dir: PathBuf,
}

impl Transport for Local {
    type Link = LocalLink;
    async fn connect(&self, target: &Target) -> Result<LocalLink, TransportError> {
        let dir = self.root.join(&target.name);
        // One `mkdir` syscall or two: not worth a blocking-pool thread for each host.
        std::fs::create_dir_all(&dir).map_err(|e| TransportError::Connect {
            host: target.name.clone(),
            address: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(LocalLink {
            host: target.name.clone(),
            dir,
        })
    }
}

impl LocalLink {
    /// `/bin/sh -c script` in the host's directory, in a process group of its own (as sshd
    /// gives every session), so that `kill -- -$$` reaches everything the script started.
    /// Its environment is a login's basics only ([`PASSED`]), as sshd gives a session: never
    /// `deploy`'s own (the fingerprint key, a store's password, another service's secrets).
    /// What the site gives a hook reaches it in the command's text, as over SSH.
    fn command(&self, script: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.env_clear();
        for name in PASSED {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        cmd.arg("-c")
            .arg(script)
            .current_dir(&self.dir)
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    fn error(&self, e: std::io::Error) -> TransportError {
        TransportError::Command {
            host: self.host.clone(),
            reason: e.to_string(),
        }
    }
}

impl Link for LocalLink {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        let out = self
            .command(script)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| self.error(e))?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn run_input(&self, script: &str, input: &[u8]) -> Result<Output, TransportError> {
        use tokio::io::AsyncWriteExt;
        let mut child = self
            .command(script)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| self.error(e))?;
        let stdin = child.stdin.take();
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A script that exits without reading its input is not an error here.
                let _ = stdin.write_all(input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, out) = tokio::join!(write, child.wait_with_output());
        let out = out.map_err(|e| self.error(e))?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn send(
        &self,
        script: &str,
        payload: super::Payload<'_>,
    ) -> Result<Output, TransportError> {
        let input = payload.open().await.map_err(|e| self.error(e))?;
        let mut child = self
            .command(script)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| self.error(e))?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (out, err) = super::feed::feed(stdin, stdout, stderr, input)
            .await
            .map_err(|e| self.error(e))?;
        let status = child.wait().await.map_err(|e| self.error(e))?;
        Ok(Output {
            code: status.code(),
            stdout: out,
            stderr: err,
        })
    }

    async fn close(self) {}
}
