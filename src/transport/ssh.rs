//! The `ssh` transport: one OpenSSH master per host, every command multiplexed over it.

use super::{Link, Output, Target, Transport, TransportError};
use crate::site::SshOptions;
use openssh::{KnownHosts, Session, SessionBuilder, Stdio};

/// Reaches hosts with the user's OpenSSH: ssh_config, agent, known_hosts and ProxyJump apply.
pub struct Ssh {
    options: SshOptions,
}

impl Ssh {
    pub fn new(options: SshOptions) -> Self {
        Ssh { options }
    }

    fn builder(&self) -> SessionBuilder {
        let o = &self.options;
        let mut b = SessionBuilder::default();
        // A host whose key is unknown is refused unless the operator accepts new keys for
        // this run (`--accept-new-host-keys`); a changed key is refused either way.
        let check = if o.accept_new_host_keys {
            KnownHosts::Add
        } else {
            KnownHosts::Strict
        };
        b.known_hosts_check(check)
            // OpenSSH counts whole seconds; less than one would mean no timeout at all.
            .connect_timeout(o.connect_timeout.max(std::time::Duration::from_secs(1)))
            // A host that stops answering mid-run (no reset, just silence) is given up after
            // three unanswered keep-alives, about one connect-timeout: its commands fail then
            // instead of hanging.
            .server_alive_interval((o.connect_timeout / 3).max(std::time::Duration::from_secs(1)));
        if let Some(user) = &o.user {
            b.user(user.clone());
        }
        if let Some(port) = o.port {
            b.port(port);
        }
        if let Some(key) = &o.identity {
            b.keyfile(key);
        }
        if let Some(config) = &o.config {
            b.config_file(config);
        }
        if let Some(known) = &o.known_hosts {
            b.user_known_hosts_file(known);
        }
        b
    }
}

impl Ssh {
    /// A failed connection; an unknown or changed host key gets its own error, which says
    /// what to run.
    fn connect_error(&self, target: &Target, reason: &str) -> TransportError {
        let refused = ["Host key verification failed", "host key is known for"];
        if !refused.iter().any(|r| reason.contains(r))
            && !reason.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
        {
            return TransportError::Connect {
                host: target.name.clone(),
                address: target.address.clone(),
                reason: reason.to_string(),
            };
        }
        let changed = reason.contains("HAS CHANGED");
        let port = self
            .options
            .port
            .map_or(String::new(), |p| format!("-p {p} "));
        let file = self.options.known_hosts.as_ref().map_or_else(
            || "~/.ssh/known_hosts".to_string(),
            |f| f.display().to_string(),
        );
        let help = if changed {
            format!(
                "the key {} presents is not the one recorded for it: find out why before \
                 anything else; if the host was really reinstalled, remove its old key with \
                 `ssh-keygen -R {} -f {file}` and add the new one",
                target.name, target.address
            )
        } else {
            format!(
                "check the host's key and add it: `ssh-keyscan {port}{} >> {file}` (compare \
                 the fingerprint with the host's own), or, for a first contact only, run \
                 `deploy apply --accept-new-host-keys` to record the keys of hosts not yet known",
                target.address
            )
        };
        TransportError::HostKey {
            host: target.name.clone(),
            address: target.address.clone(),
            reason: if changed {
                "its host key has changed".into()
            } else {
                "its host key is not in known_hosts".into()
            },
            help,
        }
    }
}

/// A multiplexed session to one host.
pub struct SshLink {
    host: String,
    session: Session,
}

impl Transport for Ssh {
    type Link = SshLink;
    async fn connect(&self, target: &Target) -> Result<SshLink, TransportError> {
        let session = self
            .builder()
            .connect_mux(&target.address)
            .await
            .map_err(|e| self.connect_error(target, &flatten(&e)))?;
        Ok(SshLink {
            host: target.name.clone(),
            session,
        })
    }
}

impl Link for SshLink {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        let out = self
            .session
            .raw_command(script)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| TransportError::Command {
                host: self.host.clone(),
                reason: flatten(&e),
            })?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn run_input(&self, script: &str, input: &[u8]) -> Result<Output, TransportError> {
        use tokio::io::AsyncWriteExt;
        let error = |e: openssh::Error| TransportError::Command {
            host: self.host.clone(),
            reason: flatten(&e),
        };
        let mut child = self
            .session
            .raw_command(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await
            .map_err(error)?;
        let stdin = child.stdin().take();
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A script that exits without reading its input is not an error here.
                let _ = stdin.write_all(input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let (_, out) = tokio::join!(write, child.wait_with_output());
        let out = out.map_err(error)?;
        Ok(Output {
            code: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn close(self) {
        let _ = self.session.close().await;
    }
}

/// The error and its causes on one line.
fn flatten(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text.trim().to_string()
}
