//! The three-tier workload (`--workload tiers`, issue 16): `db` → `api` (`needs "db"`) →
//! `web` (`needs "api" healthy="50%"` and the api hosts' addresses) on one loopback fleet, each
//! host's `install` and its server's readiness after `start` waiting durations drawn once per
//! host from a seeded distribution with stragglers, every SSH connection behind a round trip
//! (`--rtt`, 30 ms unless given). Drover at 30 % (also with every host kept connected,
//! `--max-connections` N, on a fleet over the default cap) and all at once, Ansible and pyinfra
//! at their best, and the ideal schedule of each policy (zero overhead), as a table of medians
//! with each run's SSH connections and sessions per host (the hosts' sshd logs), and the
//! issues' targets as ratios of medians of one run.
//!
//! Every tool runs the same shell steps, which read the host's waits from `/srv/tier/wait`
//! (written once, untimed, with the scripts they call): the tools differ only in how they order
//! and connect.

use super::fleet::{self, Fleet, FleetHost};
use super::stats::load1;
use super::tiers_fleet::{layout, waits};
use super::tool::{sshd_lines, ACCEPTED, SESSION};
use super::{http_version, machine_cpu, Args, Machine, Relay, Tools};
use drover::plan::Plan;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

mod ideals;
mod inputs;
mod phases;
mod render;
mod scripts;

use ideals::Ideals;
use phases::Phases;
use render::render;

/// The tiers, in dependency order.
const TIERS: [&str; 3] = ["db", "api", "web"];
/// Each tier's server listens on this port, on its host's address (one service per host).
const PORT: u16 = 8000;
const STEPS: [&str; 4] = ["stop", "install", "start", "check"];

/// One way of rolling the upgrade out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    DroverRolling,
    DroverUncapped,
    DroverPersist,
    DroverAll,
    AnsibleFree,
    Pyinfra,
}

const MODES: [Mode; 6] = [
    Mode::DroverRolling,
    Mode::DroverUncapped,
    Mode::DroverPersist,
    Mode::DroverAll,
    Mode::AnsibleFree,
    Mode::Pyinfra,
];

/// Every mode's slug, for `--modes`.
pub(crate) const SLUGS: [&str; 6] = [
    "tiers-drover-rolling",
    "tiers-drover-uncapped",
    "tiers-drover-persist",
    "tiers-drover-all",
    "tiers-ansible-free",
    "tiers-pyinfra",
];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::DroverRolling => "Drover, `batch \"30%\"`",
            Mode::DroverUncapped => {
                "Drover, `batch \"30%\"`, `--max-connections` N (every host kept connected)"
            }
            Mode::DroverPersist => {
                "Drover, `batch \"30%\"`, connected by a `deploy plan` just before (`persist=\"5m\"`)"
            }
            Mode::DroverAll => "Drover, all at once",
            Mode::AnsibleFree => "Ansible, three plays, `serial: 30%`, free",
            Mode::Pyinfra => "pyinfra, tier after tier (a run each), all at once",
        }
    }

    fn slug(self) -> &'static str {
        SLUGS[self as usize]
    }

    fn available(self, args: &Args, tools: &Tools) -> bool {
        let asked = |t: &str| args.tools.iter().any(|a| a == t);
        match self {
            // Different from the default cap (256) only on a larger fleet; also when named in
            // `--modes`, and in the smoke test, which checks the harness.
            Mode::DroverUncapped => {
                asked("drover")
                    && (super::tool::over_cap(args)
                        || args.smoke
                        || args.modes.iter().any(|m| m == self.slug()))
            }
            Mode::DroverRolling | Mode::DroverPersist | Mode::DroverAll => asked("drover"),
            Mode::AnsibleFree => asked("ansible") && tools.ansible_playbook.is_some(),
            Mode::Pyinfra => asked("pyinfra") && tools.pyinfra.is_some(),
        }
    }
}

/// A host of the workload and its waits.
struct TierHost {
    name: String,
    tier: usize,
    address: String,
    install_ms: u64,
    ready_ms: u64,
    straggler: bool,
}

impl TierHost {
    /// The host's work with zero overhead: its two waits.
    fn work(&self) -> Duration {
        Duration::from_millis(self.install_ms + self.ready_ms)
    }
}

/// One timed run.
struct Sample {
    seconds: f64,
    load: f64,
    cpu: f64,
    /// SSH connections per host, from the hosts' sshd logs (for `DroverPersist`, with its
    /// untimed `deploy plan`'s).
    connections: f64,
    /// SSH sessions (commands) per host, from the hosts' sshd logs.
    sessions: f64,
    /// Drover's runs: where the time went.
    phases: Phases,
}

/// One fleet size's results: N, the samples of each mode, the ideals, the fleet's shape.
type Size = (usize, Vec<(Mode, Vec<Sample>)>, Ideals, String);

pub(crate) fn run(args: &Args, tools: &Tools, machine: &Machine) -> String {
    let modes: Vec<Mode> = MODES
        .into_iter()
        .filter(|m| m.available(args, tools))
        .filter(|m| args.modes.is_empty() || args.modes.iter().any(|s| s == m.slug()))
        .collect();
    let mut csv = String::from(
        "hosts,mode,run,seconds,load1,connections_per_host,sessions_per_host,machine_cpu_seconds\n",
    );
    let mut results: Vec<Size> = Vec::new();
    for &n in &args.hosts {
        let mut bench = TierBench::start(n, args, tools);
        eprintln!("compare: tiers, {n} hosts up in {:.1} s", bench.started_in);
        bench.run(Mode::DroverAll, "install");
        let ideals = bench.ideals();
        eprintln!(
            "compare: N={n} ideal: 30% {:.2} s, all at once {:.2} s, Ansible's order {:.2} s, \
             pyinfra's order {:.2} s; deploy plan {:.2} s, ssh true to every host {:.2} s",
            ideals.rolling, ideals.all, ideals.ansible, ideals.pyinfra, ideals.plan, ideals.connect
        );
        let samples = super::tool::rounds(
            args,
            &modes,
            |mode, what| bench.run(mode, what),
            |r, mode, s| {
                writeln!(
                    csv,
                    "{n},{},{r},{:.3},{:.2},{:.2},{:.2},{:.2}",
                    mode.slug(),
                    s.seconds,
                    s.load,
                    s.connections,
                    s.sessions,
                    s.cpu
                )
                .unwrap();
                eprintln!(
                    "compare: tiers N={n} run {r} {}: {:.2} s (load {:.2}; {:.2} SSH \
                     connections, {:.2} sessions per host)",
                    mode.label(),
                    s.seconds,
                    s.load,
                    s.connections,
                    s.sessions
                );
            },
        );
        let shape = bench.shape();
        results.push((n, samples, ideals, shape));
    }
    fs::write(args.out.join("tiers-runs.csv"), &csv).expect("write tiers-runs.csv");
    render(args, machine, &results)
}

/// A running fleet of three tiers and every tool's inputs for it.
struct TierBench<'a> {
    n: usize,
    args: &'a Args,
    tools: &'a Tools,
    fleet: Fleet,
    hosts: Vec<TierHost>,
    work: PathBuf,
    version: u64,
    started_in: f64,
    ansible_runs: usize,
    _relay: Option<Relay>,
}

impl<'a> TierBench<'a> {
    fn start(n: usize, args: &'a Args, tools: &'a Tools) -> TierBench<'a> {
        let layout = layout(n);
        let mut specs = Vec::new();
        for (tier, count) in layout.iter().enumerate() {
            for i in 1..=*count {
                specs.push((format!("{}{i}", TIERS[tier]), tier));
            }
        }
        let fleet_hosts: Vec<FleetHost> = specs
            .iter()
            .map(|(name, tier)| FleetHost::new(name, TIERS[*tier]))
            .collect();
        let started = Instant::now();
        let sshd_port = fleet::SSH_PORT + u16::from(args.rtt_ms > 0);
        let fleet = Fleet::start_behind(&fleet_hosts, sshd_port);
        let started_in = started.elapsed().as_secs_f64();
        let hosts: Vec<TierHost> = specs
            .into_iter()
            .enumerate()
            .map(|(i, (name, tier))| {
                let (install_ms, ready_ms, straggler) = waits(i);
                TierHost {
                    address: fleet.address(&name),
                    name,
                    tier,
                    install_ms,
                    ready_ms,
                    straggler,
                }
            })
            .collect();
        let addresses: Vec<(String, String)> = hosts
            .iter()
            .map(|h| (h.name.clone(), h.address.clone()))
            .collect();
        let relay = (args.rtt_ms > 0).then(|| Relay::start(&addresses, sshd_port, args.rtt_ms));
        let work = fleet.dir.join("tiers");
        fs::create_dir_all(&work).unwrap();
        let bench = TierBench {
            n,
            args,
            tools,
            fleet,
            hosts,
            work,
            version: 0,
            started_in,
            ansible_runs: 0,
            _relay: relay,
        };
        bench.write_hosts();
        bench.write_inputs();
        bench
    }

    /// The fleet's shape, for the report.
    fn shape(&self) -> String {
        let mut parts = Vec::new();
        for (tier, name) in TIERS.iter().enumerate() {
            let hs: Vec<&TierHost> = self.hosts.iter().filter(|h| h.tier == tier).collect();
            let stragglers = hs.iter().filter(|h| h.straggler).count();
            let longest = hs.iter().map(|h| h.work()).max().unwrap_or_default();
            parts.push(format!(
                "{name} {} hosts ({stragglers} stragglers, longest {:.2} s)",
                hs.len(),
                longest.as_secs_f64()
            ));
        }
        parts.join(", ")
    }

    fn run(&mut self, mode: Mode, what: &str) -> Sample {
        self.version += 1;
        let logs = self.args.out.join("logs");
        let stem = format!("n{}-{}-{what}", self.n, mode.slug());
        let load = load1();
        let connections = sshd_lines(&self.fleet, ACCEPTED);
        let sessions = sshd_lines(&self.fleet, SESSION);
        let cpu = machine_cpu();
        let (seconds, phases) = match mode {
            Mode::DroverRolling | Mode::DroverUncapped | Mode::DroverPersist | Mode::DroverAll => {
                self.drover(mode, &logs, &stem)
            }
            Mode::AnsibleFree => (self.ansible(&logs, &stem), Phases::default()),
            Mode::Pyinfra => (self.pyinfra(&logs, &stem), Phases::default()),
        };
        let cpu = machine_cpu() - cpu;
        let per_host = |before: usize, what: &str| {
            (sshd_lines(&self.fleet, what) - before) as f64 / self.hosts.len() as f64
        };
        let connections = per_host(connections, ACCEPTED);
        let sessions = per_host(sessions, SESSION);
        self.verify(mode, &stem);
        Sample {
            seconds,
            load,
            cpu,
            connections,
            sessions,
            phases,
        }
    }

    /// `deploy apply --yes --json`: seconds, and from its events the time before the rollout,
    /// the rollout's own, and its steps replayed through the ideal schedule of its plan.
    fn drover(&self, mode: Mode, logs: &Path, stem: &str) -> (f64, Phases) {
        let policy = if mode == Mode::DroverAll {
            "all.kdl"
        } else {
            "rolling.kdl"
        };
        let platform = if mode == Mode::DroverPersist {
            "platform-persist.kdl"
        } else {
            "platform.kdl"
        };
        let site = self.write_site_on(policy, platform, self.version);
        if mode == Mode::DroverPersist {
            // What an operator does: review the plan, then apply it; the plan's connections
            // stay open (persist) for the apply. Untimed.
            let out = Command::new(&self.tools.deploy)
                .arg("plan")
                .arg(&site)
                .current_dir(&self.work)
                .output()
                .expect("run deploy plan");
            self.require(out.status.success(), "deploy plan (persist)", stem);
        }
        let events = logs.join(format!("{stem}.ndjson"));
        let mut cmd = Command::new(&self.tools.deploy);
        cmd.arg("apply").arg(&site).args(["--yes", "--json"]);
        if mode == Mode::DroverUncapped {
            // Every host's connection kept for the whole run.
            super::tool::uncapped(&mut cmd, self.hosts.len());
        }
        let spawned = SystemTime::now();
        let started = Instant::now();
        let child = cmd
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&events).unwrap())
            .stderr(fs::File::create(logs.join(format!("{stem}.err"))).unwrap())
            .spawn()
            .expect("run deploy");
        // The controller's memory: `deploy` and its ssh masters, sampled every 50 ms.
        let mut memory = super::Memory::default();
        let marker = self.fleet.ssh_config().display().to_string();
        let status =
            super::wait_sampled(child, &marker, Some(&mut memory)).expect("wait for deploy");
        let seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "compare: tiers {stem} memory: deploy peak {:.1} MiB, with its masters {:.1} MiB \
             (at most {} masters at once)",
            super::mib(memory.deploy_hwm),
            super::mib(memory.total_rss),
            memory.masters,
        );
        self.require(status.success(), "deploy apply", stem);
        let text = fs::read_to_string(&events).unwrap_or_default();
        let plan: Option<Plan> = fs::read(self.work.join(format!("plan-{policy}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let work_of = |host: &str| {
            self.hosts
                .iter()
                .find(|h| h.name == host)
                .map(TierHost::work)
        };
        let phases = phases::of(&text, spawned, work_of, plan.as_ref());
        (seconds, phases)
    }

    fn ansible(&mut self, logs: &Path, stem: &str) -> f64 {
        self.ansible_runs += 1;
        let control = self.work.join(format!("cp{}", self.ansible_runs));
        fs::create_dir_all(&control).unwrap();
        let mut cmd = Command::new(self.tools.ansible_playbook.as_ref().unwrap());
        cmd.arg(self.work.join("playbook.yml"))
            .arg("-e")
            .arg(format!("version={}", self.version))
            .env("ANSIBLE_CONFIG", self.work.join("ansible.cfg"))
            .env("ANSIBLE_SSH_CONTROL_PATH_DIR", &control);
        let seconds = self.timed(cmd, logs, stem, "ansible-playbook");
        super::tool::close_masters(&control);
        seconds
    }

    /// pyinfra at its best for tiers in order: one run per tier (`--limit` to its group), each
    /// with every host of the tier at once and none waiting for another between operations
    /// (`--no-wait`). In one run, pyinfra either waits for every host after each operation
    /// or (`--no-wait`) lets every host run all its operations, the tiers mixed.
    fn pyinfra(&self, logs: &Path, stem: &str) -> f64 {
        TIERS
            .iter()
            .map(|tier| {
                let mut cmd = Command::new(self.tools.pyinfra.as_ref().unwrap());
                cmd.args(["-y", "--no-wait", "--parallel"])
                    .arg(self.n.to_string())
                    .args(["--limit", tier])
                    .arg("--data")
                    .arg(format!("version={}", self.version))
                    .arg(self.work.join("inventory.py"))
                    .arg(self.work.join("deploy.py"));
                self.timed(cmd, logs, &format!("{stem}-{tier}"), "pyinfra")
            })
            .sum()
    }

    fn timed(&self, cmd: Command, logs: &Path, stem: &str, what: &str) -> f64 {
        super::tool::timed(cmd, &self.work, logs, stem, what)
    }

    /// Every host serves the current version, and every web host lists every api host.
    fn verify(&self, mode: Mode, stem: &str) {
        let want = self.version.to_string();
        let mut pool: Vec<String> = self.pool().split(' ').map(String::from).collect();
        pool.sort();
        let mut wrong = Vec::new();
        for h in &self.hosts {
            match http_version(&h.address) {
                Ok(v) if v == want => {}
                Ok(v) => wrong.push(format!("{} serves {v:?}", h.name)),
                Err(e) => wrong.push(format!("{}: {e}", h.name)),
            }
            if h.tier == 2 {
                let file = self.fleet.host_root(&h.name).join("srv/web/upstreams");
                let mut listed: Vec<String> = fs::read_to_string(&file)
                    .unwrap_or_default()
                    .lines()
                    .map(String::from)
                    .collect();
                listed.sort();
                if listed != pool {
                    wrong.push(format!(
                        "{}: {} lists {} addresses, not the {} api hosts",
                        h.name,
                        file.display(),
                        listed.len(),
                        pool.len()
                    ));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{} ({stem}) did not bring every host to version {want}: {}",
            mode.label(),
            wrong.join("; ")
        );
    }

    fn require(&self, ok: bool, what: &str, stem: &str) {
        super::tool::require(ok, what, &self.args.out.join("logs"), stem);
    }
}
