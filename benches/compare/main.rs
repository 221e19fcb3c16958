//! Drover against Ansible and pyinfra on the same loopback fleet (issue 6).
//!
//! Run it with `bash benches/compare/run.sh` (it makes the virtualenv with ansible-core and
//! pyinfra, then runs this driver through `cargo bench`); the latest figures are in
//! `book/src/performance.md`, the method and every dated run in
//! `book/src/appendix-measurements.md`.
//!
//! For each fleet size N the driver starts N sshd hosts (`tests/support/fleet.rs`), writes the
//! inputs of every tool (a Drover site, an Ansible inventory, config and playbooks, a pyinfra
//! inventory and deploy), installs version 1 untimed, then times every tool, `--runs` times,
//! each run upgrading the fleet from version v to v+1 with the same four shell steps per host
//! (stop the old server, install the version file, start a `python3 -m http.server` on the
//! host's address, poll it until it serves the new version). After each run every host is
//! checked over HTTP to serve the new version. Medians and ratios go to standard output and to
//! `OUT/results.md` (`OUT/smoke.md` with `--smoke`), every run to `OUT/runs.csv`, each run's
//! output to `OUT/logs/`.
//!
//! `--workload tiers` runs the three-tier workload instead (`tiers.rs`: db → api → web, steps
//! that wait, stragglers, round trips, each tool against the ideal schedule of its policy).
//! `--workload artifact` delivers one large file instead (`artifact.rs`: against parallel
//! `scp`, a second apply against a no-op one, memory at two sizes).
//! `--batch P` sets the rolling batch (30 % unless given) and `--modes` picks modes by slug,
//! for the 1,000-host run (`--hosts 1000 --batch 10`).
//!
//! Without `--run` or `--smoke` it prints how to run it and exits (so `cargo bench` and
//! `cargo test --benches` do not start a fleet by accident).

mod artifact;
#[cfg(feature = "etcd")]
#[path = "../../tests/support/etcd.rs"]
mod etcd;
#[path = "../../tests/support/fleet.rs"]
mod fleet;
#[path = "../common/stats.rs"]
mod stats;
mod tiers;
#[path = "../common/tiers_fleet.rs"]
mod tiers_fleet;
mod tool;

use fleet::{Fleet, FleetHost};
use serde_json::Value;
use stats::{load1, median};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tool::{ACCEPTED, SESSION};

/// The rolling batch of this run, % of the hosts (`--batch`), for the labels.
static BATCH: AtomicUsize = AtomicUsize::new(30);
use std::time::{Duration, Instant, SystemTime};

/// The port each host's HTTP server listens on, on the host's own address.
const HTTP_PORT: u16 = 8000;
/// Every tool's SSH connect timeout: on a loaded machine 200 handshakes at once take a while,
/// and a slow run is a result where a failed one is not.
const CONNECT_TIMEOUT_S: u32 = 60;

// The four steps: the same shell text in every tool, which only prefixes `ADDR=…; VERSION=…; `.
// Single lines without `{{`, `{%` or `{#`, so that they pass through KDL, YAML (Jinja) and
// Python source unchanged.
/// Stops the old server and waits until its process is gone.
const STOP: &str = r#"pid=$(cat /srv/web/pid 2>/dev/null) || exit 0; kill "$pid" 2>/dev/null; while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done; rm -f /srv/web/pid"#;
/// Installs the new version: a file.
const INSTALL: &str = r#"mkdir -p /srv/web && printf '%s\n' "$VERSION" >/srv/web/version.new && mv /srv/web/version.new /srv/web/version"#;
/// Starts the server, daemonized, and records its pid.
const START: &str = r#"setsid nohup python3 -m http.server 8000 --bind "$ADDR" --directory /srv/web >/srv/web/http.log 2>&1 </dev/null & echo $! >/srv/web/pid"#;
/// Polls the server until it serves the new version (30 s at most).
const CHECK: &str = r#"i=0; until [ "$(curl -fsS --noproxy '*' --max-time 2 "http://$ADDR:8000/version" 2>/dev/null)" = "$VERSION" ]; do i=$((i+1)); if [ "$i" -ge 600 ]; then echo "not serving $VERSION on $ADDR" >&2; exit 1; fi; sleep 0.05; done"#;
const STEPS: [(&str, &str); 4] = [
    ("stop", STOP),
    ("install", INSTALL),
    ("start", START),
    ("check", CHECK),
];

/// One way of rolling the upgrade out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    DroverRolling,
    DroverAll,
    AnsibleLinear,
    AnsibleFree,
    Pyinfra,
    SshRolling,
    SshAll,
    SshConnect,
    DroverPlan,
    DroverPlanOffline,
    DroverRollingTmpfs,
    DroverAllTmpfs,
    DroverFlowing,
    DroverSessions,
    DroverStore,
    DroverPlanStore,
    DroverUncapped,
    DroverStatus,
}

const MODES: [Mode; 18] = [
    Mode::DroverRolling,
    Mode::DroverUncapped,
    Mode::DroverStore,
    Mode::DroverPlanStore,
    Mode::DroverSessions,
    Mode::DroverFlowing,
    Mode::DroverAll,
    Mode::AnsibleLinear,
    Mode::AnsibleFree,
    Mode::Pyinfra,
    Mode::SshRolling,
    Mode::SshAll,
    Mode::SshConnect,
    Mode::DroverPlan,
    Mode::DroverPlanOffline,
    Mode::DroverRollingTmpfs,
    Mode::DroverAllTmpfs,
    Mode::DroverStatus,
];

impl Mode {
    /// The label, with the rolling batch of this run (`--batch`) in place of 30%.
    fn label(self) -> String {
        let batch = BATCH.load(Ordering::Relaxed);
        self.text().replace("30%", &format!("{batch}%"))
    }

    fn text(self) -> &'static str {
        match self {
            Mode::DroverRolling => "Drover, rolling 30%",
            Mode::DroverAll => "Drover, all at once",
            Mode::AnsibleLinear => "Ansible, rolling 30%, linear",
            Mode::AnsibleFree => "Ansible, rolling 30%, free",
            Mode::Pyinfra => "pyinfra, all at once",
            Mode::SshRolling => "floor: ssh per host, rolling 30%",
            Mode::SshAll => "floor: ssh per host, all at once",
            Mode::SshConnect => "floor: ssh connect + `true`, all at once",
            Mode::DroverPlan => "Drover, `deploy plan` (reads every host)",
            Mode::DroverPlanOffline => "Drover, `deploy plan --offline`",
            Mode::DroverRollingTmpfs => "Drover, rolling 30%, `.drover/` on tmpfs",
            Mode::DroverAllTmpfs => "Drover, all at once, `.drover/` on tmpfs",
            Mode::DroverFlowing => "Drover, rolling 30%, on-failure \"continue\" (waves flow)",
            Mode::DroverSessions => {
                "Drover, rolling 30%, a session per command (`keep-shell=#false`)"
            }
            Mode::DroverStore => "Drover, rolling 30%, with `store \"etcd\"`",
            Mode::DroverPlanStore => "Drover, `deploy plan` with `store \"etcd\"` (converged)",
            Mode::DroverUncapped => {
                "Drover, rolling 30%, `--max-connections` N (every host kept connected)"
            }
            Mode::DroverStatus => "Drover, `deploy status` (reads every host)",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Mode::DroverRolling => "drover-rolling",
            Mode::DroverAll => "drover-all",
            Mode::AnsibleLinear => "ansible-linear",
            Mode::AnsibleFree => "ansible-free",
            Mode::Pyinfra => "pyinfra",
            Mode::SshRolling => "ssh-rolling",
            Mode::SshAll => "ssh-all",
            Mode::SshConnect => "ssh-connect",
            Mode::DroverPlan => "drover-plan",
            Mode::DroverPlanOffline => "drover-plan-offline",
            Mode::DroverRollingTmpfs => "drover-rolling-tmpfs",
            Mode::DroverAllTmpfs => "drover-all-tmpfs",
            Mode::DroverFlowing => "drover-flowing",
            Mode::DroverSessions => "drover-sessions",
            Mode::DroverStore => "drover-store",
            Mode::DroverPlanStore => "drover-plan-store",
            Mode::DroverUncapped => "drover-uncapped",
            Mode::DroverStatus => "drover-status",
        }
    }

    fn tool(self) -> &'static str {
        match self {
            Mode::DroverRolling | Mode::DroverAll => "drover",
            Mode::DroverPlan | Mode::DroverPlanOffline => "drover",
            Mode::DroverRollingTmpfs | Mode::DroverAllTmpfs | Mode::DroverFlowing => "drover",
            Mode::DroverSessions | Mode::DroverStore | Mode::DroverPlanStore => "drover",
            Mode::DroverUncapped | Mode::DroverStatus => "drover",
            Mode::AnsibleLinear | Mode::AnsibleFree => "ansible",
            Mode::Pyinfra => "pyinfra",
            Mode::SshRolling | Mode::SshAll | Mode::SshConnect => "ssh",
        }
    }

    /// Whether a run upgrades the fleet to a new version.
    fn deploys(self) -> bool {
        !matches!(
            self,
            Mode::SshConnect
                | Mode::DroverPlan
                | Mode::DroverPlanOffline
                | Mode::DroverPlanStore
                | Mode::DroverStatus
        )
    }
}

/// What the fleet is asked to do (`--workload`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Upgrade,
    Tiers,
    Artifact,
}

struct Args {
    smoke: bool,
    hosts: Vec<usize>,
    runs: usize,
    tools: Vec<String>,
    out: PathBuf,
    memory: bool,
    /// `deploy` to run instead of the one cargo built with this driver.
    deploy: Option<PathBuf>,
    /// A round trip added to every SSH connection (`benches/compare/delay.py`), ms; 0: none.
    rtt_ms: u64,
    /// `--kex default`: the hosts' sshd offers OpenSSH's default key exchange (post-quantum
    /// on OpenSSH ≥ 9.0) instead of the fleet's curve25519 only.
    kex_default: bool,
    /// `--no-warm-up`: no untimed run of each mode before the timed ones.
    warm_up: bool,
    /// `--modes a,b`: only these modes (their slugs); all of the tools' modes when empty.
    modes: Vec<String>,
    /// `--batch P`: the rolling batch, P % of the hosts (30 unless given).
    batch_pct: usize,
    /// `--workload`: the one-service upgrade, the three tiers (`tiers.rs`) or the artifact
    /// (`artifact.rs`).
    workload: Workload,
    /// `--size-mb`: the artifact's size (100 MB unless given; 8 for the smoke test).
    size_mb: u64,
    command: String,
}

const USAGE: &str = "\
usage: bash benches/compare/run.sh [--smoke] [--hosts 50,200] [--runs 3]
           [--tools drover,ansible,pyinfra,ssh] [--out DIR] [--no-memory] [--deploy PATH]
           [--rtt MS] [--kex default|curve25519] [--workload upgrade|tiers|artifact]
           [--size-mb 100] [--batch 30%]
           [--modes drover-rolling,ssh-rolling,…] [--no-warm-up]
(the script passes --run or --smoke to this driver, which does nothing without one)";

impl Args {
    /// `None`: neither `--run` nor `--smoke` was given.
    fn parse() -> Result<Option<Args>, String> {
        let mut argv: Vec<String> = std::env::args().skip(1).collect();
        argv.retain(|a| a != "--bench"); // added by `cargo bench`
        let mut args = Args {
            smoke: false,
            hosts: vec![50, 200],
            runs: 3,
            tools: ["drover", "ansible", "pyinfra", "ssh"]
                .map(String::from)
                .to_vec(),
            out: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/compare/out"),
            memory: true,
            deploy: None,
            rtt_ms: 0,
            kex_default: false,
            workload: Workload::Upgrade,
            size_mb: 100,
            batch_pct: 30,
            modes: Vec::new(),
            warm_up: true,
            command: String::new(),
        };
        let (mut run, mut hosts_given, mut runs_given, mut rtt_given, mut size_given) =
            (false, false, false, false, false);
        let mut it = argv.iter();
        let mut shown = Vec::new();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--run" => run = true,
                "--smoke" => {
                    args.smoke = true;
                    shown.push(arg.clone());
                }
                "--hosts" => {
                    let v = value("--hosts")?;
                    args.hosts = v
                        .split(',')
                        .map(|n| n.trim().parse().map_err(|_| format!("--hosts {v}")))
                        .collect::<Result<_, _>>()?;
                    hosts_given = true;
                    shown.extend([arg.clone(), v]);
                }
                "--runs" => {
                    let v = value("--runs")?;
                    args.runs = v.parse().map_err(|_| format!("--runs {v}"))?;
                    runs_given = true;
                    shown.extend([arg.clone(), v]);
                }
                "--tools" => {
                    let v = value("--tools")?;
                    args.tools = v.split(',').map(|t| t.trim().to_string()).collect();
                    shown.extend([arg.clone(), v]);
                }
                "--out" => {
                    let v = value("--out")?;
                    args.out = PathBuf::from(&v);
                    shown.extend([arg.clone(), v]);
                }
                "--deploy" => {
                    let v = value("--deploy")?;
                    args.deploy = Some(PathBuf::from(&v));
                    shown.extend([arg.clone(), v]);
                }
                "--rtt" => {
                    let v = value("--rtt")?;
                    args.rtt_ms = v.parse().map_err(|_| format!("--rtt {v}"))?;
                    rtt_given = true;
                    shown.extend([arg.clone(), v]);
                }
                "--no-warm-up" => {
                    args.warm_up = false;
                    shown.push(arg.clone());
                }
                "--no-memory" => {
                    args.memory = false;
                    shown.push(arg.clone());
                }
                "--kex" => {
                    let v = value("--kex")?;
                    args.kex_default = match v.as_str() {
                        "default" => true,
                        "curve25519" => false,
                        _ => return Err(format!("--kex {v}: `default` or `curve25519`")),
                    };
                    shown.extend([arg.clone(), v]);
                }
                "--modes" => {
                    let v = value("--modes")?;
                    args.modes = v.split(',').map(|m| m.trim().to_string()).collect();
                    shown.extend([arg.clone(), v]);
                }
                "--batch" => {
                    let v = value("--batch")?;
                    args.batch_pct = v
                        .trim_end_matches('%')
                        .parse()
                        .ok()
                        .filter(|p| (1..=100).contains(p))
                        .ok_or_else(|| format!("--batch {v}: a share of the hosts, 1 to 100%"))?;
                    shown.extend([arg.clone(), v]);
                }
                "--workload" => {
                    let v = value("--workload")?;
                    args.workload = match v.as_str() {
                        "tiers" => Workload::Tiers,
                        "upgrade" => Workload::Upgrade,
                        "artifact" => Workload::Artifact,
                        _ => {
                            return Err(format!("--workload {v}: `upgrade`, `tiers` or `artifact`"))
                        }
                    };
                    shown.extend([arg.clone(), v]);
                }
                "--size-mb" => {
                    let v = value("--size-mb")?;
                    args.size_mb = v
                        .parse()
                        .ok()
                        .filter(|&s| s > 0)
                        .ok_or_else(|| format!("--size-mb {v}: a positive number of MB"))?;
                    size_given = true;
                    shown.extend([arg.clone(), v]);
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if !run && !args.smoke {
            return Ok(None);
        }
        let slugs: Vec<&str> = match args.workload {
            Workload::Upgrade => MODES.iter().map(|x| x.slug()).collect(),
            Workload::Tiers => tiers::SLUGS.to_vec(),
            Workload::Artifact => artifact::SLUGS.to_vec(),
        };
        if let Some(m) = args.modes.iter().find(|m| !slugs.contains(&m.as_str())) {
            return Err(format!("--modes: no mode `{m}` ({})", slugs.join(", ")));
        }
        if args.workload == Workload::Artifact {
            // The issue's: 100 MB to 50 hosts; 8 MB to 5 hosts for the smoke test.
            if !hosts_given {
                args.hosts = vec![if args.smoke { 5 } else { 50 }];
            }
            if !size_given && args.smoke {
                args.size_mb = 8;
            }
        }
        if args.workload == Workload::Tiers {
            // The issue's fleet: 200 hosts, 30 ms round trips; 20 hosts for the smoke test.
            if !hosts_given {
                args.hosts = vec![if args.smoke { 20 } else { 200 }];
            }
            if !rtt_given {
                args.rtt_ms = 30;
            }
        }
        if args.smoke {
            if !hosts_given && args.workload == Workload::Upgrade {
                args.hosts = vec![10];
            }
            if !runs_given {
                args.runs = 1;
            }
        }
        if let Some(t) = args
            .tools
            .iter()
            .find(|t| !["drover", "ansible", "pyinfra", "ssh"].contains(&t.as_str()))
        {
            return Err(format!(
                "unknown tool `{t}` (drover, ansible, pyinfra, ssh)"
            ));
        }
        if args.hosts.contains(&0) || args.runs == 0 {
            return Err("--hosts and --runs must be positive".into());
        }
        args.command = std::iter::once("bash benches/compare/run.sh".to_string())
            .chain(shown)
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Some(args))
    }
}

/// The programs under test.
struct Tools {
    deploy: PathBuf,
    ansible_playbook: Option<PathBuf>,
    pyinfra: Option<PathBuf>,
}

impl Tools {
    fn find(args: &Args) -> Result<Tools, String> {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/compare/.venv/bin");
        let want = |tool: &str, program: &str| -> Result<Option<PathBuf>, String> {
            if !args.tools.iter().any(|t| t == tool) {
                return Ok(None);
            }
            let path = venv.join(program);
            if path.exists() {
                Ok(Some(path))
            } else if args.smoke {
                eprintln!(
                    "compare: {} not installed: smoke-testing without {tool}",
                    path.display()
                );
                Ok(None)
            } else {
                Err(format!(
                    "{} not found: run `bash benches/compare/run.sh`, which installs it",
                    path.display()
                ))
            }
        };
        Ok(Tools {
            deploy: args
                .deploy
                .clone()
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_deploy"))),
            ansible_playbook: want("ansible", "ansible-playbook")?,
            pyinfra: want("pyinfra", "pyinfra")?,
        })
    }

    fn has(&self, args: &Args, mode: Mode) -> bool {
        let asked = args.tools.iter().any(|t| t == mode.tool());
        asked
            && match mode {
                Mode::AnsibleLinear | Mode::AnsibleFree => self.ansible_playbook.is_some(),
                Mode::Pyinfra => self.pyinfra.is_some(),
                Mode::DroverRollingTmpfs | Mode::DroverAllTmpfs => shm().is_some(),
                // Different from the default cap (256) only on a larger fleet.
                Mode::DroverUncapped => tool::over_cap(args),
                // A `deploy` built with the store, and Debian's etcd-server to run.
                Mode::DroverStore | Mode::DroverPlanStore => {
                    cfg!(feature = "etcd") && which("etcd")
                }
                _ => true,
            }
    }
}

/// Whether `program` is on the PATH.
fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// One timed run.
struct Sample {
    seconds: f64,
    load: f64,
    /// SSH connections per host, from the hosts' sshd logs.
    connections: f64,
    /// SSH sessions (commands) per host, from the hosts' sshd logs.
    sessions: f64,
    /// CPU time the whole machine spent during the run (user + system, every process), s.
    cpu: f64,
    phases: Option<Phases>,
}

/// `/dev/shm` when it is a tmpfs.
fn shm() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .any(|l| {
            l.split_whitespace()
                .take(3)
                .eq(["tmpfs", "/dev/shm", "tmpfs"])
        })
        .then(|| PathBuf::from("/dev/shm"))
}

fn main() {
    let args = match Args::parse() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("compare: nothing to do without --run or --smoke\n{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("compare: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if args.kex_default {
        // Read by the fleet (tests/support/fleet.rs) when it writes each host's sshd_config.
        std::env::set_var("DROVER_FLEET_KEX", "default");
    }
    BATCH.store(args.batch_pct, Ordering::Relaxed);
    let tools = Tools::find(&args).unwrap_or_else(|e| {
        eprintln!("compare: {e}");
        std::process::exit(2);
    });
    let modes: Vec<Mode> = MODES
        .into_iter()
        .filter(|m| tools.has(&args, *m))
        .filter(|m| args.modes.is_empty() || args.modes.iter().any(|s| s == m.slug()))
        .collect();
    fs::create_dir_all(args.out.join("logs")).expect("create the output directory");
    let machine = Machine::capture(&tools, args.deploy.is_some());
    // A copy of `deploy`: the shared target directory may be rebuilt during a long run.
    let copy = args.out.join("deploy");
    fs::copy(&tools.deploy, &copy).expect("copy deploy");
    let tools = Tools {
        deploy: copy,
        ..tools
    };
    eprintln!("compare: {}, {}", machine.date, machine.summary());
    let other = match args.workload {
        Workload::Artifact => Some(("artifact", artifact::run(&args, &tools, &machine))),
        Workload::Tiers => Some(("tiers", tiers::run(&args, &tools, &machine))),
        Workload::Upgrade => None,
    };
    if let Some((stem, report)) = other {
        println!("{report}");
        let kind = if args.smoke { "smoke" } else { "results" };
        let path = args.out.join(format!("{stem}-{kind}.md"));
        fs::write(&path, &report).expect("write the results");
        eprintln!("compare: written to {}", path.display());
        return;
    }
    let mut csv = String::from(
        "hosts,mode,run,seconds,load1,connections_per_host,sessions_per_host,machine_cpu_seconds\n",
    );
    let mut results: Vec<(usize, Mode, Vec<Sample>)> = Vec::new();
    let mut memory: Vec<(usize, Mode, Memory)> = Vec::new();
    let largest = args.hosts.iter().copied().max().unwrap_or(0);
    for &n in &args.hosts {
        let mut bench = Bench::start(n, &args, &tools);
        eprintln!("compare: {n} hosts up in {:.1} s", bench.started_in);
        // Version 1 everywhere (fresh install), then the runs.
        bench.run(Mode::DroverAll, "install");
        let samples = tool::rounds(
            &args,
            &modes,
            |mode, what| bench.run(mode, what),
            |r, mode, sample| {
                writeln!(
                    csv,
                    "{n},{},{r},{:.3},{:.2},{:.2},{:.2},{:.2}",
                    mode.slug(),
                    sample.seconds,
                    sample.load,
                    sample.connections,
                    sample.sessions,
                    sample.cpu
                )
                .unwrap();
                eprintln!(
                    "compare: N={n} run {r} {}: {:.2} s (load {:.2})",
                    mode.label(),
                    sample.seconds,
                    sample.load
                );
            },
        );
        if args.memory && n == largest {
            let capped = [Mode::DroverRolling, Mode::DroverUncapped, Mode::DroverAll];
            for mode in capped.into_iter().filter(|m| modes.contains(m)) {
                let m = bench.memory(mode);
                eprintln!("compare: N={n} {}: {}", mode.label(), m.summary());
                memory.push((n, mode, m));
            }
        }
        results.extend(samples.into_iter().map(|(m, s)| (n, m, s)));
        drop(bench);
    }
    fs::write(args.out.join("runs.csv"), &csv).expect("write runs.csv");
    let report = render(&args, &machine, &results, &memory);
    println!("{report}");
    let name = if args.smoke { "smoke.md" } else { "results.md" };
    fs::write(args.out.join(name), &report).expect("write the results");
    eprintln!("compare: written to {}", args.out.join(name).display());
}

/// A running fleet and every tool's inputs for it.
struct Bench<'a> {
    n: usize,
    args: &'a Args,
    tools: &'a Tools,
    fleet: Fleet,
    /// Inputs and working directory of every tool.
    work: PathBuf,
    addresses: Vec<(String, String)>,
    /// A directory on tmpfs, for the runs whose `.drover/` must not cost fsyncs.
    tmpfs: Option<PathBuf>,
    _tmpfs: Option<tempfile::TempDir>,
    version: u64,
    started_in: f64,
    ansible_runs: usize,
    /// A one-member etcd (fsync on, as in production) for the store modes.
    #[cfg(feature = "etcd")]
    etcd: Option<etcd::Etcd>,
    /// The relay that delays SSH traffic (`--rtt`), killed with the bench.
    _relay: Option<Relay>,
}

/// `benches/compare/delay.py` relaying every host's SSH port to its sshd.
struct Relay(std::process::Child);

impl Relay {
    /// Relays `SSH_PORT` to `sshd_port` on each address, each way delayed by `rtt_ms / 2`.
    fn start(addresses: &[(String, String)], sshd_port: u16, rtt_ms: u64) -> Relay {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/compare/delay.py");
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(format!("{}", rtt_ms as f64 / 2.0))
            .arg(fleet::SSH_PORT.to_string())
            .arg(sshd_port.to_string())
            .args(addresses.iter().map(|(_, a)| a))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start benches/compare/delay.py");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("relay stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read from the relay");
        assert_eq!(line.trim(), "ready", "the relay did not start");
        Relay(child)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl<'a> Bench<'a> {
    fn start(n: usize, args: &'a Args, tools: &'a Tools) -> Bench<'a> {
        let hosts: Vec<FleetHost> = (1..=n)
            .map(|i| FleetHost::new(&format!("web{i}"), "web"))
            .collect();
        let started = Instant::now();
        // With `--rtt`, each sshd listens on the next port, behind a relay on the usual one.
        let sshd_port = fleet::SSH_PORT + u16::from(args.rtt_ms > 0);
        let fleet = Fleet::start_behind(&hosts, sshd_port);
        let started_in = started.elapsed().as_secs_f64();
        let work = fleet.dir.join("compare");
        fs::create_dir_all(&work).unwrap();
        let addresses = fleet
            .names()
            .into_iter()
            .map(|h| (h.to_string(), fleet.address(h)))
            .collect::<Vec<_>>();
        let relay = (args.rtt_ms > 0).then(|| Relay::start(&addresses, sshd_port, args.rtt_ms));
        let shm_dir = shm().map(|dir| {
            tempfile::Builder::new()
                .prefix("drover-compare-")
                .tempdir_in(dir)
                .expect("make a directory in /dev/shm")
        });
        let bench = Bench {
            n,
            args,
            tools,
            fleet,
            work,
            addresses,
            tmpfs: shm_dir.as_ref().map(|d| d.path().to_path_buf()),
            _tmpfs: shm_dir,
            version: 0,
            started_in,
            ansible_runs: 0,
            #[cfg(feature = "etcd")]
            etcd: tools
                .has(args, Mode::DroverStore)
                .then(etcd::Etcd::start_durable),
            _relay: relay,
        };
        bench.write_inputs();
        bench
    }

    fn batch(&self) -> usize {
        (self.n * self.args.batch_pct / 100).max(1)
    }

    /// Every tool's inputs but the Drover site, which carries the version (see `run`).
    fn write_inputs(&self) {
        let w = &self.work;
        let write = |name: &str, text: String| fs::write(w.join(name), text).unwrap();
        let platform = self.fleet.write_platform("/var/lib/drover");
        let text = fs::read_to_string(&platform).unwrap().replacen(
            "transport \"ssh\" ",
            &format!("transport \"ssh\" connect-timeout=\"{CONNECT_TIMEOUT_S}s\" "),
            1,
        );
        fs::write(&platform, &text).unwrap();
        // The same platform, every command in an SSH session of its own.
        let sessions = text.replacen(
            "transport \"ssh\" ",
            "transport \"ssh\" keep-shell=#false ",
            1,
        );
        fs::write(platform.with_file_name("platform-sessions.kdl"), sessions).unwrap();
        // The same platform, its state also in etcd.
        #[cfg(feature = "etcd")]
        if let Some(etcd) = &self.etcd {
            let store = text.replacen(
                "platform \"fleet\" {\n",
                &format!(
                    "platform \"fleet\" {{\n    {}\n",
                    etcd.store_node("/drover", "10s")
                ),
                1,
            );
            fs::write(platform.with_file_name("platform-store.kdl"), store).unwrap();
        }
        // Drover: two policies; the sites are written before each run.
        write(
            "rolling.kdl",
            format!(
                "policy \"rolling\" {{\n    batch \"{}%\"\n    max-failed \"10%\"\n    on-failure \"stop\"\n}}\n",
                self.args.batch_pct
            ),
        );
        // Rolling as above, but a failed host does not stop the rollout (as in pyinfra and
        // Ansible's defaults): nothing is at stake between waves, so they flow.
        write(
            "flowing.kdl",
            format!(
                "policy \"flowing\" {{\n    batch \"{}%\"\n    max-failed \"100%\"\n    on-failure \"continue\"\n}}\n",
                self.args.batch_pct
            ),
        );
        write(
            "all.kdl",
            "policy \"all\" {\n    batch \"100%\"\n    max-failed \"100%\"\n    on-failure \"continue\"\n}\n".into(),
        );
        // Ansible: inventory, config (pipelining, ControlPersist, forks ≥ N, strict host key
        // checking against the fleet's known_hosts through its ssh_config) and two playbooks.
        let mut inventory = String::from("[web]\n");
        for (name, address) in &self.addresses {
            writeln!(inventory, "{name} ansible_host={address}").unwrap();
        }
        write("inventory.ini", inventory);
        write(
            "ansible.cfg",
            tool::ansible_cfg(&w.join("inventory.ini"), self.n.max(5), &self.fleet),
        );
        for strategy in ["linear", "free"] {
            let mut play = format!(
                "- hosts: web\n  gather_facts: false\n  serial: \"{}%\"\n  strategy: {strategy}\n  tasks:\n",
                self.args.batch_pct
            );
            for (name, step) in STEPS {
                let text =
                    format!("ADDR={{{{ ansible_host }}}}; VERSION={{{{ version }}}}; {step}");
                writeln!(
                    play,
                    "    - name: {name}\n      ansible.builtin.shell: {}",
                    serde_json::to_string(&text).unwrap()
                )
                .unwrap();
            }
            write(&format!("playbook-{strategy}.yml"), play);
        }
        // pyinfra: inventory with the fleet's key, known_hosts (strict) and ssh_config.
        let mut inventory = format!("{}\nweb = [\n", tool::pyinfra_common(&self.fleet));
        for (name, address) in &self.addresses {
            writeln!(
                inventory,
                "    ({name:?}, {{**common, \"ssh_hostname\": {address:?}}}),"
            )
            .unwrap();
        }
        inventory.push_str("]\n");
        write("inventory.py", inventory);
        let mut deploy = String::from(
            "from pyinfra import host\nfrom pyinfra.operations import server\n\n\
             prefix = f\"ADDR={host.data.ssh_hostname}; VERSION={host.data.version}; \"\n",
        );
        for (name, step) in STEPS {
            writeln!(
                deploy,
                "server.shell(name={name:?}, commands=[prefix + {}])",
                serde_json::to_string(step).unwrap()
            )
            .unwrap();
        }
        write("deploy.py", deploy);
    }

    /// The Drover site at the current version under the given policy file.
    fn write_site(&self, policy: &str, platform: &str) -> PathBuf {
        let mut site = format!(
            "site \"compare\" {{\n    version \"{}\"\n    platform \"{}\"\n    policy \"{policy}\"\n}}\n\n\
             class \"web\" {{ service \"web\" }}\n\nservice \"web\" {{\n    port {HTTP_PORT}\n",
            self.version,
            self.fleet.dir.join(platform).display(),
        );
        for (name, step) in STEPS {
            let text = format!("ADDR=\"$DEPLOY_ADDRESS\"; VERSION=\"$DEPLOY_NEW_VERSION\"; {step}");
            assert!(!text.contains("\"#"), "a step must not contain \"#");
            let extra = if name == "check" {
                " timeout=\"60s\""
            } else {
                ""
            };
            writeln!(site, "    {name} #\"{text}\"#{extra}").unwrap();
        }
        site.push_str("}\n");
        let path = self.work.join("site.kdl");
        fs::write(&path, site).unwrap();
        path
    }

    /// Runs `mode` once (an upgrade to the next version unless it only connects) and checks
    /// the outcome; `what` names the run in the logs.
    fn run(&mut self, mode: Mode, what: &str) -> Sample {
        if mode.deploys() {
            self.version += 1;
        }
        let logs = self.args.out.join("logs");
        let stem = format!("n{}-{}-{what}", self.n, mode.slug());
        let load = load1();
        let connections = tool::sshd_lines(&self.fleet, ACCEPTED);
        let sessions = tool::sshd_lines(&self.fleet, SESSION);
        let cpu = machine_cpu();
        let (seconds, phases) = match mode {
            Mode::DroverRolling
            | Mode::DroverAll
            | Mode::DroverRollingTmpfs
            | Mode::DroverAllTmpfs
            | Mode::DroverFlowing
            | Mode::DroverSessions
            | Mode::DroverUncapped
            | Mode::DroverStore => {
                let (seconds, events, spawned, exited) = self.drover(mode, &logs, &stem, None);
                let text = fs::read_to_string(&events).unwrap_or_default();
                (seconds, Phases::of(&text, spawned, exited))
            }
            Mode::AnsibleLinear | Mode::AnsibleFree => (self.ansible(mode, &logs, &stem), None),
            Mode::Pyinfra => (self.pyinfra(&logs, &stem), None),
            Mode::SshRolling => (self.ssh(self.batch(), true), None),
            Mode::SshAll => (self.ssh(self.n, true), None),
            Mode::SshConnect => (self.ssh(self.n, false), None),
            Mode::DroverPlanStore => {
                // The store learns the fleet first (untimed): an apply that finds nothing to
                // do publishes what it read; the timed plan then connects no host.
                let site = self.write_site("rolling.kdl", "platform-store.kdl");
                let out = Command::new(&self.tools.deploy)
                    .arg("apply")
                    .arg(&site)
                    .arg("--yes")
                    .current_dir(&self.work)
                    .output()
                    .expect("run deploy");
                self.require(out.status.success(), "deploy apply (store)", &stem);
                let connections = tool::sshd_lines(&self.fleet, ACCEPTED);
                let mut cmd = Command::new(&self.tools.deploy);
                cmd.arg("plan").arg(site).current_dir(&self.work);
                let seconds = self.timed(cmd, &logs, &stem, "deploy plan (store)");
                let opened = tool::sshd_lines(&self.fleet, ACCEPTED) - connections;
                self.require(
                    opened == 0,
                    "deploy plan (store) opened no SSH connection",
                    &stem,
                );
                (seconds, None)
            }
            Mode::DroverStatus => {
                let mut cmd = Command::new(&self.tools.deploy);
                cmd.arg("status")
                    .arg(self.write_site("rolling.kdl", "platform.kdl"));
                (self.timed(cmd, &logs, &stem, "deploy status"), None)
            }
            Mode::DroverPlan | Mode::DroverPlanOffline => {
                let mut cmd = Command::new(&self.tools.deploy);
                cmd.arg("plan")
                    .arg(self.write_site("rolling.kdl", "platform.kdl"));
                if mode == Mode::DroverPlanOffline {
                    cmd.arg("--offline");
                }
                (self.timed(cmd, &logs, &stem, "deploy plan"), None)
            }
        };
        let cpu = machine_cpu() - cpu;
        let c = tool::sshd_lines(&self.fleet, ACCEPTED);
        let s = tool::sshd_lines(&self.fleet, SESSION);
        if mode.deploys() {
            self.verify(mode, &stem);
        }
        Sample {
            seconds,
            load,
            connections: (c - connections) as f64 / self.n as f64,
            sessions: (s - sessions) as f64 / self.n as f64,
            cpu,
            phases,
        }
    }

    /// `deploy apply SITE --yes --json`; returns the seconds, the events file and when the
    /// process was spawned and exited.
    fn drover(
        &self,
        mode: Mode,
        logs: &Path,
        stem: &str,
        memory: Option<&mut Memory>,
    ) -> (f64, PathBuf, SystemTime, SystemTime) {
        let policy = match mode {
            Mode::DroverRolling
            | Mode::DroverRollingTmpfs
            | Mode::DroverSessions
            | Mode::DroverUncapped
            | Mode::DroverStore => "rolling.kdl",
            Mode::DroverFlowing => "flowing.kdl",
            _ => "all.kdl",
        };
        // `.drover/` (journal, logs, locks) lives where `deploy` runs.
        let cwd = match mode {
            Mode::DroverRollingTmpfs | Mode::DroverAllTmpfs => self.tmpfs.clone().unwrap(),
            _ => self.work.clone(),
        };
        let platform = match mode {
            Mode::DroverSessions => "platform-sessions.kdl",
            Mode::DroverStore => "platform-store.kdl",
            _ => "platform.kdl",
        };
        let site = self.write_site(policy, platform);
        let events = logs.join(format!("{stem}.ndjson"));
        let mut cmd = Command::new(&self.tools.deploy);
        cmd.arg("apply").arg(&site).args(["--yes", "--json"]);
        if mode == Mode::DroverUncapped {
            // Every host's connection kept for the whole run.
            tool::uncapped(&mut cmd, self.n);
        }
        cmd.current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&events).unwrap())
            .stderr(fs::File::create(logs.join(format!("{stem}.err"))).unwrap());
        let spawned = SystemTime::now();
        let started = Instant::now();
        let child = cmd.spawn().expect("run deploy");
        let marker = self.fleet.ssh_config().display().to_string();
        let status = wait_sampled(child, &marker, memory).expect("wait for deploy");
        let seconds = started.elapsed().as_secs_f64();
        let exited = SystemTime::now();
        self.require(status.success(), "deploy apply", stem);
        (seconds, events, spawned, exited)
    }

    fn ansible(&mut self, mode: Mode, logs: &Path, stem: &str) -> f64 {
        let strategy = if mode == Mode::AnsibleLinear {
            "linear"
        } else {
            "free"
        };
        // A control directory of its own per run: every run starts without connections, as
        // every other tool does, and its masters are closed afterwards.
        self.ansible_runs += 1;
        let control = self.work.join(format!("cp{}", self.ansible_runs));
        fs::create_dir_all(&control).unwrap();
        let mut cmd = Command::new(self.tools.ansible_playbook.as_ref().unwrap());
        cmd.arg(self.work.join(format!("playbook-{strategy}.yml")))
            .arg("-e")
            .arg(format!("version={}", self.version))
            .env("ANSIBLE_CONFIG", self.work.join("ansible.cfg"))
            .env("ANSIBLE_SSH_CONTROL_PATH_DIR", &control);
        let seconds = self.timed(cmd, logs, stem, "ansible-playbook");
        tool::close_masters(&control);
        seconds
    }

    fn pyinfra(&self, logs: &Path, stem: &str) -> f64 {
        let mut cmd = Command::new(self.tools.pyinfra.as_ref().unwrap());
        cmd.args(["-y", "--no-wait", "--parallel"])
            .arg(self.n.to_string())
            .arg("--data")
            .arg(format!("version={}", self.version))
            .arg(self.work.join("inventory.py"))
            .arg(self.work.join("deploy.py"));
        self.timed(cmd, logs, stem, "pyinfra")
    }

    /// Runs a tool with its output in the logs; the seconds it took.
    fn timed(&self, cmd: Command, logs: &Path, stem: &str, what: &str) -> f64 {
        tool::timed(cmd, &self.work, logs, stem, what)
    }

    /// The floor: one plain `ssh` per host, `batch` hosts at a time, running the four steps in
    /// one session (or only `true`).
    fn ssh(&self, batch: usize, steps: bool) -> f64 {
        let script = |address: &str| {
            if !steps {
                return "true".to_string();
            }
            // A subshell per step, as each tool runs each step in a shell of its own.
            let body: Vec<String> = STEPS.iter().map(|(_, s)| format!("( {s} )")).collect();
            format!(
                "ADDR={address}; VERSION={}; {}",
                self.version,
                body.join(" && ")
            )
        };
        let started = Instant::now();
        for wave in self.addresses.chunks(batch) {
            std::thread::scope(|s| {
                let handles: Vec<_> = wave
                    .iter()
                    .map(|(name, address)| {
                        let mut cmd = self.fleet.ssh_command();
                        cmd.arg("-o")
                            .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                            .arg(name)
                            .arg("--")
                            .arg(script(address));
                        s.spawn(move || (name, cmd.output()))
                    })
                    .collect();
                for h in handles {
                    let (name, out) = h.join().unwrap();
                    let out: Output = out.expect("run ssh");
                    assert!(
                        out.status.success(),
                        "ssh to {name} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            });
        }
        started.elapsed().as_secs_f64()
    }

    /// Every host serves the current version.
    fn verify(&self, mode: Mode, stem: &str) {
        let want = self.version.to_string();
        let wrong: Vec<String> = self
            .addresses
            .iter()
            .filter_map(|(name, address)| match http_version(address) {
                Ok(v) if v == want => None,
                Ok(v) => Some(format!("{name} serves {v:?}")),
                Err(e) => Some(format!("{name}: {e}")),
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} ({stem}) did not bring every host to version {want}: {}",
            mode.label(),
            wrong.join("; ")
        );
    }

    fn require(&self, ok: bool, what: &str, stem: &str) {
        tool::require(ok, what, &self.args.out.join("logs"), stem);
    }

    /// An untimed Drover run whose controller memory is sampled.
    fn memory(&mut self, mode: Mode) -> Memory {
        self.version += 1;
        let mut m = Memory::default();
        let logs = self.args.out.join("logs");
        let stem = format!("n{}-{}-memory", self.n, mode.slug());
        self.drover(mode, &logs, &stem, Some(&mut m));
        self.verify(mode, &stem);
        m
    }
}

fn py_string(path: &Path) -> String {
    serde_json::to_string(path.to_str().expect("UTF-8 path")).unwrap()
}

/// GET /version from the host's server.
fn http_version(address: &str) -> Result<String, String> {
    let addr: SocketAddr = format!("{address}:{HTTP_PORT}").parse().unwrap();
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /version HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.0 200") {
        return Err(head.lines().next().unwrap_or("").to_string());
    }
    Ok(body.trim().to_string())
}

/// CPU time the machine has spent so far, every process: user + nice + system + irq +
/// softirq from `/proc/stat`, in seconds (Linux counts in USER_HZ, 100 a second).
fn machine_cpu() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq …
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    busy / 100.0
}

/// Peak controller memory of a Drover run: `deploy` and the ssh masters it started.
#[derive(Default)]
struct Memory {
    /// `deploy`'s own peak RSS (VmHWM), KiB.
    deploy_hwm: u64,
    /// The largest sum over one sample of `deploy`'s RSS and its masters' RSS, KiB.
    total_rss: u64,
    /// The largest sum over one sample of the masters' PSS (shared pages divided among the
    /// processes sharing them), KiB.
    masters_pss: u64,
    /// The most masters alive at one sample, and the RSS and PSS of that sample's masters.
    masters: usize,
    masters_rss_at_peak: u64,
    masters_pss_at_peak: u64,
    samples: usize,
}

impl Memory {
    fn summary(&self) -> String {
        format!(
            "deploy peak RSS {:.1} MiB; peak deploy + ssh processes RSS {:.1} MiB; {} masters at most, \
             {:.0} KiB RSS / {:.0} KiB PSS each",
            mib(self.deploy_hwm),
            mib(self.total_rss),
            self.masters,
            self.masters_rss_at_peak as f64 / self.masters.max(1) as f64,
            self.masters_pss_at_peak as f64 / self.masters.max(1) as f64,
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Waits for `child` (a `deploy`), sampling its memory and its masters' (those whose command
/// line names `marker`) into `memory` when given.
fn wait_sampled(
    mut child: std::process::Child,
    marker: &str,
    memory: Option<&mut Memory>,
) -> std::io::Result<std::process::ExitStatus> {
    let Some(m) = memory else {
        return child.wait();
    };
    let done = AtomicBool::new(false);
    let pid = child.id();
    std::thread::scope(|s| {
        let sampler = s.spawn(|| sample(pid, marker, &done));
        let status = child.wait();
        done.store(true, Ordering::Relaxed);
        *m = sampler.join().unwrap();
        status
    })
}

/// Samples /proc every 50 ms until `done`: `deploy` (pid) and every `ssh -M` master whose
/// command line names `marker` (the fleet's ssh_config) and a `.ssh-connection` directory;
/// the `ssh` processes that send large files over connections of their own
/// (`ControlPath=none`, `direct-above`) count in the total only, not in the masters' figures.
fn sample(pid: u32, marker: &str, done: &AtomicBool) -> Memory {
    let mut m = Memory::default();
    while !done.load(Ordering::Relaxed) {
        let status = |p: &str, key: &str| -> Option<u64> {
            let text = fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let line = text.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        let pid = pid.to_string();
        let deploy_rss = status(&pid, "VmRSS:").unwrap_or(0);
        m.deploy_hwm = m.deploy_hwm.max(status(&pid, "VmHWM:").unwrap_or(0));
        let (mut count, mut rss, mut pss, mut direct_rss) = (0, 0, 0, 0);
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let p = entry.file_name().to_string_lossy().into_owned();
            if !p.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            let args: Vec<&str> = cmdline.split('\0').collect();
            let master = args.first().is_some_and(|a| a.ends_with("ssh"))
                && args.contains(&"-M")
                && args.contains(&marker)
                && cmdline.contains(".ssh-connection");
            let direct = args.first().is_some_and(|a| a.ends_with("ssh"))
                && args.contains(&"ControlPath=none")
                && args.contains(&marker);
            if direct {
                direct_rss += status(&p, "VmRSS:").unwrap_or(0);
            }
            if master {
                count += 1;
                rss += status(&p, "VmRSS:").unwrap_or(0);
                pss += fs::read_to_string(entry.path().join("smaps_rollup"))
                    .ok()
                    .and_then(|t| {
                        t.lines()
                            .find(|l| l.starts_with("Pss:"))
                            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                    })
                    .unwrap_or(0);
            }
        }
        m.samples += 1;
        m.total_rss = m.total_rss.max(deploy_rss + rss + direct_rss);
        m.masters_pss = m.masters_pss.max(pss);
        if count >= m.masters {
            m.masters = count;
            m.masters_rss_at_peak = rss;
            m.masters_pss_at_peak = pss;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

/// Where one Drover run's time went, from its NDJSON events (millisecond stamps) and the
/// driver's clock at spawn and exit.
struct Phases {
    /// Spawn → `run-started`: load the site, resolve the inventory, observe every host
    /// (connect, read the state file, disconnect), plan.
    before: f64,
    /// `run-finished` → exit: close the remaining connections.
    after: f64,
    waves: Vec<Wave>,
    /// Medians over every step of the run.
    median: Step,
}

/// One wave: its length, and the breakdown of the step that ended last.
struct Wave {
    hosts: usize,
    seconds: f64,
    /// Its number in the service (1-based).
    number: u64,
    /// From the end of the wave that finished before it (or `run-started`) to its start;
    /// negative when it opened before that one ended (waves that flow).
    gap: f64,
    slowest: Step,
}

/// One step, in seconds: `connect` is `step-started` → its first `hook-started` (waiting for
/// the connection), each hook its own `ms`, and `state` the rest of the step: everything
/// outside the hooks' commands (state writes, events, the journal).
#[derive(Clone, Copy, Default)]
struct Step {
    connect: f64,
    stop: f64,
    install: f64,
    start: f64,
    check: f64,
    state: f64,
    total: f64,
    /// Hooks seen so far (while reading the events).
    hooks: u32,
}

impl Step {
    fn text(&self) -> String {
        format!(
            "connect {:.2}, stop {:.2}, install {:.2}, start {:.2}, check {:.2}, outside hooks {:.2} (step {:.2} s)",
            self.connect, self.stop, self.install, self.start, self.check, self.state, self.total
        )
    }
}

impl Phases {
    fn of(ndjson: &str, spawned: SystemTime, exited: SystemTime) -> Option<Phases> {
        let events: Vec<Value> = ndjson
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let time = |e: &Value| -> Option<SystemTime> {
            humantime::parse_rfc3339(e.get("time")?.as_str()?).ok()
        };
        let secs = |a: SystemTime, b: SystemTime| {
            b.duration_since(a)
                .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64())
        };
        let kind = |e: &Value| e["event"].as_str().unwrap_or("").to_string();
        let find = |k: &str| events.iter().find(|e| kind(e) == k).and_then(time);
        let run_started = find("run-started")?;
        let run_finished = find("run-finished")?;
        // Steps, by host.
        let mut steps: Vec<(String, SystemTime, SystemTime, Step)> = Vec::new();
        for e in &events {
            let host = e["host"].as_str().unwrap_or("").to_string();
            match kind(e).as_str() {
                "step-started" => steps.push((host, time(e)?, time(e)?, Step::default())),
                "hook-started" => {
                    let (_, started, _, step) = steps.iter_mut().rev().find(|s| s.0 == host)?;
                    if step.hooks == 0 {
                        step.connect = secs(*started, time(e)?).max(0.0);
                    }
                    step.hooks += 1;
                }
                "hook-finished" => {
                    let (_, started, _, step) = steps.iter_mut().rev().find(|s| s.0 == host)?;
                    let ms = e["ms"].as_f64().unwrap_or(0.0) / 1000.0;
                    if step.hooks == 0 {
                        // No `hook-started` events (an older `deploy`): the first hook's start
                        // is its end less its length.
                        step.connect = (secs(*started, time(e)?) - ms).max(0.0);
                        step.hooks += 1;
                    }
                    match e["hook"].as_str() {
                        Some("stop") => step.stop += ms,
                        Some("install") => step.install += ms,
                        Some("start") => step.start += ms,
                        Some("check") => step.check += ms,
                        _ => {}
                    }
                }
                "step-finished" => {
                    let (_, started, ended, step) = steps.iter_mut().rev().find(|s| s.0 == host)?;
                    *ended = time(e)?;
                    step.total = secs(*started, *ended);
                    step.state = (step.total
                        - step.connect
                        - step.stop
                        - step.install
                        - step.start
                        - step.check)
                        .max(0.0);
                }
                _ => {}
            }
        }
        let mut waves = Vec::new();
        let mut previous_end = run_started;
        // By wave number: waves that flow are open together (and may finish out of order).
        let mut open: HashMap<u64, (SystemTime, Vec<String>)> = HashMap::new();
        for e in &events {
            match kind(e).as_str() {
                "wave-started" => {
                    let hosts = e["hosts"]
                        .as_array()?
                        .iter()
                        .filter_map(|h| h.as_str().map(String::from))
                        .collect();
                    open.insert(e["wave"].as_u64()?, (time(e)?, hosts));
                }
                "wave-finished" => {
                    let number = e["wave"].as_u64()?;
                    let (start, hosts) = open.remove(&number)?;
                    let end = time(e)?;
                    let slowest = steps
                        .iter()
                        .filter(|s| hosts.contains(&s.0))
                        .max_by_key(|s| s.2)
                        .map(|s| s.3)
                        .unwrap_or_default();
                    waves.push(Wave {
                        number,
                        hosts: hosts.len(),
                        seconds: secs(start, end),
                        gap: secs(previous_end, start),
                        slowest,
                    });
                    previous_end = end;
                }
                _ => {}
            }
        }
        let med = |f: fn(&Step) -> f64| median(steps.iter().map(|s| f(&s.3)));
        Some(Phases {
            before: secs(spawned, run_started),
            after: secs(run_finished, exited),
            waves,
            median: Step {
                connect: med(|s| s.connect),
                stop: med(|s| s.stop),
                install: med(|s| s.install),
                start: med(|s| s.start),
                check: med(|s| s.check),
                state: med(|s| s.state),
                total: med(|s| s.total),
                hooks: 0,
            },
        })
    }
}

/// What the figures were measured on.
struct Machine {
    date: String,
    cpus: usize,
    cpu: String,
    memory_gib: f64,
    kernel: String,
    deploy: String,
    /// The commit of this tree, and whether src/ differs from it.
    tree: String,
    /// The load averages (1, 5, 15 minutes) before the benchmark started anything.
    load_before: String,
    ansible: String,
    pyinfra: String,
    openssh: String,
    python: String,
}

impl Machine {
    fn capture(tools: &Tools, given: bool) -> Machine {
        let first_line = |program: &Path, arg: &str| -> String {
            Command::new(program)
                .arg(arg)
                .output()
                .ok()
                .map(|o| {
                    let text = if o.stdout.is_empty() {
                        o.stderr
                    } else {
                        o.stdout
                    };
                    String::from_utf8_lossy(&text)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .unwrap_or_else(|| "?".into())
        };
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0.0);
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_string()))
            .unwrap_or_else(|| "?".into());
        Machine {
            date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            memory_gib: mem_kib / 1024.0 / 1024.0,
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            deploy: format!(
                "{} ({})",
                first_line(&tools.deploy, "--version"),
                tools.deploy.display()
            ),
            tree: if given {
                "given with --deploy".into()
            } else {
                let git = |args: &[&str]| {
                    Command::new("git")
                        .arg("-C")
                        .arg(env!("CARGO_MANIFEST_DIR"))
                        .args(args)
                        .output()
                        .ok()
                        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                        .unwrap_or_default()
                };
                let commit = git(&["rev-parse", "--short", "HEAD"]);
                let dirty = !git(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_empty();
                format!(
                    "{}{}",
                    if commit.is_empty() { "?" } else { &commit },
                    if dirty {
                        " with uncommitted changes in src/"
                    } else {
                        ""
                    }
                )
            },
            load_before: fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(", "),
            ansible: tools
                .ansible_playbook
                .as_ref()
                .map_or("not run".into(), |p| first_line(p, "--version")),
            pyinfra: tools
                .pyinfra
                .as_ref()
                .map_or("not run".into(), |p| first_line(p, "--version")),
            openssh: first_line(Path::new("ssh"), "-V"),
            python: first_line(Path::new("/usr/bin/python3"), "--version"),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB memory, Linux {}",
            self.cpus, self.cpu, self.memory_gib, self.kernel
        )
    }
}

/// A markdown table's header: `first`, then a column per fleet size.
fn header(out: &mut String, first: &str, sizes: &[usize]) {
    write!(out, "| {first} |").unwrap();
    for n in sizes {
        write!(out, " N = {n} |").unwrap();
    }
    write!(out, "\n| --- |").unwrap();
    for _ in sizes {
        write!(out, " ---: |").unwrap();
    }
    out.push('\n');
}

/// A table of a cell per mode (rows) and fleet size (columns); modes without a cell are left
/// out.
fn per_mode_table(out: &mut String, sizes: &[usize], cell: &dyn Fn(usize, Mode) -> Option<String>) {
    header(out, "tool, mode", sizes);
    for mode in MODES {
        let cells: Vec<Option<String>> = sizes.iter().map(|&n| cell(n, mode)).collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        write!(out, "| {} |", mode.label()).unwrap();
        for c in cells {
            write!(out, " {} |", c.unwrap_or_default()).unwrap();
        }
        out.push('\n');
    }
}

fn render(
    args: &Args,
    machine: &Machine,
    results: &[(usize, Mode, Vec<Sample>)],
    memory: &[(usize, Mode, Memory)],
) -> String {
    let mut out = String::new();
    let sizes: Vec<usize> = args.hosts.clone();
    let get = |n: usize, mode: Mode| results.iter().find(|r| r.0 == n && r.1 == mode);
    let med = |n: usize, mode: Mode| get(n, mode).map(|r| median(r.2.iter().map(|s| s.seconds)));
    let loads: Vec<f64> = results
        .iter()
        .flat_map(|r| r.2.iter().map(|s| s.load))
        .collect();
    let (lo, hi) = loads
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &l| {
            (a.min(l), b.max(l))
        });
    writeln!(out, "### Results of {}\n", machine.date).unwrap();
    writeln!(out, "- command: `{}`", args.command).unwrap();
    writeln!(
        out,
        "- key exchange offered by the hosts' sshd: {}",
        if args.kex_default {
            "OpenSSH's default (`--kex default`)"
        } else {
            "curve25519-sha256 only (the fleet's default; `--kex default` for OpenSSH's own)"
        }
    )
    .unwrap();
    if args.rtt_ms > 0 {
        writeln!(
            out,
            "- every SSH connection through `benches/compare/delay.py`: {} ms added to each round \
             trip ({} ms each way); the hosts' own traffic (the `curl` checks) is not delayed",
            args.rtt_ms,
            args.rtt_ms as f64 / 2.0
        )
        .unwrap();
    }
    writeln!(out, "- machine: {}", machine.summary()).unwrap();
    writeln!(
        out,
        "- load average before the benchmark started: {} (1, 5, 15 minutes); 1-minute load \
         average at the start of the timed runs (the fleet's own work included): {lo:.2} to \
         {hi:.2}, median {:.2}",
        machine.load_before,
        median(&loads)
    )
    .unwrap();
    writeln!(
        out,
        "- versions: {} (tree: {}); ansible-core: {}; pyinfra: {}; {}; hosts' Python: {}",
        machine.deploy,
        machine.tree,
        machine.ansible,
        machine.pyinfra,
        machine.openssh,
        machine.python
    )
    .unwrap();
    writeln!(
        out,
        "- {} timed run(s) of each, interleaved; wall clock from spawn to exit; median (min to max)\n",
        args.runs
    )
    .unwrap();
    per_mode_table(&mut out, &sizes, &|n, mode| {
        let samples = &get(n, mode)?.2;
        let s: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
        let (min, max) = s
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        (!s.is_empty()).then(|| format!("{:.2} s ({min:.2} to {max:.2})", median(&s)))
    });
    let targets = [
        (Mode::DroverStore, Mode::DroverRolling, 1.05),
        (Mode::DroverRolling, Mode::AnsibleLinear, 0.15),
        (Mode::DroverRolling, Mode::AnsibleFree, 0.15),
        (Mode::DroverRolling, Mode::Pyinfra, 1.0),
        // Issue 16: "all at once ≤ 0.7 × pyinfra" is retired for this CPU-bound workload
        // (the floor itself is 0.8 to 1.0 × pyinfra here); the floor is the yardstick.
        (Mode::DroverAll, Mode::SshAll, 1.05),
        (Mode::DroverRolling, Mode::SshRolling, 1.15),
        (Mode::DroverUncapped, Mode::SshRolling, 1.15),
    ];
    let mut rows = String::new();
    for (ours, theirs, target) in targets {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| match (med(n, ours), med(n, theirs)) {
                (Some(a), Some(b)) => {
                    let r = a / b;
                    format!("{r:.3} {}", if r <= target { "met" } else { "**missed**" })
                }
                _ => String::new(),
            })
            .collect();
        if cells.iter().any(|c| !c.is_empty()) {
            writeln!(
                rows,
                "| {} ÷ {} ≤ {target} | {} |",
                ours.label(),
                theirs.label(),
                cells.join(" | ")
            )
            .unwrap();
        }
    }
    if !rows.is_empty() {
        out.push('\n');
        header(&mut out, "target (ratio of medians)", &sizes);
        out.push_str(&rows);
    }
    type Of = fn(&Sample) -> f64;
    let tables: [(&str, Of, usize); 3] = [
        (
            "SSH connections per host in one run (`Accepted publickey` lines in the hosts' sshd logs)",
            |s| s.connections,
            1,
        ),
        (
            "SSH sessions per host in one run, one per command not sent to a kept shell \
             (`Starting session: command` lines in the hosts' sshd logs)",
            |s| s.sessions,
            1,
        ),
        (
            "CPU time of the whole machine during one run, s (user + system of every process: \
             the tool, ssh, sshd and the hosts' own work; `/proc/stat`)",
            |s| s.cpu,
            2,
        ),
    ];
    for (title, of, decimals) in tables {
        write!(out, "\n{title}, median:\n\n").unwrap();
        per_mode_table(&mut out, &sizes, &|n, mode| {
            let samples = &get(n, mode)?.2;
            let v = || median(samples.iter().map(of));
            (!samples.is_empty()).then(|| format!("{:.decimals$}", v()))
        });
    }
    for (n, mode, m) in memory {
        writeln!(
            out,
            "\nController memory, {} at N = {n} (untimed run, /proc sampled every 50 ms, {} samples): \
             `deploy` peak RSS {:.1} MiB; peak of `deploy` + its ssh processes RSS {:.1} MiB; at most \
             {} masters at once, {:.0} KiB RSS ({:.0} KiB PSS) each; {:.0} KiB RSS per connected host \
             all told.",
            mode.label(),
            m.samples,
            mib(m.deploy_hwm),
            mib(m.total_rss),
            m.masters,
            m.masters_rss_at_peak as f64 / m.masters.max(1) as f64,
            m.masters_pss_at_peak as f64 / m.masters.max(1) as f64,
            m.total_rss as f64 / m.masters.max(1) as f64,
        )
        .unwrap();
    }
    // Where Drover's time went, for its median run of each mode.
    for &n in &sizes {
        for mode in [
            Mode::DroverRolling,
            Mode::DroverSessions,
            Mode::DroverFlowing,
            Mode::DroverAll,
            Mode::DroverRollingTmpfs,
            Mode::DroverAllTmpfs,
        ] {
            let Some((_, _, samples)) = get(n, mode) else {
                continue;
            };
            let m = median(samples.iter().map(|s| s.seconds));
            let Some(s) = samples
                .iter()
                .min_by(|a, b| (a.seconds - m).abs().total_cmp(&(b.seconds - m).abs()))
            else {
                continue;
            };
            let Some(p) = &s.phases else { continue };
            writeln!(
                out,
                "\nWhere the time went, {} at N = {n} (run of {:.2} s):\n",
                mode.label(),
                s.seconds
            )
            .unwrap();
            writeln!(
                out,
                "- before the rollout (load, resolve, observe every host, plan): {:.2} s",
                p.before
            )
            .unwrap();
            for w in &p.waves {
                writeln!(
                    out,
                    "- wave {} ({} hosts): {:.2} s after a gap of {:.3} s; its slowest host: {}",
                    w.number,
                    w.hosts,
                    w.seconds,
                    w.gap,
                    w.slowest.text()
                )
                .unwrap();
            }
            writeln!(
                out,
                "- after the rollout (closing connections, exit): {:.2} s",
                p.after
            )
            .unwrap();
            writeln!(out, "- median step: {}", p.median.text()).unwrap();
        }
    }
    out
}
