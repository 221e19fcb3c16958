//! Pull mode's test site: a site on the `local` platform (each host `hosts/<name>` in a
//! temporary directory) with its etcd, `deploy publish` run on it, and `deploy agent` processes
//! started for its hosts (killed when dropped); what the hosts' hooks and state files say.

use super::etcd::Etcd;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const PREFIX: &str = "/pull-test";
pub const SITE: &str = "pull";

/// A site on the `local` platform (each host `hosts/<name>` in a temporary directory), its
/// etcd, and the agents started for it (killed when dropped).
pub struct Pull {
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
    /// `(host, class)`.
    pub hosts: Vec<(String, String)>,
    pub agents: Vec<(String, Child)>,
    /// Given to every agent started.
    pub agent_args: Vec<String>,
    /// The agents' `--ttl`: long enough that a loaded machine does not lose a lease mid-step.
    pub agent_ttl: String,
}

impl Drop for Pull {
    /// Kills every agent's process group (each agent runs in a group of its own), then every
    /// process group still working in the site's directory (the hooks an agent started, each
    /// in a group of its own, as the local transport runs them): a test leaves nothing running.
    fn drop(&mut self) {
        for (_, child) in &mut self.agents {
            kill_group(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
        for _ in 0..3 {
            let left = processes_in(self.dir.path());
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: getpgid has no memory effects.
                let group = unsafe { libc::getpgid(pid) };
                if group > 1 {
                    kill_group(group as u32);
                }
                // SAFETY: kill has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// SIGKILL to process group `group`.
fn kill_group(group: u32) {
    if let Ok(group) = i32::try_from(group) {
        if group > 1 {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// The processes (other than this one) whose working directory is under `dir`.
fn processes_in(dir: &std::path::Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// A hook that logs `start <service> <ns>`, sleeps, then logs `end <service> <ns>` in the
/// host's directory.
pub fn timed(sleep: &str) -> String {
    format!(
        "echo \"start $DEPLOY_SERVICE $(date +%s%N)\" >>hook.log; sleep {sleep}; \
         echo \"end $DEPLOY_SERVICE $(date +%s%N)\" >>hook.log"
    )
}

impl Pull {
    pub fn new(hosts: &[(&str, &str)]) -> Pull {
        Pull::on(Etcd::start(), hosts)
    }

    /// On `etcd` (TLS, auth).
    pub fn on(etcd: Etcd, hosts: &[(&str, &str)]) -> Pull {
        let dir = tempfile::tempdir().expect("site directory");
        let pull = Pull {
            etcd,
            dir,
            hosts: hosts
                .iter()
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect(),
            agents: Vec::new(),
            agent_args: Vec::new(),
            agent_ttl: "10s".into(),
        };
        pull.write_platform(&pull.etcd.store_node(PREFIX, "10s"));
        for (h, _) in hosts {
            std::fs::create_dir_all(pull.host_dir(h)).expect("host directory");
        }
        pull
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn host_dir(&self, host: &str) -> PathBuf {
        self.path("hosts").join(host)
    }

    pub fn write_platform(&self, store: &str) {
        let hosts: String = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, (h, c))| {
                format!(
                    "        host \"{h}\" address=\"127.0.77.{}\" class=\"{c}\"\n",
                    i + 1
                )
            })
            .collect();
        let text = format!(
            "platform \"lab\" {{\n    transport \"local\" root=\"hosts\"\n    {store}\n    \
             inventory \"static\" {{\n{hosts}    }}\n}}\n"
        );
        std::fs::write(self.path("platform.kdl"), text).expect("platform");
    }

    /// The site at `version`: its services' text, its policy's.
    pub fn write_site(&self, version: &str, services: &str, policy: &str) {
        std::fs::write(self.path("policy.kdl"), policy).expect("policy");
        let classes: std::collections::BTreeSet<&str> =
            self.hosts.iter().map(|(_, c)| c.as_str()).collect();
        let classes: String = classes
            .iter()
            .map(|c| format!("class \"{c}\" {{ service \"{c}\"; }}\n"))
            .collect();
        let text = format!(
            "site \"{SITE}\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    \
             policy \"policy.kdl\"\n}}\n{classes}{services}"
        );
        std::fs::write(self.path("site.kdl"), text).expect("site");
    }

    pub fn deploy(&self, args: &[&str]) -> Output {
        super::cli::deploy_in(self.dir.path())
            .args(args)
            .output()
            .expect("run deploy")
    }

    pub fn publish(&self) -> String {
        let out = self.deploy(&["publish", "site.kdl"]);
        let text = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "publish: {text}");
        text
    }

    /// Starts the agent of `host`, its output in `agent-<host>.log`.
    pub fn start_agent(&mut self, host: &str) {
        self.start_agent_with(host, &[]);
    }

    /// As [`Pull::start_agent`], with these variables in the agent's environment.
    pub fn start_agent_with(&mut self, host: &str, env: &[(&str, &str)]) {
        let log = std::fs::File::create(self.path(&format!("agent-{host}.log"))).expect("log");
        use std::os::unix::process::CommandExt as _;
        let child = Command::new(env!("CARGO_BIN_EXE_deploy"))
            .envs(env.iter().copied())
            .args([
                "agent",
                "--store",
                &self.etcd.endpoints(),
                "--prefix",
                PREFIX,
            ])
            .args(["--site", SITE, "--host", host, "--ttl", &self.agent_ttl])
            .arg("--state-dir")
            .arg(self.path("agents").join(host))
            .arg("--root")
            .arg(self.host_dir(host))
            .args(&self.agent_args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            // A group of its own: dropped, the agent's group is killed, nothing left running.
            .process_group(0)
            .spawn()
            .expect("start an agent");
        self.agents.push((host.to_string(), child));
    }

    /// Starts `deploy agent --simulate n` (the first `n` hosts published, as tasks of one
    /// process: state directories `agents/<host>`, host directories `hosts/<host>`), its
    /// output in `agent-simulated.log`.
    pub fn start_simulated(&mut self, n: usize) {
        let log = std::fs::File::create(self.path("agent-simulated.log")).expect("log");
        use std::os::unix::process::CommandExt as _;
        let child = Command::new(env!("CARGO_BIN_EXE_deploy"))
            .args([
                "agent",
                "--store",
                &self.etcd.endpoints(),
                "--prefix",
                PREFIX,
            ])
            .args(["--site", SITE, "--simulate", &n.to_string()])
            .args(["--ttl", &self.agent_ttl])
            .arg("--state-dir")
            .arg(self.path("agents"))
            .arg("--root")
            .arg(self.path("hosts"))
            .args(&self.agent_args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start the simulated agents");
        self.agents.push(("simulated".to_string(), child));
    }

    /// Waits until `f` holds, for at most `limit`; else fails, showing every agent's output.
    pub fn wait(&self, what: &str, limit: Duration, f: impl Fn() -> bool) -> Duration {
        let started = Instant::now();
        while !f() {
            assert!(
                started.elapsed() < limit,
                "timed out waiting until {what}\n{}",
                self.agent_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        started.elapsed()
    }

    /// Waits up to `limit` until every one of `hosts` (host, service) records `version`.
    pub fn wait_every(&self, hosts: &[(&str, &str)], version: &str, limit: Duration) -> Duration {
        self.wait(&format!("every host runs {version}"), limit, || {
            hosts
                .iter()
                .all(|(h, c)| self.recorded(h, c).as_deref() == Some(version))
        })
    }

    pub fn agent_logs(&self) -> String {
        self.hosts
            .iter()
            .map(|(h, _)| h.as_str())
            .chain(["simulated"])
            .map(|h| {
                let log = std::fs::read_to_string(self.path(&format!("agent-{h}.log")))
                    .unwrap_or_default();
                format!("--- {h}\n{log}")
            })
            .collect()
    }

    /// The version `host` records for its service, from its own state file.
    pub fn recorded(&self, host: &str, service: &str) -> Option<String> {
        let path = self.host_dir(host).join("var/lib/drover/state.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
        v["services"][service]["version"]
            .as_str()
            .map(str::to_string)
    }

    /// `(service, start, end)` of every hook run on `host`, in nanoseconds; a start without an
    /// end (a hook still running, or killed) ends at `u128::MAX`.
    pub fn intervals(&self, host: &str) -> Vec<(String, u128, u128)> {
        let log = std::fs::read_to_string(self.host_dir(host).join("hook.log")).unwrap_or_default();
        let mut out: Vec<(String, u128, u128)> = Vec::new();
        for line in log.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [what, service, at] = parts[..] else {
                panic!("{host}: hook log line {line:?}");
            };
            let at: u128 = at.parse().expect("a time in ns");
            match what {
                "start" => out.push((service.to_string(), at, u128::MAX)),
                "end" => {
                    let open = out
                        .iter_mut()
                        .rev()
                        .find(|(s, _, e)| s == service && *e == u128::MAX)
                        .expect("an end after its start");
                    open.2 = at;
                }
                other => panic!("{host}: {other:?} in the hook log"),
            }
        }
        out
    }

    pub fn keys(&self, under: &str) -> Vec<String> {
        self.etcd
            .keys(&format!("{PREFIX}/{SITE}/{under}"))
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }
}

pub use super::intervals::most_at_once;

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A diagnostic as one line: miette's wrapping and margins taken out.
pub fn flat(err: &str) -> String {
    err.replace('│', " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < limit, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

pub const HALF: &str = "policy \"half\" {\n    batch \"50%\"\n    max-failed 0\n}\n";
