//! The three-tier workload (`--workload tiers`, issue 16): `db` → `api` (`needs "db"`) →
//! `web` (`needs "api" healthy="50%"` and the api hosts' addresses) on one loopback fleet, each
//! host's `install` and its server's readiness after `start` waiting durations drawn once per
//! host from a seeded distribution with stragglers, every SSH connection behind a round trip
//! (`--rtt`, 30 ms unless given). Drover at 30 % and all at once, Ansible and pyinfra at their
//! best, and the ideal schedule of each policy (zero overhead), as a table of medians and the
//! issue's targets as ratios of medians of one run.
//!
//! Every tool runs the same shell steps, which read the host's waits from `/srv/tier/wait`
//! (written once, untimed, with the scripts they call): the tools differ only in how they order
//! and connect.

use super::fleet::{self, Fleet, FleetHost};
use super::stats::{load1, median};
use super::{http_version, machine_cpu, Args, Machine, Relay, Tools, CONNECT_TIMEOUT_S};
use drover::plan::Plan;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The tiers, in dependency order.
const TIERS: [&str; 3] = ["db", "api", "web"];
/// Each tier's server listens on this port, on its host's address (one service per host).
const PORT: u16 = 8000;
const STEPS: [&str; 4] = ["stop", "install", "start", "check"];
/// The seed of the waits: the same fleet, host for host, on every run and every machine.
const SEED: u64 = 16;
/// A wait is uniform in [`WAIT_MIN_MS`, `WAIT_MIN_MS + WAIT_SPAN_MS`) …
const WAIT_MIN_MS: u64 = 200;
const WAIT_SPAN_MS: u64 = 400;
/// … and a host is a straggler with this probability: both its waits `STRAGGLER_FACTOR` times
/// longer.
const STRAGGLER_P: f64 = 0.05;
const STRAGGLER_FACTOR: u64 = 8;

// The host's side is kept cheap (shell builtins wherever one does, no program started per
// poll): every "host" shares the controller's two cores, and CPU the hosts burn slows every
// tool alike and hides what the benchmark is for, the order each tool starts the work in.

/// `/srv/tier/step STEP VERSION SERVICE [POOL]`: the steps every tool runs (POSIX sh). The
/// host's address is read from `/srv/tier/address`, so that a step's text is the same on every
/// host of a tier: pyinfra makes one operation of a call only when its arguments are the same
/// on every host, and with per-host text it ran one operation per host, the tiers interleaved.
const STEP_SCRIPT: &str = r#"#!/bin/sh
# step STEP VERSION SERVICE [POOL]: one step of the three-tier upgrade.
step=$1 version=$2 svc=$3 pool=${4-}
d=/srv/$svc
read -r install ready </srv/tier/wait || exit 1
read -r addr </srv/tier/address || exit 1
case $step in
stop)
    pid=
    read -r pid <"$d/pid" 2>/dev/null
    [ -n "$pid" ] || exit 0
    kill "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.01; done
    : >"$d/pid" ;;
install)
    # A download: a wait, then the version in place (and web's pool).
    sleep "$install" || exit 1
    printf '%s\n' "$version" >"$d/version" || exit 1
    if [ -n "$pool" ]; then printf '%s\n' $pool >"$d/upstreams" || exit 1; fi ;;
start)
    # The server listens only once ready: it waits, then binds the port.
    setsid /srv/tier/serve "$addr" 8000 "$d" "$ready" >"$d/server.log" 2>&1 </dev/null &
    echo $! >"$d/pid" ;;
check)
    exec bash /srv/tier/check "$addr" "$version" ;;
*)
    echo "step: unknown step $step" >&2; exit 2 ;;
esac
"#;

/// `/srv/tier/check ADDR VERSION`: polls the real port until it serves the version (60 s at
/// most): bash, for `/dev/tcp` and a `read -t` on a FIFO nobody writes as its sleep, so that a
/// poll starts no program.
const CHECK_SCRIPT: &str = r#"#!/bin/bash
addr=$1 version=$2
exec 9<>/srv/tier/fifo
for ((i = 0; i < 1200; i++)); do
    if { exec 3<>"/dev/tcp/$addr/8000"; } 2>/dev/null; then
        printf 'GET /version HTTP/1.0\r\n\r\n' >&3
        last=
        while IFS= read -r line <&3 || [ -n "$line" ]; do last=$line; line=; done
        exec 3>&-
        [ "$last" = "$version" ] && exit 0
    fi
    read -r -t 0.05 -u 9 _
done
echo "not serving $version on $addr:8000" >&2
exit 1
"#;

/// `/srv/tier/serve ADDR PORT DIR READY`: waits READY seconds, then answers every request with
/// DIR/version (HTTP/1.0). C, compiled once by the driver (`cc`, which cargo needs anyway):
/// it starts in about a millisecond where Python takes 28 ms of CPU and Perl 18 ms on this
/// machine, which 200 hosts starting at once would pay on the controller's two cores.
const SERVE_C: &str = r#"#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) { fputs("usage: serve ADDR PORT DIR READY\n", stderr); return 2; }
    char path[4096], body[256], head[160], buf[4096];
    snprintf(path, sizeof path, "%s/version", argv[3]);
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 1; }
    ssize_t n = read(fd, body, sizeof body);
    close(fd);
    if (n < 0) { perror(path); return 1; }
    double ready = atof(argv[4]);
    struct timespec ts = { (time_t)ready, (long)((ready - (double)(time_t)ready) * 1e9) };
    nanosleep(&ts, NULL);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { 0 };
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) { fputs("bad address\n", stderr); return 2; }
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 128) != 0) { perror("bind"); return 1; }
    int h = snprintf(head, sizeof head,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", (int)n);
    struct timeval tv = { 2, 0 };
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (read(c, buf, sizeof buf) >= 0 && write(c, head, h) == h) (void)!write(c, body, n);
        close(c);
    }
}
"#;

/// One way of rolling the upgrade out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    DroverRolling,
    DroverPersist,
    DroverAll,
    AnsibleFree,
    Pyinfra,
}

const MODES: [Mode; 5] = [
    Mode::DroverRolling,
    Mode::DroverPersist,
    Mode::DroverAll,
    Mode::AnsibleFree,
    Mode::Pyinfra,
];

/// Every mode's slug, for `--modes`.
pub(crate) const SLUGS: [&str; 5] = [
    "tiers-drover-rolling",
    "tiers-drover-persist",
    "tiers-drover-all",
    "tiers-ansible-free",
    "tiers-pyinfra",
];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::DroverRolling => "Drover, `batch \"30%\"`",
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

/// Hosts per tier for a fleet of `n`: 5 % db, 20 % web (at least one of each), the rest api;
/// 10, 150 and 40 at N = 200.
fn layout(n: usize) -> [usize; 3] {
    let db = (n / 20).max(1);
    let web = (n / 5).max(1);
    [db, n.saturating_sub(db + web).max(1), web]
}

/// A number in [0, 1) from (seed, i): splitmix64.
fn draw(seed: u64, i: u64) -> f64 {
    let mut z = seed
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The waits of the host numbered `i` (from 0 across the fleet): install, ready, straggler.
fn waits(i: usize) -> (u64, u64, bool) {
    let i = i as u64 * 3;
    let ms = |k: u64| WAIT_MIN_MS + (draw(SEED, i + k) * WAIT_SPAN_MS as f64) as u64;
    let straggler = draw(SEED, i + 2) < STRAGGLER_P;
    let factor = if straggler { STRAGGLER_FACTOR } else { 1 };
    (ms(0) * factor, ms(1) * factor, straggler)
}

/// Where a Drover run's time went ([`Sample`]).
#[derive(Default)]
struct Phases {
    before: Option<f64>,
    rollout: Option<f64>,
    replayed: Option<f64>,
    beyond: Option<f64>,
}

/// One timed run.
struct Sample {
    seconds: f64,
    load: f64,
    cpu: f64,
    /// Drover: spawn → `run-started` (load, resolve, observe, plan) and the rollout itself.
    before: Option<f64>,
    rollout: Option<f64>,
    /// Drover: the run's own steps, each as long as it took (`step-started` to
    /// `step-finished`), through the ideal schedule of its plan, seconds; and the median of
    /// what a step took beyond its host's two waits, seconds.
    replayed: Option<f64>,
    beyond: Option<f64>,
}

/// One fleet size's results: N, the samples of each mode, the ideals, the fleet's shape.
type Size = (usize, Vec<(Mode, Vec<Sample>)>, Ideals, String);

/// The ideal schedules, seconds: of Drover's two policies (its own planner's plan, through
/// `drover::rollout::ideal_makespan`) and of the order Ansible and pyinfra follow.
struct Ideals {
    rolling: f64,
    all: f64,
    ansible: f64,
    pyinfra: f64,
    /// `deploy plan` (reads every host), and one `ssh HOST true` to every host at once:
    /// seconds, once, untimed against the rest.
    plan: f64,
    connect: f64,
    /// The workload's own time beyond its waits: the four steps of an upgrade to the version a
    /// host runs, run on the host in one command and timed there (no round trip, no tool),
    /// median of a few api hosts, seconds.
    own: f64,
    /// Drover's two policies again, each step its two waits and one round trip (`--rtt`):
    /// the least a tool that must tell a host to start a step, and hear that it ended, can do.
    rolling_rtt: f64,
    all_rtt: f64,
}

pub(crate) fn run(args: &Args, tools: &Tools, machine: &Machine) -> String {
    let modes: Vec<Mode> = MODES
        .into_iter()
        .filter(|m| m.available(args, tools))
        .filter(|m| args.modes.is_empty() || args.modes.iter().any(|s| s == m.slug()))
        .collect();
    let mut csv = String::from("hosts,mode,run,seconds,load1,machine_cpu_seconds\n");
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
                    "{n},{},{r},{:.3},{:.2},{:.2}",
                    mode.slug(),
                    s.seconds,
                    s.load,
                    s.cpu
                )
                .unwrap();
                eprintln!(
                    "compare: tiers N={n} run {r} {}: {:.2} s (load {:.2})",
                    mode.label(),
                    s.seconds,
                    s.load
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

    /// Each host's scripts and waits, in its own `/srv/tier` (untimed).
    fn write_hosts(&self) {
        let source = self.work.join("serve.c");
        let serve = self.work.join("serve");
        fs::write(&source, SERVE_C).unwrap();
        let cc = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&serve)
            .arg(&source)
            .status();
        assert!(
            cc.is_ok_and(|s| s.success()),
            "cc could not build the hosts' server ({})",
            source.display()
        );
        for h in &self.hosts {
            let dir = self.fleet.host_root(&h.name).join("srv/tier");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("step"), STEP_SCRIPT).unwrap();
            fs::write(dir.join("check"), CHECK_SCRIPT).unwrap();
            fs::copy(&serve, dir.join("serve")).unwrap();
            fs::create_dir_all(
                self.fleet
                    .host_root(&h.name)
                    .join("srv")
                    .join(TIERS[h.tier]),
            )
            .unwrap();
            let fifo = dir.join("fifo");
            if !fifo.exists() {
                let made = Command::new("mkfifo").arg(&fifo).status();
                assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
            }
            fs::write(dir.join("address"), format!("{}\n", h.address)).unwrap();
            fs::write(
                dir.join("wait"),
                format!(
                    "{}.{:03} {}.{:03}\n",
                    h.install_ms / 1000,
                    h.install_ms % 1000,
                    h.ready_ms / 1000,
                    h.ready_ms % 1000
                ),
            )
            .unwrap();
        }
    }

    /// The api hosts' `address:port`, space-separated (the order is not checked).
    fn pool(&self) -> String {
        let mut api: Vec<&TierHost> = self.hosts.iter().filter(|h| h.tier == 1).collect();
        api.sort_by(|a, b| a.name.cmp(&b.name));
        api.iter()
            .map(|h| format!("{}:{PORT}", h.address))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every tool's inputs but the Drover site, which carries the version.
    fn write_inputs(&self) {
        let w = &self.work;
        let write = |name: &str, text: String| fs::write(w.join(name), text).unwrap();
        let platform = self.fleet.write_platform("/var/lib/drover");
        let text = fs::read_to_string(&platform).unwrap().replacen(
            "transport \"ssh\" ",
            &format!("transport \"ssh\" connect-timeout=\"{CONNECT_TIMEOUT_S}s\" "),
            1,
        );
        // The same platform, each host's connection kept 5 minutes after a command.
        let persist = text.replacen("transport \"ssh\" ", "transport \"ssh\" persist=\"5m\" ", 1);
        fs::write(platform.with_file_name("platform-persist.kdl"), persist).unwrap();
        fs::write(&platform, text).unwrap();
        // Drover: a new user's policies, nothing but the batch.
        write(
            "rolling.kdl",
            "policy \"rolling\" {\n    batch \"30%\"\n}\n".into(),
        );
        write(
            "all.kdl",
            "policy \"all\" {\n    batch \"100%\"\n    max-failed \"100%\"\n    on-failure \"continue\"\n}\n"
                .into(),
        );
        // Ansible: one group per tier, one play per tier in order, at its best (free
        // strategy, pipelining, ControlPersist, forks for every host).
        let mut inventory = String::new();
        for (tier, name) in TIERS.iter().enumerate() {
            writeln!(inventory, "[{name}]").unwrap();
            for h in self.hosts.iter().filter(|h| h.tier == tier) {
                writeln!(inventory, "{} ansible_host={}", h.name, h.address).unwrap();
            }
        }
        write("inventory.ini", inventory);
        write(
            "ansible.cfg",
            super::tool::ansible_cfg(&w.join("inventory.ini"), self.n.max(5), &self.fleet),
        );
        let pool = self.pool();
        let mut playbook = String::new();
        for tier in TIERS {
            write!(
                playbook,
                "- hosts: {tier}\n  gather_facts: false\n  serial: \"30%\"\n  strategy: free\n  tasks:\n"
            )
            .unwrap();
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    format!(" \"{pool}\"")
                } else {
                    String::new()
                };
                let text = format!("sh /srv/tier/step {step} {{{{ version }}}} {tier}{extra}");
                writeln!(
                    playbook,
                    "    - name: {tier} {step}\n      ansible.builtin.shell: {}",
                    serde_json::to_string(&text).unwrap()
                )
                .unwrap();
            }
        }
        write("playbook.yml", playbook);
        // pyinfra: one group per tier, its operations under `if "<tier>" in host.groups`; run
        // once per tier (see `pyinfra`).
        let mut inventory = super::tool::pyinfra_common(&self.fleet);
        for (tier, name) in TIERS.iter().enumerate() {
            writeln!(inventory, "\n{name} = [").unwrap();
            for h in self.hosts.iter().filter(|h| h.tier == tier) {
                writeln!(
                    inventory,
                    "    ({:?}, {{**common, \"ssh_hostname\": {:?}}}),",
                    h.name, h.address
                )
                .unwrap();
            }
            inventory.push_str("]\n");
        }
        write("inventory.py", inventory);
        let mut deploy = format!(
            "from pyinfra import host\nfrom pyinfra.operations import server\n\n\
             POOL = {pool:?}\nversion = host.data.version\n"
        );
        for tier in TIERS {
            writeln!(deploy, "\nif {tier:?} in host.groups:").unwrap();
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    " + ' \"' + POOL + '\"'"
                } else {
                    ""
                };
                writeln!(
                    deploy,
                    "    server.shell(name=\"{tier} {step}\", commands=[f\"sh /srv/tier/step {step} {{version}} {tier}\"{extra}])"
                )
                .unwrap();
            }
        }
        write("deploy.py", deploy);
    }

    /// The Drover site at `version` under the given policy file.
    fn write_site(&self, policy: &str, version: u64) -> PathBuf {
        self.write_site_on(policy, "platform.kdl", version)
    }

    /// The Drover site at `version` under the given policy file, on the given platform file.
    fn write_site_on(&self, policy: &str, platform: &str, version: u64) -> PathBuf {
        let mut site = format!(
            "site \"tiers\" {{\n    version \"{version}\"\n    platform \"{}\"\n    policy \"{policy}\"\n}}\n\n",
            self.fleet.dir.join(platform).display(),
        );
        for tier in TIERS {
            writeln!(site, "class \"{tier}\" {{ service \"{tier}\" }}").unwrap();
        }
        for tier in TIERS {
            write!(site, "\nservice \"{tier}\" {{\n    port {PORT}\n").unwrap();
            match tier {
                "api" => site.push_str("    needs \"db\"\n"),
                "web" => site.push_str("    needs \"api\" healthy=\"50%\" addressable=\"all\"\n"),
                _ => {}
            }
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    " \"$DEPLOY_NEEDS_API\""
                } else {
                    ""
                };
                let timeout = if step == "check" {
                    " timeout=\"60s\""
                } else {
                    ""
                };
                writeln!(
                    site,
                    "    {step} #\"sh /srv/tier/step {step} \"$DEPLOY_NEW_VERSION\" {tier}{extra}\"#{timeout}"
                )
                .unwrap();
            }
            site.push_str("}\n");
        }
        let path = self.work.join("site.kdl");
        fs::write(&path, site).unwrap();
        path
    }

    /// The ideal schedule of each policy for the next upgrade (the same every run): Drover's
    /// from the plan `deploy plan` makes now, Ansible's and pyinfra's from their order.
    fn ideals(&self) -> Ideals {
        let work_of = |host: &str| {
            self.hosts
                .iter()
                .find(|h| h.name == host)
                .map_or(Duration::ZERO, TierHost::work)
        };
        let ideal_of = |policy: &str| {
            let site = self.write_site(policy, self.version + 1);
            let saved = self.work.join(format!("plan-{policy}.json"));
            let started = Instant::now();
            let out = Command::new(&self.tools.deploy)
                .arg("plan")
                .arg(&site)
                .arg("--out")
                .arg(&saved)
                .current_dir(&self.work)
                .output()
                .expect("run deploy plan");
            assert!(
                out.status.success(),
                "deploy plan failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let planned = started.elapsed().as_secs_f64();
            let plan: Plan =
                serde_json::from_slice(&fs::read(&saved).unwrap()).expect("a saved plan");
            let ideal = drover::rollout::ideal_makespan(&plan, |_, host| work_of(host));
            let rtt = Duration::from_millis(self.args.rtt_ms);
            let with_rtt = drover::rollout::ideal_makespan(&plan, |_, host| work_of(host) + rtt);
            (ideal.as_secs_f64(), with_rtt.as_secs_f64(), planned)
        };
        let tier_hosts = |tier: usize| -> Vec<&TierHost> {
            self.hosts.iter().filter(|h| h.tier == tier).collect()
        };
        // Ansible: per play, `serial` batches in inventory order (30 %, rounded down, at least
        // one), each waiting for its slowest host (free strategy within the batch).
        let ansible = (0..TIERS.len())
            .map(|t| {
                let hs = tier_hosts(t);
                let batch = (hs.len() * 3 / 10).max(1);
                hs.chunks(batch)
                    .map(|c| c.iter().map(|h| h.work()).max().unwrap_or_default())
                    .sum::<Duration>()
            })
            .sum::<Duration>();
        // pyinfra: tier after tier, every host of a tier at once, so each tier its slowest host.
        let pyinfra = (0..TIERS.len())
            .map(|t| {
                tier_hosts(t)
                    .iter()
                    .map(|h| h.work())
                    .max()
                    .unwrap_or_default()
            })
            .sum::<Duration>();
        let (rolling, rolling_rtt, plan) = ideal_of("rolling.kdl");
        let (all, all_rtt, _) = ideal_of("all.kdl");
        Ideals {
            rolling,
            all,
            ansible: ansible.as_secs_f64(),
            pyinfra: pyinfra.as_secs_f64(),
            plan,
            connect: self.connect_all(),
            own: self.own_overhead(),
            rolling_rtt,
            all_rtt,
        }
    }

    /// What the steps themselves take beyond their two waits, with no tool and no round trip:
    /// `stop`, `install`, `start` and `check` of the version a host already runs, one after
    /// the other in one command on the host, timed there; the median of five api hosts, one
    /// after the other, seconds. (Drover's records are not touched; the hosts stay at their
    /// version.)
    fn own_overhead(&self) -> f64 {
        let script = format!(
            "t0=$(date +%s%N) && for s in stop install start check; do              sh /srv/tier/step $s {} api || exit 1; done && echo $(( $(date +%s%N) - t0 ))",
            self.version
        );
        let api: Vec<&TierHost> = self.hosts.iter().filter(|h| h.tier == 1).take(5).collect();
        median(api.iter().map(|h| {
            let out = self
                .fleet
                .ssh_command()
                .arg("-o")
                .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                .args([h.name.as_str(), script.as_str()])
                .output()
                .expect("run ssh");
            assert!(
                out.status.success(),
                "the steps on {}: {}",
                h.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let ns: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("nanoseconds from the host");
            ns / 1e9 - h.work().as_secs_f64()
        }))
    }

    /// The handshake floor: one plain `ssh HOST true` to every host at once, seconds.
    fn connect_all(&self) -> f64 {
        let started = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .hosts
                .iter()
                .map(|h| {
                    let mut cmd = self.fleet.ssh_command();
                    cmd.arg("-o")
                        .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                        .args([&h.name, "true"]);
                    s.spawn(move || cmd.output())
                })
                .collect();
            for h in handles {
                let out = h.join().unwrap().expect("run ssh");
                assert!(
                    out.status.success(),
                    "ssh: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        });
        started.elapsed().as_secs_f64()
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
        let cpu = machine_cpu();
        let (seconds, phases) = match mode {
            Mode::DroverRolling | Mode::DroverPersist | Mode::DroverAll => {
                self.drover(mode, &logs, &stem)
            }
            Mode::AnsibleFree => (self.ansible(&logs, &stem), Phases::default()),
            Mode::Pyinfra => (self.pyinfra(&logs, &stem), Phases::default()),
        };
        let cpu = machine_cpu() - cpu;
        self.verify(mode, &stem);
        Sample {
            seconds,
            load,
            cpu,
            before: phases.before,
            rollout: phases.rollout,
            replayed: phases.replayed,
            beyond: phases.beyond,
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
        let spawned = SystemTime::now();
        let started = Instant::now();
        let status = Command::new(&self.tools.deploy)
            .arg("apply")
            .arg(&site)
            .args(["--yes", "--json"])
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&events).unwrap())
            .stderr(fs::File::create(logs.join(format!("{stem}.err"))).unwrap())
            .status()
            .expect("run deploy");
        let seconds = started.elapsed().as_secs_f64();
        self.require(status.success(), "deploy apply", stem);
        let text = fs::read_to_string(&events).unwrap_or_default();
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let time = |e: &Value| humantime::parse_rfc3339(e["time"].as_str()?).ok();
        let at = |kind: &str| events.iter().find(|e| e["event"] == kind).and_then(time);
        let secs = |a: SystemTime, b: SystemTime| b.duration_since(a).ok().map(|d| d.as_secs_f64());
        let started_at = at("run-started");
        let before = started_at.and_then(|s| secs(spawned, s));
        let rollout = started_at
            .zip(at("run-finished"))
            .and_then(|(a, b)| secs(a, b));
        // Each step as long as it took, from its events.
        let key = |e: &Value| {
            (
                e["service"].as_str().unwrap_or("").to_string(),
                e["host"].as_str().unwrap_or("").to_string(),
            )
        };
        let mut begun: HashMap<(String, String), SystemTime> = HashMap::new();
        let mut took: HashMap<(String, String), Duration> = HashMap::new();
        for e in &events {
            match (e["event"].as_str(), time(e)) {
                (Some("step-started"), Some(t)) => {
                    begun.insert(key(e), t);
                }
                (Some("step-finished"), Some(t)) => {
                    if let Some(d) = begun.get(&key(e)).and_then(|s| t.duration_since(*s).ok()) {
                        took.insert(key(e), d);
                    }
                }
                _ => {}
            }
        }
        let work_of = |host: &str| {
            self.hosts
                .iter()
                .find(|h| h.name == host)
                .map(TierHost::work)
        };
        let beyond = median(
            took.iter()
                .filter_map(|((_, h), d)| Some(d.as_secs_f64() - work_of(h)?.as_secs_f64())),
        );
        let plan: Option<Plan> = fs::read(self.work.join(format!("plan-{policy}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let replayed = plan.filter(|_| !took.is_empty()).map(|plan| {
            drover::rollout::ideal_makespan(&plan, |s, h| {
                took.get(&(s.to_string(), h.to_string()))
                    .copied()
                    .unwrap_or_default()
            })
            .as_secs_f64()
        });
        let phases = Phases {
            before,
            rollout,
            replayed,
            beyond: (!took.is_empty()).then_some(beyond),
        };
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

/// The report: the medians, the ideals and the targets, per fleet size.
fn render(args: &Args, machine: &Machine, results: &[Size]) -> String {
    let mut out = String::new();
    let loads: Vec<f64> = results
        .iter()
        .flat_map(|r| r.1.iter().flat_map(|m| m.1.iter().map(|s| s.load)))
        .collect();
    writeln!(out, "### Three tiers: results of {}\n", machine.date).unwrap();
    writeln!(out, "- command: `{}`", args.command).unwrap();
    writeln!(
        out,
        "- workload: `db` → `api` (`needs \"db\"`) → `web` (`needs \"api\" healthy=\"50%\" \
         addressable=\"all\"`); each host's `install` waits and its server listens only after a \
         readiness wait, each uniform in {:.1} to {:.1} s, both ×{STRAGGLER_FACTOR} on a \
         straggler (probability {STRAGGLER_P}, seed {SEED}); `check` polls the port until it \
         serves the new version; `web`'s `install` writes the api pool",
        WAIT_MIN_MS as f64 / 1000.0,
        (WAIT_MIN_MS + WAIT_SPAN_MS) as f64 / 1000.0
    )
    .unwrap();
    for (n, _, _, shape) in results {
        writeln!(out, "- N = {n}: {shape}").unwrap();
    }
    super::tool::environment(&mut out, args, machine, &loads);
    writeln!(
        out,
        "- versions: {} (tree: {}); ansible-core: {}; pyinfra: {}; {}",
        machine.deploy, machine.tree, machine.ansible, machine.pyinfra, machine.openssh
    )
    .unwrap();
    writeln!(
        out,
        "- {} timed run(s) of each, interleaved; wall clock from spawn to exit; median (min to \
         max); the ideal is the policy's schedule with zero overhead (each host exactly its \
         two waits)\n",
        args.runs
    )
    .unwrap();
    let sizes: Vec<usize> = results.iter().map(|r| r.0).collect();
    super::header(&mut out, "tool, policy", &sizes);
    let med = |n: usize, mode: Mode| -> Option<f64> {
        let r = results.iter().find(|r| r.0 == n)?;
        let s = &r.1.iter().find(|m| m.0 == mode)?.1;
        (!s.is_empty()).then(|| median(s.iter().map(|s| s.seconds)))
    };
    for mode in MODES {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| {
                let Some(r) = results.iter().find(|r| r.0 == n) else {
                    return String::new();
                };
                let Some((_, s)) = r.1.iter().find(|m| m.0 == mode) else {
                    return String::new();
                };
                let v: Vec<f64> = s.iter().map(|s| s.seconds).collect();
                let (lo, hi) = v
                    .iter()
                    .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
                if v.is_empty() {
                    String::new()
                } else {
                    format!("{:.2} s ({lo:.2} to {hi:.2})", median(&v))
                }
            })
            .collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        writeln!(out, "| {} | {} |", mode.label(), cells.join(" | ")).unwrap();
    }
    type Of = fn(&Ideals) -> f64;
    let ideal_rows: [(&str, Of); 6] = [
        ("ideal of `batch \"30%\"` (Drover's plan)", |i| i.rolling),
        ("… each step also one round trip (`--rtt`)", |i| {
            i.rolling_rtt
        }),
        ("ideal of all at once (Drover's plan)", |i| i.all),
        ("… each step also one round trip (`--rtt`)", |i| i.all_rtt),
        (
            "ideal of Ansible's order (serial batches, tier after tier)",
            |i| i.ansible,
        ),
        (
            "ideal of pyinfra's order (tier after tier, each all at once)",
            |i| i.pyinfra,
        ),
    ];
    let other_rows: [(&str, Of); 2] = [
        ("Drover, `deploy plan` (reads every host; one run)", |i| {
            i.plan
        }),
        (
            "floor: `ssh HOST true` to every host at once (one run)",
            |i| i.connect,
        ),
    ];
    for (label, of) in ideal_rows.into_iter().chain(other_rows) {
        let cells: Vec<String> = results
            .iter()
            .map(|r| format!("{:.2} s", of(&r.2)))
            .collect();
        writeln!(out, "| {label} | {} |", cells.join(" | ")).unwrap();
    }
    let own: Vec<String> = results
        .iter()
        .map(|r| format!("{:.0} ms", r.2.own * 1000.0))
        .collect();
    writeln!(
        out,
        "| a step's own time beyond its two waits: its four steps in one command on a host, \
         no tool, no round trip (median of 5 api hosts) | {} |",
        own.join(" | ")
    )
    .unwrap();
    // The targets: ratios of medians (the ideal is one number).
    enum Side {
        Mode(Mode),
        Ideal(&'static str, Of),
    }
    let value = |n: usize, side: &Side| -> Option<f64> {
        match side {
            Side::Mode(m) => med(n, *m),
            Side::Ideal(_, of) => results.iter().find(|r| r.0 == n).map(|r| of(&r.2)),
        }
    };
    let name = |side: &Side| match side {
        Side::Mode(m) => m.label().to_string(),
        Side::Ideal(l, _) => l.to_string(),
    };
    let targets: [(Side, Side, f64); 6] = [
        (
            Side::Mode(Mode::DroverRolling),
            Side::Ideal("its ideal", |i| i.rolling),
            1.15,
        ),
        (
            Side::Mode(Mode::DroverPersist),
            Side::Ideal("its ideal", |i| i.rolling),
            1.15,
        ),
        (
            Side::Mode(Mode::DroverRolling),
            Side::Mode(Mode::Pyinfra),
            1.0,
        ),
        (
            Side::Mode(Mode::DroverRolling),
            Side::Mode(Mode::AnsibleFree),
            0.3,
        ),
        (Side::Mode(Mode::DroverAll), Side::Mode(Mode::Pyinfra), 0.7),
        (
            Side::Mode(Mode::DroverAll),
            Side::Ideal("its ideal", |i| i.all),
            1.15,
        ),
    ];
    out.push('\n');
    super::header(&mut out, "target (ratio of medians)", &sizes);
    for (ours, theirs, target) in &targets {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| match (value(n, ours), value(n, theirs)) {
                (Some(a), Some(b)) => {
                    let r = a / b;
                    format!("{r:.3} {}", if r <= *target { "met" } else { "**missed**" })
                }
                _ => String::new(),
            })
            .collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        writeln!(
            out,
            "| {} ÷ {} ≤ {target} | {} |",
            name(ours),
            name(theirs),
            cells.join(" | ")
        )
        .unwrap();
    }
    // Where Drover's time went: the medians of its runs' phases.
    out.push('\n');
    for (n, samples, _, _) in results {
        for (mode, s) in samples {
            if !matches!(
                mode,
                Mode::DroverRolling | Mode::DroverPersist | Mode::DroverAll
            ) || s.is_empty()
            {
                continue;
            }
            let before = median(s.iter().filter_map(|s| s.before));
            let rollout = median(s.iter().filter_map(|s| s.rollout));
            let replayed = median(s.iter().filter_map(|s| s.replayed));
            let beyond = median(s.iter().filter_map(|s| s.beyond)) * 1000.0;
            let cpu = median(s.iter().map(|s| s.cpu));
            writeln!(
                out,
                "- {} at N = {n}, medians: {before:.2} s before the rollout (load, resolve, \
                 observe every host, plan), {rollout:.2} s of rollout; its steps, each as long \
                 as it took, in the ideal schedule: {replayed:.2} s (the rest of the rollout is \
                 the scheduler's); a step beyond its host's two waits: {beyond:.0} ms; the \
                 machine's CPU during a run {cpu:.1} s",
                mode.label()
            )
            .unwrap();
        }
    }
    out
}
