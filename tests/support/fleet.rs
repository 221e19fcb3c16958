//! A real fleet of SSH hosts on loopback, for integration tests.
//!
//! Every host is its own `/usr/sbin/sshd -D -e` listening on its own loopback
//! address `127.a.b.c`, port [`SSH_PORT`], inside its own namespaces made by
//! `unshare --mount --uts --pid --fork --kill-child --mount-proc`:
//!
//! * **UTS**: `hostname` prints the host's name;
//! * **mount**: the host's own directories are bind-mounted over `/srv`,
//!   `/opt`, `/var/lib` and `/root`, so whatever a deploy writes there lands in
//!   [`Fleet::host_root`] on the controller, readable by the test (an empty
//!   `/root` also keeps login shells fast). unshare(1) makes the new mount
//!   namespace's propagation private, so nothing leaks to the real tree;
//! * **PID**: sshd is PID 1 of the host, so stopping it (or [`Fleet::kill_host`])
//!   takes down every process started on that host too, daemons included.
//!
//! A fleet has one host key and one client key (ed25519), and writes a
//! `known_hosts`, an `ssh_config` and, on request, a `platform.kdl` for drover.
//! Always call ssh with `-F` [`Fleet::ssh_config`] (as [`Fleet::ssh`] does): with
//! `-F`, neither `/etc/ssh/ssh_config` nor `~/.ssh/config` is read.
//!
//! Each host's sshd holds the read end of a pipe whose write end only the test
//! process holds; when that closes (the [`Fleet`] is dropped, or the test
//! process dies however it dies) a watchdog inside the host stops sshd, so no
//! process outlives the test.
//!
//! Needs root, `unshare` (util-linux) and openssh-server; [`Fleet::start`]
//! panics with a clear message otherwise. Set `DROVER_FLEET_KEEP=1` to keep the
//! fleet directory (configs, keys, `hosts/<name>/sshd.log`) after the test.
//!
//! ```ignore
//! mod support;
//! use support::fleet::{Fleet, FleetHost};
//!
//! let fleet = Fleet::start(&[FleetHost::new("db1", "db").tag("zone", "a")]);
//! let out = fleet.ssh("db1", "hostname");
//! assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "db1");
//! ```
#![allow(dead_code)]

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The port every fleet host's sshd listens on (each host has its own address).
pub const SSH_PORT: u16 = 2222;

const SSHD: &str = "/usr/sbin/sshd";
/// (subdirectory of the host root, mount point on the host)
const HOST_DIRS: [(&str, &str); 4] = [
    ("srv", "/srv"),
    ("opt", "/opt"),
    ("var-lib", "/var/lib"),
    ("root", "/root"),
];
/// Hosts per third-octet block: fourth octets 1..=250.
const BLOCK: usize = 250;
const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs as PID 1 inside the host's namespaces: `$1` name, `$2` host root,
/// `$3` sshd_config. fd 0 is the lifeline pipe; on EOF the watchdog sends
/// SIGTERM to sshd (PID 1), and the kernel then kills the rest of the host.
/// It repeats the signal because PID 1 ignores it until sshd has installed its
/// handler (before the `exec`, PID 1 is this shell).
const HOST_INIT: &str = r#"set -eu
hostname "$1"
mount --bind "$2/srv" /srv
mount --bind "$2/opt" /opt
mount --bind "$2/var-lib" /var/lib
mount --bind "$2/root" /root
[ ! -f "$2/passwd" ] || mount --bind "$2/passwd" /etc/passwd
exec 3<&0
(read -r _ <&3 || :; while :; do kill -TERM 1; sleep 0.1; done) &
exec /usr/sbin/sshd -D -e -f "$3" 3<&-
"#;

/// Process-global counter of address blocks, so parallel fleets never overlap.
static NEXT_BLOCK: AtomicU32 = AtomicU32::new(0);

/// One host of a test fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetHost {
    /// Host name: its `hostname`, its ssh alias and its inventory name.
    /// Letters, digits, `-` and `.` only.
    pub name: String,
    /// Host class, e.g. `db`.
    pub class: String,
    /// Further inventory properties, e.g. `("zone", "a")`.
    pub tags: Vec<(String, String)>,
    /// root's login shell on this host (the machine's own when `None`): an `/etc/passwd` of
    /// the host's, the machine's with root's shell changed, is mounted over `/etc/passwd`.
    pub login_shell: Option<String>,
    /// Whether `nobody` may log in too (with `/bin/sh`, at home in `/tmp`): in the host's own
    /// `/etc/passwd`, as for [`FleetHost::login_shell`].
    pub nobody_logs_in: bool,
    /// Whether the host has a second address its sshd also listens on, which
    /// [`Fleet::move_host`] makes the inventory's.
    pub movable: bool,
}

impl FleetHost {
    /// A host with no tags.
    pub fn new(name: &str, class: &str) -> FleetHost {
        FleetHost {
            name: name.into(),
            class: class.into(),
            tags: Vec::new(),
            login_shell: None,
            nobody_logs_in: false,
            movable: false,
        }
    }

    /// Gives root this login shell on the host (builder style).
    pub fn login_shell(mut self, shell: &str) -> FleetHost {
        self.login_shell = Some(shell.into());
        self
    }

    /// Lets `nobody` log in with the fleet's key, as a second account (builder style).
    #[allow(dead_code)]
    pub fn nobody_logs_in(mut self) -> FleetHost {
        self.nobody_logs_in = true;
        self
    }

    /// Gives the host a second address, for [`Fleet::move_host`] (builder style).
    #[allow(dead_code)]
    pub fn movable(mut self) -> FleetHost {
        self.movable = true;
        self
    }

    /// Adds a tag (builder style).
    pub fn tag(mut self, key: &str, value: &str) -> FleetHost {
        self.tags.push((key.into(), value.into()));
        self
    }
}

/// A running fleet of sshd hosts on loopback. Dropping it stops every host.
pub struct Fleet {
    /// Root of the fleet's files: keys, `ssh_config`, `known_hosts`,
    /// `platform.kdl` and `hosts/<name>/` (see [`Fleet::host_root`]).
    /// Removed on drop unless `DROVER_FLEET_KEEP` is set.
    pub dir: PathBuf,
    hosts: Vec<Host>,
    /// The port each host's sshd listens on: [`SSH_PORT`], unless something else (a relay
    /// that delays traffic, `benches/compare/delay.py`) listens there and forwards to it.
    sshd_port: u16,
    _tempdir: Option<tempfile::TempDir>,
}

struct Host {
    spec: FleetHost,
    address: Ipv4Addr,
    /// A movable host's second address.
    second: Option<Ipv4Addr>,
    /// Whether the inventory gives the second address.
    moved: std::sync::atomic::AtomicBool,
    process: Mutex<Option<HostProcess>>,
}

impl Host {
    /// The address the inventory gives.
    fn current(&self) -> Ipv4Addr {
        match self.second {
            Some(second) if self.moved.load(std::sync::atomic::Ordering::SeqCst) => second,
            _ => self.address,
        }
    }
}

struct HostProcess {
    /// `unshare`, leader of the host's process group.
    child: Child,
    /// Write end of the lifeline pipe; dropping it stops the host.
    lifeline: Option<ChildStdin>,
}

impl Fleet {
    /// Starts one sshd per host, all at once, and returns once every one
    /// listens. Panics naming the host and showing its sshd log if one exits
    /// or does not listen within 20 s.
    pub fn start(hosts: &[FleetHost]) -> Fleet {
        Fleet::start_behind(hosts, SSH_PORT)
    }

    /// As [`Fleet::start`], but each sshd listens on `sshd_port`: the caller puts what
    /// reaches it on [`SSH_PORT`], which every client is told (a relay, say).
    #[allow(dead_code)]
    pub fn start_behind(hosts: &[FleetHost], sshd_port: u16) -> Fleet {
        check_environment();
        validate(hosts);
        let tempdir = tempfile::Builder::new()
            .prefix("drover-fleet-")
            .tempdir()
            .expect("create fleet directory");
        let dir = tempdir.path().to_path_buf();
        let dir_text = dir.to_str().expect("fleet directory path is UTF-8");
        assert!(
            !dir_text.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\'),
            "fleet directory {dir_text:?} must not contain whitespace, quotes or backslashes"
        );
        assert!(
            HOST_DIRS.iter().all(|(_, mnt)| !dir.starts_with(mnt)),
            "fleet directory {dir_text:?} must not lie under a directory the hosts mount over \
             (set TMPDIR to e.g. /tmp)"
        );
        let keep = std::env::var_os("DROVER_FLEET_KEEP").is_some();
        let movable = hosts.iter().filter(|h| h.movable).count();
        let addresses = allocate_addresses(hosts.len() + movable, sshd_port);
        let mut seconds = addresses[hosts.len()..].iter().copied();
        let fleet = Fleet {
            dir: dir.clone(),
            hosts: hosts
                .iter()
                .zip(addresses.iter().copied())
                .map(|(spec, address)| Host {
                    spec: spec.clone(),
                    address,
                    second: if spec.movable { seconds.next() } else { None },
                    moved: Default::default(),
                    process: Mutex::new(None),
                })
                .collect(),
            sshd_port,
            _tempdir: if keep {
                eprintln!("fleet: keeping {dir_text}");
                let _ = tempdir.keep();
                None
            } else {
                Some(tempdir)
            },
        };
        fleet.write_files();
        // Spawn every host, then wait for all of them. Should one fail, the
        // panic drops `fleet`, which stops the hosts already started.
        for host in &fleet.hosts {
            let process = fleet.spawn_host(host);
            *host.process.lock().unwrap() = Some(process);
        }
        fleet.wait_until_up();
        fleet
    }

    /// The host's loopback address, e.g. `"127.42.1.3"` (a moved host's second one).
    pub fn address(&self, host: &str) -> String {
        self.host(host).current().to_string()
    }

    /// Gives a movable host ([`FleetHost::movable`]) its second address in the inventory
    /// (`platform.kdl` written from now on): its sshd listens on both.
    #[allow(dead_code)]
    pub fn move_host(&self, host: &str) {
        let host = self.host(host);
        assert!(host.second.is_some(), "{} is not movable", host.spec.name);
        host.moved.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The names of the fleet's hosts, in the order given to [`Fleet::start`].
    pub fn names(&self) -> Vec<&str> {
        self.hosts.iter().map(|h| h.spec.name.as_str()).collect()
    }

    /// The fleet's `ssh_config`: a `Host` block per host name (its `HostName`)
    /// and a `Host *` block that applies to names and addresses alike: port
    /// 2222, user root, the fleet identity only, the fleet `known_hosts` with
    /// strict checking, no control master, batch mode, `LogLevel ERROR`.
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// The fleet's known_hosts: one `[address]:2222` line per host.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// The client's private key (its public key is `<this>.pub`).
    pub fn identity(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }

    /// The controller-side directory holding the host's own directories:
    /// `srv/`, `opt/`, `var-lib/` and `root/` are its `/srv`, `/opt`,
    /// `/var/lib` and `/root`; `sshd.log` is its sshd's output.
    pub fn host_root(&self, host: &str) -> PathBuf {
        self.dir.join("hosts").join(&self.host(host).spec.name)
    }

    /// Logins each host's sshd accepted so far, in [`Fleet::names`] order.
    pub fn logins(&self) -> Vec<usize> {
        self.names()
            .into_iter()
            .map(|h| {
                std::fs::read_to_string(self.host_root(h).join("sshd.log"))
                    .unwrap_or_default()
                    .matches("Accepted publickey")
                    .count()
            })
            .collect()
    }

    /// Logins each host's sshd accepted since `before` ([`Fleet::logins`] then).
    pub fn logins_since(&self, before: &[usize]) -> Vec<usize> {
        self.logins()
            .iter()
            .zip(before)
            .map(|(a, b)| a - b)
            .collect()
    }

    /// The lines of `path` on `host` (a path under its root, e.g. `var-lib/hooks`); none
    /// when it does not exist.
    pub fn lines(&self, host: &str, path: &str) -> Vec<String> {
        std::fs::read_to_string(self.host_root(host).join(path))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The site's lock directory on `host`, for a state directory of `/var/lib/drover`.
    pub fn lock_dir(&self, host: &str) -> PathBuf {
        self.host_root(host).join("var-lib/drover/lock")
    }

    /// What `holder.json` in [`Fleet::lock_dir`] says, if the host is locked.
    pub fn holder(&self, host: &str) -> Option<String> {
        std::fs::read_to_string(self.lock_dir(host).join("holder.json")).ok()
    }

    /// Locks `host` as another controller's run of `site` would (a holder whose liveness this
    /// machine cannot tell); returns what its `holder.json` says.
    pub fn lock_as_another_run(&self, host: &str, site: &str) -> String {
        let dir = self.lock_dir(host);
        fs::create_dir_all(&dir).expect("lock dir");
        let holder = format!(
            r#"{{"user":"ops","controller":"elsewhere","boot":"b","machine":"m","pid":4242,"since":"2026-11-27T00:00:00Z","run":"other-run","site":"{site}"}}"#
        ) + "\n";
        fs::write(dir.join("holder.json"), &holder).expect("holder");
        holder
    }

    /// Writes `site.kdl` and `policy.kdl` in the fleet's directory; returns the site's path.
    pub fn write_site(&self, site: &str, policy: &str) -> PathBuf {
        fs::write(self.dir.join("policy.kdl"), policy).expect("write policy");
        let path = self.dir.join("site.kdl");
        fs::write(&path, site).expect("write site");
        path
    }

    /// `ssh -F <ssh_config>` with stdin closed, for callers that need their own
    /// options; add `host`, then `--` and the command.
    pub fn ssh_command(&self) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.arg("-F").arg(self.ssh_config()).stdin(Stdio::null());
        cmd
    }

    /// Runs `command` (shell text: quote values yourself) on the host with the
    /// system ssh and returns its output, whatever its exit status.
    pub fn ssh(&self, host: &str, command: &str) -> Output {
        let name = &self.host(host).spec.name;
        self.ssh_command()
            .arg(name)
            .arg("--")
            .arg(command)
            .output()
            .expect("run ssh (is openssh-client installed?)")
    }

    /// Writes `platform.kdl` for this fleet (transport, `state_dir`, and a
    /// static inventory whose hosts carry `address`, `class` and their tags)
    /// and returns its path.
    pub fn write_platform(&self, state_dir: &str) -> PathBuf {
        self.write_platform_with(state_dir, "")
    }

    /// As [`Fleet::write_platform`], with `options` (`keep-shell=#false`, `persist="60s"` …)
    /// on its `transport "ssh"`.
    pub fn write_platform_with(&self, state_dir: &str, options: &str) -> PathBuf {
        let path = self.dir.join("platform.kdl");
        fs::write(&path, self.platform_kdl(state_dir, options)).expect("write platform.kdl");
        path
    }

    /// Stops the host: its sshd and every process started on it. Connections
    /// to its address are refused afterwards. Does nothing if already stopped.
    pub fn kill_host(&self, host: &str) {
        let host = self.host(host);
        let taken = host.process.lock().unwrap().take();
        if let Some(mut process) = taken {
            drop(process.lifeline.take());
            stop(&host.spec.name, &mut process.child);
        }
    }

    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.spec.name == name)
            .unwrap_or_else(|| panic!("no host `{name}` in this fleet"))
    }

    fn platform_kdl(&self, state_dir: &str, options: &str) -> String {
        let mut out = String::from("platform \"fleet\" {\n");
        let options = if options.is_empty() {
            String::new()
        } else {
            format!("{options} ")
        };
        writeln!(
            out,
            "    transport \"ssh\" {options}user=\"root\" port={SSH_PORT} config={} known-hosts={} identity={}",
            kdl_string(&path_text(&self.ssh_config())),
            kdl_string(&path_text(&self.known_hosts())),
            kdl_string(&path_text(&self.identity())),
        )
        .unwrap();
        writeln!(out, "    state-dir {}", kdl_string(state_dir)).unwrap();
        out.push_str("    inventory \"static\" {\n");
        for host in &self.hosts {
            write!(
                out,
                "        host {} address={} class={}",
                kdl_string(&host.spec.name),
                kdl_string(&host.current().to_string()),
                kdl_string(&host.spec.class)
            )
            .unwrap();
            for (key, value) in &host.spec.tags {
                write!(out, " {}={}", kdl_key(key), kdl_string(value)).unwrap();
            }
            out.push('\n');
        }
        out.push_str("    }\n}\n");
        out
    }

    /// Keys, configs and host directories.
    fn write_files(&self) {
        let host_key = self.dir.join("ssh_host_ed25519_key");
        let keygens: Vec<Child> = [
            (&host_key, "drover-fleet-host"),
            (&self.identity(), "drover-fleet-client"),
        ]
        .into_iter()
        .map(|(path, comment)| {
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(path)
                .stdin(Stdio::null())
                .spawn()
                .expect("run ssh-keygen (is openssh-client installed?)")
        })
        .collect();
        for mut keygen in keygens {
            assert!(keygen.wait().unwrap().success(), "ssh-keygen failed");
        }
        let read_pub = |private: &Path| {
            let text = fs::read_to_string(private.with_extension("pub")).expect("read public key");
            text.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let host_pub = read_pub(&host_key);
        fs::write(
            self.dir.join("authorized_keys"),
            read_pub(&self.identity()) + "\n",
        )
        .unwrap();

        let mut known_hosts = String::new();
        let mut ssh_config =
            String::from("# ssh_config for a drover test fleet; use with ssh -F\n");
        for host in &self.hosts {
            for address in std::iter::once(host.address).chain(host.second) {
                writeln!(known_hosts, "[{address}]:{SSH_PORT} {host_pub}").unwrap();
            }
            writeln!(
                ssh_config,
                "Host {}\n    HostName {}",
                host.spec.name, host.address
            )
            .unwrap();
        }
        write!(
            ssh_config,
            "Host *\n    Port {SSH_PORT}\n    User root\n    IdentityFile \"{}\"\n    IdentitiesOnly yes\n    \
             IdentityAgent none\n    PreferredAuthentications publickey\n    PasswordAuthentication no\n    \
             KbdInteractiveAuthentication no\n    UserKnownHostsFile \"{}\"\n    GlobalKnownHostsFile /dev/null\n    \
             StrictHostKeyChecking yes\n    CheckHostIP no\n    UpdateHostKeys no\n    ControlMaster no\n    \
             BatchMode yes\n    ConnectTimeout 5\n    ForwardAgent no\n    LogLevel ERROR\n",
            path_text(&self.identity()),
            path_text(&self.known_hosts()),
        )
        .unwrap();
        fs::write(self.known_hosts(), known_hosts).unwrap();
        fs::write(self.ssh_config(), ssh_config).unwrap();

        // The post-quantum default key exchange costs ~25% of a connection's CPU: the fleet
        // offers curve25519 only, unless DROVER_FLEET_KEX=default asks for OpenSSH's own
        // default (what the user's hosts run; `benches/compare --kex default`).
        let kex = if std::env::var("DROVER_FLEET_KEX").is_ok_and(|k| k == "default") {
            "# KexAlgorithms: OpenSSH's default\n"
        } else {
            "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n"
        };
        for host in &self.hosts {
            let root = self.host_root(&host.spec.name);
            for (sub, _) in HOST_DIRS {
                fs::create_dir_all(root.join(sub)).unwrap();
            }
            if host.spec.login_shell.is_some() || host.spec.nobody_logs_in {
                let passwd = fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
                let ours: String = passwd
                    .lines()
                    .map(
                        |line| match (line.strip_prefix("root:"), &host.spec.login_shell) {
                            (Some(rest), Some(shell)) => {
                                let fields: Vec<&str> = rest.split(':').collect();
                                let kept = &fields[..fields.len().saturating_sub(1)];
                                format!("root:{}:{shell}\n", kept.join(":"))
                            }
                            _ if host.spec.nobody_logs_in && line.starts_with("nobody:") => {
                                let fields: Vec<&str> = line.split(':').collect();
                                format!("{}:/tmp:/bin/sh\n", fields[..5].join(":"))
                            }
                            _ => format!("{line}\n"),
                        },
                    )
                    .collect();
                fs::write(root.join("passwd"), ours).unwrap();
            }
            let second = match host.second {
                Some(a) => format!("ListenAddress {a}:{}\n", self.sshd_port),
                None => String::new(),
            };
            let sshd_config = format!(
                "{second}ListenAddress {}:{}\nAddressFamily inet\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PidFile none\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                 MaxStartups 500\nMaxSessions 100\nUseDNS no\nPrintMotd no\nPrintLastLog no\n\
                 X11Forwarding no\nSubsystem sftp internal-sftp\n\
                 # VERBOSE logs each command (\"Starting session: command\"), which tests count\n\
                 LogLevel VERBOSE\n\
                 {kex}",
                host.address,
                self.sshd_port,
                path_text(&host_key),
                path_text(&self.dir.join("authorized_keys")),
            );
            fs::write(root.join("sshd_config"), sshd_config).unwrap();
        }
    }

    fn spawn_host(&self, host: &Host) -> HostProcess {
        let root = self.host_root(&host.spec.name);
        let log = fs::File::create(root.join("sshd.log")).expect("create sshd.log");
        let mut child = Command::new("unshare")
            .args([
                "--mount",
                "--uts",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
            ])
            .args(["/bin/sh", "-c", HOST_INIT, "host-init"])
            .arg(&host.spec.name)
            .arg(&root)
            .arg(root.join("sshd_config"))
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("run unshare (is util-linux installed?)");
        let lifeline = child.stdin.take();
        HostProcess { child, lifeline }
    }

    /// Waits until every host's sshd has logged that it listens (it has then
    /// bound its address, so the kernel accepts connections to it). Reading
    /// the logs rather than probing with connections costs nothing: each probe
    /// would make sshd fork and re-exec itself.
    fn wait_until_up(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut pending: Vec<&Host> = self.hosts.iter().collect();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for host in pending {
                let log = fs::read_to_string(self.host_root(&host.spec.name).join("sshd.log"))
                    .unwrap_or_default();
                if log.contains(&format!(
                    "Server listening on {} port {}",
                    host.address, self.sshd_port
                )) {
                    continue;
                }
                let exited = host
                    .process
                    .lock()
                    .unwrap()
                    .as_mut()
                    .and_then(|p| p.child.try_wait().unwrap());
                if let Some(status) = exited {
                    self.host_failed(host, &format!("exited ({status}) before listening"));
                }
                still.push(host);
            }
            pending = still;
            if let Some(host) = pending.first() {
                if Instant::now() > deadline {
                    self.host_failed(host, &format!("did not listen within {START_TIMEOUT:?}"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn host_failed(&self, host: &Host, what: &str) -> ! {
        let log_path = self.host_root(&host.spec.name).join("sshd.log");
        let log = fs::read_to_string(&log_path).unwrap_or_else(|e| format!("<unreadable: {e}>"));
        panic!(
            "fleet host `{}` ({}:{SSH_PORT}) {what}; its sshd log ({}):\n{log}",
            host.spec.name,
            host.address,
            log_path.display()
        );
    }
}

impl Drop for Fleet {
    /// Stops every host (all at once), waiting until each host's processes
    /// are gone; falls back to SIGKILL of the host's process group.
    fn drop(&mut self) {
        let mut running: Vec<(String, HostProcess)> = self
            .hosts
            .iter()
            .filter_map(|h| {
                let process = h.process.lock().unwrap_or_else(|e| e.into_inner()).take();
                process.map(|p| (h.spec.name.clone(), p))
            })
            .collect();
        for (_, process) in &mut running {
            drop(process.lifeline.take());
        }
        for (name, process) in &mut running {
            stop(name, &mut process.child);
        }
    }
}

/// Waits for a host whose lifeline is closed to go away; SIGKILLs its process
/// group if it has not within [`STOP_TIMEOUT`]. When `unshare` has exited, so
/// has PID 1 of the host, and with it every process of the host.
fn stop(name: &str, child: &mut Child) {
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                eprintln!("fleet: waiting for host `{name}`: {e}");
                break;
            }
        }
    }
    eprintln!(
        "fleet: host `{name}` did not stop within {STOP_TIMEOUT:?}; killing its process group"
    );
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

/// Picks `n` free loopback addresses `127.a.b.c`: `a` from the process id,
/// `b` from a process-global counter (one block of 250 hosts per value),
/// `c` = index in the block + 1. Skips a range if any address's port 2222 is
/// taken.
fn allocate_addresses(n: usize, sshd_port: u16) -> Vec<Ipv4Addr> {
    let blocks = n.div_ceil(BLOCK).max(1) as u32;
    assert!(blocks <= 254, "a fleet holds at most {} hosts", 254 * BLOCK);
    let pid = std::process::id();
    for _ in 0..10_000 {
        let k = NEXT_BLOCK.fetch_add(blocks, Ordering::Relaxed);
        let third = k % 254 + 1;
        if third + blocks - 1 > 254 {
            continue;
        }
        let second = 20 + (pid % 200 + k / 254) % 200;
        let addresses: Vec<Ipv4Addr> = (0..n)
            .map(|i| {
                Ipv4Addr::new(
                    127,
                    second as u8,
                    (third as usize + i / BLOCK) as u8,
                    (i % BLOCK + 1) as u8,
                )
            })
            .collect();
        if addresses.iter().all(|a| {
            TcpListener::bind((*a, SSH_PORT)).is_ok() && TcpListener::bind((*a, sshd_port)).is_ok()
        }) {
            return addresses;
        }
    }
    panic!("fleet: found no free range of {n} loopback addresses with port {SSH_PORT} free");
}

/// Root, sshd, the privilege-separation directory and the mount points.
fn check_environment() {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned));
    let root = euid.as_deref() == Some("0");
    if !root || !Path::new(SSHD).exists() {
        panic!(
            "the loopback SSH test fleet needs root and openssh-server ({SSHD}): run these tests \
             as root on Linux with openssh-server and util-linux installed \
             (apt-get install openssh-server) [root: {root}, {SSHD} present: {}]",
            Path::new(SSHD).exists()
        );
    }
    // sshd refuses to start without its privilege-separation directory.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create("/run/sshd")
        .expect("create /run/sshd");
    for (_, mount_point) in HOST_DIRS {
        fs::create_dir_all(mount_point).expect("create mount point");
    }
}

fn validate(hosts: &[FleetHost]) {
    assert!(!hosts.is_empty(), "a fleet needs at least one host");
    for (i, host) in hosts.iter().enumerate() {
        let name = &host.name;
        assert!(
            !name.is_empty()
                && name.len() <= 63
                && !name.starts_with(['-', '.'])
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
            "fleet host name {name:?} must be 1-63 letters, digits, `-` or `.`"
        );
        assert!(
            hosts[..i].iter().all(|h| h.name != *name),
            "fleet host name {name:?} is used twice"
        );
    }
}

fn path_text(path: &Path) -> String {
    path.to_str().expect("fleet paths are UTF-8").to_owned()
}

/// A KDL 2.0 quoted string.
fn kdl_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => write!(out, "\\u{{{:x}}}", c as u32).unwrap(),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A KDL property key: bare if it is a plain identifier, quoted otherwise.
fn kdl_key(key: &str) -> String {
    let plain = key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !matches!(key, "true" | "false" | "null" | "inf" | "nan");
    if plain {
        key.to_owned()
    } else {
        kdl_string(key)
    }
}
