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

/// Run A (logged in as root) dies while its `install` runs on h1: the hook runs on. Run B
/// logs in as another user (`nobody`, the host's state directory shared with it), takes A's
/// stale lock over and may not end A's hook: it says so, naming the host, the hook's process
/// group and A's run, and leaves h1 alone (no hook of its own there, no record written), the
/// hook running on. Without the report, B said nothing of the hook and went on with h1 as if it
/// had ended: its own hooks ran there beside A's.
#[test]
fn a_hook_the_run_taking_the_lock_may_not_end_leaves_its_host_alone() {
    let fleet = Fleet::start(&[FleetHost::new("h1", "app").nobody_logs_in()]);
    let platform = fleet.write_platform("/var/lib/drover");
    let count = |needle: &str| {
        fleet
            .lines("h1", "var-lib/hooklog")
            .iter()
            .filter(|l| l.starts_with(needle))
            .count()
    };
    let site_1 = site(&fleet, "1.0", 300);
    let mut a = deploy(&fleet, &["apply", site_1.to_str().expect("utf-8"), "--yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start A");
    wait_for("A's install", || count("start 1.0 install") == 1);
    let _ = a.kill();
    let _ = a.wait();
    let group = fleet.ssh("h1", "read -r p _ < /var/lib/drover/hooks/*.pid && echo $p");
    let group = String::from_utf8_lossy(&group.stdout).trim().to_string();
    assert!(
        !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()),
        "{group:?}"
    );
    let hook_runs = || {
        fleet
            .ssh("h1", &format!("kill -0 -- -{group}"))
            .status
            .success()
    };
    assert!(hook_runs(), "A's hook runs on once A is gone");
    // B: nobody, the state directory (and the hooks' log) shared with it.
    assert!(fleet
        .ssh("h1", "chmod -R a+rwX /var/lib/drover && touch /var/lib/hooklog && chmod a+rw /var/lib/hooklog")
        .status
        .success());
    let text_of = std::fs::read_to_string(&platform).expect("platform");
    std::fs::write(
        &platform,
        text_of.replace("user=\"root\"", "user=\"nobody\""),
    )
    .expect("write");
    std::fs::write(fleet.host_root("h1").join("var-lib/ready-2.0"), "").expect("ready");
    let site_2 = site(&fleet, "2.0", 1);
    let b = deploy(&fleet, &["apply", site_2.to_str().expect("utf-8"), "--yes"])
        .output()
        .expect("run B");
    let said = text(&b);
    let still = hook_runs();
    let _ = fleet.ssh("h1", &format!("kill -KILL -- -{group}"));
    assert!(
        said.contains("took over the lock of") && said.contains("its process is gone"),
        "{said}"
    );
    assert!(
        said.contains(&format!("warning: h1: process group {group} of run "))
            && said.contains("could not be ended")
            && said.contains("h1 is left alone in this run")
            && said.contains(&format!("kill -KILL -- -{group}")),
        "B says which hook it could not end, and what to do:\n{said}"
    );
    // Counted with the hosts left alone, and why: the run cannot say the site converged.
    assert!(
        said.contains("skipped, unreachable: h1")
            && said.contains("Left alone, nothing known of what they run:")
            && said.contains(&format!(
                "could not be ended there (process groups {group})"
            )),
        "{said}"
    );
    assert_eq!(b.status.code(), Some(1), "h1 was left alone:\n{said}");
    assert!(still, "A's hook runs on");
    assert_eq!(count("start 2.0"), 0, "B ran no hook on h1:\n{said}");
    assert!(
        !fleet
            .host_root("h1")
            .join("var-lib/drover/state.json")
            .exists(),
        "B wrote no record on h1"
    );
}
