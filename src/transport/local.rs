//! The `local` transport: each host is a directory on this machine; commands run in it.

use super::{Link, Output, Target, Transport, TransportError};
use std::path::PathBuf;
use std::process::Stdio;

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
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| TransportError::Connect {
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

impl Link for LocalLink {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        let out = tokio::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| TransportError::Command {
                host: self.host.clone(),
                reason: e.to_string(),
            })?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn close(self) {}
}
