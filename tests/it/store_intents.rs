//! A controller SIGKILLed mid-step, with a real etcd and the sshd fleet: each step's intent
//! (`busy/<host>`) is in etcd before its first command, so a run from another working
//! directory (a fresh copy of the site's files: no journal, no `.drover/unpublished`) reads
//! the host the dead run was changing. At several kill points (a step's `install` hook ended,
//! its `start` ended and its `check` running, on different hosts): `status` from there
//! answers what every host's state file says, `plan` names the host, and `apply` converges.
#![cfg(feature = "etcd")]

use crate::support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

const PREFIX: &str = "/drover-test";
const HOSTS: [&str; 3] = ["app1", "app2", "app3"];

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Writes the site at `version` (its `check` sleeping a second first) into `dir`, on the
/// fleet's platform with the store, policy batch 1.
fn write_site(fleet: &Fleet, etcd: &Etcd, dir: &Path, version: &str) {
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let store = etcd.store_node(PREFIX, "3s");
    let text = text.replacen(
        "platform \"fleet\" {\n",
        &format!("platform \"fleet\" {{\n    {store}\n"),
        1,
    );
    std::fs::write(dir.join("platform.kdl"), text).expect("platform");
    std::fs::write(
        dir.join("policy.kdl"),
        "policy \"default\" { batch 1; max-failed 10; }\n",
    )
    .expect("policy");
    let site = format!(
        r####"site "shared" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{EV}ev stop"#
    install #"{EV}ev install-{version}; mkdir -p /srv/api && printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    start #"{EV}ev start-{version}"#
    check #"{EV}ev checked-{version}; sleep 1"# timeout="5s"
}}
"####
    );
    std::fs::write(dir.join("site.kdl"), site).expect("site");
}

fn deploy_in(dir: &Path, args: &[&str]) -> Output {
    support::cli::deploy_in(dir)
        .args(args)
        .output()
        .expect("run deploy")
}

/// The version `host`'s state file records for api.
fn recorded(fleet: &Fleet, host: &str) -> Option<String> {
    let path = fleet.host_root(host).join("var-lib/drover/state.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["services"]["api"]["version"].as_str().map(str::to_string)
}

fn has_event(fleet: &Fleet, host: &str, what: &str) -> bool {
    support::hooks::events(fleet)
        .iter()
        .any(|e| e.1 == host && e.2 == what)
}

#[test]
fn a_controller_killed_mid_step_leaves_an_intent_every_later_run_reads() {
    let fleet = Fleet::start(
        &HOSTS
            .iter()
            .map(|h| FleetHost::new(h, "app"))
            .collect::<Vec<_>>(),
    );
    let etcd = Etcd::start();
    write_site(&fleet, &etcd, &fleet.dir, "1.0");
    let out = deploy_in(&fleet.dir, &["apply", "site.kdl", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // (version, host, the hook event after which the controller is killed)
    let points = [
        ("2.0", "app2", "checked"),
        ("3.0", "app1", "install"),
        ("4.0", "app3", "checked"),
        ("5.0", "app1", "start"),
    ];
    for (version, host, hook) in points {
        write_site(&fleet, &etcd, &fleet.dir, version);
        let mut run = support::cli::deploy_in(&fleet.dir)
            .args(["apply", "site.kdl", "--yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start deploy");
        let marker = format!("{hook}-{version}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !has_event(&fleet, host, &marker) {
            assert!(Instant::now() < deadline, "{host} never ran {marker}");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(Command::new("kill")
            .args(["-KILL", &run.id().to_string()])
            .status()
            .expect("kill")
            .success());
        let _ = run.wait();

        // Another controller: a directory with only the site's files.
        let other = tempfile::tempdir().expect("other controller");
        write_site(&fleet, &etcd, other.path(), version);
        let out = deploy_in(other.path(), &["status", "site.kdl", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("status JSON: {}", text(&out)));
        for h in HOSTS {
            let said = status["hosts"]
                .as_array()
                .and_then(|hs| hs.iter().find(|x| x["host"] == h))
                .map(|x| x["services"][0]["running"].clone())
                .unwrap_or(serde_json::Value::Null);
            let on_host = recorded(&fleet, h);
            assert_eq!(
                said.as_str(),
                on_host.as_deref(),
                "killed after {marker} on {host}: status says {h} runs {said}, its state file \
                 {on_host:?}\n{}",
                serde_json::to_string_pretty(&status).unwrap_or_default()
            );
        }
        let out = deploy_in(other.path(), &["plan", "site.kdl"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(host),
            "the plan reads and names {host}: {}",
            text(&out)
        );
        let out = deploy_in(other.path(), &["apply", "site.kdl", "--yes"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        for h in HOSTS {
            assert_eq!(recorded(&fleet, h).as_deref(), Some(version), "{h}");
        }
        let out = deploy_in(other.path(), &["status", "site.kdl", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        assert_eq!(status["source"], "store", "{status}");
        let busy = etcd.keys(&format!("{PREFIX}/shared/busy/"));
        assert!(busy.is_empty(), "intents left after converging: {busy:?}");
    }
}
