//! A deep dependency graph on the `local` transport: how close `deploy apply` comes to the
//! critical path (issue 6: "total time ≤ 1.1 × the critical path").
//!
//! `cargo bench --bench graph -- --run` generates, in a temporary directory, one DAG of 48
//! services 14 deep (fan-in and fan-out, pseudo-random from a fixed seed) whose hooks only
//! sleep (install, start and check: 0.1–0.5 s a service in all), and runs it in three layouts:
//!
//! - `small`: one service per class, 1–4 hosts a class;
//! - `large`: the same, 10–20 hosts a class;
//! - `mixed`: services grouped 1–3 to a class (so they share hosts, and a host runs one step at a
//!   time), 1–4 hosts a class.
//!
//! The policy runs every host of a service at once (`batch "100%"`, no pause). The critical
//! path is the longest path through the runtime `needs` graph weighted by each service's sleep;
//! for `mixed` the bound is the schedule Drover's own rule gives with zero overhead (services
//! in plan order, each class's hosts one step at a time), which can be longer than the path.
//! Each layout runs once untimed, then `--runs` times (3), each from fresh hosts and a fresh
//! `.drover/`: `deploy apply SITE --yes --json` as a child process, timed from spawn to exit.
//! After each, the same rollout by a minimal scheduler in this process (the floor), twice: with
//! bare `sh -c 'sleep X'` hooks, and with each host locked first and its state written durably
//! after `start` and `check` as `deploy` does ([`Keep::State`]). The NDJSON events of
//! `deploy` say where its time went: before the rollout (load, observe, plan), the
//! scheduling latency of each service (needs met → first step started), the launch offset of
//! its last host, each step's time beyond its sleeps, and what follows the last step.
//!
//! Options: `--runs N`, `--only small,large,mixed`, `--dir DIR` (generate under DIR, e.g.
//! `/dev/shm`, and keep it), `--deploy PATH` (another `deploy`), `--seed N`.
//! Without `--run` it prints how to run it and exits, so that `cargo test --benches` stays fast.
//! The latest figures are in `book/src/performance.md`, the method and every dated run in
//! `book/src/appendix-measurements.md`.

#[path = "common/stats.rs"]
mod stats;

use serde_json::Value;
use stats::{load1, median};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};

const SEED: u64 = 0x6472_6f76_6572_0006;
const SERVICES: usize = 48;
const LEVELS: usize = 14;
const RUNS: usize = 3;

const USAGE: &str = "\
usage: cargo bench --bench graph -- --run [--runs 3] [--only small,large,mixed]
           [--dir DIR] [--deploy PATH] [--seed N]";

// ---------------------------------------------------------------------------------------------
// The graph and its layouts.

/// splitmix64: small, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

struct Svc {
    name: String,
    level: usize,
    /// Runtime needs (all hosts), services of lower levels.
    needs: Vec<usize>,
    /// Sleeps of install, start and check, in milliseconds.
    ms: [u64; 3],
}

impl Svc {
    fn sleep(&self) -> u64 {
        self.ms.iter().sum()
    }
}

/// Services in level order (so every need has a lower index).
struct Graph {
    services: Vec<Svc>,
}

impl Graph {
    /// `LEVELS` levels of at least one service each; every service past the first level needs
    /// one of the level before (so the graph is `LEVELS` deep) and up to two of any earlier one.
    fn generate(rng: &mut Rng) -> Graph {
        let mut per_level = [1usize; LEVELS];
        for _ in LEVELS..SERVICES {
            per_level[rng.range(0, LEVELS - 1)] += 1;
        }
        let mut services: Vec<Svc> = Vec::new();
        let mut first_of = Vec::new();
        for (level, &count) in per_level.iter().enumerate() {
            first_of.push(services.len());
            for _ in 0..count {
                let i = services.len();
                let mut needs = Vec::new();
                if level > 0 {
                    let prev = first_of[level - 1];
                    needs.push(rng.range(prev, first_of[level] - 1));
                    for _ in 0..rng.range(0, 2) {
                        let t = rng.range(0, first_of[level] - 1);
                        if !needs.contains(&t) {
                            needs.push(t);
                        }
                    }
                    needs.sort_unstable();
                }
                // 100–500 ms in steps of 10, split 30/30/40 over install, start and check.
                let total = 10 * rng.range(10, 50) as u64;
                let install = total * 3 / 10;
                let start = total * 3 / 10;
                services.push(Svc {
                    name: format!("s{i:02}"),
                    level,
                    needs,
                    ms: [install, start, total - install - start],
                });
            }
        }
        Graph { services }
    }

    /// The longest path, weighted by sleep, and its number of services.
    fn critical_path(&self) -> (u64, usize) {
        let mut finish = vec![0u64; self.services.len()];
        let mut depth = vec![0usize; self.services.len()];
        for (i, s) in self.services.iter().enumerate() {
            let before = s.needs.iter().map(|&t| finish[t]).max().unwrap_or(0);
            finish[i] = before + s.sleep();
            depth[i] = 1 + s.needs.iter().map(|&t| depth[t]).max().unwrap_or(0);
        }
        let cp = finish.iter().copied().max().unwrap_or(0);
        (cp, depth.iter().copied().max().unwrap_or(0))
    }

    fn edges(&self) -> usize {
        self.services.iter().map(|s| s.needs.len()).sum()
    }

    fn max_fan_in(&self) -> usize {
        self.services
            .iter()
            .map(|s| s.needs.len())
            .max()
            .unwrap_or(0)
    }

    fn max_fan_out(&self) -> usize {
        let mut out = vec![0usize; self.services.len()];
        for s in &self.services {
            for &t in &s.needs {
                out[t] += 1;
            }
        }
        out.into_iter().max().unwrap_or(0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Small,
    Large,
    Mixed,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Small => "small",
            Variant::Large => "large",
            Variant::Mixed => "mixed",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Variant::Small => "1 service a class, 1–4 hosts a class",
            Variant::Large => "1 service a class, 10–20 hosts a class",
            Variant::Mixed => "1–3 services a class, sharing hosts; 1–4 hosts a class",
        }
    }
}

struct Class {
    name: String,
    services: Vec<usize>,
    hosts: usize,
}

struct Layout {
    classes: Vec<Class>,
}

impl Layout {
    fn new(g: &Graph, variant: Variant, rng: &mut Rng) -> Layout {
        let n = g.services.len();
        let groups: Vec<Vec<usize>> = match variant {
            Variant::Small | Variant::Large => (0..n).map(|i| vec![i]).collect(),
            Variant::Mixed => {
                // A shuffle, cut into groups of 1–3: some share a class with a service they
                // need, some with one they have nothing to do with.
                let mut order: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    order.swap(i, rng.range(0, i));
                }
                let mut groups = Vec::new();
                let mut at = 0;
                while at < n {
                    let k = rng.range(1, 3).min(n - at);
                    let mut group = order[at..at + k].to_vec();
                    group.sort_unstable();
                    groups.push(group);
                    at += k;
                }
                groups.sort();
                groups
            }
        };
        let (lo, hi) = match variant {
            Variant::Large => (10, 20),
            _ => (1, 4),
        };
        let classes = groups
            .into_iter()
            .enumerate()
            .map(|(c, services)| Class {
                name: format!("c{c:02}"),
                services,
                hosts: rng.range(lo, hi),
            })
            .collect();
        Layout { classes }
    }

    fn hosts(&self) -> usize {
        self.classes.iter().map(|c| c.hosts).sum()
    }

    fn steps(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.hosts * c.services.len())
            .sum()
    }

    fn class_of(&self, services: usize) -> Vec<usize> {
        let mut of = vec![0; services];
        for (c, class) in self.classes.iter().enumerate() {
            for &s in &class.services {
                of[s] = c;
            }
        }
        of
    }

    /// The busiest class: the sum of its services' sleeps (a host runs one step at a time).
    fn busiest(&self, g: &Graph) -> u64 {
        self.classes
            .iter()
            .map(|c| c.services.iter().map(|&s| g.services[s].sleep()).sum())
            .max()
            .unwrap_or(0)
    }

    /// The rollout with zero overhead under Drover's rule: a service starts once every host of
    /// every service it needs is done; a host runs one step at a time and, when it is free,
    /// takes the first service in plan order that waits for it. All hosts of a class run the
    /// same steps in the same order, so a class is one machine here.
    fn ideal(&self, g: &Graph, order: &[usize]) -> u64 {
        let n = g.services.len();
        let class_of = self.class_of(n);
        let mut done: Vec<Option<u64>> = vec![None; n];
        let mut started = vec![false; n];
        let mut free_at = vec![0u64; self.classes.len()];
        let mut running: Vec<(u64, usize)> = Vec::new();
        let mut now = 0;
        loop {
            for &s in order {
                let ready = g.services[s]
                    .needs
                    .iter()
                    .all(|&t| done[t].is_some_and(|d| d <= now));
                if !started[s] && ready && free_at[class_of[s]] <= now {
                    started[s] = true;
                    let end = now + g.services[s].sleep();
                    free_at[class_of[s]] = end;
                    running.push((end, s));
                }
            }
            let Some(next) = running.iter().map(|r| r.0).min() else {
                break;
            };
            now = next;
            running.retain(|&(end, s)| {
                if end == now {
                    done[s] = Some(end);
                }
                end != now
            });
        }
        done.iter()
            .map(|d| d.unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0)
    }
}

/// Writes `sites/graph.kdl`, `platforms/graph.kdl` and `policies/all.kdl` under `dir`.
fn write_site(dir: &Path, g: &Graph, layout: &Layout) -> PathBuf {
    for sub in ["sites", "platforms", "policies"] {
        fs::create_dir_all(dir.join(sub)).unwrap();
    }
    fs::write(
        dir.join("policies/all.kdl"),
        "policy \"all\" {\n    batch \"100%\"\n    pause \"0s\"\n    max-failed 0\n    on-failure \"stop\"\n}\n",
    )
    .unwrap();
    let mut p = String::from(
        "// Generated by benches/graph.rs: each host is a directory, platforms/hosts/<host>.\n\
         platform \"graph\" {\n    transport \"local\"\n    inventory \"static\" {\n",
    );
    for (c, class) in layout.classes.iter().enumerate() {
        for h in 1..=class.hosts {
            writeln!(
                p,
                "        host \"{}-h{h:02}\" address=\"127.1.{c}.{h}\" class=\"{}\"",
                class.name, class.name
            )
            .unwrap();
        }
    }
    p.push_str("    }\n}\n");
    fs::write(dir.join("platforms/graph.kdl"), p).unwrap();
    let mut s = String::from(
        "// Generated by benches/graph.rs: a deep runtime DAG whose hooks only sleep.\n\
         site \"graph\" {\n    version \"1\"\n    platform \"../platforms/graph.kdl\"\n    policy \"../policies/all.kdl\"\n}\n\n",
    );
    for class in &layout.classes {
        let names: Vec<String> = class
            .services
            .iter()
            .map(|&i| format!("service \"{}\"", g.services[i].name))
            .collect();
        writeln!(s, "class \"{}\" {{ {} }}", class.name, names.join("; ")).unwrap();
    }
    for svc in &g.services {
        writeln!(s, "\nservice \"{}\" {{", svc.name).unwrap();
        for &t in &svc.needs {
            writeln!(s, "    needs \"{}\"", g.services[t].name).unwrap();
        }
        let [install, start, check] = svc.ms;
        writeln!(s, "    install \"sleep {}\"", secs(install)).unwrap();
        writeln!(s, "    start \"sleep {}\"", secs(start)).unwrap();
        writeln!(s, "    check \"sleep {}\" timeout=\"30s\"", secs(check)).unwrap();
        s.push_str("}\n");
    }
    let site = dir.join("sites/graph.kdl");
    fs::write(&site, s).unwrap();
    site
}

fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

// ---------------------------------------------------------------------------------------------
// Running `deploy` and reading its events.

struct Args {
    runs: usize,
    variants: Vec<Variant>,
    dir: Option<PathBuf>,
    deploy: Option<PathBuf>,
    seed: u64,
    command: String,
}

impl Args {
    /// `None`: `--run` was not given.
    fn parse() -> Result<Option<Args>, String> {
        let mut argv: Vec<String> = std::env::args().skip(1).collect();
        argv.retain(|a| a != "--bench"); // added by `cargo bench`
        let mut args = Args {
            runs: RUNS,
            variants: vec![Variant::Small, Variant::Large, Variant::Mixed],
            dir: None,
            deploy: None,
            seed: SEED,
            command: String::new(),
        };
        let mut run = false;
        let mut shown = vec!["--run".to_string()];
        let mut it = argv.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--run" => run = true,
                "--runs" => {
                    let v = value(arg)?;
                    args.runs = v.parse().map_err(|_| format!("--runs {v}"))?;
                    shown.extend([arg.clone(), v]);
                }
                "--only" => {
                    let v = value(arg)?;
                    args.variants = v
                        .split(',')
                        .map(|n| match n.trim() {
                            "small" => Ok(Variant::Small),
                            "large" => Ok(Variant::Large),
                            "mixed" => Ok(Variant::Mixed),
                            other => Err(format!("unknown layout `{other}` (small, large, mixed)")),
                        })
                        .collect::<Result<_, _>>()?;
                    shown.extend([arg.clone(), v]);
                }
                "--dir" => {
                    let v = value(arg)?;
                    args.dir = Some(PathBuf::from(&v));
                    shown.extend([arg.clone(), v]);
                }
                "--deploy" => {
                    let v = value(arg)?;
                    args.deploy = Some(PathBuf::from(&v));
                    shown.extend([arg.clone(), v]);
                }
                "--seed" => {
                    let v = value(arg)?;
                    args.seed = v.parse().map_err(|_| format!("--seed {v}"))?;
                    shown.extend([arg.clone(), v]);
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if !run {
            return Ok(None);
        }
        if args.runs == 0 {
            return Err("--runs must be positive".into());
        }
        args.command = format!("cargo bench --bench graph -- {}", shown.join(" "));
        Ok(Some(args))
    }
}

/// One event: its kind, service, host, hook, `ms`, and its time in seconds since the spawn.
struct Ev {
    kind: String,
    service: String,
    host: String,
    ms: f64,
    at: f64,
}

/// One timed `deploy apply`.
struct Run {
    /// Spawn → exit.
    wall: f64,
    /// CPU time of `deploy` and everything it started (user + system).
    cpu: f64,
    /// CPU time of `deploy` itself (its threads, not its children).
    own: f64,
    load: f64,
    events: Vec<Ev>,
}

/// CPU seconds from a `/proc/PID/stat`: the process's own (`utime + stime`, all its threads)
/// and its waited-for children's (`cutime + cstime`).
fn cpu_of(stat: &str, tick: f64) -> (f64, f64) {
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let field = |i: usize| -> f64 {
        rest.split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 to 17 of proc_pid_stat(5); `rest` starts at field 3.
    (
        (field(11) + field(12)) / tick,
        (field(13) + field(14)) / tick,
    )
}

fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The machine's own cost of a hook, in seconds beyond its sleep (median of 21, one at a time):
/// `/bin/sh -c 'sleep 0.05'` alone, and in the shape `deploy` runs a hook (`hook_run.rs`: a
/// wrapper shell that writes and removes a pid file and `env … /bin/sh -c` the hook).
fn spawn_floor(dir: &Path) -> (f64, f64) {
    let pid_dir = dir.join("floor/hooks");
    fs::create_dir_all(&pid_dir).unwrap();
    let hooked = format!(
        "[ -d {d} ] || mkdir -p {d}; trap 'rm -f {d}/p.pid' EXIT; {{ echo $$ >{d}/p.pid; }} 2>/dev/null; \
         env 'DEPLOY_SITE=graph' 'DEPLOY_HOST=h' 'DEPLOY_SERVICE=s' /bin/sh -c 'sleep 0.050'",
        d = pid_dir.display()
    );
    let time = |script: &str| {
        let runs = (0..21)
            .map(|_| {
                let t = Instant::now();
                let ok = Command::new("/bin/sh")
                    .args(["-c", script])
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .output()
                    .is_ok_and(|o| o.status.success());
                assert!(ok, "the floor's script fails: {script}");
                t.elapsed().as_secs_f64() - 0.050
            })
            .collect::<Vec<f64>>();
        median(runs)
    };
    (time("sleep 0.050"), time(&hooked))
}

/// What a host must do besides its hooks in a floor run: nothing, or lock and record state.
#[derive(Clone, Copy)]
enum Keep<'a> {
    /// Bare hooks: no lock, no state.
    Nothing,
    /// Under this directory, each host (one directory each) is first locked (`mkdir -p` of its
    /// state directory, `mkdir` of the lock, the holder written), and each step writes the
    /// host's state durably after `start` and after `check` (`printf` to a temporary file,
    /// `sync`, `mv`), in the hook's own command; a host's last step then removes the lock
    /// (`rm -rf`). That is what `deploy` does on a host, without its wrapper shell, pid file
    /// and journal: the least any tool that locks each host and records each step must do.
    State(&'a Path),
}

/// Shell text that locks one host of a [`Keep::State`] floor.
fn floor_lock(dir: &Path) -> String {
    format!(
        "umask 077; mkdir -p {d}/hooks && mkdir {d}/lock && printf '%s\\n' '{{\"run\":\"floor\"}}' > {d}/lock/holder.json",
        d = dir.display()
    )
}

/// Shell text that writes a [`Keep::State`] floor host's state, as `deploy` does.
fn floor_write(dir: &Path, service: &str, release: bool) -> String {
    let json = format!(
        "{{\"schema\":1,\"services\":{{\"{service}\":{{\"version\":\"2\",\"configured\":{{\"outcome\":\"success\"}}}}}}}}"
    );
    let d = dir.display();
    let mut text = format!(
        " && printf '%s\\n' '{json}' > {d}/.state.json.tmp && {{ sync {d}/.state.json.tmp || true; }} && mv -f {d}/.state.json.tmp {d}/state.json"
    );
    if release {
        text.push_str(&format!(" && rm -rf {d}/lock"));
    }
    text
}

/// The floor: the same rollout by a minimal scheduler in this process, with Drover's rule (a
/// service starts once every host of its needs is done; a host runs one step at a time, the
/// first waiting service in plan order first), each hook a bare `/bin/sh -c 'sleep X'`, no
/// journal; with [`Keep::Nothing`] no state file either: what starting the hooks alone costs
/// on this machine. Its wall time and the CPU time of the processes it started, in seconds.
fn floor_run(g: &Graph, layout: &Layout, order: &[usize], tick: f64, keep: Keep) -> (f64, f64) {
    let n = g.services.len();
    let class_of = layout.class_of(n);
    let hosts_of = |s: usize| layout.classes[class_of[s]].hosts;
    let mut left: Vec<usize> = (0..n).map(hosts_of).collect();
    // Steps still to come on each host (its last one gives the lock back).
    let mut steps_left: Vec<Vec<usize>> = layout
        .classes
        .iter()
        .enumerate()
        .map(|(c, cl)| vec![(0..n).filter(|&s| class_of[s] == c).count(); cl.hosts])
        .collect();
    let host_dir = |c: usize, h: usize| match keep {
        Keep::Nothing => None,
        Keep::State(root) => Some(root.join(format!("c{c}h{h}"))),
    };
    let mut done = vec![false; n];
    let mut opened = vec![false; n];
    let mut pending: Vec<(usize, usize)> = Vec::new();
    let mut busy: Vec<Vec<bool>> = layout
        .classes
        .iter()
        .map(|c| vec![false; c.hosts])
        .collect();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, usize)>();
    let cpu_before = children_cpu(tick);
    let started = Instant::now();
    if let Keep::State(root) = keep {
        let _ = fs::remove_dir_all(root);
        let locks: Vec<_> = (0..layout.classes.len())
            .flat_map(|c| (0..layout.classes[c].hosts).map(move |h| (c, h)))
            .filter_map(|(c, h)| host_dir(c, h))
            .map(|d| {
                fs::create_dir_all(&d).expect("a floor host");
                Command::new("/bin/sh")
                    .args(["-c", &floor_lock(&d)])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("sh runs")
            })
            .collect();
        for mut child in locks {
            assert!(child.wait().is_ok_and(|st| st.success()), "a floor lock");
        }
    }
    let mut running = 0;
    loop {
        for &s in order {
            if !opened[s] && g.services[s].needs.iter().all(|&t| done[t]) {
                opened[s] = true;
                pending.extend((0..hosts_of(s)).map(|h| (s, h)));
            }
        }
        // In plan order, as the scheduler scans.
        pending.sort_by_key(|&(s, h)| (order.iter().position(|&o| o == s), h));
        pending.retain(|&(s, h)| {
            let c = class_of[s];
            if busy[c][h] {
                return true;
            }
            busy[c][h] = true;
            running += 1;
            steps_left[c][h] -= 1;
            let (tx, ms) = (tx.clone(), g.services[s].ms);
            let (dir, name, last) = (
                host_dir(c, h),
                g.services[s].name.clone(),
                steps_left[c][h] == 0,
            );
            std::thread::spawn(move || {
                for (i, m) in ms.into_iter().enumerate() {
                    let mut text = format!("sleep {}", secs(m));
                    // After `start` and `check` (the last stage), as `deploy` writes them.
                    if let (Some(dir), true) = (&dir, i > 0) {
                        text.push_str(&floor_write(dir, &name, last && i == 2));
                    }
                    let ok = Command::new("/bin/sh")
                        .args(["-c", &text])
                        .stdin(Stdio::null())
                        .status()
                        .is_ok_and(|st| st.success());
                    assert!(ok, "the floor's hook fails: {text}");
                }
                let _ = tx.send((s, h));
            });
            false
        });
        if running == 0 {
            break;
        }
        let (s, h) = rx.recv().expect("a step ends");
        running -= 1;
        busy[class_of[s]][h] = false;
        left[s] -= 1;
        done[s] = left[s] == 0;
    }
    assert!(done.iter().all(|&d| d), "the floor ran every service");
    let wall = started.elapsed().as_secs_f64();
    (wall, children_cpu(tick) - cpu_before)
}

/// CPU seconds of this process's waited-for children.
fn children_cpu(tick: f64) -> f64 {
    cpu_of(
        &fs::read_to_string("/proc/self/stat").unwrap_or_default(),
        tick,
    )
    .1
}

/// Runs `deploy apply` from fresh hosts; its NDJSON goes to `dir/<name>.ndjson` too.
fn apply(deploy: &Path, dir: &Path, tick: f64, name: &str) -> Run {
    // Fresh hosts and a fresh `.drover/` (no journal, no locks, no state).
    for sub in ["platforms/hosts", ".drover"] {
        let _ = fs::remove_dir_all(dir.join(sub));
    }
    let cpu_before = children_cpu(tick);
    let spawned = SystemTime::now();
    let mut child = Command::new(deploy)
        .args(["apply", "sites/graph.kdl", "--yes", "--json"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run deploy");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let stdout = pipe(Box::new(child.stdout.take().unwrap()));
    let stderr = pipe(Box::new(child.stderr.take().unwrap()));
    // `deploy`'s own CPU time: its last reading before it exits (sampled every 10 ms).
    let stat = format!("/proc/{}/stat", child.id());
    let mut own = 0.0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for deploy") {
            break status;
        }
        if let Ok(text) = fs::read_to_string(&stat) {
            own = cpu_of(&text, tick).0;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let exited = SystemTime::now();
    let cpu = children_cpu(tick) - cpu_before;
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    let _ = fs::write(dir.join(format!("{name}.ndjson")), &stdout);
    if !status.success() {
        eprintln!("{}", String::from_utf8_lossy(&stderr));
        panic!("deploy apply failed: {status}");
    }
    let secs = |t: SystemTime| {
        t.duration_since(spawned)
            .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64())
    };
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let events = String::from_utf8_lossy(&stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let at = humantime::parse_rfc3339(v["time"].as_str()?).ok()?;
            Some(Ev {
                kind: text(&v, "event"),
                service: text(&v, "service"),
                host: text(&v, "host"),
                ms: v["ms"].as_f64().unwrap_or(0.0) / 1000.0,
                at: secs(at),
            })
        })
        .collect();
    Run {
        wall: secs(exited),
        cpu,
        own,
        load: load1(),
        events,
    }
}

/// One step as its events tell it (seconds since the spawn).
#[derive(Default, Clone)]
struct Step {
    started: f64,
    finished: f64,
    /// (hook-started, hook-finished, its `ms`) of each hook.
    hooks: Vec<(f64, f64, f64)>,
}

/// Where one run's time went.
struct Analysis {
    before: f64,
    rollout: f64,
    after: f64,
    /// The sleep of the chain of services that ended the run (each waited for the one before).
    chain_sleep: f64,
    /// Along the chain: needs met (or `run-started`) → first step started.
    latency: f64,
    /// Along the chain: first step started → the step that ended the service started.
    offset: f64,
    /// Along the chain: the time of that step beyond its sleeps.
    overhead: f64,
    /// The last service done → `run-finished`.
    trail: f64,
    /// Medians over every service / step / hook.
    latency_median: f64,
    latency_max: f64,
    spacing_median: f64,
    step_overhead: f64,
    connect: f64,
    in_hooks: f64,
    between: f64,
    tail: f64,
    hook_spawn: f64,
}

fn analyse(g: &Graph, run: &Run) -> Analysis {
    let index: HashMap<&str, usize> = g
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let first = |k: &str| run.events.iter().find(|e| e.kind == k).map(|e| e.at);
    let run_started = first("run-started").expect("a run-started event");
    let run_finished = first("run-finished").expect("a run-finished event");
    let mut steps: HashMap<(usize, String), Step> = HashMap::new();
    for e in &run.events {
        let Some(&s) = index.get(e.service.as_str()) else {
            continue;
        };
        let key = (s, e.host.clone());
        match e.kind.as_str() {
            "step-started" => {
                steps.insert(
                    key,
                    Step {
                        started: e.at,
                        ..Step::default()
                    },
                );
            }
            "hook-started" => {
                if let Some(st) = steps.get_mut(&key) {
                    st.hooks.push((e.at, f64::NAN, 0.0));
                }
            }
            "hook-finished" => {
                if let Some(h) = steps.get_mut(&key).and_then(|st| st.hooks.last_mut()) {
                    h.1 = e.at;
                    h.2 = e.ms;
                }
            }
            "step-finished" => {
                if let Some(st) = steps.get_mut(&key) {
                    st.finished = e.at;
                }
            }
            _ => {}
        }
    }
    let n = g.services.len();
    let mut first_start = vec![f64::INFINITY; n];
    let mut done = vec![f64::NEG_INFINITY; n];
    let mut last: Vec<Option<Step>> = vec![None; n];
    let mut by_service: Vec<Vec<f64>> = vec![Vec::new(); n];
    for ((s, _), st) in &steps {
        first_start[*s] = first_start[*s].min(st.started);
        by_service[*s].push(st.started);
        if st.finished > done[*s] {
            done[*s] = st.finished;
            last[*s] = Some(st.clone());
        }
    }
    let ready = |s: usize| -> f64 {
        g.services[s]
            .needs
            .iter()
            .map(|&t| done[t])
            .fold(run_started, f64::max)
    };
    // The chain that ended the run: from the last service done, back through the need that
    // was done last.
    let mut chain = Vec::new();
    let mut at = (0..n).max_by(|&a, &b| done[a].total_cmp(&done[b]));
    while let Some(s) = at {
        chain.push(s);
        at = g.services[s]
            .needs
            .iter()
            .copied()
            .max_by(|&a, &b| done[a].total_cmp(&done[b]));
    }
    chain.reverse();
    let sleep = |s: usize| g.services[s].sleep() as f64 / 1000.0;
    let (mut latency, mut offset, mut overhead) = (0.0, 0.0, 0.0);
    for &s in &chain {
        let st = last[s].as_ref().expect("a finished step");
        latency += first_start[s] - ready(s);
        offset += st.started - first_start[s];
        overhead += st.finished - st.started - sleep(s);
    }
    let latencies: Vec<f64> = (0..n).map(|s| first_start[s] - ready(s)).collect();
    // The scheduler launches a service's steps one after another: the time between the first
    // and the last, per further step.
    let spacing: Vec<f64> = by_service
        .iter()
        .filter(|v| v.len() > 1)
        .map(|v| {
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                });
            (hi - lo) / (v.len() - 1) as f64
        })
        .collect();
    let mut parts: [Vec<f64>; 5] = Default::default();
    let mut hook_spawn = Vec::new();
    for ((s, _), st) in &steps {
        let ms = g.services[*s].ms;
        parts[0].push(st.finished - st.started - sleep(*s));
        if let (Some(first), Some(end)) = (st.hooks.first(), st.hooks.last()) {
            parts[1].push(first.0 - st.started);
            parts[2].push(st.hooks.iter().map(|h| h.1 - h.0).sum::<f64>() - sleep(*s));
            parts[3].push(st.hooks.windows(2).map(|w| w[1].0 - w[0].1).sum());
            parts[4].push(st.finished - end.1);
        }
        for (h, sleep_ms) in st.hooks.iter().zip(ms) {
            hook_spawn.push(h.2 - sleep_ms as f64 / 1000.0);
        }
    }
    let [step_overhead, connect, in_hooks, between, tail] = parts.map(median);
    let end = chain.last().map_or(run_started, |&s| done[s]);
    Analysis {
        before: run_started,
        rollout: run_finished - run_started,
        after: run.wall - run_finished,
        chain_sleep: chain.iter().map(|&s| sleep(s)).sum(),
        latency,
        offset,
        overhead,
        trail: run_finished - end,
        latency_median: median(&latencies),
        latency_max: latencies.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        spacing_median: median(spacing),
        step_overhead,
        connect,
        in_hooks,
        between,
        tail,
        hook_spawn: median(hook_spawn),
    }
}

/// The plan's service order (`deploy plan --offline --json`): the order the scheduler scans.
fn plan_order(deploy: &Path, dir: &Path, g: &Graph) -> Vec<usize> {
    let out = Command::new(deploy)
        .args(["plan", "sites/graph.kdl", "--offline", "--json"])
        .current_dir(dir)
        .output()
        .expect("run deploy plan");
    assert!(
        out.status.success(),
        "deploy plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    let names: Vec<&str> = plan["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    let order: Vec<usize> = names
        .iter()
        .filter_map(|n| g.services.iter().position(|s| s.name == *n))
        .collect();
    assert_eq!(order.len(), g.services.len(), "every service in the plan");
    order
}

// ---------------------------------------------------------------------------------------------
// The machine, and the report.

struct Machine {
    date: String,
    cpus: usize,
    cpu: String,
    kernel: String,
    rustc: String,
    commit: String,
    filesystem: String,
}

impl Machine {
    fn capture(dir: &Path) -> Machine {
        let first_line = |program: &str, args: &[&str]| -> String {
            Command::new(program)
                .args(args)
                .output()
                .ok()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .unwrap_or_else(|| "?".into())
        };
        let manifest = env!("CARGO_MANIFEST_DIR");
        let dirty = !first_line(
            "git",
            &["-C", manifest, "status", "--porcelain", "--", "src"],
        )
        .is_empty();
        Machine {
            date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu: fs::read_to_string("/proc/cpuinfo")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_string()))
                .unwrap_or_else(|| "?".into()),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            rustc: first_line("rustc", &["--version"]),
            commit: format!(
                "{}{}",
                first_line("git", &["-C", manifest, "rev-parse", "--short", "HEAD"]),
                if dirty { " (src/ modified)" } else { "" }
            ),
            filesystem: first_line("df", &["--output=fstype", &dir.display().to_string()]),
        }
    }
}

/// One layout's results.
struct Measured {
    variant: Variant,
    services: usize,
    depth: usize,
    classes: usize,
    hosts: usize,
    steps: usize,
    critical: f64,
    /// The zero-overhead schedule (the critical path when no two services share a host).
    bound: f64,
    busiest: f64,
    /// Median of the minimal scheduler's runs ([`floor_run`]).
    floor: f64,
    floor_cpu: f64,
    /// Median of the minimal scheduler's runs that also lock and record state
    /// ([`Keep::State`]).
    floor_state: f64,
    runs: Vec<Run>,
    /// The run of median wall time, analysed.
    analysis: Analysis,
}

fn main() {
    let args = match Args::parse() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("graph: nothing to do without --run\n{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("graph: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let temp;
    let root = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("drover-graph-")
                .tempdir()
                .expect("a temporary directory");
            temp.path().to_path_buf()
        }
    };
    fs::create_dir_all(&root).expect("create the directory");
    // A copy of `deploy`: the shared target directory may be rebuilt during the run.
    let built = args
        .deploy
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_deploy")));
    let deploy = root.join("deploy");
    fs::copy(&built, &deploy).expect("copy deploy");
    let machine = Machine::capture(&root);
    let load_before = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let tick = clock_tick();
    eprintln!(
        "graph: {} in {}, load {}",
        machine.date,
        root.display(),
        load_before.trim()
    );

    let floor_before = spawn_floor(&root);
    let mut rng = Rng(args.seed);
    let g = Graph::generate(&mut rng);
    let (critical_ms, depth) = g.critical_path();
    let mut results = Vec::new();
    for &variant in &args.variants {
        // Each layout draws from its own stream, so that `--only` changes nothing.
        let mut lrng = Rng(args.seed ^ (variant as u64 + 1).wrapping_mul(0x1000_0001));
        let layout = Layout::new(&g, variant, &mut lrng);
        let dir = root.join(variant.name());
        let _ = fs::remove_dir_all(&dir);
        write_site(&dir, &g, &layout);
        let order = plan_order(&deploy, &dir, &g);
        let bound = layout.ideal(&g, &order);
        eprintln!(
            "graph: {}: {} classes, {} hosts, {} steps, critical path {:.2} s, zero-overhead schedule {:.2} s",
            variant.name(),
            layout.classes.len(),
            layout.hosts(),
            layout.steps(),
            critical_ms as f64 / 1000.0,
            bound as f64 / 1000.0
        );
        let warm = apply(&deploy, &dir, tick, "warm-up");
        eprintln!("graph: {} warm-up: {:.2} s", variant.name(), warm.wall);
        let kept = dir.join("floor-hosts");
        floor_run(&g, &layout, &order, tick, Keep::Nothing);
        floor_run(&g, &layout, &order, tick, Keep::State(&kept));
        let (mut runs, mut floors, mut stated) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..args.runs {
            let run = apply(&deploy, &dir, tick, &format!("run{}", r + 1));
            let floor = floor_run(&g, &layout, &order, tick, Keep::Nothing);
            let state = floor_run(&g, &layout, &order, tick, Keep::State(&kept));
            eprintln!(
                "graph: {} run {}: {:.2} s (CPU {:.2} s, `deploy` itself {:.2} s, load {:.2}); floor {:.2} s, with lock and state {:.2} s",
                variant.name(),
                r + 1,
                run.wall,
                run.cpu,
                run.own,
                run.load,
                floor.0,
                state.0
            );
            runs.push(run);
            floors.push(floor);
            stated.push(state.0);
        }
        let mut by_wall: Vec<usize> = (0..runs.len()).collect();
        by_wall.sort_by(|&a, &b| runs[a].wall.total_cmp(&runs[b].wall));
        let analysis = analyse(&g, &runs[by_wall[by_wall.len() / 2]]);
        results.push(Measured {
            variant,
            services: g.services.len(),
            depth,
            classes: layout.classes.len(),
            hosts: layout.hosts(),
            steps: layout.steps(),
            critical: critical_ms as f64 / 1000.0,
            bound: bound as f64 / 1000.0,
            busiest: layout.busiest(&g) as f64 / 1000.0,
            floor: median(floors.iter().map(|f| f.0)),
            floor_cpu: median(floors.iter().map(|f| f.1)),
            floor_state: median(stated),
            runs,
            analysis,
        });
    }
    let load_after = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let floor_after = spawn_floor(&root);
    let loads = [load_before.as_str(), load_after.as_str()];
    let floors = [floor_before, floor_after];
    println!("{}", report(&args, &machine, &g, &results, loads, floors));
}

fn report(
    args: &Args,
    m: &Machine,
    g: &Graph,
    results: &[Measured],
    [load_before, load_after]: [&str; 2],
    floors: [(f64, f64); 2],
) -> String {
    let mut o = String::new();
    let w = &mut o;
    writeln!(w, "Command: `{}`\n", args.command).unwrap();
    writeln!(
        w,
        "Measured {} on {} CPUs ({}), Linux {}, {}, `deploy` from {} (release), work directory on {}; \
         load average {} before, {} after.\n",
        m.date,
        m.cpus,
        m.cpu,
        m.kernel,
        m.rustc,
        m.commit,
        m.filesystem,
        load_before.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        load_after.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
    .unwrap();
    writeln!(
        w,
        "The machine's own cost of a hook, beyond its sleep (before / after the runs): \
         `sh -c 'sleep 0.05'` {:.1} / {:.1} ms; the same in the shape of a Drover hook (wrapper \
         shell, pid file, `env … sh -c`) {:.1} / {:.1} ms.\n",
        floors[0].0 * 1000.0,
        floors[1].0 * 1000.0,
        floors[0].1 * 1000.0,
        floors[1].1 * 1000.0,
    )
    .unwrap();
    writeln!(
        w,
        "The graph (seed {:#x}): {} services on {} levels, {} runtime `needs`, fan-in up to {}, \
         fan-out up to {}; each service sleeps 0.1–0.5 s in all (30 % install, 30 % start, 40 % check).\n",
        args.seed,
        g.services.len(),
        g.services.iter().map(|s| s.level).max().unwrap_or(0) + 1,
        g.edges(),
        g.max_fan_in(),
        g.max_fan_out()
    )
    .unwrap();
    w.push_str(
        "| layout | services | depth | classes | hosts | steps | critical path | bound | Drover, median (each run) | ratio (target ≤ 1.1) | floor: minimal scheduler, bare `sh -c` hooks | floor ratio | floor with lock and state | its ratio |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in results {
        let walls: Vec<f64> = r.runs.iter().map(|x| x.wall).collect();
        let wall = median(&walls);
        writeln!(
            w,
            "| {} ({}) | {} | {} | {} | {} | {} | {:.2} s | {:.2} s | {:.2} s ({}) | **{:.2}** | {:.2} s | {:.2} | {:.2} s | {:.2} |",
            r.variant.name(),
            r.variant.describe(),
            r.services,
            r.depth,
            r.classes,
            r.hosts,
            r.steps,
            r.critical,
            r.bound,
            wall,
            walls.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", "),
            wall / r.bound,
            r.floor,
            r.floor / r.bound,
            r.floor_state,
            r.floor_state / r.bound,
        )
        .unwrap();
    }
    w.push_str(
        "\nMedians of the same runs: the rollout alone (`run-started` → `run-finished`), the gap per \
         level of the graph, a step's time beyond its sleeps, and CPU time (`deploy` with every \
         process it started, and `deploy` alone; the floor's hooks).\n\n\
         | layout | rollout only | ratio | (wall − bound) / depth | step beyond its sleeps | CPU: all / `deploy` itself | CPU per step: all / `deploy` / floor |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in results {
        let rollout = median(r.runs.iter().map(|x| {
            let t = |k: &str| x.events.iter().find(|e| e.kind == k).map_or(0.0, |e| e.at);
            t("run-finished") - t("run-started")
        }));
        let wall = median(r.runs.iter().map(|x| x.wall));
        let cpu = median(r.runs.iter().map(|x| x.cpu));
        let own = median(r.runs.iter().map(|x| x.own));
        writeln!(
            w,
            "| {} | {:.2} s | {:.2} | {:.0} ms | {:.0} ms | {:.1} / {:.1} s | {:.0} / {:.1} / {:.0} ms |",
            r.variant.name(),
            rollout,
            rollout / r.bound,
            (wall - r.bound) / r.depth as f64 * 1000.0,
            r.analysis.step_overhead * 1000.0,
            cpu,
            own,
            cpu / r.steps as f64 * 1000.0,
            own / r.steps as f64 * 1000.0,
            r.floor_cpu / r.steps as f64 * 1000.0,
        )
        .unwrap();
    }
    w.push_str(
        "\nWhere the gap went, in the run of median time: the chain of services that ended the run \
         (each waited for the one before it), and what it spent besides sleeping.\n\n\
         | layout | wall | bound | gap | before the rollout (load, connect, lock, observe, plan) | scheduling latency | launch offset | step overhead | last step → `run-finished` | `run-finished` → exit | slack (bound − chain's sleep) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in results {
        let a = &r.analysis;
        let wall = a.before + a.rollout + a.after;
        writeln!(
            w,
            "| {} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s |",
            r.variant.name(),
            wall,
            r.bound,
            wall - r.bound,
            a.before,
            a.latency,
            a.offset,
            a.overhead,
            a.trail,
            a.after,
            (r.bound - a.chain_sleep).max(0.0),
        )
        .unwrap();
    }
    w.push_str(
        "\nPer step and per service, medians over the run of median time (ms):\n\n\
         | layout | step beyond its sleeps | connect (step-started → first hook) | in hooks beyond sleep (3 hooks) | between hooks (2 gaps) | last hook → step-finished | one hook beyond its sleep (`ms`) | scheduling latency, median / max | launch spacing per further host |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in results {
        let a = &r.analysis;
        writeln!(
            w,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} / {:.0} | {:.1} |",
            r.variant.name(),
            a.step_overhead * 1000.0,
            a.connect * 1000.0,
            a.in_hooks * 1000.0,
            a.between * 1000.0,
            a.tail * 1000.0,
            a.hook_spawn * 1000.0,
            a.latency_median * 1000.0,
            a.latency_max * 1000.0,
            a.spacing_median * 1000.0,
        )
        .unwrap();
    }
    for r in results.iter().filter(|r| r.variant == Variant::Mixed) {
        writeln!(
            w,
            "\n`mixed`: the critical path alone is {:.2} s and the busiest class sleeps {:.2} s; \
             the bound is the zero-overhead schedule under Drover's rule.",
            r.critical, r.busiest
        )
        .unwrap();
    }
    o
}
