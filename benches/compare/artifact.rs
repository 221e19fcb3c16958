//! The artifact workload (`--workload artifact`, issue 16): one large plain `file` (100 MB
//! unless `--size-mb`) delivered to every host of a loopback fleet (50 unless `--hosts`), all at
//! once, against parallel `scp` of the same bytes to the same hosts; a second `apply` with
//! nothing to send against a no-op `apply` of the same site shape whose file is 1 KiB; and the
//! controller's peak memory delivering the file at a tenth of its size and at its size.
//!
//! Each delivery sends new content (a seeded pseudo-random file, incompressible), so that every
//! host lacks it. The no-op site keeps its own state directory on each
//! host (`/var/lib/drover-small`), so the two sites are each converged on the same hosts and
//! their applies can be interleaved.

use super::fleet::{self, Fleet, FleetHost};
use super::stats::{load1, median};
use super::{machine_cpu, Args, Machine, Memory, Relay, Tools, CONNECT_TIMEOUT_S};
use std::fmt::Write as _;
use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where every tool puts the file on each host.
const DROVER_TO: &str = "/srv/app/big.bin";
const SCP_TO: &str = "/srv/app/scp.bin";
const SMALL_TO: &str = "/srv/app/small.bin";
/// The no-op site's file.
const SMALL_BYTES: u64 = 1024;
/// Blocks compared per host when checking a delivered copy against its source (plus its size).
const CHECKED_BLOCKS: u64 = 16;
const BLOCK: usize = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Scp,
    ScpSync,
    DroverFirst,
    DroverSecond,
    DroverNoop,
}

const MODES: [Mode; 5] = [
    Mode::Scp,
    Mode::ScpSync,
    Mode::DroverFirst,
    Mode::DroverSecond,
    Mode::DroverNoop,
];

/// Every mode's slug, for `--modes`.
pub(crate) const SLUGS: [&str; 5] = [
    "artifact-scp",
    "artifact-scp-sync",
    "artifact-drover-first",
    "artifact-drover-second",
    "artifact-drover-noop",
];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Scp => "parallel `scp` to every host at once",
            Mode::ScpSync => {
                "parallel `scp` to every host at once, then `sync FILE` on each (on disk, as \
                 Drover's are)"
            }
            Mode::DroverFirst => "Drover, all at once, new content (every host lacks it)",
            Mode::DroverSecond => "Drover, a second apply (every host has it: nothing to send)",
            Mode::DroverNoop => "Drover, a no-op apply of the same site with a 1 KiB file",
        }
    }

    fn slug(self) -> &'static str {
        SLUGS[self as usize]
    }

    fn available(self, args: &Args) -> bool {
        let asked = |t: &str| args.tools.iter().any(|a| a == t);
        match self {
            Mode::Scp | Mode::ScpSync => asked("ssh"),
            _ => asked("drover"),
        }
    }
}

/// One timed run.
struct Sample {
    seconds: f64,
    load: f64,
    cpu: f64,
}

/// One fleet size's results: N, the samples by mode, the memory at a tenth of the size and at
/// the size.
type Size = (usize, Vec<(Mode, Vec<Sample>)>, Option<(Memory, Memory)>);

pub(crate) fn run(args: &Args, tools: &Tools, machine: &Machine) -> String {
    let modes: Vec<Mode> = MODES
        .into_iter()
        .filter(|m| m.available(args))
        .filter(|m| args.modes.is_empty() || args.modes.iter().any(|s| s == m.slug()))
        .collect();
    let mut csv = String::from("hosts,bytes,mode,run,seconds,load1,machine_cpu_seconds\n");
    let mut results: Vec<Size> = Vec::new();
    for &n in &args.hosts {
        let mut bench = ArtifactBench::start(n, args, tools);
        eprintln!(
            "compare: artifact, {n} hosts up in {:.1} s",
            bench.started_in
        );
        // The sites the modes apply converged once, untimed.
        if modes.contains(&Mode::DroverFirst) || modes.contains(&Mode::DroverSecond) {
            bench.run(Mode::DroverFirst, "install");
        }
        if modes.contains(&Mode::DroverNoop) {
            bench.run(Mode::DroverNoop, "install");
        }
        let bytes = bench.bytes;
        let samples = super::tool::rounds(
            args,
            &modes,
            |mode, what| bench.run(mode, what),
            |r, mode, s| {
                writeln!(
                    csv,
                    "{n},{bytes},{},{r},{:.3},{:.2},{:.2}",
                    mode.slug(),
                    s.seconds,
                    s.load,
                    s.cpu
                )
                .unwrap();
                eprintln!(
                    "compare: artifact N={n} run {r} {}: {:.2} s (load {:.2})",
                    mode.label(),
                    s.seconds,
                    s.load
                );
            },
        );
        let memory = (args.memory && modes.contains(&Mode::DroverFirst)).then(|| {
            let tenth = bench.memory((bytes / 10).max(SMALL_BYTES));
            let full = bench.memory(bytes);
            eprintln!(
                "compare: artifact N={n} memory at {} bytes: {}; at {bytes} bytes: {}",
                (bytes / 10).max(SMALL_BYTES),
                tenth.summary(),
                full.summary()
            );
            (tenth, full)
        });
        results.push((n, samples, memory));
    }
    fs::write(args.out.join("artifact-runs.csv"), &csv).expect("write artifact-runs.csv");
    render(args, machine, &results)
}

/// A running fleet, the two sites and the file.
struct ArtifactBench<'a> {
    n: usize,
    args: &'a Args,
    tools: &'a Tools,
    fleet: Fleet,
    hosts: Vec<String>,
    work: PathBuf,
    /// The file's size, and the seed of its current content.
    bytes: u64,
    seed: u64,
    /// The current content's sha256 (empty before the first).
    digest: String,
    started_in: f64,
    _relay: Option<Relay>,
}

impl<'a> ArtifactBench<'a> {
    fn start(n: usize, args: &'a Args, tools: &'a Tools) -> ArtifactBench<'a> {
        let names: Vec<String> = (1..=n).map(|i| format!("app{i}")).collect();
        let fleet_hosts: Vec<FleetHost> = names.iter().map(|h| FleetHost::new(h, "app")).collect();
        let started = Instant::now();
        let sshd_port = fleet::SSH_PORT + u16::from(args.rtt_ms > 0);
        let fleet = Fleet::start_behind(&fleet_hosts, sshd_port);
        let started_in = started.elapsed().as_secs_f64();
        let addresses: Vec<(String, String)> = names
            .iter()
            .map(|h| (h.clone(), fleet.address(h)))
            .collect();
        let relay = (args.rtt_ms > 0).then(|| Relay::start(&addresses, sshd_port, args.rtt_ms));
        let work = fleet.dir.join("artifact");
        fs::create_dir_all(&work).unwrap();
        for h in &names {
            fs::create_dir_all(fleet.host_root(h).join("srv/app")).unwrap();
        }
        let bench = ArtifactBench {
            n,
            args,
            tools,
            fleet,
            hosts: names,
            work,
            bytes: args.size_mb * 1_000_000,
            seed: 0,
            digest: String::new(),
            started_in,
            _relay: relay,
        };
        bench.write_inputs();
        bench
    }

    /// The platforms (one state directory each), the policy and the two sites.
    fn write_inputs(&self) {
        let platform = self.fleet.write_platform("/var/lib/drover");
        let text = fs::read_to_string(&platform).unwrap().replacen(
            "transport \"ssh\" ",
            &format!("transport \"ssh\" connect-timeout=\"{CONNECT_TIMEOUT_S}s\" "),
            1,
        );
        fs::write(&platform, &text).unwrap();
        fs::write(
            platform.with_file_name("platform-small.kdl"),
            text.replace("\"/var/lib/drover\"", "\"/var/lib/drover-small\""),
        )
        .unwrap();
        fs::write(
            self.work.join("all.kdl"),
            "policy \"all\" {\n    batch \"100%\"\n    max-failed \"100%\"\n    on-failure \"continue\"\n}\n",
        )
        .unwrap();
        let site = |platform: &str, source: &str, to: &str| {
            format!(
                "site \"artifact\" {{\n    version \"1\"\n    platform \"{}\"\n    policy \"all.kdl\"\n}}\n\n\
                 class \"app\" {{ service \"app\" }}\n\n\
                 service \"app\" {{\n    file \"{source}\" to=\"{to}\" mode=\"0644\"\n}}\n",
                self.fleet.dir.join(platform).display()
            )
        };
        fs::write(
            self.work.join("site.kdl"),
            site("platform.kdl", "big.bin", DROVER_TO),
        )
        .unwrap();
        fs::write(
            self.work.join("site-small.kdl"),
            site("platform-small.kdl", "small.bin", SMALL_TO),
        )
        .unwrap();
        write_content(&self.work.join("small.bin"), SMALL_BYTES, u64::MAX);
    }

    /// New content for the big file: `bytes` long, from the next seed. (Each host keeps the
    /// placed file, and while a step runs the one it replaced; with `scp`'s copy and a content
    /// arriving, up to four times the size per host on the fleet's disk.)
    fn renew(&mut self, bytes: u64) {
        self.seed += 1;
        self.bytes = bytes;
        let path = self.work.join("big.bin");
        self.digest = write_content(&path, bytes, self.seed);
    }

    fn run(&mut self, mode: Mode, what: &str) -> Sample {
        let logs = self.args.out.join("logs");
        let stem = format!("n{}-{}-{what}", self.n, mode.slug());
        // New content for each first delivery (and the first content for any mode).
        if mode == Mode::DroverFirst || self.digest.is_empty() {
            self.renew(self.args.size_mb * 1_000_000);
        }
        let load = load1();
        let cpu = machine_cpu();
        let seconds = match mode {
            Mode::Scp => self.scp(&logs, &stem, false),
            Mode::ScpSync => self.scp(&logs, &stem, true),
            Mode::DroverFirst | Mode::DroverSecond => self.drover("site.kdl", &logs, &stem, None),
            Mode::DroverNoop => self.drover("site-small.kdl", &logs, &stem, None),
        };
        let cpu = machine_cpu() - cpu;
        if mode == Mode::DroverFirst {
            self.wait_for_removals(&logs, &stem);
        }
        // A site applied the first time, or new content, steps every host.
        let steps = if mode == Mode::DroverFirst || what == "install" {
            self.n
        } else {
            0
        };
        self.verify(mode, &logs, &stem, steps);
        Sample { seconds, load, cpu }
    }

    /// Waits (untimed) until every host has removed, in the background, the file its last
    /// placement replaced (`<dir>/.drover/<name>.gone.<pid>`), so that the next run of any mode
    /// does not share the disk with those removals; the wait goes to the logs.
    fn wait_for_removals(&self, logs: &Path, stem: &str) {
        let started = Instant::now();
        let private = Path::new(DROVER_TO)
            .parent()
            .unwrap()
            .join(".drover")
            .display()
            .to_string();
        // A directory that cannot be read counts as still removing (it exists after a
        // delivery), so that an error never reads as "done".
        let removing = |h: &String| match fs::read_dir(
            self.fleet
                .host_root(h)
                .join(private.trim_start_matches('/')),
        ) {
            Ok(entries) => entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains(".gone.")),
            Err(_) => true,
        };
        while self.hosts.iter().any(removing) && started.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let left = self.hosts.iter().filter(|h| removing(h)).count();
        fs::write(
            logs.join(format!("{stem}.removals")),
            format!(
                "background removals ended {:.2} s after the run; hosts still removing: {left}\n",
                started.elapsed().as_secs_f64()
            ),
        )
        .unwrap();
    }

    /// `scp` of the file to every host at once (one process per host, as a script would); with
    /// `sync`, each host's copy then synced to disk (`ssh HOST sync FILE`, a second connection).
    fn scp(&self, logs: &Path, stem: &str, sync: bool) -> f64 {
        let source = self.work.join("big.bin");
        // The previous run's copies go first (untimed), so that only this run's can pass.
        for h in &self.hosts {
            let copy = self.fleet.host_root(h).join(SCP_TO.trim_start_matches('/'));
            let _ = fs::remove_file(copy);
        }
        let started = Instant::now();
        let failed: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .hosts
                .iter()
                .map(|h| {
                    let mut cmd = Command::new("scp");
                    cmd.arg("-q")
                        .arg("-F")
                        .arg(self.fleet.ssh_config())
                        .arg("-o")
                        .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                        .arg(&source)
                        .arg(format!("{h}:{SCP_TO}"))
                        .stdin(Stdio::null());
                    let mut then = self.fleet.ssh_command();
                    then.arg("-o")
                        .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                        .args([h.as_str(), "sync", SCP_TO])
                        .stdin(Stdio::null());
                    s.spawn(move || {
                        let out = cmd.output();
                        match out {
                            Ok(o) if o.status.success() && sync => (h, then.output()),
                            other => (h, other),
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|t| match t.join().unwrap() {
                    (_, Ok(out)) if out.status.success() => None,
                    (h, Ok(out)) => Some(format!("{h}: {}", String::from_utf8_lossy(&out.stderr))),
                    (h, Err(e)) => Some(format!("{h}: {e}")),
                })
                .collect()
        });
        let seconds = started.elapsed().as_secs_f64();
        fs::write(logs.join(format!("{stem}.err")), failed.join("\n")).unwrap();
        self.require(failed.is_empty(), "scp", stem);
        seconds
    }

    /// `deploy apply SITE --yes --json`, its events in the logs; seconds.
    fn drover(&self, site: &str, logs: &Path, stem: &str, memory: Option<&mut Memory>) -> f64 {
        let mut cmd = Command::new(&self.tools.deploy);
        cmd.arg("apply")
            .arg(self.work.join(site))
            .args(["--yes", "--json"])
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(fs::File::create(logs.join(format!("{stem}.ndjson"))).unwrap())
            .stderr(fs::File::create(logs.join(format!("{stem}.err"))).unwrap());
        let started = Instant::now();
        let child = cmd.spawn().expect("run deploy");
        let marker = self.fleet.ssh_config().display().to_string();
        let status = super::wait_sampled(child, &marker, memory).expect("wait for deploy");
        let seconds = started.elapsed().as_secs_f64();
        self.require(status.success(), "deploy apply", stem);
        seconds
    }

    /// Each host holds the file the mode delivered (size and sampled blocks equal to the
    /// source's), and Drover ran `steps` steps: one on every host for new content, none for a
    /// converged site.
    fn verify(&self, mode: Mode, logs: &Path, stem: &str, steps: usize) {
        let (source, to) = match mode {
            Mode::Scp | Mode::ScpSync => (self.work.join("big.bin"), SCP_TO),
            Mode::DroverFirst | Mode::DroverSecond => (self.work.join("big.bin"), DROVER_TO),
            Mode::DroverNoop => (self.work.join("small.bin"), SMALL_TO),
        };
        let mut wrong = Vec::new();
        for h in &self.hosts {
            // The host's /srv is its root's srv/.
            let copy = self.fleet.host_root(h).join(to.trim_start_matches('/'));
            if let Err(e) = same_content(&source, &copy) {
                wrong.push(format!("{h}: {}: {e}", copy.display()));
            }
        }
        if !matches!(mode, Mode::Scp | Mode::ScpSync) {
            let events = fs::read_to_string(logs.join(format!("{stem}.ndjson"))).unwrap();
            let finished = events
                .lines()
                .filter(|l| l.contains("\"step-finished\""))
                .count();
            if finished != steps {
                wrong.push(format!("{finished} steps finished, not {steps}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} ({stem}): {}",
            mode.label(),
            wrong.join("; ")
        );
    }

    /// An untimed first delivery of `bytes` new bytes whose controller memory is sampled.
    fn memory(&mut self, bytes: u64) -> Memory {
        self.renew(bytes);
        let logs = self.args.out.join("logs");
        let stem = format!("n{}-artifact-memory-{bytes}", self.n);
        let mut m = Memory::default();
        self.drover("site.kdl", &logs, &stem, Some(&mut m));
        self.verify(Mode::DroverFirst, &logs, &stem, self.n);
        m
    }

    fn require(&self, ok: bool, what: &str, stem: &str) {
        super::tool::require(ok, what, &self.args.out.join("logs"), stem);
    }
}

/// Writes `bytes` pseudo-random bytes (splitmix64 from `seed`) to `path`; their sha256.
fn write_content(path: &Path, bytes: u64, seed: u64) -> String {
    use sha2::{Digest as _, Sha256};
    let mut file = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(path).unwrap());
    let mut hasher = Sha256::new();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n]).unwrap();
        hasher.update(&block[..n]);
        left -= n as u64;
    }
    file.flush().unwrap();
    drover::secrets::hex(&hasher.finalize())
}

/// Whether `copy` has `source`'s size and, at [`CHECKED_BLOCKS`] places spread over it, the
/// same bytes (a different seed differs in every block).
fn same_content(source: &Path, copy: &Path) -> Result<(), String> {
    let size = fs::metadata(source).map_err(|e| e.to_string())?.len();
    let got = fs::metadata(copy).map_err(|e| e.to_string())?.len();
    if got != size {
        return Err(format!("{got} bytes, not {size}"));
    }
    let (mut a, mut b) = (
        fs::File::open(source).map_err(|e| e.to_string())?,
        fs::File::open(copy).map_err(|e| e.to_string())?,
    );
    let (mut x, mut y) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    for i in 0..CHECKED_BLOCKS {
        let at = (size.saturating_sub(BLOCK as u64)) * i / (CHECKED_BLOCKS - 1);
        let len = (size - at).min(BLOCK as u64) as usize;
        for (f, buf) in [(&mut a, &mut x), (&mut b, &mut y)] {
            f.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
            f.read_exact(&mut buf[..len]).map_err(|e| e.to_string())?;
        }
        if x[..len] != y[..len] {
            return Err(format!("differs at byte {at}"));
        }
    }
    Ok(())
}

fn render(args: &Args, machine: &Machine, results: &[Size]) -> String {
    let mut out = String::new();
    let loads: Vec<f64> = results
        .iter()
        .flat_map(|r| r.1.iter().flat_map(|m| m.1.iter().map(|s| s.load)))
        .collect();
    let bytes = args.size_mb * 1_000_000;
    writeln!(out, "### Artifacts: results of {}\n", machine.date).unwrap();
    writeln!(out, "- command: `{}`", args.command).unwrap();
    writeln!(
        out,
        "- workload: one plain `file` of {} MB (pseudo-random, new content for each first \
         delivery) to every host, `batch \"100%\"`; `scp` copies the same file to the same \
         hosts, one process per host, all at once",
        args.size_mb
    )
    .unwrap();
    super::tool::environment(&mut out, args, machine, &loads);
    writeln!(
        out,
        "- versions: {} (tree: {}); {}",
        machine.deploy, machine.tree, machine.openssh
    )
    .unwrap();
    writeln!(
        out,
        "- {} timed run(s) of each, interleaved; wall clock; median (min to max); machine CPU \
         is every process's, controller and hosts\n",
        args.runs
    )
    .unwrap();
    writeln!(
        out,
        "| hosts | mode | seconds | throughput | machine CPU |\n| --- | --- | --- | --- | --- |"
    )
    .unwrap();
    let med = |n: usize, mode: Mode| -> Option<f64> {
        let r = results.iter().find(|r| r.0 == n)?;
        let s = &r.1.iter().find(|m| m.0 == mode)?.1;
        (!s.is_empty()).then(|| median(s.iter().map(|s| s.seconds)))
    };
    for (n, samples, _) in results {
        for (mode, s) in samples {
            if s.is_empty() {
                continue;
            }
            let v: Vec<f64> = s.iter().map(|s| s.seconds).collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            let m = median(&v);
            let throughput = match mode {
                Mode::Scp | Mode::ScpSync | Mode::DroverFirst => {
                    format!("{:.0} MB/s", *n as f64 * bytes as f64 / 1e6 / m)
                }
                _ => String::new(),
            };
            writeln!(
                out,
                "| {n} | {} | {m:.2} s ({lo:.2} to {hi:.2}) | {throughput} | {:.1} s |",
                mode.label(),
                median(s.iter().map(|s| s.cpu))
            )
            .unwrap();
        }
    }
    writeln!(
        out,
        "\n| hosts | target | ratio | |\n| --- | --- | --- | --- |"
    )
    .unwrap();
    for (n, _, memory) in results {
        let n = *n;
        if let (Some(scp), Some(first)) = (med(n, Mode::Scp), med(n, Mode::DroverFirst)) {
            let r = scp / first;
            writeln!(
                out,
                "| {n} | first delivery's throughput ≥ 0.8 × scp's | {r:.3} | {} |",
                if r >= 0.8 { "met" } else { "missed" }
            )
            .unwrap();
        }
        if let (Some(scp), Some(first)) = (med(n, Mode::ScpSync), med(n, Mode::DroverFirst)) {
            writeln!(
                out,
                "| {n} | (not a target) first delivery's throughput ÷ scp's with each copy synced | {:.3} | |",
                scp / first
            )
            .unwrap();
        }
        if let (Some(second), Some(noop)) = (med(n, Mode::DroverSecond), med(n, Mode::DroverNoop)) {
            let r = second / noop;
            writeln!(
                out,
                "| {n} | second apply ≤ 1.1 × a no-op apply | {r:.3} | {} |",
                if r <= 1.1 { "met" } else { "missed" }
            )
            .unwrap();
        }
        if let Some((tenth, full)) = memory {
            let r = full.deploy_hwm as f64 / tenth.deploy_hwm.max(1) as f64;
            writeln!(
                out,
                "| {n} | `deploy`'s peak RSS independent of the size (≤ 1.1 × at a tenth of it): \
                 {:.1} MiB at {} MB, {:.1} MiB at {} MB; with its ssh processes (masters, connections of their own) {:.1} and {:.1} MiB \
                 | {r:.3} | {} |",
                super::mib(tenth.deploy_hwm),
                args.size_mb as f64 / 10.0,
                super::mib(full.deploy_hwm),
                args.size_mb,
                super::mib(tenth.total_rss),
                super::mib(full.total_rss),
                if r <= 1.1 { "met" } else { "missed" }
            )
            .unwrap();
        }
    }
    out
}
