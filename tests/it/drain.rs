//! A dependent never points at an address where the needed host does not serve: a real
//! haproxy in front of two api hosts on the sshd fleet, its configuration rendered from
//! `needs.api`, with no `retries` or `redispatch` to hide a server that goes away, and a client
//! sending requests through it without pause. During a rolling change of the api's port, and
//! during a same-address upgrade with `drain=#true` (no drain written in the api's hooks), no
//! request fails: before each api wave stops its host, haproxy's configuration drops it (a
//! reload), and lists it again (at its new port) once its check passed; at most two reloads
//! per api wave. The same when one api host moves to another address.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;
use support::traffic::with_traffic;

const API: &[&str] = &["app1", "app2"];

/// The site, with `refuse` at the start of the api's `stop` (shell text that may exit 1).
fn site(api_version: &str, api_port: u16, drain: bool, refuse: &str) -> String {
    let api_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; o = u.build_opener(u.ProxyHandler({})); b = "http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]); o.open(b + "health", timeout=1); v = o.open(b, timeout=1).read().decode().split()[1]; raise SystemExit(v != a["DEPLOY_NEW_VERSION"])'"#;
    let lb_check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; u.build_opener(u.ProxyHandler({})).open("http://%s:%s/" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]), timeout=1).read()'"#;
    // What haproxy's configuration lists, as one event word:
    // `servers:app1@127.1.2.1:18080,app2@127.1.2.2:18080,`.
    let servers =
        r#"ev "servers:$(awk '/^ *server /{printf "%s@%s,", $2, $3}' /srv/lb/haproxy.cfg)""#;
    let drain = if drain { " drain=#true" } else { "" };
    r####"site "proxied" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
class "lb" { service "lb" }

service "api" {
    version "@API_VERSION@"
    port @API_PORT@
    file "api.py" to="/srv/api/server.py"
    install #"@EV@ev install; printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    // No drain of its own: the server just goes.
    stop #"""
        @REFUSE@
        @EV@ev stop
        [ -f /srv/api/pid ] || exit 0
        pid="$(cat /srv/api/pid)"; kill "$pid"; rm -f /srv/api/pid
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        """#
    start #"@EV@ev start; setsid nohup python3 /srv/api/server.py "$DEPLOY_ADDRESS" "$DEPLOY_PORT" >/srv/api/log 2>&1 </dev/null & echo $! >/srv/api/pid"#
    check #"@API_CHECK@ && @EV@ev checked"# timeout="10s" interval="100ms"
}

service "lb" {
    port 18000
    needs "api" addressable="all"@DRAIN@
    file "haproxy.cfg.j2" to="/srv/lb/haproxy.cfg" template=#true
    start #"@EV@ev start; @SERVERS@; haproxy -W -D -f /srv/lb/haproxy.cfg -p /srv/lb/haproxy.pid </dev/null >/srv/lb/log 2>&1"#
    // Master-worker mode: new workers take the listening sockets, the old ones finish what
    // they serve.
    reload #"@EV@ev reload; @SERVERS@; haproxy -c -q -f /srv/lb/haproxy.cfg && kill -USR2 "$(cat /srv/lb/haproxy.pid)" && sleep 0.3"#
    stop #"@EV@ev stop; [ -f /srv/lb/haproxy.pid ] && kill -USR1 "$(cat /srv/lb/haproxy.pid)"; sleep 0.2"#
    check #"@LB_CHECK@ && @EV@ev checked"# timeout="10s" interval="100ms"
}
"####
        .replace("@API_VERSION@", api_version)
        .replace("@API_PORT@", &api_port.to_string())
        .replace("@REFUSE@", refuse)
        .replace("@DRAIN@", drain)
        .replace("@API_CHECK@", api_check)
        .replace("@LB_CHECK@", lb_check)
        .replace("@SERVERS@", servers)
        .replace("@EV@", EV)
}

struct Proxied {
    fleet: Fleet,
}

impl Proxied {
    fn start() -> Proxied {
        assert!(
            std::path::Path::new("/usr/sbin/haproxy").exists(),
            "haproxy is missing: tests/run.sh installs Debian's haproxy"
        );
        let fleet = Fleet::start(&[
            FleetHost::new("app1", "app").movable(),
            FleetHost::new("app2", "app"),
            FleetHost::new("lb1", "lb"),
        ]);
        Proxied { fleet }
    }

    fn write(&self, api_version: &str, api_port: u16, drain: bool) -> PathBuf {
        self.write_with(api_version, api_port, drain, "", "")
    }

    /// The site with `refuse` at the start of the api's `stop`, and `on_failure` in the
    /// policy (`on-failure "revert"`, or nothing).
    fn write_with(
        &self,
        api_version: &str,
        api_port: u16,
        drain: bool,
        refuse: &str,
        on_failure: &str,
    ) -> PathBuf {
        self.fleet.write_platform("/var/lib/drover");
        let dir = &self.fleet.dir;
        std::fs::write(
            dir.join("policy.kdl"),
            format!("policy \"half\" {{ batch \"50%\"; max-failed 0; {on_failure} }}\n"),
        )
        .expect("policy");
        let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/haproxy");
        std::fs::copy(fixtures.join("api.py"), dir.join("api.py")).expect("fixture");
        std::fs::copy(
            fixtures.join("haproxy-strict.cfg.j2"),
            dir.join("haproxy.cfg.j2"),
        )
        .expect("fixture");
        let path = dir.join("site.kdl");
        std::fs::write(&path, site(api_version, api_port, drain, refuse)).expect("site");
        path
    }

    fn apply(&self, api_version: &str, api_port: u16, drain: bool) -> String {
        let site = self.write(api_version, api_port, drain);
        support::cli::ok(
            support::cli::deploy_in(&self.fleet.dir)
                .args(["apply", site.to_str().unwrap(), "--yes"])
                .output()
                .expect("run deploy"),
        )
    }

    fn lb(&self) -> SocketAddr {
        format!("{}:18000", self.fleet.address("lb1"))
            .parse()
            .expect("address")
    }

    /// `(ns, host, what, service)` of every hook event, oldest first.
    fn events(&self) -> Vec<(u128, String, String, String)> {
        support::hooks::events(&self.fleet)
    }
}

/// haproxy's configuration over time, from lb1's `servers:` events: `(ns, [(host,
/// address:port)])`.
fn configs(events: &[(u128, String, String, String)]) -> Vec<(u128, Vec<(String, String)>)> {
    events
        .iter()
        .filter(|(_, h, ..)| h == "lb1")
        .filter_map(|(ns, _, what, _)| {
            let list = what.strip_prefix("servers:")?;
            let servers = list
                .split(',')
                .filter(|s| !s.is_empty())
                .filter_map(|s| {
                    let (host, at) = s.split_once('@')?;
                    Some((host.to_string(), at.to_string()))
                })
                .collect();
            Some((*ns, servers))
        })
        .collect()
}

/// The order the run kept, from the hooks' own logs (`events`: this run's): each api host of
/// `hosts` left haproxy's configuration before its `stop`, was listed where it does not serve
/// at no time, and came back (at `serves(host)`, `address:port`) only after its check passed;
/// haproxy reloaded at most twice per api wave (`waves`).
fn assert_drained(
    events: &[(u128, String, String, String)],
    hosts: &[&str],
    serves: impl Fn(&str) -> String,
    waves: usize,
) {
    let configs = configs(events);
    let at = |host: &str, what: &str| {
        events
            .iter()
            .find(|(_, h, w, s)| h == host && w == what && s == "api")
            .map(|(ns, ..)| *ns)
            .unwrap_or_else(|| panic!("no api {what} on {host}: {events:?}"))
    };
    for &host in hosts {
        let (stop, checked) = (at(host, "stop"), at(host, "checked"));
        let port = serves(host);
        // The configuration haproxy ran with when the host stopped.
        let before: Vec<&(u128, Vec<(String, String)>)> =
            configs.iter().filter(|(ns, _)| *ns < stop).collect();
        let last = before
            .last()
            .unwrap_or_else(|| panic!("haproxy never reloaded before {host} stopped"));
        assert!(
            !last.1.iter().any(|(h, _)| h == host),
            "{host} stopped at {stop} while haproxy listed it: {configs:?}"
        );
        for (ns, servers) in configs.iter().filter(|(ns, _)| *ns > stop) {
            if servers.iter().any(|(h, _)| h == host) {
                assert!(
                    *ns > checked,
                    "{host} listed again at {ns}, before its check passed at {checked}: \
                     {configs:?}"
                );
                assert!(
                    servers.contains(&(host.to_string(), port.clone())),
                    "{host} listed again elsewhere than {port}: {configs:?}"
                );
            }
        }
        assert!(
            configs
                .last()
                .is_some_and(|(_, s)| s.contains(&(host.to_string(), port.clone()))),
            "haproxy ends listing {host} at {port}: {configs:?}"
        );
    }
    let reloads = events
        .iter()
        .filter(|(_, h, w, _)| h == "lb1" && w == "reload")
        .count();
    assert!(
        reloads <= 2 * waves,
        "{reloads} reloads of haproxy for {waves} api waves: {configs:?}"
    );
}

/// No request failed during `what`, and the client kept sending.
fn assert_served(seen: &support::traffic::Seen, what: &str) {
    assert!(
        seen.failed.is_empty(),
        "failed requests during {what}: {:?}",
        seen.failed
    );
    assert!(
        seen.ok > 50,
        "the client kept sending ({} answers)",
        seen.ok
    );
}

#[test]
fn a_rolling_port_change_of_the_backends_fails_no_request() {
    let p = Proxied::start();
    p.apply("1.0", 18080, false);
    // lb1's own step waits for both api hosts, whose port changes.
    let site = p.write("1.0", 18081, false);
    let out = support::cli::deploy_in(&p.fleet.dir)
        .args(["plan", site.to_str().unwrap()])
        .output()
        .expect("run deploy");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains("reconfigure 1.0 (port: 18080 → 18081) by switch-over, no reload hook: app1"),
        "{plan}"
    );
    assert!(
        plan.contains("after api on app1, api on app2) by reload: lb1"),
        "{plan}"
    );
    let before = p.events().len();
    let seen = with_traffic(p.lb(), || {
        p.apply("1.0", 18081, false);
    });
    assert_served(&seen, "the port change");
    let events = p.events();
    assert_drained(
        &events[before..],
        API,
        |h| format!("{}:18081", p.fleet.address(h)),
        2,
    );
    let cfg = std::fs::read_to_string(p.fleet.host_root("lb1").join("srv/lb/haproxy.cfg"))
        .expect("haproxy.cfg");
    for host in API {
        assert!(
            cfg.contains(&format!(
                "server {host} {}:18081 check",
                p.fleet.address(host)
            )),
            "{cfg}"
        );
    }
}

#[test]
fn a_same_address_upgrade_with_drain_fails_no_request() {
    let p = Proxied::start();
    p.apply("1.0", 18080, true);
    let before = p.events().len();
    let seen = with_traffic(p.lb(), || {
        p.apply("2.0", 18080, true);
    });
    assert!(
        seen.failed.is_empty(),
        "failed requests during the upgrade: {:?}",
        seen.failed
    );
    for host in API {
        for v in ["1.0", "2.0"] {
            assert!(
                seen.bodies.contains_key(&format!("{host} {v}")),
                "{:?}",
                seen.bodies
            );
        }
    }
    let events = p.events();
    assert_drained(
        &events[before..],
        API,
        |h| format!("{}:18080", p.fleet.address(h)),
        2,
    );
    // Converged: the next plan has nothing to do, and haproxy lists both.
    let site = p.write("2.0", 18080, true);
    let out = support::cli::deploy_in(&p.fleet.dir)
        .args(["plan", site.to_str().unwrap()])
        .output()
        .expect("run deploy");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("\n0 steps in 0 waves"), "{plan}");
}

#[test]
fn a_backend_moved_to_another_address_fails_no_request() {
    let p = Proxied::start();
    p.apply("1.0", 18080, false);
    let old = p.fleet.address("app1");
    p.fleet.move_host("app1");
    let new = p.fleet.address("app1");
    assert_ne!(old, new);
    // Its hooks have its address (DEPLOY_ADDRESS): app1 runs the switch-over, and lb1 lists
    // it at the new address only once it serves there.
    let site = p.write("1.0", 18080, false);
    let out = support::cli::deploy_in(&p.fleet.dir)
        .args(["plan", site.to_str().unwrap()])
        .output()
        .expect("run deploy");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains(&format!(
            "reconfigure 1.0 (address: {old} → {new}) by switch-over, no reload hook: app1"
        )),
        "{plan}"
    );
    assert!(plan.contains("after api on app1) by reload: lb1"), "{plan}");
    let before = p.events().len();
    let seen = with_traffic(p.lb(), || {
        p.apply("1.0", 18080, false);
    });
    assert!(
        seen.failed.is_empty(),
        "failed requests while app1 moved: {:?}",
        seen.failed
    );
    let events = p.events();
    let events = &events[before..];
    assert_drained(
        events,
        &["app1"],
        |h| format!("{}:18080", p.fleet.address(h)),
        1,
    );
    // app2 did not move: it ran no hook.
    assert!(
        !events
            .iter()
            .any(|(_, h, w, s)| h == "app2" && s == "api" && w == "stop"),
        "{events:?}"
    );
    // Nothing listens at the old address any more, and the next plan has nothing to do.
    assert!(std::net::TcpStream::connect(format!("{old}:18080")).is_err());
    let out = support::cli::deploy_in(&p.fleet.dir)
        .args(["plan", site.to_str().unwrap()])
        .output()
        .expect("run deploy");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("\n0 steps in 0 waves"), "{plan}");
}

/// An api upgrade that also changes the port, under `on-failure "revert"`, whose `stop` refuses
/// on app2: app1 switched to 2.0 at the new port, then is switched back to 1.0 at the old one
/// while a client sends requests through haproxy. None fails: haproxy drops app1 before its
/// revert stops it and lists it again at the old port once its check passed; app2, which kept
/// serving 1.0 at the old port when its `stop` refused, is never listed at the new one. With
/// `drain=#true`, the same, and the revert of a same-port upgrade drops the host too.
fn a_revert_repoints_the_dependents(new_port: u16, drain: bool) {
    let p = Proxied::start();
    p.apply("1.0", 18080, drain);
    let refuse =
        r#"if [ "$DEPLOY_HOST" = app2 ] && [ "$DEPLOY_NEW_VERSION" = 2.0 ]; then exit 1; fi"#;
    let revert = "on-failure \"revert\";";
    let site = p.write_with("2.0", new_port, drain, refuse, revert);
    let before = p.events().len();
    let mut out = None;
    let seen = with_traffic(p.lb(), || {
        out = Some(
            support::cli::deploy_in(&p.fleet.dir)
                .args(["apply", site.to_str().unwrap(), "--yes"])
                .output()
                .expect("run deploy"),
        );
    });
    let out = out.expect("applied");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("api: REVERTED"), "{said}");
    assert_served(&seen, "the revert");
    let events = p.events();
    let events = &events[before..];
    let configs = configs(events);
    let at = |host: &str, what: &str| -> Vec<u128> {
        events
            .iter()
            .filter(|(_, h, w, s)| h == host && w == what && s == "api")
            .map(|(ns, ..)| *ns)
            .collect()
    };
    let old = |h: &str| format!("{}:18080", p.fleet.address(h));
    // app1 stopped twice: for 2.0, then for its revert; its last check is 1.0's.
    let stops = at("app1", "stop");
    assert_eq!(stops.len(), 2, "{events:?}");
    let back = *at("app1", "checked").last().expect("app1 checked");
    assert!(back > stops[1], "{events:?}");
    let listed_at = |ns: u128| {
        configs
            .iter()
            .rfind(|(at, _)| *at < ns)
            .map(|(_, servers)| servers.clone())
            .unwrap_or_else(|| panic!("haproxy never reloaded before {ns}: {configs:?}"))
    };
    assert!(
        !listed_at(stops[1]).iter().any(|(h, _)| h == "app1"),
        "app1's revert stopped it while haproxy listed it: {configs:?}"
    );
    for (ns, servers) in configs.iter().filter(|(ns, _)| *ns > stops[1]) {
        if let Some((_, at)) = servers.iter().find(|(h, _)| h == "app1") {
            assert!(
                *ns > back && *at == old("app1"),
                "app1 listed at {at} at {ns}, its revert checked at {back}: {configs:?}"
            );
        }
    }
    // app2 never served at the new port: never listed there.
    if new_port != 18080 {
        let new = format!("{}:{new_port}", p.fleet.address("app2"));
        assert!(
            !configs
                .iter()
                .any(|(_, s)| s.contains(&("app2".to_string(), new.clone()))),
            "app2 listed at {new}, where it never served: {configs:?}"
        );
    }
    let last = &configs.last().expect("configs").1;
    for host in API {
        assert!(
            last.contains(&(host.to_string(), old(host))),
            "haproxy ends listing {host} at {}: {configs:?}",
            old(host)
        );
    }
    let cfg = std::fs::read_to_string(p.fleet.host_root("lb1").join("srv/lb/haproxy.cfg"))
        .expect("haproxy.cfg");
    for host in API {
        assert!(
            cfg.contains(&format!("server {host} {} check", old(host))),
            "{cfg}"
        );
    }
}

#[test]
fn a_revert_of_a_port_change_repoints_the_load_balancer_and_fails_no_request() {
    a_revert_repoints_the_dependents(18081, false);
}

#[test]
fn a_revert_under_drain_drops_the_host_first_and_fails_no_request() {
    a_revert_repoints_the_dependents(18080, true);
}
