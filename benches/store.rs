//! `deploy status` from the shared store: 10,000 hosts published to a real etcd (one member,
//! fsync on, Debian's etcd-server), then `deploy status SITE` timed as a whole process: one
//! range read, no SSH. Target (issue 14): under 1 s.
//!
//! `cargo bench --features etcd --bench store` (needs `etcd` on the PATH: Debian's
//! etcd-server). `DROVER_BENCH_HOSTS=N` changes the fleet's size (under `cargo test --benches`
//! the default is 500, a smoke test).

#[path = "../tests/support/etcd.rs"]
mod etcd;
#[path = "common/stats.rs"]
mod stats;

use drover::state::lock::{Holder, Lock};
use drover::state::store::{self, Etcd, Keys, LeaseLock, Store};
use drover::state::{Mark, Outcome, ServiceRecord};
use std::fmt::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RUNS: usize = 5;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("DROVER_BENCH_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 10_000 } else { 500 });
    let etcd = etcd::Etcd::start_durable();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut inventory = String::new();
    for i in 0..n {
        writeln!(
            inventory,
            "        host \"h{i}\" address=\"127.{}.{}.{}\" class=\"app\"",
            1 + i / 65536 % 200,
            i / 256 % 256,
            i % 256
        )
        .unwrap();
    }
    let platform = format!(
        "platform \"p\" {{\n    transport \"local\"\n    {}\n    inventory \"static\" {{\n{inventory}    }}\n}}\n",
        etcd.store_node("/drover", "10s")
    );
    std::fs::write(dir.path().join("platform.kdl"), platform).expect("platform");
    std::fs::write(
        dir.path().join("site.kdl"),
        "site \"big\" { version \"1\"; platform \"platform.kdl\" }\n\
         class \"app\" { service \"api\" }\n\
         service \"api\" { version \"2.0\"; port 8080; start \"true\"; check \"true\" }\n",
    )
    .expect("site");
    let site_path = dir.path().join("site.kdl");

    // Publish every host as an apply would: converged at 2.0, healthy.
    let site = drover::site::load(&site_path).expect("site");
    let hosts = drover::inventory::resolve(&site).expect("hosts");
    let desired = drover::desired::resolve(&site, &hosts, &drover::secrets::Secrets::none())
        .expect("desired");
    let spec = site.platform.store.clone().expect("store");
    let published = Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = Arc::new(Etcd::connect(&spec, "p").await.expect("etcd"));
        let keys = Keys::new(&spec.prefix, &site.name);
        let lock = LeaseLock::new(client.clone(), &keys, spec.lock_ttl);
        let me = Holder::me(&site.name, "bench");
        lock.acquire(&me, false).await.expect("lock");
        let fence = lock.fence().expect("fence");
        let mark = |_: ()| Mark {
            outcome: Outcome::Success,
            at: "2026-11-25T00:00:00Z".into(),
            run: "bench".into(),
            log: ".drover/runs/bench/h/api.log".into(),
            hook: None,
        };
        let mut writes = Vec::new();
        for (h, host) in hosts.hosts.enumerate() {
            let record = ServiceRecord {
                version: "2.0".into(),
                configured: Some(mark(())),
                validated: Some(mark(())),
                inputs: Some(desired.inputs(drover::site::ServiceId::new(0), h)),
                removal: None,
                hooks: None,
            };
            writes.push(store::host_seen(
                &keys,
                &host.name,
                &host.address,
                vec!["app".into()],
                None,
                "bench",
                "2026-11-25T00:00:00Z",
            ));
            let hs = store::HostService {
                service: "api",
                host: &host.name,
                address: format!("{}:8080", host.address),
                record: &record,
            };
            writes.extend(store::recorded(&keys, &hs, "bench", "2026-11-25T00:00:00Z"));
        }
        client.write(&fence, &writes).await.expect("publish");
        lock.release(&me).await.expect("release");
    });
    eprintln!(
        "store: {n} hosts published ({} keys) in {:.1} s",
        n * 4,
        published.elapsed().as_secs_f64()
    );

    let deploy = env!("CARGO_BIN_EXE_deploy");
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let out = Command::new(deploy)
            .arg("status")
            .arg(&site_path)
            .current_dir(dir.path())
            .output()
            .expect("run deploy status");
        let secs = started.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = format!("{n} of {n} host services converged");
        assert!(
            text.contains(&want),
            "{}",
            text.lines().last().unwrap_or("")
        );
        assert!(text.contains("(as the store says)"));
        times.push(secs);
    }
    let (min, med, max) = (
        times.iter().copied().fold(f64::INFINITY, f64::min),
        stats::median(&times),
        times.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "`deploy status` of {n} hosts from etcd: median {med:.3} s (min {min:.3}, max {max:.3}, {RUNS} runs); load {:.2}; target < 1 s: {}",
        stats::load1(),
        if med < 1.0 { "met" } else { "MISSED" }
    );
    let _ = Duration::ZERO;
}
