//! Planning a big site: 100,000 hosts, 1,000 services (100 classes × 10 services), written
//! flat in one file and again from 10 templates with the services in 50 included files.
//!
//! `cargo bench --bench plan` generates the site, its platform (a static inventory with zone
//! tags) and its policies into a temporary directory, then measures, as the median of three
//! runs each: the bare KDL parse of every file, `site::load`, `inventory::resolve`,
//! `desired::resolve` (a template on one service of each class: every host renders it once),
//! `plan::plan`, and the whole `deploy plan --offline SITE > /dev/null` as a child process
//! (with its peak RSS when `/usr/bin/time` is there); then `site::load` and `deploy plan
//! --offline` of the templated layout, which must plan the same site within the same bounds.
//!
//! `DROVER_BENCH_HOSTS=2000` scales the inventory down (a smoke test for CI; also the default
//! under `cargo test --benches`);
//! `DROVER_BENCH_DIR=DIR` writes the files to DIR and keeps them, and with
//! `DROVER_BENCH_GENERATE_ONLY=1` nothing is measured (for profiling `deploy` by hand).

use drover::plan::{self, Selection};
use drover::state::Observed;
use drover::{inventory, site};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLASSES: usize = 100;
const SERVICES_PER_CLASS: usize = 10;
const DEFAULT_HOSTS: usize = 100_000;
/// The default when run as a test (`cargo test --benches`) rather than by `cargo bench`.
const SMOKE_HOSTS: usize = 2_000;
const ZONES: usize = 4;
const RUNS: usize = 3;
/// The templated layout spreads the services over this many included files.
const INCLUDED_FILES: usize = 50;

const POLICIES: [(&str, &str); 4] = [
    (
        "thirty-percent",
        "policy \"thirty-percent\" {\n    batch \"30%\"\n    max-failed \"10%\"\n    pause \"0s\"\n    on-failure \"rollback\"\n}\n",
    ),
    (
        "canary-zones",
        "policy \"canary-zones\" {\n    canary 2\n    batch \"10%\"\n    max-failed 5\n    spread \"zone\"\n    on-failure \"rollback\"\n}\n",
    ),
    (
        "fifty-at-a-time",
        "policy \"fifty-at-a-time\" {\n    batch 50\n    max-failed \"1%\"\n    on-failure \"continue\"\n}\n",
    ),
    (
        "one-zone-at-a-time",
        "policy \"one-zone-at-a-time\" {\n    batch \"100%\"\n    spread \"zone\"\n    max-failed 0\n    on-failure \"stop\"\n}\n",
    ),
];

/// The template every host renders: its own facts and a line per needed pool.
const TEMPLATE: &str = "# {{ service }} {{ version }} on {{ host }} ({{ address }}, zone {{ tags.zone }})\n{% for name, pool in needs|items %}{% if pool %}{{ name }}: {{ pool|length }} hosts, first {{ pool[0].host }} {{ pool[0].address }}:{{ pool[0].port }}\n{% endif %}{% endfor %}";

/// The files of the generated site.
struct Generated {
    site: PathBuf,
    /// The same site from templates and included files.
    templated: PathBuf,
    files: Vec<PathBuf>,
    platform_bytes: usize,
}

fn class_name(c: usize) -> String {
    format!("c{c:03}")
}

fn service_name(c: usize, k: usize) -> String {
    format!("c{c:03}-s{k}")
}

/// Writes the site, platform and policies under `dir`.
fn generate(dir: &Path, hosts: usize) -> Generated {
    let classes = CLASSES.min(hosts).max(1);
    std::fs::create_dir_all(dir.join("sites")).unwrap();
    std::fs::create_dir_all(dir.join("platforms")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    let mut files = Vec::new();

    for (name, text) in POLICIES {
        let path = dir.join(format!("policies/{name}.kdl"));
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }

    let mut s = String::new();
    s.push_str("site \"big\" {\n    version \"2026.11.2\"\n    platform \"../platforms/big.kdl\"\n    policy \"../policies/thirty-percent.kdl\"\n}\n\n");
    for c in 0..classes {
        let _ = write!(s, "class \"{}\" {{", class_name(c));
        for k in 0..SERVICES_PER_CLASS {
            let _ = write!(s, " service \"{}\";", service_name(c, k));
        }
        s.push_str(" }\n");
    }
    for c in 0..classes {
        for k in 0..SERVICES_PER_CLASS {
            let _ = writeln!(s, "\nservice \"{}\" {{", service_name(c, k));
            s.push_str(&service_own(c, k, classes));
            s.push_str(&service_kind(
                k,
                &service_name(c, k),
                "../templates/hosts.j2",
            ));
            s.push_str("}\n");
        }
    }
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    let template = dir.join("templates/hosts.j2");
    std::fs::write(&template, TEMPLATE).unwrap();
    let site = dir.join("sites/big.kdl");
    std::fs::write(&site, &s).unwrap();
    files.insert(0, site.clone());
    let templated = templated(dir, classes);

    let mut p = String::with_capacity(hosts * 72 + 200);
    p.push_str("platform \"big\" {\n    transport \"ssh\" user=\"root\"\n    state-dir \"/var/lib/drover\"\n    inventory \"static\" {\n");
    let per_class = hosts / classes;
    for c in 0..classes {
        let count = per_class + usize::from(c < hosts % classes);
        for i in 0..count {
            let _ = writeln!(
                p,
                "        host \"{}-h{}\" address=\"10.{}.{}.{}\" class=\"{}\" zone=\"z{}\"",
                class_name(c),
                i + 1,
                c % 256,
                i / 256,
                i % 256,
                class_name(c),
                (i * 7 + c) % ZONES
            );
        }
    }
    p.push_str("    }\n}\n");
    let platform = dir.join("platforms/big.kdl");
    std::fs::write(&platform, &p).unwrap();
    files.insert(1, platform);
    Generated {
        site,
        templated,
        files,
        platform_bytes: p.len(),
    }
}

/// A service's own nodes: version, port, needs and policy.
fn service_own(c: usize, k: usize, classes: usize) -> String {
    let mut s = String::new();
    if (c + k).is_multiple_of(7) {
        let _ = writeln!(s, "    version \"{}.{}\"", 1 + c % 5, k);
    }
    let _ = writeln!(s, "    port {}", 10_000 + c * SERVICES_PER_CLASS + k);
    // A chain inside the class: every host orders up to 9 same-host steps.
    if k > 0 {
        let _ = writeln!(s, "    needs \"{}\"", service_name(c, k - 1));
    }
    if k > 2 && k.is_multiple_of(3) {
        let _ = writeln!(s, "    needs \"{}\"", service_name(c, k - 3));
    }
    // Across classes: a deep DAG, 100 classes long.
    if c > 0 {
        let _ = writeln!(
            s,
            "    needs \"{}\" healthy=\"50%\"",
            service_name(c - 1, k)
        );
    }
    if c > 3 && k.is_multiple_of(4) {
        let _ = writeln!(s, "    needs \"{}\" healthy=1", service_name(c - 4, 9 - k));
    }
    // Data dependencies, some pointing forward (data cycles are fine).
    if k.is_multiple_of(2) {
        let _ = writeln!(
            s,
            "    needs \"{}\" addressable=\"all\"",
            service_name((c + 1) % classes, k)
        );
    }
    match (c + k) % 5 {
        1 => s.push_str("    policy \"../policies/canary-zones.kdl\"\n"),
        2 => s.push_str("    policy \"../policies/fifty-at-a-time.kdl\"\n"),
        3 => s.push_str("    policy \"../policies/one-zone-at-a-time.kdl\"\n"),
        _ => {}
    }
    s
}

/// The nodes every service of kind `k` shares: its hooks, and for kind 0 a template file
/// (`hosts`: its path from the file written in). `name`: the service's name, or
/// `$DEPLOY_SERVICE` in a template.
fn service_kind(k: usize, name: &str, hosts: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "    install \"/opt/{name}/fetch \\\"$DEPLOY_NEW_VERSION\\\"\" timeout=\"5m\""
    );
    // One service of every class renders a template on each of its hosts: every one of
    // the fleet's hosts renders it once.
    if k == 0 {
        let _ = writeln!(
            s,
            "    file \"{hosts}\" to=\"/etc/app/hosts.conf\" template=#true"
        );
    }
    let _ = writeln!(s, "    stop \"systemctl stop {name}\"");
    let _ = writeln!(s, "    start \"systemctl start {name}\"");
    let _ = writeln!(
        s,
        "    check \"curl -fsS http://$DEPLOY_ADDRESS:$DEPLOY_PORT/health\" timeout=\"20s\" interval=\"1s\""
    );
    s
}

/// The same services as `sites/big.kdl`, from 10 templates (one per kind) in
/// `sites/templates/kinds.kdl`, the services spread over 50 included files
/// (`sites/services/part-NN.kdl`); returns `sites/templated.kdl`.
fn templated(dir: &Path, classes: usize) -> PathBuf {
    std::fs::create_dir_all(dir.join("sites/templates")).unwrap();
    std::fs::create_dir_all(dir.join("sites/services")).unwrap();
    let mut t = String::new();
    for k in 0..SERVICES_PER_CLASS {
        let _ = writeln!(t, "template \"kind-{k}\" {{");
        t.push_str(&service_kind(
            k,
            "$DEPLOY_SERVICE",
            "../../templates/hosts.j2",
        ));
        t.push_str("}\n");
    }
    std::fs::write(dir.join("sites/templates/kinds.kdl"), t).unwrap();
    let parts = INCLUDED_FILES.min(classes);
    let mut texts = vec![String::new(); parts];
    for c in 0..classes {
        let s = &mut texts[c * parts / classes];
        let _ = write!(s, "class \"{}\" {{", class_name(c));
        for k in 0..SERVICES_PER_CLASS {
            let _ = write!(s, " service \"{}\";", service_name(c, k));
        }
        s.push_str(" }\n");
        for k in 0..SERVICES_PER_CLASS {
            let _ = writeln!(
                s,
                "service \"{}\" template=\"kind-{k}\" {{",
                service_name(c, k)
            );
            // Paths in an included file are relative to it.
            s.push_str(&service_own(c, k, classes).replace("\"../policies/", "\"../../policies/"));
            s.push_str("}\n");
        }
    }
    for (i, text) in texts.iter().enumerate() {
        std::fs::write(dir.join(format!("sites/services/part-{i:02}.kdl")), text).unwrap();
    }
    let site = dir.join("sites/templated.kdl");
    std::fs::write(
        &site,
        "site \"big\" {\n    version \"2026.11.2\"\n    platform \"../platforms/big.kdl\"\n    policy \"../policies/thirty-percent.kdl\"\n}\n\ninclude \"templates/*.kdl\"\ninclude \"services/*.kdl\"\n",
    )
    .unwrap();
    site
}

/// One run of a stage: wall-clock time, and CPU time (user + system) when it can be read.
#[derive(Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Option<Duration>,
}

/// Every run of each stage.
#[derive(Default)]
struct Timings {
    parse: Vec<Run>,
    load: Vec<Run>,
    resolve: Vec<Run>,
    desired: Vec<Run>,
    plan: Vec<Run>,
    text: Vec<Run>,
    whole: Vec<Run>,
    /// `site::load` and `deploy plan --offline` of the templated layout.
    load_templated: Vec<Run>,
    whole_templated: Vec<Run>,
}

/// CPU time of the calling thread so far (user + system), from the scheduler's statistics.
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Runs `f`, adding how long it took to `runs`; dropping its result is not measured.
fn time<T>(runs: &mut Vec<Run>, f: impl FnOnce() -> T) -> T {
    let (cpu, start) = (thread_cpu(), Instant::now());
    let out = f();
    let wall = start.elapsed();
    let cpu = thread_cpu().zip(cpu).map(|(end, start)| end - start);
    runs.push(Run { wall, cpu });
    out
}

/// A stage's median wall time, median CPU time, and every wall time, for the table.
struct Summary {
    wall: Duration,
    cpu: Option<Duration>,
    runs: String,
}

fn summary(runs: &[Run]) -> Summary {
    let mid = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let cpus: Option<Vec<Duration>> = runs.iter().map(|r| r.cpu).collect();
    Summary {
        wall: mid(runs.iter().map(|r| r.wall).collect()),
        cpu: cpus.map(mid),
        runs: runs
            .iter()
            .map(|r| format!("{:.3}", r.wall.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" / "),
    }
}

/// Runs `deploy plan --offline SITE > /dev/null` once: its times and peak RSS in KiB.
fn deploy_once(deploy: &Path, site: &Path, report: &Path) -> (Run, Option<u64>) {
    let timed = Path::new("/usr/bin/time").exists();
    let mut cmd = if timed {
        let mut c = Command::new("/usr/bin/time");
        c.arg("-f")
            .arg("%U %S %M")
            .arg("-o")
            .arg(report)
            .arg(deploy);
        c
    } else {
        Command::new(deploy)
    };
    cmd.args(["plan", "--offline"])
        .arg(site)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let start = Instant::now();
    let status = cmd.status().expect("deploy runs");
    let wall = start.elapsed();
    assert!(status.success(), "deploy plan failed: {status}");
    // GNU time: "user system maxrss" on the last line (after any message of its own).
    let fields: Vec<String> = timed
        .then(|| std::fs::read_to_string(report).ok())
        .flatten()
        .and_then(|t| t.lines().last().map(str::to_string))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    let cpu = num(0)
        .zip(num(1))
        .map(|(u, s)| Duration::from_secs_f64(u + s));
    let rss = num(2).map(|kib| kib as u64);
    (Run { wall, cpu }, rss)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --benches` this is a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    let hosts: usize = std::env::var("DROVER_BENCH_HOSTS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(if benching { DEFAULT_HOSTS } else { SMOKE_HOSTS })
        .max(1);
    // `DROVER_BENCH_DIR`: generate there and keep the files (for profiling `deploy` by hand).
    let (_temp, dir) = match std::env::var_os("DROVER_BENCH_DIR") {
        Some(d) => (None, PathBuf::from(d)),
        None => {
            let t = tempfile::tempdir().expect("temp dir");
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
    let start = Instant::now();
    let g = generate(&dir, hosts);
    let total_bytes: u64 = g
        .files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    println!(
        "generated {hosts} hosts, {} services in {} ({} files, {:.1} MB, platform {:.1} MB) in {}",
        CLASSES.min(hosts) * SERVICES_PER_CLASS,
        dir.display(),
        g.files.len(),
        total_bytes as f64 / 1e6,
        g.platform_bytes as f64 / 1e6,
        secs(start.elapsed())
    );
    if std::env::var_os("DROVER_BENCH_GENERATE_ONLY").is_some() {
        return;
    }

    let texts: Vec<String> = g
        .files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let deploy = PathBuf::from(env!("CARGO_BIN_EXE_deploy"));
    let rss_file = dir.join("rss.txt");

    // Rounds, each measuring every stage once: a busy machine slows all of them alike.
    let mut t = Timings::default();
    let mut rss = None;
    let mut rss_templated = None;
    let service_count = CLASSES.min(hosts) * SERVICES_PER_CLASS;
    let (mut steps, mut waves, mut text_bytes) = (0, 0, 0);
    for _ in 0..RUNS {
        let docs = time(&mut t.parse, || {
            texts
                .iter()
                .map(|t| kdl::KdlDocument::parse_v2(t).expect("valid KDL"))
                .collect::<Vec<_>>()
        });
        drop(docs);
        let site = time(&mut t.load, || {
            site::load(&g.site).expect("the site checks")
        });
        let hosts = time(&mut t.resolve, || {
            inventory::resolve(&site).expect("inventory resolves")
        });
        let observed = vec![Observed::Fresh; hosts.hosts.len()];
        let desired = time(&mut t.desired, || {
            let secrets = drover::secrets::Secrets::none();
            drover::desired::resolve(&site, &hosts, &secrets).expect("renders")
        });
        let the_plan = time(&mut t.plan, || {
            plan::plan(&site, &hosts, &observed, &desired, &Selection::default()).expect("plans")
        });
        drop(desired);
        let rendered = time(&mut t.text, || drover::report::plan_text(&the_plan));
        steps = the_plan
            .services
            .iter()
            .flat_map(|s| &s.waves)
            .map(|w| w.steps.len())
            .sum();
        waves = the_plan.services.iter().map(|s| s.waves.len()).sum();
        text_bytes = rendered.len();
        drop((rendered, the_plan, observed, hosts, site));

        let (run, kib) = deploy_once(&deploy, &g.site, &rss_file);
        t.whole.push(run);
        rss = rss.max(kib);

        let site = time(&mut t.load_templated, || {
            site::load(&g.templated).expect("the templated site checks")
        });
        assert_eq!(site.services.len(), service_count);
        drop(site);
        let (run, kib) = deploy_once(&deploy, &g.templated, &rss_file);
        t.whole_templated.push(run);
        rss_templated = rss_templated.max(kib);
    }
    let [parse, load, resolve, desired, planning, text, whole, load_t, whole_t] = [
        &t.parse,
        &t.load,
        &t.resolve,
        &t.desired,
        &t.plan,
        &t.text,
        &t.whole,
        &t.load_templated,
        &t.whole_templated,
    ]
    .map(|v| summary(v));

    let cpu_cell = |c: Option<Duration>| c.map_or("n/a".into(), secs);
    let row = |what: &str, s: &Summary| {
        println!(
            "{what:<40} {:>9} {:>9}   {}",
            secs(s.wall),
            cpu_cell(s.cpu),
            s.runs
        );
    };
    println!();
    println!(
        "{:<40} {:>9} {:>9}   wall of each run (s)",
        "stage (median of 3)", "wall", "cpu"
    );
    println!("{:-<40} {:->9} {:->9}   {:-<23}", "", "", "", "");
    row("(a) kdl parse_v2 of every file", &parse);
    row("(b) site::load", &load);
    row("(c) inventory::resolve", &resolve);
    row("    desired::resolve (100,000 renders)", &desired);
    row("(d) plan::plan", &planning);
    let both = Summary {
        wall: desired.wall + planning.wall,
        cpu: desired.cpu.zip(planning.cpu).map(|(a, b)| a + b),
        runs: String::new(),
    };
    row("    desired + plan (target < 2 s)", &both);
    row("    report::plan_text", &text);
    row("(e) deploy plan --offline > /dev/null", &whole);
    let ratio = |a: Option<Duration>, b: Option<Duration>| {
        a.zip(b).map_or("n/a".into(), |(a, b)| {
            format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
        })
    };
    println!(
        "{:<40} {:>9} {:>9}",
        "    (e) / (a) (target ≤ 1.5)",
        ratio(Some(whole.wall), Some(parse.wall)),
        ratio(whole.cpu, parse.cpu)
    );
    println!(
        "{:<40} {:>9}",
        "    peak RSS of (e) (target < 1 GiB)",
        rss.map_or("n/a".into(), |kib| format!(
            "{:.0} MiB",
            kib as f64 / 1024.0
        ))
    );
    let mib = |r: Option<u64>| {
        r.map_or("n/a".into(), |kib| {
            format!("{:.0} MiB", kib as f64 / 1024.0)
        })
    };
    println!();
    println!("the same site from 10 templates, services in {INCLUDED_FILES} included files:");
    row("(b') site::load", &load_t);
    row("(e') deploy plan --offline > /dev/null", &whole_t);
    println!(
        "{:<40} {:>9} {:>9}",
        "    (b') / (b)",
        ratio(Some(load_t.wall), Some(load.wall)),
        ratio(load_t.cpu, load.cpu)
    );
    println!(
        "{:<40} {:>9} {:>9}",
        "    (e') / (e)",
        ratio(Some(whole_t.wall), Some(whole.wall)),
        ratio(whole_t.cpu, whole.cpu)
    );
    println!(
        "{:<40} {:>9} {:>9}",
        "    (e') / (a) (target ≤ 1.5)",
        ratio(Some(whole_t.wall), Some(parse.wall)),
        ratio(whole_t.cpu, parse.cpu)
    );
    println!(
        "{:<40} {:>9}",
        "    peak RSS of (e') (target < 1 GiB)",
        mib(rss_templated)
    );
    println!();
    println!(
        "plan: {steps} steps in {waves} waves; text {:.1} MB",
        text_bytes as f64 / 1e6
    );
}
