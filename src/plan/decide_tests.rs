//! Which path a reconfigure takes: the reload only when every changed input is one a running
//! service takes without restarting, and the service has `reload`.

use super::*;
use crate::secrets::Secrets;
use crate::state::{Inputs, ServiceRecord};

/// Loads a site of one app host (api) and one lb host (lb: `lb` added to its service node,
/// `reload` when `reload`), with the file `cfg.txt` holding `cfg`.
fn load(lb: &str, reload: bool, cfg: &str) -> (tempfile::TempDir, Site, Hosts) {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    w("cfg.txt", cfg);
    w(
        "platform.kdl",
        "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
         host \"app1\" address=\"10.0.0.1\" class=\"app\"\n\
         host \"lb1\" address=\"10.0.1.1\" class=\"lb\"\n} }",
    );
    let reload = if reload { "reload \"lb reload\"" } else { "" };
    w(
        "site.kdl",
        &format!(
            r#"site "s" {{ version "1.0"; platform "platform.kdl" }}
class "app" {{ service "api" }}
class "lb" {{ service "lb" }}
service "api" {{ port 8080; start "run api" }}
service "lb" {{
    needs "api" addressable="all"
    file "cfg.txt" to="/etc/lb.cfg"
    {reload}
    {lb}
}}
"#
        ),
    );
    let site = crate::site::load(&dir.path().join("site.kdl")).expect("site loads");
    let hosts = crate::inventory::resolve(&site).expect("hosts");
    (dir, site, hosts)
}

const BASE: &str = "install \"i1\"\nstart \"s1\"\nstop \"t1\"\ncheck \"c1\"\nrollback \"r1\"\n\
                    env \"MODE\" \"a\"\nport 80";

/// lb's inputs on lb1 under `lb` (and `secret`, the value of the site's secret TOKEN).
fn inputs(lb: &str, reload: bool, cfg: &str, secret: &str) -> Inputs {
    let (_dir, site, hosts) = load(lb, reload, cfg);
    let secrets = Secrets::from_values(vec![("TOKEN".into(), secret.into())], Default::default());
    let d = crate::desired::resolve(&site, &hosts, &secrets).expect("resolves");
    d.inputs(
        site.service("lb").expect("lb"),
        hosts.find("lb1").expect("lb1"),
    )
}

/// How lb1, recording `was`, is reconfigured under `lb` (with `reload` or not): its path and
/// the restarts named.
fn decided(was: Option<Inputs>, lb: &str, reload: bool, cfg: &str, secret: &str) -> Decided {
    let (_dir, site, hosts) = load(lb, reload, cfg);
    let secrets = Secrets::from_values(vec![("TOKEN".into(), secret.into())], Default::default());
    let desired = crate::desired::resolve(&site, &hosts, &secrets).expect("resolves");
    let mut record = ServiceRecord::at("1.0");
    record.inputs = was;
    let observed = Observed::Running {
        services: [("lb".to_string(), record)].into_iter().collect(),
    };
    let lb = site.service("lb").expect("lb");
    let d = decide(
        &site,
        &desired,
        lb,
        hosts.find("lb1").expect("lb1"),
        &observed,
    );
    let d = d.expect("read").expect("a step");
    assert_eq!(d.kind, StepKind::Reconfigure);
    d
}

#[test]
fn a_reconfigure_reloads_only_what_a_running_service_takes_without_restarting() {
    for reload in [true, false] {
        let was = inputs(BASE, reload, "one", "t");
        let path = |lb: &str, cfg: &str, secret: &str| {
            let d = decided(Some(was.clone()), lb, reload, cfg, secret);
            (d.path, d.restarts)
        };
        let edit = |from: &str, to: &str| BASE.replace(from, to);
        let restart = |keys: &[&str]| {
            let keys = keys.iter().map(|k| k.to_string()).collect::<Vec<_>>();
            (Path::SwitchOver, if reload { keys } else { Vec::new() })
        };
        // Taken without restarting: the reload path, with a `reload` hook only.
        let quiet = match reload {
            true => (Path::Reload, Vec::new()),
            false => (Path::SwitchOver, Vec::new()),
        };
        assert_eq!(path(BASE, "two", "t"), quiet, "a file");
        assert_eq!(path(&edit("c1", "c2"), "one", "t"), quiet, "the check hook");
        // Each switch-over hook, `env`, `port`, a secret: the whole switch-over.
        for (from, to, key) in [
            ("i1", "i2", "hook:install"),
            ("s1", "s2", "hook:start"),
            ("t1", "t2", "hook:stop"),
            ("\"a\"", "\"b\"", "env:MODE"),
            ("port 80", "port 81", "port"),
        ] {
            assert_eq!(path(&edit(from, to), "one", "t"), restart(&[key]), "{key}");
        }
        assert_eq!(
            path(&format!("{BASE}\nmigrate \"m\""), "one", "t"),
            restart(&["hook:migrate"])
        );
        assert_eq!(path(BASE, "one", "u"), restart(&["secret:TOKEN"]));
        // A restart wins over a file changed with it, and every key that needs it is named.
        assert_eq!(
            path(&edit("i1", "i2").replace("\"a\"", "\"b\""), "two", "t"),
            restart(&["env:MODE", "hook:install"])
        );
        // Only the rollback hook: nothing running uses it, the new inputs are recorded; with
        // a file, the file's path.
        assert_eq!(
            path(&edit("r1", "r2"), "one", "t"),
            (Path::Record, Vec::new())
        );
        assert_eq!(path(&edit("r1", "r2"), "two", "t"), quiet);
        // Nothing recorded of the configuration: the switch-over.
        let unknown = decided(None, BASE, reload, "one", "t");
        assert_eq!(
            (unknown.path, unknown.restarts),
            restart(&["configuration"])
        );
    }
    // The reload hook itself, and a `needs` address: the reload path.
    let was = inputs(BASE, true, "one", "t");
    let d = decided(
        Some(was.clone()),
        &format!("{BASE}\nreload \"lb reload 2\""),
        false,
        "one",
        "t",
    );
    assert_eq!(d.path, Path::Reload, "{:?}", d.reasons);
    let mut moved = was;
    moved
        .0
        .insert("needs:api".into(), "app1=10.0.0.9:8080".into());
    let d = decided(Some(moved), BASE, true, "one", "t");
    assert_eq!((d.path, d.restarts), (Path::Reload, Vec::new()));
}

#[test]
fn a_failed_check_makes_a_converged_host_a_repair_and_nothing_else() {
    let (_dir, site, hosts) = load(BASE, true, "one");
    let desired = crate::desired::resolve(&site, &hosts, &Secrets::none()).expect("resolves");
    let (lb, lb1) = (
        site.service("lb").expect("lb"),
        hosts.find("lb1").expect("lb1"),
    );
    let api = site.service("api").expect("api");
    let app1 = hosts.find("app1").expect("app1");
    // Both hosts converged; app1's api at another version.
    let mut observed: Vec<Observed> = hosts
        .hosts
        .iter()
        .map(|h| {
            let service = if &*h.name == "lb1" { "lb" } else { "api" };
            let version = if service == "api" { "0.9" } else { "1.0" };
            Observed::Running {
                services: [(service.to_string(), ServiceRecord::at(version))]
                    .into_iter()
                    .collect(),
            }
        })
        .collect();
    desired.stamp(&site, &mut observed);
    let mut selection = Selection::default();
    let plan = |selection: &Selection| {
        super::super::plan(&site, &hosts, &observed, &desired, selection).expect("plans")
    };
    let without = plan(&selection);
    assert!(without
        .services
        .iter()
        .all(|s| s.name != "lb" || s.steps() == 0));
    selection
        .repair
        .insert((lb, lb1), "check failed: exited 3: gone".into());
    selection
        .repair
        .insert((api, app1), "check failed: exited 1".into());
    let with = plan(&selection);
    let step = |name: &str| {
        let s = with
            .services
            .iter()
            .find(|s| s.name == name)
            .expect("service");
        s.each_step().next().cloned().expect("a step")
    };
    let repair = step("lb");
    assert_eq!(repair.kind, StepKind::Repair);
    assert_eq!(repair.from.as_deref(), Some("1.0"));
    assert_eq!(repair.path, Some(Path::SwitchOver));
    assert_eq!(repair.reasons, ["check failed: exited 3: gone"]);
    // A host that changes anyway takes its own step.
    assert_eq!(step("api").kind, StepKind::Upgrade);
    // Its check failed: lb1 is not counted healthy for lb's dependents until its repair
    // passes.
    let lb_plan = |p: &super::super::Plan| p.services.iter().find(|s| s.name == "lb").cloned();
    let (before, after) = (lb_plan(&without).expect("lb"), lb_plan(&with).expect("lb"));
    assert_eq!(without.healthy_before(&before), 1);
    assert_eq!(with.healthy_before(&after), 0);
    assert!(
        with.inconsistencies().is_empty(),
        "{:?}",
        with.inconsistencies()
    );
}

#[test]
fn a_host_at_another_address_runs_the_switch_over_and_an_older_record_is_left_alone() {
    let was = inputs(BASE, true, "one", "t");
    assert_eq!(was.get("address"), Some("10.0.1.1"));
    // Its hooks have the address (DEPLOY_ADDRESS): the whole switch-over, even with reload.
    let mut moved = was.clone();
    moved.0.insert("address".into(), "10.0.9.9".into());
    let d = decided(Some(moved), BASE, true, "one", "t");
    assert_eq!(d.path, Path::SwitchOver);
    assert_eq!(d.reasons, ["address: 10.0.9.9 → 10.0.1.1"]);
    assert_eq!(d.restarts, ["address"]);
    // Recorded by a deploy that did not record the address: nothing to do.
    let mut older = was;
    older.0.remove("address");
    let (_dir, site, hosts) = load(BASE, true, "one");
    let secrets = Secrets::from_values(vec![("TOKEN".into(), "t".into())], Default::default());
    let desired = crate::desired::resolve(&site, &hosts, &secrets).expect("resolves");
    let mut record = ServiceRecord::at("1.0");
    record.inputs = Some(older.clone());
    let observed = Observed::Running {
        services: [("lb".to_string(), record)].into_iter().collect(),
    };
    let (lb, lb1) = (
        site.service("lb").expect("lb"),
        hosts.find("lb1").expect("lb1"),
    );
    assert_eq!(decide(&site, &desired, lb, lb1, &observed), Ok(None));
    assert!(desired.matches(lb, lb1, &older));
    // The store's fingerprint leaves the address out (it compares addresses on its own).
    assert_eq!(desired.fingerprint(lb, lb1), Some(older.fingerprint()));
}
