//! A site built from templates and includes, on a real sshd fleet: it converges, and a change
//! to a template reconfigures exactly the services that take it (per-host hook logs).

use crate::support;

use std::path::PathBuf;
use std::process::Output;
use support::cli::ok;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;

/// Writes the site: `site.kdl` includes `services/*.kdl` and `templates/*.kdl`; `api` and
/// `worker` take the template `unit` (whose check says `check`), `db` takes `plain`.
fn write(fleet: &Fleet, check: &str) -> PathBuf {
    let dir = &fleet.dir;
    fleet.write_platform("/var/lib/drover");
    std::fs::create_dir_all(dir.join("services")).expect("services");
    std::fs::create_dir_all(dir.join("templates")).expect("templates");
    std::fs::write(
        dir.join("site.kdl"),
        "site \"templated\" {\n    version \"1.0\"\n    platform \"platform.kdl\"\n}\n\
         include \"templates/*.kdl\"\ninclude \"services/*.kdl\"\n",
    )
    .expect("site");
    std::fs::write(
        dir.join("templates/unit.kdl"),
        format!(
            r####"template "unit" {{
    stop #"{EV}ev stop"#
    install #"{EV}ev install"#
    start #"{EV}ev start"#
    check #"{EV}ev checked; {check}"# timeout="5s" interval="100ms"
}}
template "plain" {{
    install #"{EV}ev install"#
    start #"{EV}ev start"#
}}
"####
        ),
    )
    .expect("templates");
    std::fs::write(
        dir.join("services/app.kdl"),
        "class \"app\" { service \"api\"; service \"worker\" }\n\
         service \"api\" template=\"unit\" {\n    port 18080\n    needs \"db\"\n}\n\
         service \"worker\" template=\"unit\" {\n    needs \"api\" healthy=1\n}\n",
    )
    .expect("app");
    std::fs::write(
        dir.join("services/db.kdl"),
        "class \"db\" { service \"db\" }\nservice \"db\" template=\"plain\" {\n    port 15432\n}\n",
    )
    .expect("db");
    dir.join("site.kdl")
}

fn deploy(fleet: &Fleet, args: &[&str]) -> Output {
    support::cli::deploy_in(&fleet.dir)
        .args(args)
        .env_remove("DROVER_FINGERPRINT_KEY")
        .output()
        .expect("run deploy")
}

/// `host what service` of every hook event after the first `from`, sorted.
fn since(fleet: &Fleet, from: usize) -> Vec<String> {
    let mut ran: Vec<String> = support::hooks::events(fleet)[from..]
        .iter()
        .map(|(_, h, w, s)| format!("{h} {w} {s}"))
        .collect();
    ran.sort();
    ran
}

#[test]
fn a_changed_template_reconfigures_only_the_services_that_take_it() {
    let fleet = Fleet::start(&[
        FleetHost::new("app1", "app"),
        FleetHost::new("app2", "app"),
        FleetHost::new("db1", "db"),
    ]);
    let site = write(&fleet, "true");
    let site = site.to_str().expect("path");
    ok(deploy(&fleet, &["apply", site, "--yes"]));
    let fresh = since(&fleet, 0);
    for host in ["app1", "app2"] {
        for service in ["api", "worker"] {
            for what in ["install", "start", "checked"] {
                let e = format!("{host} {what} {service}");
                assert!(fresh.contains(&e), "{e} missing from {fresh:#?}");
            }
        }
    }
    assert!(fresh.contains(&"db1 start db".to_string()), "{fresh:#?}");
    ok(deploy(&fleet, &["verify", site]));

    // The template's check changes: api and worker on both app hosts, nothing of db.
    write(&fleet, "[ -n \"$DEPLOY_SERVICE\" ]");
    let plan = ok(deploy(&fleet, &["plan", site]));
    let changed: Vec<&str> = plan.lines().filter(|l| l.contains("reconfigure")).collect();
    assert_eq!(changed.len(), 4, "api and worker, each on 2 hosts:\n{plan}");
    assert!(
        changed.iter().all(|l| l.contains("(hooks: check)")),
        "the plan names the changed hook:\n{plan}"
    );
    assert!(
        plan.contains("skipped, converged: db1"),
        "db is left alone:\n{plan}"
    );
    let before = support::hooks::events(&fleet).len();
    ok(deploy(&fleet, &["apply", site, "--yes"]));
    let ran = since(&fleet, before);
    assert!(!ran.is_empty(), "the change was deployed");
    for e in &ran {
        assert!(
            e.starts_with("app") && (e.ends_with(" api") || e.ends_with(" worker")),
            "only the template's services ran hooks: {ran:#?}"
        );
    }
    for host in ["app1", "app2"] {
        for service in ["api", "worker"] {
            let e = format!("{host} checked {service}");
            assert!(ran.contains(&e), "{e} missing from {ran:#?}");
        }
    }
    let again = support::hooks::events(&fleet).len();
    ok(deploy(&fleet, &["apply", site, "--yes"]));
    assert_eq!(
        support::hooks::events(&fleet).len(),
        again,
        "converged: no hook runs"
    );
}
