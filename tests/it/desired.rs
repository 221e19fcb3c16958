//! Desired state on a real sshd fleet: a host is converged only when each service runs with
//! exactly the inputs the site gives it. Hook, env, file, template and secret changes redo only
//! the service they belong to, within its batch; pool changes reach dependents in order; a
//! failed reload puts the previous files back; large files are streamed and sent once; a
//! secret's value is written nowhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;
use support::fleet::{Fleet, FleetHost};
use support::hooks::{write_platform_without, EV};

/// What the site says; tests change one thing at a time.
#[derive(Clone)]
struct Conf {
    lb_install: &'static str,
    lb_start: &'static str,
    lb_rollback: &'static str,
    mode: &'static str,
    /// lb's batch.
    batch: u32,
}

impl Default for Conf {
    fn default() -> Self {
        Conf {
            lb_install: "ev install",
            lb_start: "ev start",
            lb_rollback: "ev rollback",
            mode: "fast",
            batch: 1,
        }
    }
}

struct Site {
    fleet: Fleet,
    /// Hosts left out of the inventory.
    hidden: Vec<&'static str>,
    /// `CONF_TOKEN`, the secret.
    token: String,
    home: tempfile::TempDir,
}

impl Site {
    fn start(apps: usize, lbs: usize) -> Site {
        let mut hosts = Vec::new();
        for i in 1..=apps {
            hosts.push(FleetHost::new(&format!("app{i}"), "app"));
        }
        for i in 1..=lbs {
            hosts.push(FleetHost::new(&format!("lb{i}"), "lb"));
        }
        let fleet = Fleet::start(&hosts);
        std::fs::write(
            fleet.dir.join("lb.cfg.j2"),
            "# {{ host }} ({{ env.MODE }})\n{% for h in needs.api %}server {{ h.host }} {{ h.address }}:{{ h.port }}\n{% endfor %}",
        )
        .expect("template");
        std::fs::write(fleet.dir.join("static.txt"), "static one\n").expect("static");
        Site {
            fleet,
            hidden: Vec::new(),
            token: "t0ken-Xq9-first".into(),
            home: tempfile::tempdir().expect("home"),
        }
    }

    fn write(&self, c: &Conf) -> PathBuf {
        write_platform_without(&self.fleet, &self.hidden);
        let dir = &self.fleet.dir;
        std::fs::write(
            dir.join("policy.kdl"),
            "policy \"default\" { batch 1; max-failed 0; }\n",
        )
        .expect("policy");
        std::fs::write(
            dir.join("lb-policy.kdl"),
            format!("policy \"lb\" {{ batch {}; max-failed 0; }}\n", c.batch),
        )
        .expect("policy");
        let serve = r#"cd /srv/api && setsid nohup python3 -m http.server --bind "$DEPLOY_ADDRESS" "$DEPLOY_PORT" >/srv/api/log 2>&1 </dev/null & echo $! >/srv/api/pid"#;
        let check = r#"python3 -c 'import os, urllib.request as u; a = os.environ; v = u.build_opener(u.ProxyHandler({})).open("http://%s:%s/version" % (a["DEPLOY_ADDRESS"], a["DEPLOY_PORT"]), timeout=2).read().decode(); raise SystemExit(v != a["DEPLOY_NEW_VERSION"])'"#;
        let site = format!(
            r####"site "conf" {{
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
    env "TZ" "UTC"
}}
class "app" {{ service "api" }}
class "lb" {{ service "lb" }}
service "api" {{
    port 18080
    stop #"{EV}ev stop; [ -f /srv/api/pid ] && kill $(cat /srv/api/pid); rm -f /srv/api/pid; sleep 0.1"#
    install #"{EV}ev install; mkdir -p /srv/api && printf %s "$DEPLOY_NEW_VERSION" >/srv/api/version"#
    start #"{EV}ev start; {serve}"#
    check #"{check} && {EV}ev checked"# timeout="5s" interval="100ms"
}}
service "lb" {{
    port 18000
    needs "api" addressable="all"
    policy "lb-policy.kdl"
    env "MODE" "{mode}"
    secret "TOKEN" env="CONF_TOKEN"
    file "lb.cfg.j2" to="/srv/lb/upstreams" template=#true
    file "static.txt" to="/srv/lb/static.txt" mode="0640"
    stop #"{EV}ev stop"#
    install #"{EV}{install}; [ -n "$TOKEN" ] && [ -n "$MODE" ] && [ "$TZ" = UTC ]"#
    start #"{EV}{start}"#
    reload #"{EV}ev reload; [ ! -e /srv/fail-reload ]"#
    check #"{EV}ev checked; [ -s /srv/lb/upstreams ]"# timeout="5s" interval="100ms"
    rollback #"{EV}{rollback}"#
}}
"####,
            mode = c.mode,
            install = c.lb_install,
            start = c.lb_start,
            rollback = c.lb_rollback,
        );
        let path = dir.join("site.kdl");
        std::fs::write(&path, site).expect("site");
        path
    }

    fn deploy(&self, args: &[&str]) -> Output {
        self.deploy_with(args, Some(&self.token))
    }

    /// `deploy ARGS…` with the secret's variable set to `token`, or unset.
    fn deploy_with(&self, args: &[&str], token: Option<&str>) -> Output {
        let mut cmd = support::cli::deploy_in(&self.fleet.dir);
        match token {
            Some(t) => cmd.env("CONF_TOKEN", t),
            None => cmd.env_remove("CONF_TOKEN"),
        };
        cmd.args(args)
            .env("HOME", self.home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("DROVER_FINGERPRINT_KEY")
            .output()
            .expect("run deploy")
    }

    fn apply(&self, c: &Conf) -> Output {
        let site = self.write(c);
        self.deploy(&["apply", site.to_str().unwrap(), "--yes"])
    }

    fn apply_ok(&self, c: &Conf) -> String {
        let out = self.apply(c);
        assert_eq!(out.status.code(), Some(0), "apply failed:\n{}", text(&out));
        text(&out)
    }

    fn plan(&self, c: &Conf) -> String {
        let site = self.write(c);
        text(&self.deploy(&["plan", site.to_str().unwrap()]))
    }

    /// `(ns, host, what, service)` of every hook event, oldest first.
    fn events(&self) -> Vec<(u128, String, String, String)> {
        support::hooks::events(&self.fleet)
    }

    fn file(&self, host: &str, path: &str) -> String {
        std::fs::read_to_string(self.fleet.host_root(host).join(path)).unwrap_or_default()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Events after `from` as `host what`.
fn since(all: &[(u128, String, String, String)], from: usize) -> Vec<String> {
    all[from..]
        .iter()
        .map(|(_, h, w, _)| format!("{h} {w}"))
        .collect()
}

/// The most lb hosts between their first hook and their check at once.
fn lb_in_flight(all: &[(u128, String, String, String)], from: usize) -> usize {
    let mut open = std::collections::BTreeSet::new();
    let mut max = 0;
    for (_, host, what, service) in &all[from..] {
        if service != "lb" {
            continue;
        }
        if what == "checked" {
            open.remove(host);
        } else {
            open.insert(host.clone());
        }
        max = max.max(open.len());
    }
    max
}

/// Which hooks a reconfigure runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum By {
    /// Files, `reload`, `check`.
    Reload,
    /// `stop`, files, `install`, `start`, `check`, at the same version.
    SwitchOver,
}

/// Applies `c` after a change: only lb's hosts are reconfigured (`by` the reload or the
/// switch-over), at most `batch` at once, the plan names `reason` and the path, and applying
/// again runs no hook.
fn only_lb_reconfigured(s: &Site, c: &Conf, reason: &str, by: By) {
    let plan = s.plan(c);
    let lines: Vec<&str> = plan.lines().filter(|l| l.contains("reconfigure")).collect();
    assert_eq!(lines.len(), 2, "two lb hosts are reconfigured:\n{plan}");
    let path = match by {
        By::Reload => ") by reload: ",
        By::SwitchOver => ") by switch-over, restarting for ",
    };
    assert!(
        lines
            .iter()
            .all(|l| l.contains("reconfigure 1.0 (") && l.contains(reason) && l.contains(path)),
        "the plan names the reason `{reason}` and the path {by:?}:\n{plan}"
    );
    let before = s.events().len();
    s.apply_ok(c);
    let all = s.events();
    let mut ran = since(&all, before);
    ran.sort();
    let hooks: &[&str] = match by {
        By::Reload => &["checked", "reload"],
        By::SwitchOver => &["checked", "install", "start", "stop"],
    };
    let want: Vec<String> = ["lb1", "lb2"]
        .iter()
        .flat_map(|h| hooks.iter().map(move |w| format!("{h} {w}")))
        .collect();
    assert_eq!(
        ran, want,
        "after a change of {reason}, only lb is reconfigured, by {by:?}"
    );
    assert_eq!(lb_in_flight(&all, before), 1, "within lb's batch of 1");
    let again = s.events().len();
    s.apply_ok(c);
    assert_eq!(
        s.events().len(),
        again,
        "a second apply runs no hook ({reason})"
    );
}

#[test]
fn a_changed_install_hook_runs_even_when_the_service_has_reload() {
    let s = Site::start(1, 2);
    let mut c = Conf::default();
    s.apply_ok(&c);
    // The new install hook's text runs, in the whole switch-over, at the same version.
    c.lb_install = r#"ev "install2:$DEPLOY_OLD_VERSION:$DEPLOY_NEW_VERSION""#;
    let plan = s.plan(&c);
    for lb in ["lb1", "lb2"] {
        assert!(
            plan.contains(&format!(
                "reconfigure 1.0 (hooks: install) by switch-over, restarting for hook:install: \
                 {lb}\n"
            )),
            "the plan says the path and why:\n{plan}"
        );
    }
    let before = s.events().len();
    s.apply_ok(&c);
    let mut ran = since(&s.events(), before);
    ran.sort();
    assert_eq!(
        ran,
        [
            "lb1 checked",
            "lb1 install2:1.0:1.0",
            "lb1 start",
            "lb1 stop",
            "lb2 checked",
            "lb2 install2:1.0:1.0",
            "lb2 start",
            "lb2 stop"
        ],
        "the new install hook ran, between stop and start, with old = new"
    );
    let again = s.events().len();
    s.apply_ok(&c);
    assert_eq!(s.events().len(), again, "converged once the new hook ran");
    // Only a file: the reload.
    std::fs::write(s.fleet.dir.join("static.txt"), "static two\n").expect("static");
    let plan = s.plan(&c);
    for lb in ["lb1", "lb2"] {
        assert!(
            plan.contains(&format!(
                "reconfigure 1.0 (file: /srv/lb/static.txt) by reload: {lb}\n"
            )),
            "{plan}"
        );
    }
    let before = s.events().len();
    s.apply_ok(&c);
    let mut ran = since(&s.events(), before);
    ran.sort();
    assert_eq!(
        ran,
        ["lb1 checked", "lb1 reload", "lb2 checked", "lb2 reload"],
        "a file alone: only the reload and the check"
    );
    assert_eq!(s.file("lb2", "srv/lb/static.txt"), "static two\n");
    // Only the rollback hook: no running process uses it; the new inputs are recorded, no
    // hook runs, and the hosts are converged with it.
    c.lb_rollback = "ev rollback; true";
    let plan = s.plan(&c);
    for lb in ["lb1", "lb2"] {
        assert!(
            plan.contains(&format!(
                "reconfigure 1.0 (hooks: rollback) recorded only, nothing running uses it: {lb}\n"
            )),
            "{plan}"
        );
    }
    let before = s.events().len();
    s.apply_ok(&c);
    assert_eq!(
        since(&s.events(), before),
        Vec::<String>::new(),
        "no hook ran"
    );
    let plan = s.plan(&c);
    assert!(
        plan.contains("skipped, converged: lb1"),
        "recorded:\n{plan}"
    );
}

#[test]
fn each_kind_of_input_change_redoes_only_its_service() {
    let mut s = Site::start(2, 2);
    let mut c = Conf::default();
    s.apply_ok(&c);
    let fresh = s.events().len();
    assert_eq!(
        fresh,
        2 * 3 + 2 * 3,
        "install, start, checked on every host"
    );
    let upstreams = s.file("lb1", "srv/lb/upstreams");
    assert!(upstreams.starts_with("# lb1 (fast)\n"), "{upstreams}");
    assert!(upstreams.contains(&format!("server app2 {}:18080", s.fleet.address("app2"))));
    assert_eq!(s.file("lb2", "srv/lb/static.txt"), "static one\n");
    let mode = std::fs::metadata(s.fleet.host_root("lb2").join("srv/lb/static.txt"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .unwrap_or(0);
    assert_eq!(mode, 0o640, "the file has the mode the site gives");
    s.apply_ok(&c);
    assert_eq!(s.events().len(), fresh, "a converged site runs no hook");

    c.lb_start = "ev start; true";
    only_lb_reconfigured(&s, &c, "hooks: start", By::SwitchOver);
    c.mode = "slow";
    only_lb_reconfigured(&s, &c, "env: MODE", By::SwitchOver);
    assert!(s
        .file("lb2", "srv/lb/upstreams")
        .starts_with("# lb2 (slow)"));
    std::fs::write(s.fleet.dir.join("static.txt"), "static two\n").expect("static");
    only_lb_reconfigured(&s, &c, "file: /srv/lb/static.txt", By::Reload);
    assert_eq!(s.file("lb1", "srv/lb/static.txt"), "static two\n");
    // What the placements replaced is let go once their steps passed (renamed away at once,
    // removed in the background): nothing is kept beside the files but the generations the
    // platform keeps (`keep-generations`, 3 by default: the file and two it replaced).
    for lb in ["lb1", "lb2"] {
        let private = s.fleet.host_root(lb).join("srv/lb/.drover");
        assert_eq!(
            std::fs::read_to_string(private.join("static.txt.gen.1"))
                .ok()
                .as_deref(),
            Some("static one\n"),
            "{lb} keeps what the placement replaced"
        );
        assert!(
            s.fleet.host_root(lb).join("srv/lb/.drover").is_dir(),
            "{lb}: the placements worked beside the files"
        );
        assert_eq!(
            kept_once_let_go(&s.fleet, lb),
            Vec::<String>::new(),
            "{lb} keeps no previous file"
        );
        // The command that let go gave the host's lock back too.
        assert!(
            !s.fleet.host_root(lb).join("var-lib/drover/lock").exists(),
            "{lb}'s lock was given back"
        );
    }
    std::fs::write(
        s.fleet.dir.join("lb.cfg.j2"),
        "{% for h in needs.api %}backend {{ h.host }}\n{% endfor %}",
    )
    .expect("template");
    only_lb_reconfigured(&s, &c, "file: /srv/lb/upstreams", By::Reload);
    assert_eq!(
        s.file("lb1", "srv/lb/upstreams"),
        "backend app1\nbackend app2\n"
    );
    s.token = "t0ken-Xq9-second".into();
    only_lb_reconfigured(&s, &c, "secret: TOKEN", By::SwitchOver);
    // A list of what an earlier placement replaced, as a step cut off after its placement
    // leaves it (or a let-go that never got through): the next step of the service to pass
    // lets go of it, even one that places nothing (an env change here), and gives the lock
    // back with it.
    let root = s.fleet.host_root("lb1");
    std::fs::write(root.join("srv/lb/.drover/static.txt.prev"), "static zero\n").expect("copy");
    std::fs::create_dir_all(root.join("var-lib/drover/files/prev")).expect("prev");
    let list = root.join("var-lib/drover/files/prev/lb");
    std::fs::write(&list, "+ /srv/lb/static.txt\n").expect("list");
    let placed_nothing = || grep(&s.fleet.dir.join(".drover"), b"the host had every content").len();
    let before = placed_nothing();
    c.mode = "fast";
    only_lb_reconfigured(&s, &c, "env: MODE", By::SwitchOver);
    assert_eq!(placed_nothing(), before + 2, "both lb steps placed nothing");
    assert_eq!(
        kept_once_let_go(&s.fleet, "lb1"),
        Vec::<String>::new(),
        "the stale copy went"
    );
    assert!(!list.exists(), "the stale list went");
    assert_eq!(s.file("lb1", "srv/lb/static.txt"), "static two\n");
    assert!(
        !root.join("var-lib/drover/lock").exists(),
        "lb1's lock was given back"
    );

    // Neither value is in any file the hosts or the controller keep.
    for token in ["t0ken-Xq9-first", "t0ken-Xq9-second"] {
        for root in [s.fleet.dir.as_path(), s.home.path()] {
            let found = grep(root, token.as_bytes());
            assert!(found.is_empty(), "the secret is written in {found:?}");
        }
    }
}

/// Files under `root` containing `needle`.
fn grep(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                todo.push(p);
            } else if meta.is_file() && meta.len() < 64 << 20 {
                if let Ok(bytes) = std::fs::read(&p) {
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

/// A secret this controller cannot read (its variable unset) is taken as the hosts recorded it:
/// `plan`, `status` and `verify` find the converged site converged and name the secret once on
/// stderr; `apply`, whose steps would need its value, refuses before touching a host.
#[test]
fn an_unreadable_secret_is_taken_as_the_hosts_recorded_it() {
    let s = Site::start(1, 2);
    let c = Conf::default();
    s.apply_ok(&c);
    let before = s.events().len();
    let site = s.write(&c);
    let site = site.to_str().unwrap();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let named_once = |what: &str, out: &Output| {
        let err = stderr(out);
        assert_eq!(
            err.matches("CONF_TOKEN").count(),
            1,
            "{what} names the unreadable secret once on stderr:\n{}",
            text(out)
        );
        assert!(err.contains("TOKEN"), "{err}");
    };

    let plan = s.deploy_with(&["plan", site], None);
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan));
    let out = String::from_utf8_lossy(&plan.stdout);
    assert!(
        !out.contains("reconfigure") && out.contains("skipped, converged: lb1, lb2"),
        "nothing to do:\n{}",
        text(&plan)
    );
    named_once("plan", &plan);

    let status = s.deploy_with(&["status", site], None);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(
        !out.contains("diverged") && out.contains("converged"),
        "every host converged:\n{}",
        text(&status)
    );
    named_once("status", &status);

    let verify = s.deploy_with(&["verify", site], None);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stdout).starts_with("verified:"),
        "{}",
        text(&verify)
    );
    named_once("verify", &verify);

    // The checks ran (verify reads the hosts), nothing else did.
    let ran = since(&s.events(), before);
    assert!(
        ran.iter().all(|e| e.ends_with(" checked")) && ran.len() == 3,
        "verify ran only the checks: {ran:?}"
    );

    // A step would need the value: apply refuses before touching a host.
    std::fs::write(s.fleet.dir.join("static.txt"), "static two\n").expect("static");
    let before = s.events().len();
    let apply = s.deploy_with(&["apply", site, "--yes"], None);
    assert_eq!(apply.status.code(), Some(5), "{}", text(&apply));
    assert!(stderr(&apply).contains("CONF_TOKEN"), "{}", text(&apply));
    assert_eq!(s.events().len(), before, "no hook ran");
    assert_eq!(s.file("lb1", "srv/lb/static.txt"), "static one\n");
}

#[test]
fn a_new_pool_member_is_listed_after_it_serves_and_a_removed_one_at_once() {
    let mut s = Site::start(3, 1);
    s.hidden = vec!["app3"];
    let c = Conf::default();
    s.apply_ok(&c);
    assert!(!s.file("lb1", "srv/lb/upstreams").contains("app3"));

    s.hidden.clear();
    let plan = s.plan(&c);
    assert!(
        plan.contains(
            "reconfigure 1.0 (needs api: +app3; file: /srv/lb/upstreams; after api on app3) by reload: lb1"
        ),
        "{plan}"
    );
    let before = s.events().len();
    s.apply_ok(&c);
    let all = s.events();
    let at = |host: &str, what: &str| {
        all[before..]
            .iter()
            .find(|(_, h, w, _)| h == host && w == what)
            .map(|(ns, ..)| *ns)
            .unwrap_or_else(|| panic!("no {what} on {host}: {:?}", since(&all, before)))
    };
    assert!(
        at("app3", "checked") < at("lb1", "reload"),
        "lb1 reloads only after app3's api passed its check"
    );
    let mut ran = since(&all, before);
    ran.sort();
    assert_eq!(
        ran,
        [
            "app3 checked",
            "app3 install",
            "app3 start",
            "lb1 checked",
            "lb1 reload"
        ]
    );
    let upstreams = s.file("lb1", "srv/lb/upstreams");
    assert!(
        upstreams.contains(&format!("server app3 {}:18080", s.fleet.address("app3"))),
        "{upstreams}"
    );

    s.hidden = vec!["app2"];
    let plan = s.plan(&c);
    assert!(
        plan.contains("reconfigure 1.0 (needs api: -app2; file: /srv/lb/upstreams) by reload: lb1"),
        "{plan}"
    );
    assert!(
        !plan.contains("after api"),
        "a removed member is dropped without waiting"
    );
    s.apply_ok(&c);
    let upstreams = s.file("lb1", "srv/lb/upstreams");
    assert!(
        !upstreams.contains("app2") && upstreams.contains("app3"),
        "{upstreams}"
    );
}

#[test]
fn a_failed_reload_puts_the_previous_files_back_and_rolls_back() {
    let s = Site::start(1, 2);
    let c = Conf::default();
    s.apply_ok(&c);
    let old = s.file("lb1", "srv/lb/upstreams");
    std::fs::write(s.fleet.dir.join("lb.cfg.j2"), "changed {{ host }}\n").expect("template");
    std::fs::write(s.fleet.host_root("lb1").join("srv/fail-reload"), "").expect("fail");
    let before = s.events().len();
    let out = s.apply(&c);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed host fails the run:\n{}",
        text(&out)
    );
    assert_eq!(
        s.file("lb1", "srv/lb/upstreams"),
        old,
        "the previous file is back"
    );
    let ran = since(&s.events(), before);
    assert!(ran.contains(&"lb1 rollback".to_string()), "{ran:?}");
    let state: serde_json::Value =
        serde_json::from_str(&s.file("lb1", "var-lib/drover/state.json")).expect("state");
    assert_eq!(state["services"]["lb"]["configured"]["outcome"], "failure");
    assert_eq!(state["services"]["lb"]["configured"]["hook"], "reload");
    // The status says so, and the next apply (reload fixed) converges.
    std::fs::remove_file(s.fleet.host_root("lb1").join("srv/fail-reload")).expect("unfail");
    s.apply_ok(&c);
    assert_eq!(s.file("lb1", "srv/lb/upstreams"), "changed lb1\n");
}

#[test]
fn a_large_file_is_streamed_once_and_never_held_whole() {
    let hosts: Vec<FleetHost> = (1..=12)
        .map(|i| FleetHost::new(&format!("h{i}"), "box"))
        .collect();
    let fleet = Fleet::start(&hosts);
    fleet.write_platform("/var/lib/drover");
    let big = fleet.dir.join("big.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&big).expect("big");
        let mut block = vec![0u8; 1 << 20];
        for i in 0..200u32 {
            block[..4].copy_from_slice(&i.to_le_bytes());
            f.write_all(&block).expect("write");
        }
    }
    let site = |mode: &str| {
        format!(
            r##"site "big" {{ version "1.0"; platform "platform.kdl" }}
class "box" {{ service "art" }}
service "art" {{
    env "MODE" "{mode}"
    file "big.bin" to="/opt/art/big.bin"
    reload "true"
    check #"[ $(stat -c %s /opt/art/big.bin) = 209715200 ]"#
}}
"##
        )
    };
    let run = |mode: &str| -> (Output, u64) {
        std::fs::write(fleet.dir.join("site.kdl"), site(mode)).expect("site");
        // The controller's peak RSS (VmHWM), sampled until it exits.
        let script = format!(
            "{} apply site.kdl --yes >out.txt 2>&1 & p=$!; m=0; while kill -0 $p 2>/dev/null; do v=$(awk '/VmHWM/ {{print $2}}' /proc/$p/status 2>/dev/null); [ -n \"$v\" ] && [ \"$v\" -gt $m ] && m=$v; sleep 0.05; done; wait $p; c=$?; echo $m >peak.txt; exit $c",
            env!("CARGO_BIN_EXE_deploy")
        );
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .current_dir(&fleet.dir)
            .output()
            .expect("run");
        let peak = std::fs::read_to_string(fleet.dir.join("peak.txt"))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0);
        (out, peak)
    };
    let (out, peak_kib) = run("a");
    let log = std::fs::read_to_string(fleet.dir.join("out.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{log}");
    for h in fleet.names() {
        let got = std::fs::metadata(fleet.host_root(h).join("opt/art/big.bin")).map(|m| m.len());
        assert_eq!(got.ok(), Some(200 << 20), "{h} has the whole file");
    }
    assert!(peak_kib > 0, "sampled the controller");
    assert!(
        peak_kib < 64 * 1024,
        "the controller's peak RSS ({peak_kib} KiB) is far below the file's 200 MiB"
    );
    // A reconfigure (env changed) finds the file in place on each host: nothing sent.
    let (out, _) = run("b");
    let log = std::fs::read_to_string(fleet.dir.join("out.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{log}");
    let logs = grep(&fleet.dir.join(".drover"), b"the host had every content");
    assert_eq!(
        logs.len(),
        12,
        "every host's second step sent no file bytes: {logs:?}"
    );
    let sent = grep(&fleet.dir.join(".drover"), b"sent 1 content");
    assert_eq!(
        sent.len(),
        12,
        "the first apply sent the content once to each host"
    );
}

/// What `host` keeps in `srv/lb/.drover` once the background removals of a let-go ended (at
/// most 10 s), but for the generations the platform keeps (`<name>.gen.<n>`).
fn kept_once_let_go(fleet: &Fleet, host: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let left = || {
        let mut kept = others_in(fleet, host, "srv/lb/.drover", &[]);
        kept.retain(|n| {
            !n.rsplit_once(".gen.")
                .is_some_and(|(_, j)| !j.is_empty() && j.bytes().all(|b| b.is_ascii_digit()))
        });
        kept
    };
    let mut kept = left();
    while !kept.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        kept = left();
    }
    kept
}

/// What `host` has in `dir` (under its root) besides `names`.
fn others_in(fleet: &Fleet, host: &str, dir: &str, names: &[&str]) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(fleet.host_root(host).join(dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !names.contains(&n.as_str()))
        .collect();
    left.sort();
    left
}

#[test]
fn a_source_changed_during_the_run_is_neither_placed_nor_kept() {
    let fleet = Fleet::start(&[FleetHost::new("a1", "a"), FleetHost::new("b1", "b")]);
    fleet.write_platform("/var/lib/drover");
    let source = fleet.dir.join("conf.txt");
    std::fs::write(&source, "first\n").expect("source");
    // `edit` runs before `art` (which needs it) and rewrites art's file on the controller
    // (the fleet's directory is not one the hosts mount over): after the run read it.
    let site = |version: &str| {
        format!(
            r##"site "edit" {{ version "{version}"; platform "platform.kdl" }}
class "a" {{ service "edit" }}
class "b" {{ service "art" }}
service "edit" {{
    install #"printf 'changed by %s\n' "$DEPLOY_NEW_VERSION" >'{src}'"#
}}
service "art" {{
    needs "edit"
    file "conf.txt" to="/srv/art/conf.txt"
    install "true"
}}
"##,
            src = source.display()
        )
    };
    std::fs::write(fleet.dir.join("site.kdl"), site("1")).expect("site");
    let out = support::cli::deploy_in(&fleet.dir)
        .args(["apply", "site.kdl", "--yes"])
        .output()
        .expect("run deploy");
    let log = text(&out);
    assert_ne!(out.status.code(), Some(0), "{log}");
    assert!(
        log.contains("changed after this run read it"),
        "the step says why: {log}"
    );
    assert_eq!(
        others_in(&fleet, "b1", "srv/art", &[".drover"]),
        Vec::<String>::new(),
        "nothing was put in place"
    );
    assert_eq!(
        others_in(&fleet, "b1", "srv/art/.drover", &[]),
        Vec::<String>::new(),
        "nothing of what arrived was kept"
    );
    // The next run reads the new content and delivers it (edit writes the same text again).
    let out = support::cli::deploy_in(&fleet.dir)
        .args(["apply", "site.kdl", "--yes"])
        .output()
        .expect("run deploy");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(fleet.host_root("b1").join("srv/art/conf.txt")).unwrap(),
        "changed by 1\n"
    );
    assert_eq!(
        others_in(&fleet, "b1", "srv/art", &["conf.txt", ".drover"]),
        Vec::<String>::new()
    );
    assert_eq!(
        others_in(&fleet, "b1", "srv/art/.drover", &[]),
        Vec::<String>::new()
    );
}
