//! `deploy history` and `deploy undo` on the sshd fleet: an upgrade 1.0 → 2.0 that changes a
//! delivered file and an env value, then `undo`: every host is back on 1.0's version, file
//! content and env, as its own files and hook log say; `history` lists the runs; `plan` of the
//! (unchanged) site file shows 2.0 pending again, `status` names the run undone to. With a
//! store, the same from a fresh copy of the site's files (no `.drover/`): the history and the
//! snapshot's contents come from etcd.

use crate::support;
use std::path::Path;
use std::process::Output;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

const HOSTS: [&str; 3] = ["app1", "app2", "app3"];

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn deploy_in(dir: &Path, args: &[&str]) -> Output {
    support::cli::deploy_in(dir)
        .args(args)
        .output()
        .expect("run deploy")
}

fn ok_in(dir: &Path, args: &[&str]) -> String {
    let out = deploy_in(dir, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "deploy {args:?}:\n{}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes the site at `version` into `dir`: `MODE` in its env, `api.conf` delivered to
/// /srv/api/api.conf; its install writes the version and `$MODE` to /srv/api and logs
/// `install-<version>-<mode>`. `store`: the platform's `store` node, if any.
fn write_site(fleet: &Fleet, dir: &Path, version: &str, mode: &str, store: Option<&str>) {
    write_site_batch(fleet, dir, version, mode, store, "\"100%\"");
}

/// As [`write_site`], with the policy's `batch`.
fn write_site_batch(
    fleet: &Fleet,
    dir: &Path,
    version: &str,
    mode: &str,
    store: Option<&str>,
    batch: &str,
) {
    let platform = fleet.write_platform("/var/lib/drover");
    let mut platform_text = std::fs::read_to_string(&platform).expect("platform");
    if let Some(store) = store {
        platform_text = platform_text.replacen(
            "platform \"fleet\" {\n",
            &format!("platform \"fleet\" {{\n    {store}\n"),
            1,
        );
    }
    std::fs::write(dir.join("platform.kdl"), platform_text).expect("platform");
    std::fs::write(
        dir.join("policy.kdl"),
        format!("policy \"all\" {{ batch {batch}; }}\n"),
    )
    .expect("policy");
    std::fs::write(dir.join("api.conf"), format!("conf of {version}\n")).expect("conf");
    std::fs::write(dir.join("token.j2"), "{{ secrets.TOKEN }}\n").expect("template");
    std::fs::write(dir.join("token.secret"), token(version)).expect("secret");
    let site = format!(
        r####"site "history" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    env "MODE" "{mode}"
    secret "TOKEN" file="token.secret"
    file "api.conf" to="/srv/api/api.conf"
    file "token.j2" to="/srv/api/token" template=#true
    stop #"{EV}ev stop"#
    install #"{EV}ev "install-$DEPLOY_NEW_VERSION-$MODE"; mkdir -p /srv/api && printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version && printf %s "$MODE" >/srv/api/mode"#
    start #"{EV}ev start-hook-of-{version}"#
    check #"test -f /srv/api/api.conf && {{ [ ! -e /srv/slow ] || sleep 2; }}"# timeout="5s"
}}
"####
    );
    std::fs::write(dir.join("site.kdl"), site).expect("site");
}

/// The secret's value at `version`: it must never be kept anywhere but in its source and in
/// the file rendered from it on the hosts.
fn token(version: &str) -> String {
    format!("tok3n-{version}-s3cret")
}

/// Files under `root` holding `needle`.
fn grep(root: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => todo.push(p),
                Ok(m) if m.is_file() => {
                    let bytes = std::fs::read(&p).unwrap_or_default();
                    if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                        out.push(p);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Where the value of `version`'s secret is found under the fleet's directory (the hosts'
/// files, the controller's `.drover/`), but for the secret's own source files; waits up to
/// 5 s for the background removals of let-go files.
fn secret_kept(fleet: &Fleet, version: &str) -> Vec<std::path::PathBuf> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let found: Vec<_> = grep(&fleet.dir, &token(version))
            .into_iter()
            .filter(|p| !p.ends_with("token.secret"))
            .collect();
        if found.is_empty() || std::time::Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// What `host` has: its version and mode files (written by the install hook), the delivered
/// file, and the last install and start its hook log names (the start hook's text names the
/// site's version: which hook text ran).
fn on_host(fleet: &Fleet, host: &str) -> (String, String, String, String, String) {
    let srv = fleet.host_root(host).join("srv/api");
    let read = |name: &str| std::fs::read_to_string(srv.join(name)).unwrap_or_default();
    let last = |what: &str| {
        support::hooks::events(fleet)
            .into_iter()
            .filter(|e| e.1 == host && e.2.starts_with(what))
            .map(|e| e.2)
            .next_back()
            .unwrap_or_default()
    };
    (
        read("version"),
        read("mode"),
        read("api.conf"),
        last("install-"),
        last("start-hook-of-"),
    )
}

/// The generations of api.conf `host` keeps, newest first (`.gen.1`, `.gen.2`, …).
fn kept(fleet: &Fleet, host: &str) -> Vec<String> {
    let private = fleet.host_root(host).join("srv/api/.drover");
    (1..10)
        .map_while(|j| std::fs::read_to_string(private.join(format!("api.conf.gen.{j}"))).ok())
        .collect()
}

fn assert_fleet_at(fleet: &Fleet, version: &str, mode: &str) {
    for host in HOSTS {
        assert_eq!(
            on_host(fleet, host),
            (
                version.to_string(),
                mode.to_string(),
                format!("conf of {version}\n"),
                format!("install-{version}-{mode}"),
                format!("start-hook-of-{version}"),
            ),
            "{host}"
        );
    }
}

fn fleet() -> Fleet {
    Fleet::start(
        &HOSTS
            .iter()
            .map(|h| FleetHost::new(h, "app"))
            .collect::<Vec<_>>(),
    )
}

/// `deploy history --json`'s runs.
fn runs(dir: &Path) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&ok_in(dir, &["history", "site.kdl", "--json"])).expect("json");
    json["runs"].as_array().cloned().unwrap_or_default()
}

/// `text` with each run's id, times and who replaced by stable words.
fn redact(text: &str, runs: &[serde_json::Value]) -> String {
    let mut out = text.to_string();
    for (i, r) in runs.iter().enumerate() {
        for (field, word) in [
            ("run", format!("RUN-{}", i + 1)),
            ("started", "TIME".to_string()),
            ("finished", "TIME".to_string()),
            ("who", "USER@MACHINE".to_string()),
            ("site_digest", "DIGEST".to_string()),
        ] {
            if let Some(v) = r[field].as_str() {
                out = out.replace(v, &word);
            }
        }
    }
    out
}

#[test]
fn undo_brings_back_the_version_files_and_env_of_the_run_before() {
    let fleet = fleet();
    let dir = fleet.dir.clone();
    write_site(&fleet, &dir, "1.0", "one", None);
    ok_in(&dir, &["apply", "site.kdl", "--yes"]);
    write_site(&fleet, &dir, "2.0", "two", None);
    ok_in(&dir, &["apply", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "2.0", "two");

    // Nothing to change: not a run of the history.
    ok_in(&dir, &["apply", "site.kdl", "--yes"]);
    assert_eq!(runs(&dir).len(), 2);

    // Each host keeps what the upgrade replaced beside the file (keep-generations 3), but
    // nothing of the file that renders the secret: 1.0's value is in no file anywhere, on the
    // hosts or in the history.
    for host in HOSTS {
        assert_eq!(kept(&fleet, host), ["conf of 1.0\n"], "{host}");
        let rendered = std::fs::read_to_string(fleet.host_root(host).join("srv/api/token"));
        assert_eq!(rendered.ok(), Some(format!("{}\n", token("2.0"))));
    }
    assert_eq!(secret_kept(&fleet, "1.0"), Vec::<std::path::PathBuf>::new());

    ok_in(&dir, &["undo", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "1.0", "one");
    for host in HOSTS {
        assert_eq!(
            kept(&fleet, host),
            ["conf of 2.0\n", "conf of 1.0\n"],
            "{host}"
        );
    }
    let site = std::fs::read_to_string(dir.join("site.kdl")).expect("site");
    assert!(
        site.contains("version \"2.0\""),
        "the site file is left as it is"
    );

    let runs = runs(&dir);
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(runs[2]["undone_to"], runs[0]["run"]);
    let history = ok_in(&dir, &["history", "site.kdl"]);
    insta::assert_snapshot!("history-after-undo", redact(&history, &runs));

    // The site file still says 2.0: the plan has it pending on every host.
    assert_eq!(planned_steps(&dir), pending_upgrade());

    let status = ok_in(&dir, &["status", "site.kdl"]);
    let first = runs[0]["run"].as_str().expect("run");
    assert!(
        status.contains(&format!("undone to run {first}")),
        "{status}"
    );
    let status = ok_in(&dir, &["status", "site.kdl", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    assert_eq!(status["undone"]["to"], runs[0]["run"]);

    // Undoing the undo goes forward again to 2.0; `--to` names a run.
    ok_in(&dir, &["undo", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "2.0", "two");
    ok_in(&dir, &["undo", "site.kdl", "--yes", "--to", first]);
    assert_fleet_at(&fleet, "1.0", "one");
    // Three generations: the one in place and the two it replaced, no more.
    for host in HOSTS {
        assert_eq!(
            kept(&fleet, host),
            ["conf of 2.0\n", "conf of 1.0\n"],
            "{host}"
        );
    }
    let unknown = deploy_in(&dir, &["undo", "site.kdl", "--yes", "--to", "no-such-run"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
}

#[test]
fn an_interrupted_undo_is_carried_through_to_the_same_run_by_the_next() {
    use std::time::{Duration, Instant};
    let fleet = fleet();
    let dir = fleet.dir.clone();
    // One host at a time; each check takes 2 s once /srv/slow is there.
    write_site_batch(&fleet, &dir, "1.0", "one", None, "1");
    ok_in(&dir, &["apply", "site.kdl", "--yes"]);
    write_site_batch(&fleet, &dir, "2.0", "two", None, "1");
    ok_in(&dir, &["apply", "site.kdl", "--yes"]);
    for host in HOSTS {
        std::fs::write(fleet.host_root(host).join("srv/slow"), "").expect("slow");
    }
    let undo = support::cli::deploy_in(&dir)
        .args(["undo", "site.kdl", "--yes"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start deploy undo");
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        if let Some(h) = HOSTS
            .iter()
            .find(|h| on_host(&fleet, h).3 == "install-1.0-one")
        {
            break *h;
        }
        assert!(Instant::now() < deadline, "no host installed 1.0");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Ctrl-C while that host checks: its step ends, nothing new starts.
    assert!(std::process::Command::new("kill")
        .args(["-INT", &undo.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let out = undo.wait_with_output().expect("undo ends");
    assert_eq!(out.status.code(), Some(130));
    for host in HOSTS {
        let want = if host == first { "1.0" } else { "2.0" };
        assert_eq!(
            on_host(&fleet, host).0,
            want,
            "{host}: only {first} was undone"
        );
    }
    let listed = runs(&dir);
    assert_eq!(
        listed.len(),
        3,
        "the interrupted undo changed a host: {listed:?}"
    );
    assert_eq!(listed[2]["result"], "interrupted");
    assert_eq!(listed[2]["undone_to"], listed[0]["run"]);

    // The latest run is an undo that did not converge: the next goes on to the same run
    // (not back to 2.0, the converged run before it).
    for host in HOSTS {
        std::fs::remove_file(fleet.host_root(host).join("srv/slow")).expect("fast");
    }
    ok_in(&dir, &["undo", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "1.0", "one");
    let listed = runs(&dir);
    assert_eq!(listed.len(), 4);
    assert_eq!(listed[3]["result"], "converged");
    assert_eq!(listed[3]["undone_to"], listed[0]["run"]);
}

#[cfg(feature = "etcd")]
#[test]
fn a_fresh_copy_of_the_site_with_a_store_sees_the_history_and_undoes_from_etcd() {
    use crate::support::etcd::Etcd;
    const PREFIX: &str = "/drover-history";
    let fleet = fleet();
    let etcd = Etcd::start();
    // One generation: the hosts keep no file a placement replaced.
    let store = format!("{}\n    keep-generations 1", etcd.store_node(PREFIX, "3s"));
    let first = fleet.dir.join("first");
    std::fs::create_dir_all(&first).expect("first");
    // 1.0 goes out before the platform names the store: its run is kept on this controller
    // only, and the first run that reaches the store writes it there too.
    write_site(&fleet, &first, "1.0", "one", None);
    ok_in(&first, &["apply", "site.kdl", "--yes"]);
    write_site(&fleet, &first, "2.0", "two", Some(&store));
    ok_in(&first, &["apply", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "2.0", "two");

    // A fresh checkout: the site's files, no .drover/.
    let fresh = fleet.dir.join("fresh");
    std::fs::create_dir_all(&fresh).expect("fresh");
    for f in [
        "site.kdl",
        "platform.kdl",
        "policy.kdl",
        "api.conf",
        "token.j2",
        "token.secret",
    ] {
        std::fs::copy(first.join(f), fresh.join(f)).expect("copy");
    }
    assert!(!fresh.join(".drover").exists());
    let listed = runs(&fresh);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed, runs(&first));

    ok_in(&fresh, &["undo", "site.kdl", "--yes"]);
    assert_fleet_at(&fleet, "1.0", "one");
    for host in HOSTS {
        assert!(kept(&fleet, host).is_empty(), "{host}");
    }
    let after = runs(&first);
    assert_eq!(
        after.len(),
        3,
        "the undo is in the store for the first checkout too"
    );
    assert_eq!(after[2]["undone_to"], listed[0]["run"]);

    // Each content in chunks under the site's keys, the entries beside them; the store's
    // state read is not disturbed by them.
    let keys = etcd.keys(&format!("{PREFIX}/history/history/"));
    assert_eq!(
        keys.iter()
            .filter(|(k, _)| k.contains("/history/runs/"))
            .count(),
        3
    );
    assert!(keys.iter().any(|(k, _)| k.contains("/history/blobs/")));
    let status = ok_in(&fresh, &["status", "site.kdl", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    assert_eq!(status["source"], "store");
    assert_eq!(status["undone"]["to"], listed[0]["run"]);
    assert_eq!(planned_steps(&fresh), pending_upgrade());
}

/// `(host, from, to)` of every step `deploy plan site.kdl` plans in `dir`.
fn planned_steps(dir: &Path) -> Vec<(String, String, String)> {
    let plan = ok_in(dir, &["plan", "site.kdl", "--json"]);
    let plan: serde_json::Value = serde_json::from_str(&plan).expect("plan json");
    plan["services"][0]["waves"]
        .as_array()
        .expect("waves")
        .iter()
        .flat_map(|w| w["steps"].as_array().cloned().unwrap_or_default())
        .map(|s| {
            (
                s["host"].as_str().unwrap_or("").to_string(),
                s["from"].as_str().unwrap_or("").to_string(),
                s["to"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// 1.0 → 2.0 on every host: what the site file says, after an undo to 1.0.
fn pending_upgrade() -> Vec<(String, String, String)> {
    HOSTS
        .iter()
        .map(|h| (h.to_string(), "1.0".to_string(), "2.0".to_string()))
        .collect()
}
