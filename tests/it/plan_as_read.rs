//! Services planned as their hosts are read: `deploy apply --yes` under `--max-connections`
//! reads the hosts the first service is planned from (and the first host by name) before the
//! run, starts it, and locks and reads the other hosts as the run goes, planning each service
//! once every host it is planned from is read, or starting it when its needs hold first, each
//! host stepped once read. On a real sshd fleet of three tiers (db → api → web), where web's
//! host takes two seconds to log in to: db switches while web's host is still being read,
//! every host is connected once, and the run converges as one that read every host first
//! would; a tier starts on its hosts read while another of its hosts
//! still logs in; a host whose lock another run holds stops the run there, what ran
//! recorded (and `--break-lock` reads every host first, to break it there); a host that does
//! not answer is left alone.

use crate::support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::fleet::{Fleet, FleetHost};

/// d1, d2 run `db`; a1, a2 `api` (needs db); w1 `web` (needs api). root on w1 logs in through
/// a shell that waits two seconds first: its read ends well after db's hosts are read.
fn fleet(slow: &Path) -> Fleet {
    login_shell(slow, "sleep 2");
    tiers_fleet(("w1", slow))
}

/// Writes an executable login shell at `path` that runs `first`, then `/bin/sh`.
fn login_shell(path: &Path, first: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{first}\nexec /bin/sh \"$@\"\n"))
        .expect("write shell");
    let mut perms = std::fs::metadata(path).expect("shell").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms).expect("chmod");
}

/// The three tiers' fleet, root on `slow.0` logging in through the shell `slow.1`.
fn tiers_fleet(slow: (&str, &Path)) -> Fleet {
    let hosts = [
        ("d1", "db"),
        ("d2", "db"),
        ("a1", "app"),
        ("a2", "app"),
        ("w1", "web"),
    ]
    .map(|(name, class)| {
        let host = FleetHost::new(name, class);
        match name == slow.0 {
            true => host.login_shell(slow.1.to_str().expect("utf-8")),
            false => host,
        }
    });
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// Writes site.kdl at `version` (every service; batch 1); returns its path. Each hook
/// appends `<service> <hook> <old> <new>` to the host's /var/lib/hooks.
fn site(fleet: &Fleet, version: &str) -> PathBuf {
    site_with(fleet, version, "")
}

/// As [`site`], with `extra` (nodes such as `env "MODE" "a"`) in every service.
fn site_with(fleet: &Fleet, version: &str, extra: &str) -> PathBuf {
    let service = |name: &str, needs: &str| {
        let hook = |hook: &str| {
            format!(
                "    {hook} #\"echo \"{name} {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION\" >> /var/lib/hooks\"#\n"
            )
        };
        format!(
            "service \"{name}\" {{\n{needs}{extra}{}{}{}}}\n",
            hook("stop"),
            hook("install"),
            hook("start")
        )
    };
    let text = format!(
        "site \"tiers\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
         class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\nclass \"web\" {{ service \"web\" }}\n{}{}{}",
        service("db", ""),
        service("api", "    needs \"db\"\n"),
        service("web", "    needs \"api\"\n"),
    );
    fleet.write_site(&text, "policy \"default\" { batch 1; max-failed 0 }\n")
}

/// `deploy apply SITE --yes` (with `--json`: the events on stdout): exit code, stdout, stderr.
fn apply(fleet: &Fleet, site: &Path, json: bool) -> (Option<i32>, String, String) {
    let mut cmd = support::cli::deploy_in(&fleet.dir);
    cmd.args(["apply", site.to_str().expect("utf-8"), "--yes"]);
    if json {
        cmd.arg("--json");
    }
    support::cli::outcome(&mut cmd)
}

/// `deploy apply SITE --yes --on SELECTOR`: exit code, stdout, stderr.
fn apply_on(fleet: &Fleet, site: &Path, on: &str) -> (Option<i32>, String, String) {
    let mut cmd = support::cli::deploy_in(&fleet.dir);
    cmd.args(["apply", site.to_str().expect("utf-8"), "--yes", "--on", on]);
    support::cli::outcome(&mut cmd)
}

/// The position of the first event of `kind` about `service` (or `host`).
fn first(events: &[Value], kind: &str, key: &str, value: &str) -> Option<usize> {
    events
        .iter()
        .position(|e| e["event"] == kind && e[key] == value)
}

/// The lines the hooks wrote on `host`.
fn hooks(fleet: &Fleet, host: &str) -> Vec<String> {
    fleet.lines(host, "var-lib/hooks")
}

fn version_on(fleet: &Fleet, host: &str, service: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json")).ok()?;
    let state: Value = serde_json::from_str(&text).ok()?;
    state["services"][service]["version"]
        .as_str()
        .map(str::to_string)
}

#[test]
fn later_tiers_are_read_and_planned_while_the_first_switches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fleet = fleet(&tmp.path().join("slow-sh"));
    let site_1 = site(&fleet, "1.0");

    // A fresh fleet: the plan shown names api and web as planned during the run.
    let before = fleet.logins();
    let (code, stdout, stderr) = apply(&fleet, &site_1, false);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("api → 1.0  (class app: 2 hosts)\n  planned during the run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 hosts not read before the run"),
        "{stdout}"
    );
    // Planned once w1 was read, or (api done before w1's login ended, as it mostly is)
    // started before, its step waiting for the read: either way said, with its one step.
    assert!(
        stderr.contains("web: planned once its hosts were read, 1 step in 1 wave")
            || stderr.contains(
                "web: started before its hosts were all read, 1 step in 1 wave, 0 skipped; \
                 1 step once its host is read"
            ),
        "{stderr}"
    );
    assert_eq!(
        fleet.logins_since(&before),
        vec![1; 5],
        "each host connected once"
    );
    for host in fleet.names() {
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }

    // An upgrade, as events: db's first step starts before web's host is read, web is told
    // the version it ran, and every host ends at 2.0.
    let site_2 = site(&fleet, "2.0");
    let (code, stdout, stderr) = apply(&fleet, &site_2, true);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let db_started = first(&ev, "step-started", "service", "db").expect("db started");
    let web_planned = first(&ev, "service-planned", "service", "web").expect("web planned");
    let api_planned = first(&ev, "service-planned", "service", "api").expect("api planned");
    assert!(
        db_started < web_planned,
        "db switches while web's host is read:\n{stdout}"
    );
    assert_eq!(ev[web_planned]["steps"], 1);
    assert_eq!(ev[api_planned]["steps"], 2);
    // The run's start counted the steps known then: db's.
    assert_eq!(ev[0]["event"], "run-started");
    assert_eq!(ev[0]["steps"], 2, "{stdout}");
    // As a whole plan would run: api after db, web after api; web's step, decided from what
    // w1 was read to run, is an upgrade from 1.0 (below).
    let done = |service: &str| {
        ev.iter()
            .position(|e| e["event"] == "service-finished" && e["service"] == service)
            .expect("finished")
    };
    assert!(done("db") < first(&ev, "step-started", "service", "api").expect("api"));
    assert!(done("api") < first(&ev, "step-started", "service", "web").expect("web"));
    assert_eq!(
        hooks(&fleet, "w1")[2..],
        [
            "web stop 1.0 2.0",
            "web install 1.0 2.0",
            "web start 1.0 2.0"
        ]
    );
    for (host, service) in [
        ("d1", "db"),
        ("d2", "db"),
        ("a1", "api"),
        ("a2", "api"),
        ("w1", "web"),
    ] {
        assert_eq!(
            version_on(&fleet, host, service).as_deref(),
            Some("2.0"),
            "{host}"
        );
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }

    // Nothing to change: said so, and nothing runs.
    let (code, stdout, stderr) = apply(&fleet, &site_2, false);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Nothing to change."), "{stdout}");
    assert_eq!(hooks(&fleet, "w1").len(), 5);
}

#[test]
fn steps_decided_as_hosts_are_read_are_said_with_what_they_do_and_why() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fleet = fleet(&tmp.path().join("slow-sh"));
    let (code, stdout, stderr) = apply(&fleet, &site(&fleet, "1.0"), false);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    // Every service's env changes: db's steps are in the plan shown (its hosts read before
    // the run), api's and web's are decided as their hosts are read, each said as it starts.
    // d2 and a2 took the change already (a run `--on` them): left alone, d2 in the plan shown
    // (read before the run), a2 once read; the closing line counts both as skipped.
    let site_2 = site_with(&fleet, "1.0", "    env \"MODE\" \"b\"\n");
    let (code, stdout, stderr) = apply_on(&fleet, &site_2, "host:d2,host:a2");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let ran_before = ["d2", "a2"].map(|host| hooks(&fleet, host));
    let (code, stdout, stderr) = apply(&fleet, &site_2, false);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        ["d2", "a2"].map(|host| hooks(&fleet, host)),
        ran_before,
        "d2 and a2 left alone"
    );
    assert!(
        stdout.contains("1 step in 1 wave planned now, 1 skipped."),
        "{stdout}"
    );
    assert!(
        stdout.contains("reconfigure 1.0 (env: MODE) by switch-over, no reload hook: d1"),
        "db's steps in the plan shown, with why:\n{stdout}"
    );
    let mut said: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, text)| text))
        .filter(|text| text.ends_with(", decided once read"))
        .collect();
    said.sort_unstable();
    let last = stderr
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, text)| text))
        .find(|text| text.starts_with("run converged"))
        .map(|text| text.rsplit_once(" in ").map_or(text, |(head, _)| head));
    insta::assert_snapshot!(
        "decided-text",
        format!(
            "{}\n{}",
            said.join("\n"),
            last.unwrap_or("(no closing line)")
        )
    );
    // What ran on the hosts: the whole switch-over at 1.0 (no `reload`), each once.
    for host in ["d1", "d2", "a1", "a2", "w1"] {
        let lines = hooks(&fleet, host);
        let tail: Vec<&str> = lines[lines.len() - 3..]
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(
            tail[1].split(' ').nth(1),
            Some("install"),
            "{host}: {lines:?}"
        );
        assert!(tail[1].ends_with(" 1.0 1.0"), "{host}: {lines:?}");
    }

    // The same as events: each step-started says its kind and reasons, `decided` where it was
    // not in the plan shown; the closing event counts the steps by kind, and the hosts left
    // alone (d2 and a2 again), by why.
    let site_3 = site_with(&fleet, "1.0", "    env \"MODE\" \"c\"\n");
    let (code, stdout, stderr) = apply_on(&fleet, &site_3, "host:d2,host:a2");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let (code, stdout, stderr) = apply(&fleet, &site_3, true);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let mut started: Vec<Value> = ev
        .iter()
        .filter(|e| e["event"] == "step-started")
        .map(|e| {
            let mut e = e.clone();
            if let Some(o) = e.as_object_mut() {
                o.remove("time");
            }
            e
        })
        .collect();
    started.sort_by_key(|e| (e["service"].to_string(), e["host"].to_string()));
    let finished = ev.iter().find(|e| e["event"] == "run-finished");
    insta::assert_json_snapshot!(
        "decided-events",
        serde_json::json!({
            "started": started,
            "kinds": finished.map(|e| e["kinds"].clone()),
            "skips": finished.map(|e| e["skips"].clone()),
        })
    );
}

#[test]
fn a_lock_another_run_holds_on_a_later_tier_stops_the_run_there() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fleet = fleet(&tmp.path().join("slow-sh"));
    let site_1 = site(&fleet, "1.0");
    // Another controller's run holds w1.
    let holder = fleet.lock_as_another_run("w1", "tiers");
    let (code, stdout, stderr) = apply(&fleet, &site_1, true);
    assert_eq!(code, Some(1), "not converged:\n{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let refused = first(&ev, "refused", "host", "w1").expect("refused");
    assert!(
        ev[refused]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("locked by ops on elsewhere")),
        "{stdout}"
    );
    // Nothing started after the refusal, web never; what ran is recorded on its host.
    assert!(
        ev[refused..].iter().all(|e| e["event"] != "step-started"),
        "{stdout}"
    );
    assert!(hooks(&fleet, "w1").is_empty());
    for host in ["d1", "d2", "a1", "a2"] {
        let ran = hooks(&fleet, host);
        let service = if host.starts_with('d') { "db" } else { "api" };
        let recorded = version_on(&fleet, host, service);
        assert_eq!(
            recorded.is_some(),
            ran.len() == 2,
            "{host}: its record says what ran ({ran:?}, {recorded:?})"
        );
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: this run's lock given back"
        );
    }
    assert_eq!(
        fleet.holder("w1"),
        Some(holder),
        "the other run's lock is untouched"
    );

    // Again, for people: said as it happens and at the end, and the same outcome.
    let (code, stdout, stderr) = apply(&fleet, &site_1, false);
    assert_eq!(code, Some(1), "not converged:\n{stdout}\n{stderr}");
    assert!(stderr.contains("REFUSED: w1 cannot be locked"), "{stderr}");
    assert!(
        stderr.contains("refused: w1 could not be locked as it was read during the run"),
        "{stderr}"
    );
    assert!(hooks(&fleet, "w1").is_empty());

    // The other run is known to be dead: `--break-lock` reads every host before the run, so
    // that its lock on w1 is broken there, said, and the run converges.
    let out = support::cli::deploy_in(&fleet.dir)
        .args([
            "apply",
            site_1.to_str().expect("utf-8"),
            "--yes",
            "--break-lock",
        ])
        .output()
        .expect("run deploy");
    let text = support::cli::ok(out);
    assert!(
        text.contains("--break-lock: broke the lock of ops on elsewhere"),
        "{text}"
    );
    assert!(!text.contains("planned during the run"), "{text}");
    assert_eq!(hooks(&fleet, "w1").len(), 2, "w1 installed");
    for host in fleet.names() {
        assert!(!fleet.lock_dir(host).exists(), "{host}: no lock left");
    }
}

#[test]
fn a_host_that_does_not_answer_when_read_is_left_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fleet = fleet(&tmp.path().join("slow-sh"));
    let site_1 = site(&fleet, "1.0");
    fleet.kill_host("a2");
    let (code, stdout, stderr) = apply(&fleet, &site_1, false);
    assert_eq!(code, Some(1), "not converged:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: not locked, since they do not answer: a2"),
        "{stderr}"
    );
    for host in ["d1", "d2", "a1"] {
        assert_eq!(hooks(&fleet, host).len(), 2, "{host} installed:\n{stderr}");
    }
    assert!(hooks(&fleet, "a2").is_empty());
}

#[test]
fn a_tier_whose_needs_hold_steps_its_hosts_read_while_another_still_logs_in() {
    // a2's login waits until the test opens its gate (or 30 s have passed: then the run had
    // waited for a2 to start api at all). a1, first by name, is read before the run.
    let tmp = tempfile::tempdir().expect("tempdir");
    let gate = tmp.path().join("gate");
    let gated = tmp.path().join("gated-sh");
    login_shell(
        &gated,
        &format!(
            "i=0; while [ ! -e '{}' ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
            gate.display()
        ),
    );
    let fleet = tiers_fleet(("a2", &gated));
    let site_1 = site(&fleet, "1.0");
    let fallback = gate.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        if !fallback.exists() {
            let _ = std::fs::write(&fallback, "fallback");
        }
    });
    let err = std::fs::File::create(tmp.path().join("stderr")).expect("stderr file");
    let mut child = support::cli::deploy_in(&fleet.dir)
        .args(["apply", site_1.to_str().expect("utf-8"), "--yes", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(err)
        .spawn()
        .expect("run deploy");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line.expect("read stdout");
        let event: Value = serde_json::from_str(&line).unwrap_or_default();
        let a1_done = event["event"] == "step-finished"
            && event["service"] == "api"
            && event["host"] == "a1"
            && event["ok"] == true;
        if a1_done && !gate.exists() {
            std::fs::write(&gate, "a1 switched").expect("open the gate");
        }
        lines.push(line);
    }
    let status = child.wait().expect("deploy ends");
    let stdout = lines.join("\n");
    let stderr = std::fs::read_to_string(tmp.path().join("stderr")).unwrap_or_default();
    assert_eq!(
        std::fs::read_to_string(&gate).ok().as_deref(),
        Some("a1 switched"),
        "api switched a1 before a2 was read:\n{stdout}\n{stderr}"
    );
    assert!(status.success(), "{stdout}\n{stderr}");
    let ev = support::cli::events(&stdout);
    let api = first(&ev, "service-planned", "service", "api").expect("api said it started");
    assert_eq!(ev[api]["unread"], 1, "a2 was still being read");
    for host in fleet.names() {
        let service = match &host[..1] {
            "d" => "db",
            "a" => "api",
            _ => "web",
        };
        assert_eq!(
            version_on(&fleet, host, service).as_deref(),
            Some("1.0"),
            "{host}"
        );
        assert!(
            !fleet.lock_dir(host).exists(),
            "{host}: its lock given back"
        );
    }
    assert_eq!(
        fleet.logins().iter().sum::<usize>(),
        5,
        "each host connected once"
    );
}
