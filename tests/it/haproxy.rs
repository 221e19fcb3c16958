//! A real Debian haproxy in front of the api pool, on the sshd fleet: its configuration is a
//! `file … template=#true` rendered from `needs.api`, and a new api host reaches it by a
//! reconfigure (files, then `reload`) once the host serves. A client sending requests through
//! haproxy without pause sees no failed request during a rolling api upgrade, nor during the
//! pool change. The book's worked example ("Desired state") is this site.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use support::fleet::{Fleet, FleetHost};
use support::hooks::{write_platform_without, EV};
use support::traffic::with_traffic;

fn site(api_version: &str) -> String {
    let api_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; o = u.build_opener(u.ProxyHandler({})); b = "http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]); o.open(b + "health", timeout=1); v = o.open(b, timeout=1).read().decode().split()[1]; raise SystemExit(v != a["DEPLOY_NEW_VERSION"])'"#;
    let lb_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; u.build_opener(u.ProxyHandler({})).open("http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]), timeout=1).read()'"#;
    format!(
        r####"site "proxied" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
class "lb" {{ service "lb" }}

service "api" {{
    version "{api_version}"
    port 18080
    file "api.py" to="/srv/api/server.py"
    install #"{EV}ev install; printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    // Drain first: /health fails, haproxy stops sending new requests here within a check
    // interval or two, then the server goes.
    stop #"""
        {EV}ev stop
        [ -f /srv/api/pid ] || exit 0
        touch /srv/api/draining; sleep 0.5
        kill "$(cat /srv/api/pid)"; rm -f /srv/api/pid
        while python3 -c 'import os, socket; s = socket.socket(); raise SystemExit(s.connect_ex((os.environ["DEPLOY_ADDRESS"], int(os.environ["DEPLOY_PORT"]))))'; do sleep 0.05; done
        """#
    start #"{EV}ev start; rm -f /srv/api/draining; setsid nohup python3 /srv/api/server.py "$DEPLOY_ADDRESS" "$DEPLOY_PORT" >/srv/api/log 2>&1 </dev/null & echo $! >/srv/api/pid"#
    // Healthy, then a moment for haproxy's own check (every 100 ms) to see it before the next
    // host drains (what Kubernetes calls minReadySeconds).
    check #"{api_check} && {EV}ev checked && sleep 0.4"# timeout="10s" interval="100ms"
}}

service "lb" {{
    port 18000
    needs "api" addressable="all"
    file "haproxy.cfg.j2" to="/srv/lb/haproxy.cfg" template=#true
    // Master-worker mode: a reload (SIGUSR2 to the master) starts new workers on the same
    // listening sockets and lets the old ones finish what they serve: nothing is refused.
    start #"{EV}ev start; haproxy -W -D -f /srv/lb/haproxy.cfg -p /srv/lb/haproxy.pid </dev/null >/srv/lb/log 2>&1"#
    reload #"{EV}ev reload; haproxy -c -q -f /srv/lb/haproxy.cfg && kill -USR2 "$(cat /srv/lb/haproxy.pid)" && sleep 0.3"#
    stop #"{EV}ev stop; [ -f /srv/lb/haproxy.pid ] && kill -USR1 "$(cat /srv/lb/haproxy.pid)"; sleep 0.2"#
    check #"{lb_check} && {EV}ev checked"# timeout="10s" interval="100ms"
}}
"####
    )
}

struct Proxied {
    fleet: Fleet,
    /// Hosts left out of the inventory.
    hidden: Vec<&'static str>,
}

impl Proxied {
    fn write(&self, api_version: &str) -> PathBuf {
        write_platform_without(&self.fleet, &self.hidden);
        let dir = &self.fleet.dir;
        std::fs::write(
            dir.join("policy.kdl"),
            "policy \"one\" { batch 1; max-failed 0; }\n",
        )
        .expect("policy");
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/haproxy");
        for f in ["api.py", "haproxy.cfg.j2"] {
            std::fs::copy(fixtures.join(f), dir.join(f)).expect("fixture");
        }
        let path = dir.join("site.kdl");
        std::fs::write(&path, site(api_version)).expect("site");
        path
    }

    fn deploy(&self, args: &[&str]) -> std::process::Output {
        support::cli::deploy_in(&self.fleet.dir)
            .args(args)
            .output()
            .expect("run deploy")
    }

    fn apply(&self, api_version: &str) -> String {
        let site = self.write(api_version);
        support::cli::ok(self.deploy(&["apply", site.to_str().unwrap(), "--yes"]))
    }

    fn plan(&self, api_version: &str) -> String {
        let site = self.write(api_version);
        let out = self.deploy(&["plan", site.to_str().unwrap()]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(ns, host, what, service)` of every hook event, oldest first.
    fn events(&self) -> Vec<(u128, String, String, String)> {
        support::hooks::events(&self.fleet)
    }
}

#[test]
fn no_request_fails_through_haproxy_during_an_upgrade_or_a_pool_change() {
    assert!(
        std::path::Path::new("/usr/sbin/haproxy").exists(),
        "haproxy is missing: tests/run.sh installs Debian's haproxy"
    );
    let fleet = Fleet::start(&[
        FleetHost::new("app1", "app"),
        FleetHost::new("app2", "app"),
        FleetHost::new("app3", "app"),
        FleetHost::new("lb1", "lb"),
    ]);
    let mut p = Proxied {
        fleet,
        hidden: vec!["app3"],
    };
    p.apply("1.0");
    let lb: SocketAddr = format!("{}:18000", p.fleet.address("lb1"))
        .parse()
        .expect("address");
    let cfg = |p: &Proxied| {
        std::fs::read_to_string(p.fleet.host_root("lb1").join("srv/lb/haproxy.cfg"))
            .unwrap_or_default()
    };
    assert!(cfg(&p).contains(&format!(
        "server app2 {}:18080 check",
        p.fleet.address("app2")
    )));
    assert!(!cfg(&p).contains("app3"));

    // A rolling upgrade of the api, one host at a time, under traffic.
    let seen = with_traffic(lb, || {
        p.apply("2.0");
    });
    assert!(
        seen.failed.is_empty(),
        "failed requests during the upgrade: {:?}",
        seen.failed
    );
    assert!(
        seen.ok > 50,
        "the client kept sending ({} answers)",
        seen.ok
    );
    for h in ["app1", "app2"] {
        assert!(
            seen.bodies.contains_key(&format!("{h} 1.0")),
            "{:?}",
            seen.bodies
        );
        assert!(
            seen.bodies.contains_key(&format!("{h} 2.0")),
            "{:?}",
            seen.bodies
        );
    }

    // A pool change: app3 joins the inventory. haproxy reloads once app3's api passed its
    // check, with app3 in its configuration.
    p.hidden.clear();
    let plan = p.plan("2.0");
    assert!(
        plan.contains(
            "reconfigure 1.0 (needs api: +app3; file: /srv/lb/haproxy.cfg; after api on app3) by reload: lb1"
        ),
        "{plan}"
    );
    let before = p.events().len();
    let seen = with_traffic(lb, || {
        p.apply("2.0");
    });
    assert!(
        seen.failed.is_empty(),
        "failed requests during the pool change: {:?}",
        seen.failed
    );
    let all = p.events();
    let at = |host: &str, what: &str| {
        all[before..]
            .iter()
            .find(|(_, h, w, _)| h == host && w == what)
            .map(|(ns, ..)| *ns)
            .unwrap_or_else(|| panic!("no {what} on {host}"))
    };
    assert!(
        at("app3", "checked") < at("lb1", "reload"),
        "haproxy reloads after app3 serves"
    );
    assert!(
        all[before..]
            .iter()
            .all(|(_, h, w, _)| !(h == "lb1" && w == "start")),
        "a reconfigure reloads haproxy, it does not restart it"
    );
    assert!(cfg(&p).contains(&format!(
        "server app3 {}:18080 check",
        p.fleet.address("app3")
    )));
    // Requests reach app3 once haproxy has it.
    let seen = with_traffic(lb, || std::thread::sleep(Duration::from_millis(800)));
    assert!(seen.failed.is_empty(), "{:?}", seen.failed);
    assert!(seen.bodies.contains_key("app3 2.0"), "{:?}", seen.bodies);
}
