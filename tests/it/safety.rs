//! Reliability and safety on a real sshd fleet: hooks that hang, failure budgets, secrets,
//! private logs, unknown host keys and a corrupt state file.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::fleet::{Fleet, FleetHost};

/// Hooks that record what ran in `/var/lib/events` and install a version file in /srv; a host
/// with `/srv/fail-<service>` fails its install.
const HOOKS: &str = r####"
    install #"echo "install $DEPLOY_SERVICE $DEPLOY_NEW_VERSION" >> /var/lib/events; [ ! -e /srv/fail-$DEPLOY_SERVICE ] && printf %s "$DEPLOY_NEW_VERSION" > /srv/$DEPLOY_SERVICE.version"#
    check #"[ "$(cat /srv/$DEPLOY_SERVICE.version)" = "$DEPLOY_NEW_VERSION" ]"# timeout="5s" interval="100ms"
"####;

/// A fleet of `hosts` (name, class) with its platform written.
fn fleet(hosts: &[(&str, &str)]) -> Fleet {
    let specs: Vec<FleetHost> = hosts.iter().map(|(n, c)| FleetHost::new(n, c)).collect();
    let fleet = Fleet::start(&specs);
    fleet.write_platform("/var/lib/drover");
    fleet
}

/// Writes `site.kdl` in the fleet's directory: the site node gets `settings`, then `body`
/// (classes and services); the default policy is `policy`. Returns its path.
fn write_site(fleet: &Fleet, settings: &str, policy: &str, body: &str) -> String {
    std::fs::write(
        fleet.dir.join("policy.kdl"),
        format!("policy \"p\" {{ {policy} }}\n"),
    )
    .unwrap();
    let path = fleet.dir.join("site.kdl");
    std::fs::write(
        &path,
        format!(
            "site \"safety\" {{\n    version \"1.0\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n    {settings}\n}}\n{body}"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn deploy(fleet: &Fleet, args: &[&str]) -> Output {
    deploy_env(fleet, args, &[])
}

fn deploy_env(fleet: &Fleet, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deploy"));
    cmd.args(args)
        .current_dir(&fleet.dir)
        .env("NO_COLOR", "1")
        .env_remove("DROVER_TEST_PASSWORD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run deploy")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Lines of `/var/lib/events` on `host`.
fn events(fleet: &Fleet, host: &str) -> Vec<String> {
    std::fs::read_to_string(fleet.host_root(host).join("var-lib/events"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn host_file(fleet: &Fleet, host: &str, path: &str) -> Option<String> {
    std::fs::read_to_string(fleet.host_root(host).join(path)).ok()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------------
// Hung hooks and failure budgets

#[test]
fn a_hung_hook_is_killed_on_its_host_fails_the_step_and_spends_the_budget() {
    let fleet = fleet(&[("app1", "app"), ("app2", "app"), ("app3", "app")]);
    // On app2 the install starts a child that would outlive it, then hangs.
    let body = r####"class "app" { service "api" }
service "api" {
    install #"echo "install $DEPLOY_HOST" >> /var/lib/events; if [ "$DEPLOY_HOST" = app2 ]; then sleep 300 & echo $! > /srv/child; sleep 301; fi"#
}
"####;
    let site = write_site(&fleet, "hook-timeout \"2s\"", "batch 1; max-failed 0", body);
    let started = std::time::Instant::now();
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the run did not wait for the hook"
    );
    assert!(all.contains("install timed out after 2s"), "{all}");
    assert!(
        all.contains("HALTED"),
        "the failure spent the budget: {all}"
    );
    assert_eq!(events(&fleet, "app1"), ["install app1"]);
    assert_eq!(events(&fleet, "app2"), ["install app2"]);
    assert!(
        events(&fleet, "app3").is_empty(),
        "no wave after the budget"
    );
    // Nothing the hook started is left on app2.
    let ps = fleet.ssh("app2", "ps -e -o args= | grep -c '^sleep 30[01]' || true");
    assert_eq!(
        String::from_utf8_lossy(&ps.stdout).trim(),
        "0",
        "the hook's process group was killed"
    );
    let state = fleet.host_root("app2").join("var-lib/drover/state.json");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    assert_eq!(state["services"]["api"]["configured"]["hook"], "install");
    let hooks_dir = fleet.host_root("app2").join("var-lib/drover/hooks");
    assert!(
        files(&hooks_dir).is_empty(),
        "no pid file is left: {:?}",
        files(&hooks_dir)
    );
}

/// A hook that leaves a process holding its output has not ended, as with a session of its
/// own, though its commands go to the shell kept on the host: it times out (rather than pass
/// and leave that process to die writing to a closed pipe once the run ends).
#[test]
fn a_hook_that_leaves_a_process_holding_its_output_times_out() {
    let fleet = fleet(&[("app1", "app")]);
    let body = r####"class "app" { service "api" }
service "api" {
    install #"echo installed"#
    start #"sleep 300 & echo $! > /srv/child; echo started"#
}
"####;
    let site = write_site(&fleet, "hook-timeout \"2s\"", "batch 1; max-failed 0", body);
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    // Timed out, and killed with its group though the hook's shell had ended.
    assert!(all.contains("start timed out after 2s"), "{all}");
    assert!(!all.contains("could not kill it"), "{all}");
    let ps = fleet.ssh("app1", "ps -e -o args= | grep -c '^sleep 300' || true");
    assert_eq!(
        String::from_utf8_lossy(&ps.stdout).trim(),
        "0",
        "the process the hook left was killed"
    );
    // The same hook with its process's output sent elsewhere passes at once.
    let body = body.replace("sleep 300 &", "sleep 300 >/dev/null 2>&1 &");
    let site = write_site(
        &fleet,
        "hook-timeout \"20s\"",
        "batch 1; max-failed 0",
        &body,
    );
    let started = std::time::Instant::now();
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let _ = fleet.ssh("app1", "kill $(cat /srv/child)");
}

#[test]
fn the_sites_failure_budget_stops_new_waves_of_every_service() {
    let fleet = fleet(&[
        ("db1", "db"),
        ("db2", "db"),
        ("app1", "app"),
        ("app2", "app"),
        ("app3", "app"),
    ]);
    std::fs::write(fleet.host_root("db1").join("srv/fail-db"), "").unwrap();
    // api's hosts take a second, so that db1 has failed before api could open its wave 2.
    let slow = HOOKS.replace("install #\"", "install #\"sleep 1; ");
    let body = format!(
        "class \"db\" {{ service \"db\" }}\nclass \"app\" {{ service \"api\" }}\n\
         service \"db\" {{ {HOOKS} }}\nservice \"api\" {{ {slow} }}\n"
    );
    // Each service alone would carry on (max-failed 5); the run allows no failed host.
    let site = write_site(&fleet, "max-failed 0", "batch 1; max-failed 5", &body);
    let plan = deploy(&fleet, &["plan", &site]);
    assert!(
        text(&plan)
            .contains("Run budget: no new wave of any service once more than 0 hosts failed"),
        "{}",
        text(&plan)
    );
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("1 host failed in this run, more than the site's max-failed 0 allows (0)"),
        "{all}"
    );
    assert!(
        events(&fleet, "db2").is_empty(),
        "db: no wave after db1 failed"
    );
    for h in ["app2", "app3"] {
        assert!(
            events(&fleet, h).is_empty(),
            "{h}: api starts no new wave either"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets and private logs

const PASSWORD: &str = "pa$$w'rd \"x\" $(touch /srv/pwned) `id`";
const TOKEN: &str = "tok-3f9a1c77e2";

fn secret_site(fleet: &Fleet) -> String {
    std::fs::write(fleet.dir.join("token.txt"), format!("{TOKEN}\n")).unwrap();
    // The hook writes both secrets where the test can read them, then echoes them on stdout and
    // stderr and fails on app2, so that they would be in the log, the events and the reason.
    let body = r####"class "app" { service "api" }
service "api" {
    secret "API_TOKEN" file="token.txt"
    install #"printf %s "$DB_PASSWORD" > /srv/password; printf %s "$API_TOKEN" > /srv/token; echo "password: $DB_PASSWORD"; echo "token: $API_TOKEN" >&2; [ "$DEPLOY_HOST" != app2 ]"#
}
"####;
    write_site(
        fleet,
        "secret \"DB_PASSWORD\" env=\"DROVER_TEST_PASSWORD\"",
        "batch \"100%\"; max-failed 5",
        body,
    )
}

#[test]
fn secrets_reach_the_hooks_and_nothing_the_controller_writes() {
    let fleet = fleet(&[("app1", "app"), ("app2", "app")]);
    let site = secret_site(&fleet);

    // Missing: a clear error naming the secret and its source, before anything runs.
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(5), "{all}");
    assert!(all.contains("secret `DB_PASSWORD`"), "{all}");
    assert!(all.contains("DROVER_TEST_PASSWORD"), "{all}");
    assert!(events(&fleet, "app1").is_empty());
    assert!(host_file(&fleet, "app1", "srv/password").is_none());

    // Plans never hold secrets: they are read at apply time.
    let plan_file = fleet.dir.join("saved.plan");
    let plan = deploy(
        &fleet,
        &[
            "plan",
            &site,
            "--json",
            "--out",
            &plan_file.display().to_string(),
        ],
    );
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan));

    let env = [("DROVER_TEST_PASSWORD", PASSWORD)];
    let out = deploy_env(&fleet, &["apply", &site, "--yes"], &env);
    let plain = text(&out);
    assert_eq!(out.status.code(), Some(1), "app2 fails: {plain}");
    for h in ["app1", "app2"] {
        assert_eq!(
            host_file(&fleet, h, "srv/password").as_deref(),
            Some(PASSWORD)
        );
        assert_eq!(host_file(&fleet, h, "srv/token").as_deref(), Some(TOKEN));
    }
    assert!(
        host_file(&fleet, "app1", "srv/pwned").is_none(),
        "a secret ran as code"
    );

    // Once more with NDJSON events (app2 fails again).
    let json = deploy_env(&fleet, &["apply", &site, "--yes", "--json"], &env);
    let json_text = text(&json);
    assert_eq!(json.status.code(), Some(1), "{json_text}");

    let runs = fleet.dir.join(".drover/runs");
    let logs = files(&runs);
    assert!(!logs.is_empty());
    let mut seen_redacted = false;
    for f in &logs {
        let t = String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned();
        seen_redacted |= t.contains("password: [redacted]") && t.contains("token: [redacted]");
        for secret in [PASSWORD, TOKEN] {
            assert!(!t.contains(secret), "{} holds a secret:\n{t}", f.display());
        }
    }
    assert!(seen_redacted, "the hooks' output is logged, redacted");
    for (what, t) in [
        ("plain output", &plain),
        ("NDJSON events", &json_text),
        ("plan output", &text(&plan)),
        ("saved plan", &std::fs::read_to_string(&plan_file).unwrap()),
    ] {
        for secret in [PASSWORD, TOKEN] {
            assert!(!t.contains(secret), "{what} holds a secret:\n{t}");
        }
    }
    assert!(
        json_text.contains("token: [redacted]"),
        "the failure reason is redacted, not dropped: {json_text}"
    );

    // The run directories and logs are the operator's alone.
    for run in std::fs::read_dir(&runs).unwrap().flatten() {
        assert_eq!(mode(&run.path()), 0o700, "{}", run.path().display());
    }
    for f in &logs {
        assert_eq!(mode(f), 0o600, "{}", f.display());
        assert_eq!(mode(f.parent().unwrap()), 0o700, "{}", f.display());
    }
}

// ---------------------------------------------------------------------------------------------
// Host keys

#[test]
fn an_unknown_host_key_is_refused_until_accepted_for_first_contact() {
    let fleet = fleet(&[("app1", "app"), ("app2", "app")]);
    let known = fleet.known_hosts();
    let app2 = format!("[{}]:2222", fleet.address("app2"));
    let kept: String = std::fs::read_to_string(&known)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with(&app2))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&known, kept).unwrap();
    let body = format!("class \"app\" {{ service \"api\" }}\nservice \"api\" {{ {HOOKS} }}\n");
    let site = write_site(&fleet, "", "batch \"100%\"", &body);

    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let line = all
        .lines()
        .find(|l| l.contains("app2") && l.contains("host key"))
        .unwrap_or_else(|| panic!("no line names app2's host key:\n{all}"));
    assert!(line.contains("is not in known_hosts"), "{line}");
    assert!(line.contains("ssh-keyscan -p 2222"), "{line}");
    assert!(line.contains("--accept-new-host-keys"), "{line}");
    assert!(events(&fleet, "app2").is_empty());
    assert_eq!(events(&fleet, "app1"), ["install api 1.0"]);

    let out = deploy(&fleet, &["apply", &site, "--yes", "--accept-new-host-keys"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(events(&fleet, "app2"), ["install api 1.0"]);
    let found = Command::new("ssh-keygen")
        .args(["-F", &app2, "-f"])
        .arg(&known)
        .output()
        .unwrap();
    assert!(found.status.success(), "app2's key was recorded");
    // From now on, strict checking knows it.
    let out = deploy(&fleet, &["verify", &site]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

// ---------------------------------------------------------------------------------------------
// A corrupt state file

#[test]
fn a_corrupt_state_file_leaves_its_host_alone_and_says_how_to_fix_it() {
    let fleet = fleet(&[("app1", "app"), ("app2", "app")]);
    let body = |v: &str| {
        format!(
            "class \"app\" {{ service \"api\" }}\nservice \"api\" {{ version \"{v}\"\n{HOOKS} }}\n"
        )
    };
    let site = write_site(&fleet, "", "batch \"100%\"", &body("1.0"));
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let state = fleet.host_root("app2").join("var-lib/drover/state.json");
    std::fs::write(&state, "{\"schema\": 1, \"services\": {\"api\": tru").unwrap();

    let site = write_site(&fleet, "", "batch \"100%\"", &body("2.0"));
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("app2: state file /var/lib/drover/state.json is unusable"),
        "{all}"
    );
    assert!(
        all.contains("delete it to treat the host as fresh"),
        "{all}"
    );
    // Summarised as what it is, not as a host that does not answer.
    assert!(all.contains("skipped, state unreadable: app2"), "{all}");
    assert!(
        all.contains("1 host with an unreadable state file"),
        "{all}"
    );
    assert!(!all.contains("unreachable"), "{all}");
    // Counts agree with their nouns.
    assert!(all.contains(": 2 hosts, 1 service (digest"), "{all}");
    assert!(all.contains("1 step on 2 hosts"), "{all}");
    assert_eq!(
        events(&fleet, "app1"),
        ["install api 1.0", "install api 2.0"]
    );
    assert_eq!(
        events(&fleet, "app2"),
        ["install api 1.0"],
        "the host whose state is unknown is not touched"
    );

    let status = deploy(&fleet, &["status", &site]);
    let st = text(&status);
    assert!(
        st.contains("app2: state unreadable: state file /var/lib/drover/state.json is unusable"),
        "{st}"
    );

    // The fix the message gives: delete it, and the host is installed afresh.
    std::fs::remove_file(&state).unwrap();
    let out = deploy(&fleet, &["apply", &site, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        events(&fleet, "app2"),
        ["install api 1.0", "install api 2.0"]
    );
}

// ---------------------------------------------------------------------------------------------
// The new site nodes, checked offline

#[test]
fn new_nodes_are_checked_with_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("platform.kdl"),
        "platform \"p\" { transport \"local\"; inventory \"static\" { host \"a1\" address=\"10.0.0.1\" class=\"app\" } }\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy.kdl"),
        "policy \"p\" { batch 1; wave-max-failed \"lots\" }\n",
    )
    .unwrap();
    let site = dir.path().join("site.kdl");
    std::fs::write(
        &site,
        r#"site "s" {
    version "1"
    platform "platform.kdl"
    policy "policy.kdl"
    hook-timeout "10"
    max-failed "110%"
    secret "1BAD" env="X"
    secret "DEPLOY_HOST" env="X"
    secret "TWO" env="X" file="y"
    secret "NONE"
    secret "OK" env="X"
    secret "OK" file="x"
}
class "app" { service "api" }
service "api" { secret "API-KEY" env="Y" }
"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["check"])
        .arg(&site)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(3), "{all}");
    for want in [
        "`10` is not a duration",
        "`110%` is more than 100%",
        "`1BAD` is not an environment variable name",
        "names starting with DEPLOY_ are drover's own variables",
        "a secret has one source",
        "the source of secret `NONE` is missing",
        "secret `OK` is defined twice",
        "`API-KEY` is not an environment variable name",
        "`lots`",
    ] {
        assert!(all.contains(want), "no `{want}` in:\n{all}");
    }
}

// ---------------------------------------------------------------------------------------------
// The controller's environment

/// On the `local` transport a hook runs as a child of `deploy`: it is given what the site gives
/// it and a login's basics, never `deploy`'s own environment (the fingerprint key, a store's
/// password, another service's secret, anything else set where `deploy` runs).
#[test]
fn a_local_hook_is_given_nothing_of_the_controllers_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("platform.kdl"),
        "platform \"p\" { transport \"local\"; inventory \"static\" { host \"a1\" address=\"127.0.0.1\" class=\"app\" } }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("policy.kdl"), "policy \"p\" { batch 1 }\n").unwrap();
    let site = dir.path().join("site.kdl");
    std::fs::write(
        &site,
        r####"site "s" {
    version "1"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "db"; service "api" }
service "db" {
    secret "DB_TOKEN" env="DROVER_TEST_DB_TOKEN"
    install #"env > "$DEPLOY_SERVICE.env""#
}
service "api" {
    env "MODE" "blue"
    install #"env > "$DEPLOY_SERVICE.env""#
}
"####,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["apply", site.to_str().unwrap(), "--yes"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env("DROVER_FINGERPRINT_KEY", "fingerprint-key-never-on-a-host")
        .env("ETCD_PASSWORD", "etcd-password-never-on-a-host")
        .env("DROVER_TEST_DB_TOKEN", "db-token-only-for-db")
        .env("UNRELATED_CONTROLLER_VAR", "controller-only")
        .output()
        .expect("run deploy");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let env_of = |service: &str| {
        std::fs::read_to_string(dir.path().join(format!("hosts/a1/{service}.env")))
            .unwrap_or_else(|e| panic!("{service}'s hook wrote no env: {e}\n{}", text(&out)))
    };
    let (db, api) = (env_of("db"), env_of("api"));
    for (service, env) in [("db", &db), ("api", &api)] {
        for leaked in [
            "fingerprint-key-never-on-a-host",
            "etcd-password-never-on-a-host",
            "controller-only",
        ] {
            assert!(
                !env.contains(leaked),
                "{service}'s hook got {leaked}:\n{env}"
            );
        }
        assert!(env.contains("DEPLOY_SERVICE="), "{service}: {env}");
        assert!(
            env.lines().any(|l| l.starts_with("PATH=")),
            "{service}: {env}"
        );
    }
    // Each service's own: db its secret, api its env, neither the other's.
    assert!(db.contains("DB_TOKEN=db-token-only-for-db"), "{db}");
    assert!(
        !api.contains("db-token-only-for-db"),
        "api got db's secret:\n{api}"
    );
    assert!(api.contains("MODE=blue"), "{api}");
    assert!(!db.contains("MODE="), "{db}");
}
