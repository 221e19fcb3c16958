//! Removals on a real sshd fleet, asserted from the hosts' own hook logs, processes and state
//! files. A service taken out of the site: `plan` shows its removal on every host, `apply`
//! without `--prune` removes nothing and says so; with `--prune` its recorded `stop` and
//! `remove` run on every host (its process stops) and its record is gone. An api host taken
//! out of its class behind a real haproxy while a client hammers it: no request fails, and
//! haproxy's configuration dropped the host before its `stop` ran. With a store (etcd), the
//! removed service's keys are gone too, and the hosts that published it are read.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;
use support::traffic::with_traffic;

const HOSTS: &[&str] = &["app1", "app2"];

/// `api` and, with `cache`, a `cache` service whose process is a `sleep` it starts.
fn shop(cache: bool) -> String {
    let cache = if cache {
        r####"class "app" { service "api"; service "cache" }
service "cache" {
    version "0.9"
    start #"@EV@ev start; mkdir -p /srv/cache; setsid nohup sleep 1000 >/dev/null 2>&1 </dev/null & echo $! >/srv/cache/pid"#
    stop #"@EV@ev stop; echo "$DEPLOY_OLD_VERSION $DEPLOY_HOST $MODE" >/srv/cache/stopped-as; kill "$(cat /srv/cache/pid)""#
    remove #"@EV@ev remove; rm -f /srv/cache/pid"#
    env "MODE" "warm"
}
"####
    } else {
        "class \"app\" { service \"api\" }\n"
    };
    r####"site "shop" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
@CACHE@service "api" {
    start #"@EV@ev start"#
}
"####
        .replace("@CACHE@", cache)
        .replace("@EV@", EV)
}

fn deploy(fleet: &Fleet, args: &[&str]) -> std::process::Output {
    support::cli::deploy_in(&fleet.dir)
        .args(args)
        .output()
        .expect("run deploy")
}

fn state(fleet: &Fleet, host: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fleet.host_root(host).join("var-lib/drover/state.json"))
        .unwrap_or_else(|e| panic!("state of {host}: {e}"));
    serde_json::from_str(&text).expect("state is JSON")
}

fn alive(fleet: &Fleet, host: &str, pid: &str) -> bool {
    fleet.ssh(host, &format!("kill -0 {pid}")).status.success()
}

#[test]
fn a_service_taken_out_of_the_site_is_removed_only_with_prune() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app"), FleetHost::new("app2", "app")]);
    fleet.write_platform("/var/lib/drover");
    let policy = "policy \"all\" { batch \"100%\"; }\n";
    let site = fleet.write_site(&shop(true), policy);
    let site = site.to_str().unwrap().to_string();
    support::cli::ok(deploy(&fleet, &["apply", &site, "--yes"]));
    let pids: Vec<String> = HOSTS
        .iter()
        .map(|h| {
            let pid = std::fs::read_to_string(fleet.host_root(h).join("srv/cache/pid"))
                .expect("cache pid");
            pid.trim().to_string()
        })
        .collect();
    for (h, pid) in HOSTS.iter().zip(&pids) {
        assert!(alive(&fleet, h, pid), "cache runs on {h}");
        // The host keeps the texts its removal will run.
        let recorded = &state(&fleet, h)["services"]["cache"]["removal"];
        assert!(
            recorded["remove"]["command"]
                .as_str()
                .is_some_and(|c| c.contains("rm -f /srv/cache/pid")),
            "{recorded}"
        );
    }
    // The site no longer has `cache`.
    fleet.write_site(&shop(false), policy);
    let out = deploy(&fleet, &["plan", &site]);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    for h in HOSTS {
        assert!(
            plan.contains(&format!(
                "remove cache 0.9 from {h} (no longer in the site): runs its recorded stop, remove"
            )),
            "{plan}"
        );
    }
    assert!(plan.contains("left: 2 removals (pass --prune"), "{plan}");
    let json = deploy(&fleet, &["plan", &site, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("plan JSON");
    assert_eq!(json["removals"].as_array().map(Vec::len), Some(2), "{json}");
    assert_eq!(json["removals"][0]["why"], "left-site", "{json}");
    assert_eq!(json["removals"][0]["hooks"][1], "remove", "{json}");

    // Without --prune: nothing is removed, and apply says so.
    let out = support::cli::ok(deploy(&fleet, &["apply", &site, "--yes"]));
    assert!(out.contains("left: 2 removals"), "{out}");
    for (h, pid) in HOSTS.iter().zip(&pids) {
        assert!(alive(&fleet, h, pid), "cache still runs on {h}");
        assert!(state(&fleet, h)["services"]["cache"].is_object());
    }
    assert!(!support::hooks::events(&fleet)
        .iter()
        .any(|(_, _, what, s)| s == "cache" && (what == "stop" || what == "remove")));

    // With --prune: the recorded stop, then remove, on every host; its records are gone.
    let out = deploy(&fleet, &["apply", &site, "--yes", "--prune"]);
    let said = support::cli::ok(out);
    for (h, pid) in HOSTS.iter().zip(&pids) {
        assert!(!alive(&fleet, h, pid), "cache stopped on {h}");
        let services = &state(&fleet, h)["services"];
        assert!(services["cache"].is_null(), "{h}: {services}");
        assert!(services["api"].is_object(), "{h}: {services}");
        let whats: Vec<String> = support::hooks::events(&fleet)
            .into_iter()
            .filter(|(_, host, _, s)| host == h && s == "cache")
            .map(|(_, _, what, _)| what)
            .collect();
        assert_eq!(whats, ["start", "stop", "remove"], "{h}: {said}");
        // The stop ran with what it was given when it last switched.
        let stopped =
            std::fs::read_to_string(fleet.host_root(h).join("srv/cache/stopped-as")).expect("stop");
        assert_eq!(stopped.trim(), format!("0.9 {h} warm"));
        assert!(!fleet.host_root(h).join("srv/cache/pid").exists());
    }
    // Nothing is left to remove.
    let out = deploy(&fleet, &["plan", &site]);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!plan.contains("remove cache"), "{plan}");
    assert!(plan.contains("\n0 steps in 0 waves"), "{plan}");

    // The run that only removed is in the history, as what it did: the last one, converged.
    let out = deploy(&fleet, &["history", &site, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).expect("history JSON");
    let runs = history["runs"].as_array().expect("runs");
    let last = runs.last().expect("a run");
    assert_eq!(last["result"], "converged", "{history}");
    let changes = last["changes"].as_array().expect("changes");
    assert_eq!(changes.len(), 1, "{history}");
    assert_eq!(changes[0]["service"], "cache", "{history}");
    assert_eq!(changes[0]["removed"], 2, "{history}");
    assert_eq!(changes[0]["removed_versions"][0], "0.9", "{history}");
    assert_eq!(changes[0]["hosts"], 0, "{history}");
    let text = support::cli::ok(deploy(&fleet, &["history", &site]));
    assert!(text.contains("cache: 0.9 removed from 2 hosts"), "{text}");
    // So `deploy undo` goes back to the run before it, and the service comes back.
    support::cli::ok(deploy(&fleet, &["undo", &site, "--yes"]));
    for h in HOSTS {
        let services = &state(&fleet, h)["services"];
        assert_eq!(services["cache"]["version"], "0.9", "{h}: {services}");
        let pid = std::fs::read_to_string(fleet.host_root(h).join("srv/cache/pid"))
            .expect("cache started again");
        assert!(alive(&fleet, h, pid.trim()), "cache runs again on {h}");
        let whats: Vec<String> = support::hooks::events(&fleet)
            .into_iter()
            .filter(|(_, host, _, s)| host == h && s == "cache")
            .map(|(_, _, what, _)| what)
            .collect();
        assert_eq!(whats, ["start", "stop", "remove", "start"], "{h}");
    }
}

/// The api behind haproxy (tests/drain.rs's site), with a `remove` hook; with `spare`, app2 is
/// in class `spare` (which runs `idle`) instead of `app`.
fn proxied(spare: bool) -> String {
    let api_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; o = u.build_opener(u.ProxyHandler({})); b = "http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]); o.open(b + "health", timeout=1); v = o.open(b, timeout=1).read().decode().split()[1]; raise SystemExit(v != a["DEPLOY_NEW_VERSION"])'"#;
    let lb_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; u.build_opener(u.ProxyHandler({})).open("http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]), timeout=1).read()'"#;
    let servers =
        r#"ev "servers:$(awk '/^ *server /{printf "%s@%s,", $2, $3}' /srv/lb/haproxy.cfg)""#;
    let spare = if spare {
        "class \"spare\" { service \"idle\" }\nservice \"idle\" { start \"true\" }\n"
    } else {
        ""
    };
    r####"site "proxied" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
class "lb" { service "lb" }
@SPARE@
service "api" {
    port 18080
    file "api.py" to="/srv/api/server.py"
    install #"@EV@ev install; printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    // No drain of its own: the server just goes.
    stop #"""
        @EV@ev stop
        [ -f /srv/api/pid ] || exit 0
        pid="$(cat /srv/api/pid)"; kill "$pid"; rm -f /srv/api/pid
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        """#
    start #"@EV@ev start; setsid nohup python3 /srv/api/server.py "$DEPLOY_ADDRESS" "$DEPLOY_PORT" >/srv/api/log 2>&1 </dev/null & echo $! >/srv/api/pid"#
    check #"@API_CHECK@ && @EV@ev checked"# timeout="10s" interval="100ms"
    remove #"@EV@ev remove; rm -rf /srv/api"#
}

service "lb" {
    port 18000
    needs "api" addressable="all"
    file "haproxy.cfg.j2" to="/srv/lb/haproxy.cfg" template=#true
    start #"@EV@ev start; @SERVERS@; haproxy -W -D -f /srv/lb/haproxy.cfg -p /srv/lb/haproxy.pid </dev/null >/srv/lb/log 2>&1"#
    reload #"@EV@ev reload; @SERVERS@; haproxy -c -q -f /srv/lb/haproxy.cfg && kill -USR2 "$(cat /srv/lb/haproxy.pid)" && sleep 0.3"#
    stop #"@EV@ev stop; [ -f /srv/lb/haproxy.pid ] && kill -USR1 "$(cat /srv/lb/haproxy.pid)"; sleep 0.2"#
    check #"@LB_CHECK@ && @EV@ev checked"# timeout="10s" interval="100ms"
}
"####
        .replace("@SPARE@", spare)
        .replace("@API_CHECK@", api_check)
        .replace("@LB_CHECK@", lb_check)
        .replace("@SERVERS@", servers)
        .replace("@EV@", EV)
}

/// Writes the platform (app2 in class `spare` with `spare`), policy, fixtures and site.
fn write_proxied(fleet: &Fleet, spare: bool) -> PathBuf {
    let platform = fleet.write_platform("/var/lib/drover");
    if spare {
        let text = std::fs::read_to_string(&platform).expect("platform");
        let text: Vec<String> = text
            .lines()
            .map(|l| {
                if l.contains("host \"app2\"") {
                    l.replace("class=\"app\"", "class=\"spare\"")
                } else {
                    l.to_string()
                }
            })
            .collect();
        std::fs::write(&platform, text.join("\n") + "\n").expect("platform");
    }
    let dir = &fleet.dir;
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/haproxy");
    std::fs::copy(fixtures.join("api.py"), dir.join("api.py")).expect("fixture");
    std::fs::copy(
        fixtures.join("haproxy-strict.cfg.j2"),
        dir.join("haproxy.cfg.j2"),
    )
    .expect("fixture");
    fleet.write_site(
        &proxied(spare),
        "policy \"half\" { batch \"50%\"; max-failed 0; }\n",
    )
}

#[test]
fn an_api_host_taken_out_of_its_class_behind_haproxy_fails_no_request() {
    assert!(
        std::path::Path::new("/usr/sbin/haproxy").exists(),
        "haproxy is missing: tests/run.sh installs Debian's haproxy"
    );
    let fleet = Fleet::start(&[
        FleetHost::new("app1", "app"),
        FleetHost::new("app2", "app"),
        FleetHost::new("lb1", "lb"),
    ]);
    let site = write_proxied(&fleet, false);
    let site = site.to_str().unwrap().to_string();
    support::cli::ok(deploy(&fleet, &["apply", &site, "--yes"]));
    let lb: SocketAddr = format!("{}:18000", fleet.address("lb1"))
        .parse()
        .expect("address");
    write_proxied(&fleet, true);
    let out = deploy(&fleet, &["plan", &site]);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        plan.contains(
            "remove api 1.0 from app2 (no class of the host runs it): runs its recorded stop, \
             remove"
        ),
        "{plan}"
    );
    let before = support::hooks::events(&fleet).len();
    let mut said = String::new();
    let seen = with_traffic(lb, || {
        said = support::cli::ok(deploy(&fleet, &["apply", &site, "--yes", "--prune"]));
    });
    assert!(
        seen.failed.is_empty(),
        "failed requests while app2 was removed: {:?}\n{said}",
        seen.failed
    );
    assert!(
        seen.ok > 20,
        "the client kept sending ({} answers)",
        seen.ok
    );
    let events = support::hooks::events(&fleet);
    let events = &events[before..];
    let at = |host: &str, what: &str, service: &str| {
        events
            .iter()
            .find(|(_, h, w, s)| h == host && w == what && s == service)
            .map(|(ns, ..)| *ns)
            .unwrap_or_else(|| panic!("no {service} {what} on {host}: {events:?}\n{said}"))
    };
    let (stop, remove) = (at("app2", "stop", "api"), at("app2", "remove", "api"));
    assert!(stop < remove, "{events:?}");
    // haproxy's last configuration before app2's stop no longer lists it.
    let last = events
        .iter()
        .rfind(|(ns, h, w, _)| h == "lb1" && *ns < stop && w.starts_with("servers:"))
        .map(|(_, _, w, _)| w.clone())
        .unwrap_or_else(|| panic!("haproxy never reloaded before app2 stopped: {events:?}"));
    assert!(!last.contains("app2@"), "{last}: {events:?}");
    assert!(last.contains("app1@"), "{last}");
    // app1 ran nothing; app2's record keeps `idle` only; its files are gone.
    assert!(!events.iter().any(|(_, h, _, s)| h == "app1" && s == "api"));
    let services = &state(&fleet, "app2")["services"];
    assert!(
        services["api"].is_null() && services["idle"].is_object(),
        "{services}"
    );
    assert!(!fleet.host_root("app2").join("srv/api").exists());
    let cfg = std::fs::read_to_string(fleet.host_root("lb1").join("srv/lb/haproxy.cfg"))
        .expect("haproxy.cfg");
    assert!(!cfg.contains("server app2"), "{cfg}");
}

/// With a store: a host that publishes a service the site no longer has is read (not taken
/// from the store), the service's removal is planned and carried out, and its `running/`,
/// `status/` and `desired/` keys are gone; the next plan takes every host from the store.
#[cfg(feature = "etcd")]
#[test]
fn with_a_store_a_removed_services_keys_are_gone() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app"), FleetHost::new("app2", "app")]);
    let etcd = support::etcd::Etcd::start();
    let prefix = "/drover-removal";
    store_platform(&fleet, &etcd, prefix, &[]);
    let policy = "policy \"all\" { batch \"100%\"; }\n";
    let site = fleet.write_site(&shop(true), policy);
    let site = site.to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        support::cli::deploy_in(&fleet.dir)
            .env(support::etcd::PASSWORD_ENV, support::etcd::PASSWORD)
            .args(args)
            .output()
            .expect("run deploy")
    };
    support::cli::ok(run(&["apply", &site, "--yes"]));
    let root = format!("{prefix}/shop/");
    let cache_keys = || -> Vec<String> {
        etcd.keys(&root)
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.contains("/cache"))
            .collect()
    };
    // running/, two status/ per host, and desired/.
    assert_eq!(cache_keys().len(), 7, "{:?}", etcd.keys(&root));
    fleet.write_site(&shop(false), policy);
    let plan = String::from_utf8_lossy(&run(&["plan", &site]).stdout).to_string();
    assert!(plan.contains("remove cache 0.9 from app1"), "{plan}");
    assert!(plan.contains("remove cache 0.9 from app2"), "{plan}");
    let said = support::cli::ok(run(&["apply", &site, "--yes", "--prune"]));
    for h in HOSTS {
        assert!(state(&fleet, h)["services"]["cache"].is_null(), "{said}");
    }
    // The writes are queued; the run waits for them before it ends.
    assert_eq!(cache_keys(), Vec::<String>::new(), "{said}");
    assert!(etcd
        .keys(&root)
        .iter()
        .any(|(k, _)| k.ends_with("running/api/app1")));
    // Nothing left: every host is taken from the store, none read.
    let out = run(&["plan", &site]);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!plan.contains("remove cache"), "{plan}");
    assert!(plan.contains("\n0 steps in 0 waves"), "{plan}");
}

/// The fleet's platform with the store, without the hosts in `hidden`.
#[cfg(feature = "etcd")]
fn store_platform(fleet: &Fleet, etcd: &support::etcd::Etcd, prefix: &str, hidden: &[&str]) {
    let platform = support::hooks::write_platform_without(fleet, hidden);
    let text = std::fs::read_to_string(&platform).expect("platform");
    let text = text.replacen(
        "platform \"fleet\" {\n",
        &format!(
            "platform \"fleet\" {{\n    {}\n",
            etcd.store_node(prefix, "3s")
        ),
        1,
    );
    std::fs::write(&platform, text).expect("platform");
}

/// With a store: a host taken out of the inventory is known from its `hosts/` key, read, and
/// every service it records removed (its processes stop, its record is emptied); the store
/// then forgets it. The next plan does not name it. A host gone that does not answer (app3,
/// killed) has no removal and does not fail the run.
#[cfg(feature = "etcd")]
#[test]
fn with_a_store_a_host_gone_from_the_inventory_is_found_and_emptied() {
    let fleet = Fleet::start(&[
        FleetHost::new("app1", "app"),
        FleetHost::new("app2", "app"),
        FleetHost::new("app3", "app"),
    ]);
    let etcd = support::etcd::Etcd::start();
    let prefix = "/drover-gone";
    store_platform(&fleet, &etcd, prefix, &[]);
    let site = fleet.write_site(&shop(true), "policy \"all\" { batch \"100%\"; }\n");
    let site = site.to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        support::cli::deploy_in(&fleet.dir)
            .env(support::etcd::PASSWORD_ENV, support::etcd::PASSWORD)
            .args(args)
            .output()
            .expect("run deploy")
    };
    support::cli::ok(run(&["apply", &site, "--yes"]));
    let pid =
        std::fs::read_to_string(fleet.host_root("app2").join("srv/cache/pid")).expect("cache pid");
    let pid = pid.trim().to_string();
    assert!(alive(&fleet, "app2", &pid));
    fleet.kill_host("app3");
    store_platform(&fleet, &etcd, prefix, &["app2", "app3"]);
    let plan = String::from_utf8_lossy(&run(&["plan", &site]).stdout).to_string();
    for service in ["api 1.0", "cache 0.9"] {
        assert!(
            plan.contains(&format!(
                "remove {service} from app2 (the host is no longer in the inventory)"
            )),
            "{plan}"
        );
    }
    let said = support::cli::ok(run(&["apply", &site, "--yes", "--prune"]));
    assert!(
        !alive(&fleet, "app2", &pid),
        "cache stopped on app2: {said}"
    );
    let services = &state(&fleet, "app2")["services"];
    assert_eq!(services.as_object().map(|o| o.len()), Some(0), "{services}");
    assert!(state(&fleet, "app1")["services"]["cache"].is_object());
    let left: Vec<String> = etcd
        .keys(&format!("{prefix}/shop/"))
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.ends_with("/app2") || k.contains("/app2/"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "{said}");
    let out = run(&["plan", &site]);
    let plan = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !plan.contains("app2") && !err.contains("app2"),
        "{plan}{err}"
    );
    assert!(!plan.contains("from app3"), "{plan}");
}
