//! Large contents over a connection of their own (`direct-above` on the ssh transport): a file
//! at least that large is streamed to the host by an `ssh` process of its own, with the same
//! options as the host's master (strict host-key checking, BatchMode, the user's ssh_config,
//! identity and known_hosts) but never through a master (`ControlPath=none`). Measured on the
//! loopback fleet (book, appendix-measurements.md): a session over a master made for the run
//! costs the host's sshd far more per byte than a connection of its own. The price is a second
//! authentication per host for each such file.

use super::Output;
use crate::site::SshOptions;
use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The arguments of `ssh` that run `script` on `address` over a connection of its own: the
/// options the master is made with, then `-- address script` (`--`: neither the address nor
/// the script is ever read as an option).
pub fn arguments(options: &SshOptions, address: &str, script: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut opt = |o: String| {
        args.push("-o".into());
        args.push(o.into());
    };
    opt("BatchMode=yes".into());
    opt(format!(
        "StrictHostKeyChecking={}",
        if options.accept_new_host_keys {
            "accept-new"
        } else {
            "yes"
        }
    ));
    // Its own connection, even where the user's ssh_config multiplexes.
    opt("ControlMaster=no".into());
    opt("ControlPath=none".into());
    // Forwardings the user's ssh_config asks for are the master's: here they would only clash
    // with it (a port already taken fails the connection under ExitOnForwardFailure).
    opt("ClearAllForwardings=yes".into());
    let (connect, alive) = super::ssh::timeouts(options);
    opt(format!("ConnectTimeout={}", connect.as_secs()));
    opt(format!("ServerAliveInterval={}", alive.as_secs()));
    if let Some(known) = &options.known_hosts {
        let mut o = OsString::from("UserKnownHostsFile=");
        o.push(known);
        args.push("-o".into());
        args.push(o);
    }
    if let Some(port) = options.port {
        args.push("-p".into());
        args.push(port.to_string().into());
    }
    if let Some(user) = &options.user {
        args.push("-l".into());
        args.push(user.into());
    }
    if let Some(key) = &options.identity {
        args.push("-o".into());
        args.push("IdentitiesOnly=yes".into());
        args.push("-i".into());
        args.push(key.into());
    }
    if let Some(config) = &options.config {
        args.push("-F".into());
        args.push(config.into());
    }
    args.extend([
        "-T".into(),
        "--".into(),
        address.into(),
        super::in_sh(script).into(),
    ]);
    args
}

/// Room for connections of their own within the run's `--max-connections`: each of the run's
/// hosts may hold a master at any time (the link pool keeps those within the cap), so these
/// get what the cap leaves beyond one per host, and none when the fleet reaches the cap.
#[derive(Debug)]
pub struct Open {
    now: AtomicUsize,
    room: usize,
}

/// One connection of its own counted in [`Open`], until dropped.
#[derive(Debug)]
pub struct Counted(Arc<Open>);

impl Open {
    /// For a run on `hosts` hosts under a cap of `max_connections`.
    pub fn new(hosts: usize, max_connections: usize) -> Arc<Open> {
        Arc::new(Open {
            now: AtomicUsize::new(0),
            room: max_connections.saturating_sub(hosts),
        })
    }

    /// Counts one more connection of its own if there is room; `None` if there is not.
    pub fn take(self: &Arc<Self>) -> Option<Counted> {
        self.now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.room).then_some(n + 1)
            })
            .ok()
            .map(|_| Counted(self.clone()))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether `path` is large enough to go over a connection of its own.
pub fn goes_direct(options: &SshOptions, path: &Path) -> bool {
    match options.direct_above {
        Some(above) => std::fs::metadata(path).is_ok_and(|m| m.len() >= above),
        None => false,
    }
}

/// OpenSSH's own failures (it could not connect, authenticate, or lost the connection) end
/// with this code, and so does a remote command killed by a signal; the scripts sent here
/// never exit with it themselves. Either way the content is sent again over the master,
/// which is harmless: each attempt receives into a part of its own
/// ([`crate::state::receive_script`]).
pub const SSH_FAILED: i32 = 255;

/// Runs `script` on `address` over a connection of its own with `path` as its standard input
/// (handed to `ssh` as a descriptor: no byte passes through this process). `Err` when that
/// connection could not carry it: why, with ssh's last words.
pub async fn send(
    options: &SshOptions,
    address: &str,
    script: &str,
    path: &Path,
) -> Result<Output, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut command = tokio::process::Command::new("ssh");
    command
        .args(arguments(options, address, script))
        .stdin(Stdio::from(file))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Not in the terminal's process group: a first Ctrl-C lets running steps finish, and
        // their transfers with them; a step given up drops (and so kills) this process.
        .process_group(0)
        .kill_on_drop(true);
    ends_with_this_process(&mut command);
    let out = command
        .output()
        .await
        .map_err(|e| format!("cannot start ssh: {e}"))?;
    if out.status.code() == Some(SSH_FAILED) {
        let text = String::from_utf8_lossy(&out.stderr);
        let last = super::last_line(&text).unwrap_or("");
        return Err(format!(
            "a connection of its own for {} failed: {}",
            path.display(),
            last.trim()
        ));
    }
    Ok(Output {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// On Linux, `command` gets SIGTERM when this process ends, however it ends (a SIGKILL, the
/// OOM killer): a transfer never runs on for a `deploy` that is gone (the host then keeps
/// nothing of it: the part it received is short, and removed). The signal comes when the
/// thread that started it ends: the runtime's threads last as long as the process (nothing
/// here may run on a thread that ends sooner: no `block_in_place` here; a worker that blocks
/// in place elsewhere joins the blocking pool, whose idle threads [`crate::session::runtime`]
/// keeps). Elsewhere the transfer runs to its end.
fn ends_with_this_process(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: between fork and exec the closure calls only prctl and getppid, both
        // async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before the signal was asked for: end now.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn options() -> SshOptions {
        SshOptions {
            user: Some("deploy".into()),
            port: Some(2222),
            identity: Some("/keys/id".into()),
            known_hosts: Some("/keys/known".into()),
            config: Some("/keys/config".into()),
            connect_timeout: Duration::from_secs(9),
            keep_shell: true,
            persist: Duration::ZERO,
            accept_new_host_keys: false,
            direct_above: Some(10),
        }
    }

    fn text(args: &[OsString]) -> Vec<String> {
        args.iter().map(|a| a.to_string_lossy().into()).collect()
    }

    #[test]
    fn a_connection_of_its_own_keeps_every_option_of_the_master() {
        let args = text(&arguments(&options(), "-oProxyCommand=x", "cat >f"));
        let pairs: Vec<String> = args.windows(2).map(|w| w.join(" ")).collect();
        for want in [
            "-o BatchMode=yes",
            "-o StrictHostKeyChecking=yes",
            "-o ControlPath=none",
            "-o ControlMaster=no",
            "-o ClearAllForwardings=yes",
            "-o ConnectTimeout=9",
            "-o ServerAliveInterval=3",
            "-o UserKnownHostsFile=/keys/known",
            "-p 2222",
            "-l deploy",
            "-i /keys/id",
            "-F /keys/config",
        ] {
            assert!(
                pairs.iter().any(|p| p == want),
                "{want} missing in {args:?}"
            );
        }
        // The address and the script come after `--`, never read as options; the login shell
        // only starts `/bin/sh` for the script.
        assert_eq!(
            args[args.len() - 3..],
            ["--", "-oProxyCommand=x", "exec /bin/sh -c 'cat >f'"]
        );
        let new = SshOptions {
            accept_new_host_keys: true,
            ..options()
        };
        let args = text(&arguments(&new, "h", "s"));
        assert!(args.iter().any(|a| a == "StrictHostKeyChecking=accept-new"));
        assert!(!args.iter().any(|a| a == "StrictHostKeyChecking=no"));
    }

    #[test]
    fn connections_of_their_own_get_what_the_cap_leaves_beyond_a_master_per_host() {
        let open = Open::new(3, 5);
        let first = open.take().expect("1 of the 2 left");
        let second = open.take().expect("2 of the 2 left");
        assert!(open.take().is_none(), "a third would pass the cap");
        drop(first);
        let again = open.take().expect("room again once one ended");
        assert!(open.take().is_none());
        drop((second, again));
        assert!(open.take().is_some());
        // A fleet at or over the cap leaves none.
        assert!(Open::new(5, 5).take().is_none());
        assert!(Open::new(9, 5).take().is_none());
    }

    #[test]
    fn only_files_at_least_as_large_as_the_setting_go_direct() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        let large = dir.path().join("large");
        std::fs::write(&small, b"123456789").unwrap();
        std::fs::write(&large, b"1234567890").unwrap();
        assert!(!goes_direct(&options(), &small));
        assert!(goes_direct(&options(), &large));
        let off = SshOptions {
            direct_above: None,
            ..options()
        };
        assert!(!goes_direct(&off, &large));
        assert!(!goes_direct(&options(), &dir.path().join("missing")));
    }
}
