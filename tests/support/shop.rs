//! A three-class shop (db, app, lb) on a real sshd fleet, whose hooks log timestamped events
//! on each host, for rollout tests.

use super::fleet::{Fleet, FleetHost};
use std::path::PathBuf;
use std::process::Output;

/// What the site declares; tests change versions and policies between runs.
#[derive(Clone, Debug)]
pub struct Spec {
    pub db: &'static str,
    pub api: &'static str,
    pub lb: &'static str,
    /// The body of the default policy (batch, max-failed, …).
    pub policy: &'static str,
    /// The body of api's own policy.
    pub api_policy: &'static str,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            db: "1.0",
            api: "1.0",
            lb: "1.0",
            policy: r#"batch 1; max-failed 0"#,
            api_policy: r#"batch 2; max-failed 0"#,
        }
    }
}

/// One line a hook wrote on a host: `<ns> <what> <service> <old> <new>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ev {
    pub ns: u128,
    pub what: String,
    pub service: String,
    pub old: String,
    pub new: String,
}

pub struct Shop {
    pub fleet: Fleet,
}

/// Appends an event line to the host's /var/lib/events.
/// The hosts' state directory in the shop's platform.
pub const STATE_DIR: &str = "/var/lib/drover";

const EV: &str = r#"ev() { echo "$(date +%s%N) $1 $DEPLOY_SERVICE ${DEPLOY_OLD_VERSION:--} ${DEPLOY_NEW_VERSION:--}" >> /var/lib/events; }; d=/srv/$DEPLOY_SERVICE; "#;

fn hooks() -> String {
    let serve = r#"cd $d && setsid nohup python3 -m http.server --bind "$DEPLOY_ADDRESS" "$DEPLOY_PORT" >$d/http.log 2>&1 </dev/null & echo $! > $d/pid"#;
    let check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; v = u.build_opener(u.ProxyHandler({})).open("http://%s:%s/version" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]), timeout=2).read().decode(); raise SystemExit(v != a["DEPLOY_NEW_VERSION"])'"#;
    format!(
        r####"
    stop #"{EV}ev stop; [ -f $d/pid ] && kill $(cat $d/pid); rm -f $d/pid; sleep 0.1"#
    install #"{EV}ev install; mkdir -p $d && printf %s "$DEPLOY_NEW_VERSION" > $d/version && env | grep ^DEPLOY_ | sort > $d/env"#
    migrate #"{EV}ev migrate"#
    start #"{EV}ev start; {serve}"#
    check #"{EV}[ ! -e /srv/fail-$DEPLOY_SERVICE ] && {check} && ev checked"# timeout="5s" interval="100ms"
    rollback #"{EV}ev rollback; [ -f $d/pid ] && kill $(cat $d/pid); sleep 0.1; printf %s "$DEPLOY_OLD_VERSION" > $d/version; {serve}"#
"####
    )
}

impl Shop {
    /// Starts the fleet: db1-3, app1-6, lb1-3, zones a/b/c.
    pub fn start() -> Shop {
        let zones = ["a", "b", "c"];
        let mut hosts = Vec::new();
        for i in 1..=3 {
            hosts.push(FleetHost::new(&format!("db{i}"), "db").tag("zone", zones[i - 1]));
        }
        for i in 1..=6 {
            hosts.push(FleetHost::new(&format!("app{i}"), "app").tag("zone", zones[(i - 1) % 3]));
        }
        for i in 1..=3 {
            hosts.push(FleetHost::new(&format!("lb{i}"), "lb").tag("zone", zones[i - 1]));
        }
        let fleet = Fleet::start(&hosts);
        fleet.write_platform(STATE_DIR);
        Shop { fleet }
    }

    /// Writes site.kdl (and its policies) for `spec`; returns its path.
    pub fn write(&self, spec: &Spec) -> PathBuf {
        let dir = &self.fleet.dir;
        std::fs::write(
            dir.join("policy.kdl"),
            format!("policy \"default\" {{ {} }}\n", spec.policy),
        )
        .expect("write policy");
        std::fs::write(
            dir.join("api-policy.kdl"),
            format!("policy \"api\" {{ {} }}\n", spec.api_policy),
        )
        .expect("write policy");
        let h = hooks();
        let site = format!(
            r#"site "shop" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "db" {{ service "db" }}
class "app" {{ service "api" }}
class "lb" {{ service "lb" }}
service "db" {{
    version "{db}"
    port 15432
{h}}}
service "api" {{
    version "{api}"
    port 18080
    needs "db"
    needs "lb" addressable="all"
    policy "api-policy.kdl"
{h}}}
service "lb" {{
    version "{lb}"
    port 18000
    needs "api" healthy="50%"
    needs "api" addressable="all"
{h}}}
"#,
            db = spec.db,
            api = spec.api,
            lb = spec.lb
        );
        let path = dir.join("site.kdl");
        std::fs::write(&path, site).expect("write site");
        path
    }

    /// Runs `deploy ARGS` in the fleet's directory (logs land in its .drover/).
    pub fn deploy(&self, args: &[&str]) -> Output {
        super::cli::deploy_in(&self.fleet.dir)
            .args(args)
            .output()
            .expect("run deploy")
    }

    /// The events the hooks recorded on `host`, oldest first.
    pub fn events(&self, host: &str) -> Vec<Ev> {
        let text = std::fs::read_to_string(self.fleet.host_root(host).join("var-lib/events"))
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Some(Ev {
                    ns: f.first()?.parse().ok()?,
                    what: f.get(1)?.to_string(),
                    service: f.get(2)?.to_string(),
                    old: f.get(3)?.to_string(),
                    new: f.get(4)?.to_string(),
                })
            })
            .collect()
    }

    /// Every event of every host, with its host.
    pub fn all_events(&self) -> Vec<(String, Ev)> {
        let mut all: Vec<(String, Ev)> = self
            .fleet
            .names()
            .iter()
            .flat_map(|h| self.events(h).into_iter().map(move |e| (h.to_string(), e)))
            .collect();
        all.sort_by_key(|(_, e)| e.ns);
        all
    }

    /// The host's state file, parsed.
    pub fn state(&self, host: &str) -> serde_json::Value {
        let text =
            std::fs::read_to_string(self.fleet.host_root(host).join("var-lib/drover/state.json"))
                .unwrap_or_else(|e| panic!("state of {host}: {e}"));
        serde_json::from_str(&text).expect("state is JSON")
    }

    /// The version `service` records on `host`.
    pub fn version(&self, host: &str, service: &str) -> String {
        self.state(host)["services"][service]["version"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// What the service's HTTP server on `host` serves now.
    pub fn serving(&self, host: &str, service: &str) -> String {
        let out = self.fleet.ssh(host, &format!("python3 -c 'import urllib.request as u; print(u.build_opener(u.ProxyHandler({{}})).open(\"http://{}:{}/version\", timeout=2).read().decode())'", self.fleet.address(host), port(service)));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn hosts_of(&self, class: &str) -> Vec<String> {
        self.fleet
            .names()
            .into_iter()
            .filter(|n| n.starts_with(class))
            .map(String::from)
            .collect()
    }
}

pub fn port(service: &str) -> u16 {
    match service {
        "db" => 15432,
        "api" => 18080,
        _ => 18000,
    }
}

/// The most hosts of `service` that were at once between their first hook and a passing check.
pub fn max_in_flight(events: &[(String, Ev)], service: &str) -> usize {
    let mut open = std::collections::BTreeSet::new();
    let mut max = 0;
    for (host, e) in events.iter().filter(|(_, e)| e.service == service) {
        match e.what.as_str() {
            "stop" | "install" => {
                open.insert(host.clone());
            }
            "checked" | "rollback" => {
                open.remove(host);
            }
            _ => {}
        }
        max = max.max(open.len());
    }
    max
}
