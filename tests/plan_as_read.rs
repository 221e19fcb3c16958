//! Services planned as their hosts are read: `deploy apply --yes` under `--max-connections`
//! reads the hosts the first service is planned from (and the first host by name) before the
//! run, starts it, and locks and reads the other hosts as the run goes, planning each service
//! once every host it is planned from is read. On a real sshd fleet of three tiers (db → api
//! → web), where web's host takes two seconds to log in to: db switches while web's host is
//! still being read, every host is connected once, and the run converges as one that read
//! every host first would; a host whose lock another run holds stops the run there, what ran
//! recorded (and `--break-lock` reads every host first, to break it there); a host that does
//! not answer is left alone.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use support::fleet::{Fleet, FleetHost};

/// d1, d2 run `db`; a1, a2 `api` (needs db); w1 `web` (needs api). root on w1 logs in through
/// a shell that waits two seconds first: its read ends well after db's hosts are read.
fn fleet(slow: &Path) -> Fleet {
    std::fs::write(slow, "#!/bin/sh\nsleep 2\nexec /bin/sh \"$@\"\n").expect("write shell");
    let mut perms = std::fs::metadata(slow).expect("shell").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(slow, perms).expect("chmod");
    let hosts = [
        FleetHost::new("d1", "db"),
        FleetHost::new("d2", "db"),
        FleetHost::new("a1", "app"),
        FleetHost::new("a2", "app"),
        FleetHost::new("w1", "web").login_shell(slow.to_str().expect("utf-8")),
    ];
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// Writes site.kdl at `version` (every service; batch 1); returns its path. Each hook
/// appends `<service> <hook> <old> <new>` to the host's /var/lib/hooks.
fn site(fleet: &Fleet, version: &str) -> PathBuf {
    let service = |name: &str, needs: &str| {
        let hook = |hook: &str| {
            format!(
                "    {hook} #\"echo \"{name} {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION\" >> /var/lib/hooks\"#\n"
            )
        };
        format!(
            "service \"{name}\" {{\n{needs}{}{}{}}}\n",
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
    assert!(
        stderr.contains("web: planned once its hosts were read, 1 step in 1 wave"),
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
    // Planned as a whole plan would be: api waits for db, web for api.
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
