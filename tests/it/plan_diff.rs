//! `deploy plan --diff` on a real sshd fleet: for each file a step would place with other
//! content, a unified diff of the host's file (read from the host) against the site's,
//! rendered for that host; a template that renders a secret says only `[secret changed]`,
//! never its value; with `--json`, the diffs are in the plan.

use crate::support;

use support::fleet::{Fleet, FleetHost};

fn write(fleet: &Fleet, greeting: &str, token: &str) -> std::path::PathBuf {
    fleet.write_platform("/var/lib/drover");
    std::fs::write(
        fleet.dir.join("app.conf.j2"),
        format!("# on {{{{ host }}}}\ngreeting = {greeting}\nworkers = 4\n"),
    )
    .expect("template");
    std::fs::write(fleet.dir.join("creds.j2"), "token = {{ secrets.TOKEN }}\n").expect("template");
    std::fs::write(fleet.dir.join("token"), token).expect("secret");
    fleet.write_site(
        r#"site "diffs" {
    version "1.0"
    platform "platform.kdl"
    policy "policy.kdl"
}
class "app" { service "api" }
service "api" {
    secret "TOKEN" file="token"
    file "app.conf.j2" to="/srv/api/app.conf" template=#true
    file "creds.j2" to="/srv/api/creds" template=#true
    start "true"
    reload "true"
}
"#,
        "policy \"p\" { batch 1; }\n",
    )
}

#[test]
fn plan_diff_shows_each_changed_file_and_never_a_secret() {
    let fleet = Fleet::start(&[FleetHost::new("app1", "app")]);
    let site = write(&fleet, "hello", "s3cret-one");
    let out = support::cli::deploy_in(&fleet.dir)
        .args(["apply", site.to_str().unwrap(), "--yes"])
        .output()
        .expect("run deploy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let site = write(&fleet, "bonjour", "s3cret-two");
    let plan = |extra: &[&str]| {
        let out = support::cli::deploy_in(&fleet.dir)
            .args(["plan", site.to_str().unwrap(), "--diff"])
            .args(extra)
            .output()
            .expect("run deploy");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = plan(&[]);
    let diffs = &text[text.find("File changes").expect("a diff section")..];
    insta::assert_snapshot!("plan-diff", diffs);
    assert!(!text.contains("s3cret"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&plan(&["--json"])).expect("JSON");
    let diffs = json["diffs"].as_array().expect("diffs");
    assert_eq!(diffs.len(), 2, "{json}");
    assert_eq!(diffs[0]["path"], "/srv/api/app.conf");
    assert!(diffs[0]["diff"]
        .as_str()
        .unwrap()
        .contains("+greeting = bonjour"));
    assert_eq!(diffs[1]["diff"], "[secret changed]");
    // The host's file is what the diff's old side says: read from the host.
    let on_host =
        std::fs::read_to_string(fleet.host_root("app1").join("srv/api/app.conf")).expect("placed");
    assert!(on_host.contains("greeting = hello"), "{on_host}");
    // Without --diff, nothing is read for it and nothing is shown.
    let out = support::cli::deploy_in(&fleet.dir)
        .args(["plan", site.to_str().unwrap()])
        .output()
        .expect("run deploy");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("File changes"));
}
