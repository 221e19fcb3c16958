//! Fencing on a real sshd fleet: a run whose host locks were broken (`deploy apply
//! --break-lock` while it still runs) runs nothing more on those hosts, and the run that broke
//! them ends its hooks there first: two controllers never run hooks on one host at once. Asserted
//! from what the hosts' hooks logged (start and end times, from the host's clock).

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::fleet::{Fleet, FleetHost};

/// Writes the site at `version`: `api` on both hosts at once, whose hooks log their start and
/// end (and an end when killed: a `TERM` trap) in `/var/lib/hooklog`. `install` sleeps
/// `seconds`; `check` passes only once `/var/lib/ready-<version>` exists, tried every 200 ms for
/// a minute: a run at a version never made ready keeps trying checks, hook after hook.
fn site(fleet: &Fleet, version: &str, seconds: u32) -> PathBuf {
    let logged = |hook: &str, body: &str| {
        format!(
            r####"trap 'echo "end $DEPLOY_NEW_VERSION {hook} $(date +%s%N) killed" >> /var/lib/hooklog; exit 143' TERM; echo "start $DEPLOY_NEW_VERSION {hook} $(date +%s%N)" >> /var/lib/hooklog; {body}; r=$?; echo "end $DEPLOY_NEW_VERSION {hook} $(date +%s%N)" >> /var/lib/hooklog; exit $r"####
        )
    };
    let install = logged("install", &format!("sleep {seconds} & wait $!"));
    let check = logged("check", "[ -e /var/lib/ready-$DEPLOY_NEW_VERSION ]");
    let site = format!(
        r####"site "fence" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    install #"{install}"# timeout="60s"
    check #"{check}"# timeout="60s" interval="200ms"
}}
"####
    );
    fleet.write_site(&site, "policy \"p\" { batch 2 }\n")
}

fn deploy(fleet: &Fleet, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deploy"));
    cmd.args(args).current_dir(&fleet.dir).env("NO_COLOR", "1");
    cmd
}

/// `(version, start ns, end ns)` of every hook run `host` logged; a hook still running (or
/// killed without its trap) ends at `u128::MAX`.
fn intervals(fleet: &Fleet, host: &str) -> Vec<(String, u128, u128)> {
    let mut open: Vec<(String, u128)> = Vec::new();
    let mut out = Vec::new();
    for line in fleet.lines(host, "var-lib/hooklog") {
        let parts: Vec<&str> = line.split(' ').collect();
        let (Some(what), Some(version), Some(at)) = (parts.first(), parts.get(1), parts.get(3))
        else {
            continue;
        };
        let at: u128 = at.parse().expect("a time");
        match *what {
            "start" => open.push((version.to_string(), at)),
            "end" => {
                if let Some(i) = open.iter().position(|(v, _)| v == version) {
                    let (v, start) = open.remove(i);
                    out.push((v, start, at));
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|(v, s)| (v, s, u128::MAX)));
    out
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_run_whose_locks_were_broken_runs_no_hook_beside_the_run_that_broke_them() {
    let fleet = Fleet::start(&[FleetHost::new("h1", "app"), FleetHost::new("h2", "app")]);
    fleet.write_platform("/var/lib/drover");
    let count = |host: &str, needle: &str| {
        fleet
            .lines(host, "var-lib/hooklog")
            .iter()
            .filter(|l| l.starts_with(needle))
            .count()
    };

    // A: 1.0 on both hosts at once, never made ready: it keeps trying its checks, each a
    // new hook on the host (a hook may be running when its lock is broken, or not).
    let site_1 = site(&fleet, "1.0", 1);
    let site_1 = site_1.to_str().expect("utf-8").to_string();
    let a = deploy(&fleet, &["apply", &site_1, "--yes"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start A");
    wait_for("A's checks on both hosts", || {
        count("h1", "start 1.0 check") >= 3 && count("h2", "start 1.0 check") >= 3
    });

    // B, while A tries its checks: 2.0, made ready by its install, breaking A's locks.
    for host in ["h1", "h2"] {
        std::fs::write(fleet.host_root(host).join("var-lib/ready-2.0"), "").expect("ready");
    }
    let site_2 = site(&fleet, "2.0", 1);
    let b = deploy(
        &fleet,
        &[
            "apply",
            site_2.to_str().expect("utf-8"),
            "--yes",
            "--break-lock",
        ],
    )
    .output()
    .expect("run B");
    assert_eq!(b.status.code(), Some(0), "B converges:\n{}", text(&b));
    // A's checks would go on for a minute: it must stop at once, refused by the hosts.
    let a = a.wait_with_output().expect("A ends");
    assert_ne!(a.status.code(), Some(0), "A cannot converge:\n{}", text(&a));

    for host in ["h1", "h2"] {
        let runs = intervals(&fleet, host);
        assert!(
            runs.iter().all(|(_, _, end)| *end != u128::MAX),
            "{host}: a hook never ended: {runs:?}"
        );
        // B's first hook there starts once it holds the host: no hook of A's starts after
        // it, and none runs beside any of B's.
        let b_first = runs
            .iter()
            .filter(|r| r.0 == "2.0")
            .map(|r| r.1)
            .min()
            .expect("B ran hooks");
        for (v1, s1, e1) in runs.iter().filter(|r| r.0 == "1.0") {
            assert!(
                *s1 < b_first,
                "{host}: A started a hook after B held the host: {runs:?}"
            );
            for (v2, s2, e2) in runs.iter().filter(|r| r.0 == "2.0") {
                assert!(
                    e1 <= s2 || e2 <= s1,
                    "{host}: A's {v1} hook ({s1}..{e1}) ran beside B's {v2} ({s2}..{e2})"
                );
            }
        }
        let state =
            std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
                .expect("state");
        let state: serde_json::Value = serde_json::from_str(&state).expect("json");
        assert_eq!(
            state["services"]["api"]["version"], "2.0",
            "{host}: B's record stands"
        );
        assert_eq!(
            state["services"]["api"]["validated"]["outcome"], "success",
            "{host}: B's record stands, not A's failure"
        );
    }
    let broke = text(&b);
    assert!(
        broke.contains("--break-lock: broke the lock of"),
        "B says whose lock it broke:\n{broke}"
    );
    let said = text(&a);
    assert!(said.contains("fenced"), "A says why it stopped:\n{said}");
}
