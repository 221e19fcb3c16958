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
        b.known_hosts_check(KnownHosts::Strict)
            // OpenSSH counts whole seconds; less than one would mean no timeout at all.
            .connect_timeout(o.connect_timeout.max(std::time::Duration::from_secs(1)));
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
            .map_err(|e| TransportError::Connect {
                host: target.name.clone(),
                address: target.address.clone(),
                reason: flatten(&e),
            })?;
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
