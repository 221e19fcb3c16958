//! Pull mode at scale (issue 41): `deploy agent --simulate N` (N real agents as threads of one
//! process, each its own etcd connection, watch, leases, state and host directory) rolling the
//! three-tier site (db → api → web at 30 %, the compare harness's tiers: 5 % db, 20 % web, the
//! rest api; each host's work drawn from the same seeded waits with 5 % stragglers, slept by its
//! `start` hook) on a real etcd (one member, fsync on). Timed from `deploy publish` of the new
//! version returning to the last host's state file recording it, against
//! `rollout::ideal_makespan` of `deploy plan`'s plan with the same durations; with etcd's own
//! counters (/metrics) per host-step: revisions, puts, deletes, transactions, ranges, lease
//! grants, its watches and its resident memory, and the errors etcd and the agents logged.
//!
//! `cargo bench --features etcd --bench pull_scale` (needs `etcd` on the PATH: Debian's
//! etcd-server; raise `ulimit -n` above 2 N). `DROVER_BENCH_HOSTS=N` sets the fleet's size
//! (1,000 under `cargo bench`, 20 under `cargo test --benches`, a smoke test). The figures go
//! to stdout as the lines of book/src/appendix-measurements.md's table.

#[path = "../tests/support/etcd.rs"]
mod etcd;
#[path = "../tests/support/intervals.rs"]
mod intervals;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;
#[path = "common/tiers_fleet.rs"]
mod tiers_fleet;

use intervals::most_at_once;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};
use tiers_fleet::{layout, waits};

const PREFIX: &str = "/drover";
const SITE: &str = "tiers";
const TIERS: [&str; 3] = ["db", "api", "web"];
/// The work of the host numbered `i` (its install and ready waits, as the compare harness
/// draws them: the same fleet, host for host).
fn work(i: usize) -> Duration {
    let (install, ready, _) = waits(i);
    Duration::from_millis(install + ready)
}

struct Host {
    name: String,
    tier: &'static str,
    work: Duration,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("DROVER_BENCH_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 1_000 } else { 20 });
    let deploy = PathBuf::from(env!("CARGO_BIN_EXE_deploy"));
    let load_before = stats::load1();
    let etcd = etcd::Etcd::start_durable();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut hosts = Vec::new();
    for (t, count) in layout(n).into_iter().enumerate() {
        for k in 0..count {
            let i = hosts.len();
            hosts.push(Host {
                name: format!("{}{}", TIERS[t], k + 1),
                tier: TIERS[t],
                work: work(i),
            });
        }
    }
    let mut inventory = String::new();
    for (i, h) in hosts.iter().enumerate() {
        writeln!(
            inventory,
            "        host \"{}\" address=\"127.{}.{}.{}\" class=\"{}\"",
            h.name,
            1 + i / 65536 % 200,
            i / 256 % 256,
            i % 256,
            h.tier
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("hosts").join(&h.name)).expect("host directory");
    }
    std::fs::write(
        dir.join("platform.kdl"),
        format!(
            "platform \"lab\" {{\n    transport \"local\" root=\"hosts\"\n    {}\n    inventory \"static\" {{\n{inventory}    }}\n}}\n",
            etcd.store_node(PREFIX, "10s")
        ),
    )
    .expect("platform");
    std::fs::write(
        dir.join("policy.kdl"),
        "policy \"thirty\" {\n    batch \"30%\"\n    max-failed 0\n}\n",
    )
    .expect("policy");
    let site = |version: u32| {
        // Each host's hook sleeps the work its `wait` file says (none: no wait), logging its
        // start and end in the host's directory.
        let hook = r#"w=$(cat wait 2>/dev/null || echo 0); echo \"start $DEPLOY_SERVICE $(date +%s%N)\" >>hook.log; sleep $w; echo \"end $DEPLOY_SERVICE $(date +%s%N)\" >>hook.log"#;
        let mut text = format!(
            "site \"{SITE}\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n"
        );
        for tier in TIERS {
            writeln!(text, "class \"{tier}\" {{ service \"{tier}\"; }}").unwrap();
        }
        text.push_str("service \"db\" {\n    start \"HOOK\"\n}\n");
        text.push_str("service \"api\" {\n    needs \"db\"\n    start \"HOOK\"\n}\n");
        text.push_str(
            "service \"web\" {\n    needs \"api\" healthy=\"50%\"\n    start \"HOOK\"\n}\n",
        );
        std::fs::write(dir.join("site.kdl"), text.replace("HOOK", hook)).expect("site");
    };
    let run = |args: &[&str]| {
        let out = Command::new(&deploy)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run deploy");
        assert!(
            out.status.success(),
            "deploy {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };

    // 1.0 everywhere, no waits (untimed): the agents' first snapshot.
    site(1);
    run(&["publish", "site.kdl"]);
    let log = std::fs::File::create(dir.join("agents.log")).expect("log");
    let started = Instant::now();
    let mut agents = Command::new(&deploy)
        .args(["agent", "--store", &etcd.endpoints(), "--prefix", PREFIX])
        .args(["--site", SITE, "--simulate", &n.to_string(), "--ttl", "10s"])
        .arg("--state-dir")
        .arg(dir.join("agents"))
        .arg("--root")
        .arg(dir.join("hosts"))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the simulated agents");
    let wait_all = |version: &str, limit: Duration| {
        let from = Instant::now();
        loop {
            let left = hosts
                .iter()
                .filter(|h| recorded(dir, h).as_deref() != Some(version))
                .count();
            if left == 0 {
                return;
            }
            if from.elapsed() > limit {
                let _ = Command::new("kill").arg(agents.id().to_string()).status();
                panic!("{left} hosts not at {version} after {limit:?}; see the agents' log");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    wait_all("1", Duration::from_secs(3600));
    let first = started.elapsed();

    // 2: every host's work in its `wait` file, the plan and its ideal (untimed).
    for h in &hosts {
        std::fs::write(
            dir.join("hosts").join(&h.name).join("wait"),
            format!("{:.3}", h.work.as_secs_f64()),
        )
        .expect("wait");
    }
    site(2);
    run(&["plan", "site.kdl", "--out", "plan.json"]);
    let plan: drover::plan::Plan =
        serde_json::from_slice(&std::fs::read(dir.join("plan.json")).expect("plan"))
            .expect("a saved plan");
    let by_name: BTreeMap<&str, Duration> =
        hosts.iter().map(|h| (h.name.as_str(), h.work)).collect();
    let ideal =
        drover::rollout::ideal_makespan(&plan, |_, h| by_name.get(h).copied().unwrap_or_default());
    let before = metrics(&etcd);
    let agents_cpu_before = cpu_seconds(agents.id());
    let hosts_cpu_before = children_cpu_seconds(agents.id());
    let marks: Vec<usize> = hosts.iter().map(|h| intervals(dir, h).len()).collect();
    let publish_started = Instant::now();
    run(&["publish", "site.kdl"]);
    let published = SystemTime::now();
    let publish = publish_started.elapsed();
    wait_all("2", Duration::from_secs(3600));
    let last = hosts
        .iter()
        .filter_map(|h| {
            std::fs::metadata(
                dir.join("hosts")
                    .join(&h.name)
                    .join("var/lib/drover/state.json"),
            )
            .and_then(|m| m.modified())
            .ok()
        })
        .max()
        .expect("state files");
    let wall = last.duration_since(published).unwrap_or_default();
    let after = metrics(&etcd);
    let agents_cpu = cpu_seconds(agents.id()) - agents_cpu_before;
    let hosts_cpu = children_cpu_seconds(agents.id()) - hosts_cpu_before;
    let load_after = stats::load1();
    let _ = Command::new("kill").arg(agents.id().to_string()).status();
    let _ = agents.wait();

    // What the hosts recorded: one step each, never more than a batch of a tier at once.
    let mut by_tier: BTreeMap<&str, Vec<(u128, u128)>> = BTreeMap::new();
    for (h, mark) in hosts.iter().zip(&marks) {
        let ran = intervals(dir, h);
        assert_eq!(ran.len() - mark, 1, "{}: {:?}", h.name, &ran[*mark..]);
        by_tier.entry(h.tier).or_default().extend(&ran[*mark..]);
    }
    let mut most = String::new();
    for (t, count) in layout(n).into_iter().enumerate() {
        let batch = (count * 3 / 10).max(1);
        let at_once = most_at_once(&by_tier[TIERS[t]]);
        assert!(
            at_once <= batch,
            "{}: {at_once} at once, batch {batch}",
            TIERS[t]
        );
        write!(most, "{} {at_once}/{batch} ", TIERS[t]).unwrap();
    }
    // Per tier: its window from the publish, and how long a freed place in the batch stood
    // empty (the k-th start after the first batch against the (k − batch)-th end: the slot's
    // hand-over, from one hook's end to the next host's hook starting).
    let since = published
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut windows = String::new();
    for (t, count) in layout(n).into_iter().enumerate() {
        let batch = (count * 3 / 10).max(1);
        let ran = &by_tier[TIERS[t]];
        let mut starts: Vec<u128> = ran.iter().map(|r| r.0).collect();
        let mut ends: Vec<u128> = ran.iter().map(|r| r.1).collect();
        starts.sort_unstable();
        ends.sort_unstable();
        let mut handover: Vec<f64> = starts
            .iter()
            .skip(batch)
            .zip(&ends)
            .map(|(s, e)| s.saturating_sub(*e) as f64 / 1e6)
            .collect();
        handover.sort_by(f64::total_cmp);
        let q = |p: f64| {
            handover
                .get(((handover.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let at = |ns: u128| ns.saturating_sub(since) as f64 / 1e9;
        write!(
            windows,
            "{} {:.2}→{:.2} s, hand-over {:.0}/{:.0} ms; ",
            TIERS[t],
            at(starts.first().copied().unwrap_or(since)),
            at(ends.last().copied().unwrap_or(since)),
            q(0.5),
            q(0.9),
        )
        .unwrap();
    }
    let agents_log = std::fs::read_to_string(dir.join("agents.log")).unwrap_or_default();
    let agent_errors = agents_log
        .lines()
        .filter(|l| l.contains("error:") || l.contains("warning:"))
        .count();
    let etcd_errors = etcd_log_errors(&etcd);
    let d = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let per = |k: &str| d(k) / n as f64;
    println!(
        "| {n} | {:.2} s | {:.2} s | {:.3} × | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} MiB | {} | {agent_errors} | {etcd_errors} | {:.1}→{:.1} |",
        wall.as_secs_f64(),
        ideal.as_secs_f64(),
        wall.as_secs_f64() / ideal.as_secs_f64(),
        per("revision"),
        per("etcd_mvcc_put_total"),
        per("etcd_mvcc_delete_total"),
        per("txn"),
        per("range"),
        per("grant"),
        after.get("etcd_debugging_mvcc_watcher_total").copied().unwrap_or(0.0),
        after.get("process_resident_memory_bytes").copied().unwrap_or(0.0) / 1048576.0,
        most.trim(),
        load_before,
        load_after,
    );
    println!(
        "(first convergence from no state, agents starting: {:.1} s; publish of 2: {:.2} s; \
         CPU while converging on 2: agents {agents_cpu:.1} s, the hosts' hooks and scripts \
         {hosts_cpu:.1} s, etcd {:.1} s; etcd bytes sent \
         {:.0} MiB)\n(tiers from the publish, hand-over median/p90: {})",
        first.as_secs_f64(),
        publish.as_secs_f64(),
        d("process_cpu_seconds_total"),
        d("etcd_network_client_grpc_sent_bytes_total") / 1048576.0,
        windows.trim_end_matches("; "),
    );
    // `DROVER_BENCH_KEEP=1`: the hosts' directories and the agents' log stay, for a look after.
    if std::env::var_os("DROVER_BENCH_KEEP").is_some() {
        println!("(kept: {})", tmp.keep().display());
    }
}

/// The CPU seconds process `pid` used so far (user and system, its threads included).
fn cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [11, 12])
}

/// The CPU seconds of the children process `pid` waited for so far (the hosts' hooks and the
/// `local` transport's scripts, with what they waited for in turn).
fn children_cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [13, 14])
}

/// Two tick counts of `/proc/<pid>/stat` (numbered after the command's `)`), in seconds.
fn stat_seconds(pid: u32, at: [usize; 2]) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's `)`: state is field 3; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = at
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz.max(1.0)
}

/// The version `h` records for its service, from its own state file.
fn recorded(dir: &Path, h: &Host) -> Option<String> {
    let path = dir
        .join("hosts")
        .join(&h.name)
        .join("var/lib/drover/state.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v["services"][h.tier]["version"]
        .as_str()
        .map(str::to_string)
}

/// `(start, end)` of every hook run on `h`, in nanoseconds.
fn intervals(dir: &Path, h: &Host) -> Vec<(u128, u128)> {
    let log = std::fs::read_to_string(dir.join("hosts").join(&h.name).join("hook.log"))
        .unwrap_or_default();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for line in log.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let at: u128 = parts.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
        match parts.first() {
            Some(&"start") => out.push((at, u128::MAX)),
            Some(&"end") => {
                if let Some(open) = out.iter_mut().rev().find(|(_, e)| *e == u128::MAX) {
                    open.1 = at;
                }
            }
            _ => {}
        }
    }
    out
}

/// etcd's counters from its /metrics (summed over labels), with its revision (`revision`),
/// its gRPC calls by kind (`txn`, `range`, `grant`).
fn metrics(etcd: &etcd::Etcd) -> BTreeMap<String, f64> {
    let addr = etcd.client_addr(0);
    let mut s = std::net::TcpStream::connect(addr).expect("etcd's metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("ask");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics");
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let base = name.split('{').next().unwrap_or(name);
        *out.entry(base.to_string()).or_default() += value;
        if base == "grpc_server_handled_total" {
            for (method, key) in [
                ("grpc_method=\"Txn\"", "txn"),
                ("grpc_method=\"Range\"", "range"),
                ("grpc_method=\"LeaseGrant\"", "grant"),
            ] {
                if name.contains(method) {
                    *out.entry(key.to_string()).or_default() += value;
                }
            }
        }
    }
    let revision = out
        .get("etcd_mvcc_db_total_size_in_bytes")
        .map(|_| current_revision(etcd))
        .unwrap_or(0.0);
    out.insert("revision".into(), revision);
    out
}

/// etcd's current revision (etcdctl's endpoint status).
fn current_revision(etcd: &etcd::Etcd) -> f64 {
    let out = Command::new("etcdctl")
        .args([
            "--endpoints",
            &etcd.endpoints(),
            "endpoint",
            "status",
            "-w",
            "json",
        ])
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v[0]["Status"]["header"]["revision"].as_f64().unwrap_or(0.0)
}

/// The lines etcd logged at level error or above.
fn etcd_log_errors(etcd: &etcd::Etcd) -> usize {
    etcd.log()
        .lines()
        .filter(|l| {
            l.contains("\"level\":\"error\"")
                || l.contains("\"level\":\"panic\"")
                || l.contains("\"level\":\"fatal\"")
        })
        .count()
}
