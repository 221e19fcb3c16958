//! What counts in a service's inputs, on sites written to a temporary directory.

use super::*;
use crate::secrets::{Key, Secrets};
use crate::site;

/// Loads a site of two app hosts (api) and one lb host (lb, which needs api's addresses and
/// renders `lb.j2`), with `lb_extra` added to lb's service node; resolves it.
fn load(lb_extra: &str, template: &str, apps: usize) -> (tempfile::TempDir, Site, Hosts) {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    w("lb.j2", template);
    w("plain.txt", "plain\n");
    let mut inventory = String::new();
    for i in 1..=apps {
        inventory.push_str(&format!(
            "host \"app{i}\" address=\"10.0.0.{i}\" class=\"app\"\n"
        ));
    }
    w(
        "platform.kdl",
        &format!(
            "platform \"p\" {{ transport \"local\"; inventory \"static\" {{\n{inventory}host \"lb1\" address=\"10.0.1.1\" class=\"lb\" zone=\"z\"\n}} }}"
        ),
    );
    w(
        "site.kdl",
        &format!(
            r#"site "s" {{ version "1.0"; platform "platform.kdl"; env "TZ" "UTC" }}
class "app" {{ service "api" }}
class "lb" {{ service "lb" }}
service "api" {{ port 8080; start "run api"; check "probe" timeout="5s" }}
service "lb" {{
    needs "api" addressable="all"
    start "run lb"
    file "lb.j2" to="/etc/lb.cfg" template=#true
    file "plain.txt" to="/etc/plain.txt" mode="0600"
    {lb_extra}
}}
"#
        ),
    );
    let site = site::load(&dir.path().join("site.kdl")).expect("site loads");
    let hosts = crate::inventory::resolve(&site).expect("hosts");
    (dir, site, hosts)
}

const TEMPLATE: &str =
    "{% for h in needs.api %}{{ h.host }} {{ h.address }}:{{ h.port }} on {{ host }}\n{% endfor %}";

fn lb_inputs(extra: &str, template: &str, apps: usize, secrets: &Secrets) -> Inputs {
    let (_dir, site, hosts) = load(extra, template, apps);
    let d = resolve(&site, &hosts, secrets).expect("resolves");
    let lb = site.service("lb").expect("lb");
    d.inputs(lb, hosts.find("lb1").expect("lb1"))
}

#[test]
fn every_input_counts_and_nothing_else() {
    let none = Secrets::none();
    let base = lb_inputs("", TEMPLATE, 2, &none);
    assert_eq!(
        base.get("needs:api"),
        Some("app1=10.0.0.1:8080 app2=10.0.0.2:8080")
    );
    assert_eq!(
        base.get("env:TZ").map(str::len),
        Some(32),
        "a digest, not the value"
    );
    assert!(base
        .get("file:/etc/plain.txt")
        .is_some_and(|v| v.ends_with(" 600")));
    assert!(base.get("hook:start").is_some());
    // The same site gives the same inputs.
    assert_eq!(lb_inputs("", TEMPLATE, 2, &none), base);
    let reasons = |extra: &str, template: &str, apps: usize| {
        lb_inputs(extra, template, apps, &none).reasons(&base)
    };
    assert_eq!(reasons("env \"MODE\" \"a\"", TEMPLATE, 2), ["env: MODE"]);
    assert_eq!(
        reasons("reload \"kill -HUP 1\"", TEMPLATE, 2),
        ["hooks: reload"]
    );
    assert_eq!(
        reasons("", "changed {{ host }}", 2),
        ["file: /etc/lb.cfg"],
        "a template's rendered text counts"
    );
    assert_eq!(
        reasons("", TEMPLATE, 3),
        ["needs api: +app3", "file: /etc/lb.cfg"],
        "a new pool member changes the list and the rendered file"
    );
    assert_eq!(reasons("port 80", TEMPLATE, 2), ["port: none → 80"]);
}

#[test]
fn comments_timeouts_and_node_order_do_not_count() {
    let none = Secrets::none();
    let base = lb_inputs("reload \"a\"\n    env \"X\" \"1\"", TEMPLATE, 2, &none);
    let same = lb_inputs(
        "// a comment\n    env \"X\" \"1\"\n    reload \"a\" timeout=\"9s\"",
        TEMPLATE,
        2,
        &none,
    );
    assert_eq!(same, base);
}

#[test]
fn a_template_renders_per_host_with_needs_in_name_order() {
    let (_dir, site, hosts) = load("", TEMPLATE, 2);
    let lb = site.service("lb").expect("lb");
    let h = &hosts.hosts[hosts.find("lb1").expect("lb1")];
    let d = resolve(&site, &hosts, &Secrets::none()).expect("resolves");
    let files = d
        .deliveries(&site, lb, h, &Secrets::none())
        .expect("renders");
    assert_eq!(files.len(), 2);
    match &files[0].content {
        Content::Rendered { text, secret } => {
            assert_eq!(
                text.as_str(),
                "app1 10.0.0.1:8080 on lb1\napp2 10.0.0.2:8080 on lb1\n"
            );
            assert!(!secret);
        }
        other => panic!("not rendered: {other:?}"),
    }
    assert_eq!(files[0].mode, 0o644);
    // Its digest is the one the inputs record.
    let recorded = d.inputs(lb, hosts.find("lb1").expect("lb1"));
    assert_eq!(
        recorded.get("file:/etc/lb.cfg"),
        Some(format!("{} 644", files[0].digest).as_str())
    );
}

#[test]
fn render_errors_are_all_reported_pointing_into_the_template() {
    // A name the site gives, read past what it holds: only rendering can tell.
    let (_dir, site, hosts) = load("", "{{ needs.api[5].host }}", 2);
    let err = resolve(&site, &hosts, &Secrets::none()).expect_err("does not render");
    assert_eq!(
        err.errors.len(),
        1,
        "one per template file, not one per host"
    );
    let text = format!("{:?}", miette::Report::new(err));
    assert!(text.contains("lb.j2"), "{text}");
}

#[test]
fn a_secret_counts_only_as_an_hmac_under_the_controllers_key() {
    let secret =
        || Secrets::from_values(vec![("TOKEN".into(), "hunter2".into())], Default::default());
    let a = secret().with_key(Key::new(b"key a, long enough".to_vec()));
    let b = secret().with_key(Key::new(b"key b, long enough".to_vec()));
    let ia = lb_inputs("", TEMPLATE, 2, &a);
    let ib = lb_inputs("", TEMPLATE, 2, &b);
    let mac = ia.get("secret:TOKEN").expect("counted");
    use sha2::Digest;
    let plain = crate::secrets::hex(&sha2::Sha256::digest(b"hunter2"));
    assert!(!plain.starts_with(mac), "not a plain digest of the value");
    assert_ne!(ia.get("secret:TOKEN"), ib.get("secret:TOKEN"));
    assert_eq!(
        ib.reasons(&ia),
        ["secrets: recorded under another controller's key"]
    );
    let changed =
        Secrets::from_values(vec![("TOKEN".into(), "hunter3".into())], Default::default())
            .with_key(Key::new(b"key a, long enough".to_vec()));
    assert_eq!(
        lb_inputs("", TEMPLATE, 2, &changed).reasons(&ia),
        ["secret: TOKEN"]
    );
    // A template that reads secrets is secret: 0600 and its store name is keyed.
    let (_dir, site, hosts) = load("", "{{ secrets.TOKEN }}", 2);
    let lb = site.service("lb").expect("lb");
    let h = &hosts.hosts[hosts.find("lb1").expect("lb1")];
    let d = resolve(&site, &hosts, &a).expect("resolves");
    let files = d.deliveries(&site, lb, h, &a).expect("renders");
    assert_eq!(files[0].mode, 0o600);
    let plain = crate::secrets::hex(&sha2::Sha256::digest(b"hunter2"));
    assert_ne!(files[0].digest, plain);
}

#[test]
fn a_host_in_two_classes_is_refused_only_for_two_services_of_one_path() {
    use crate::inventory::Host;
    let dir = tempfile::tempdir().expect("tempdir");
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    w("a.conf", "a\n");
    w(
        "platform.kdl",
        "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
         host \"a\" address=\"10.0.0.1\" class=\"app\"\n\
         host \"e\" address=\"10.0.0.2\" class=\"edge\"\n\
         host \"b\" address=\"10.0.0.3\" class=\"both\"\n} }",
    );
    // The platform's hosts only make the site load; the test's fleet is made below, with
    // hosts in two classes (as an ec2 or command inventory gives them).
    w(
        "site.kdl",
        r#"site "s" { version "1.0"; platform "platform.kdl" }
class "app" { service "api" }
class "edge" { service "proxy" }
class "both" { service "api" }
service "api" { start "run api"; file "a.conf" to="/etc/shared.conf" }
service "proxy" { start "run proxy"; file "a.conf" to="/etc/shared.conf" }
"#,
    );
    let site = site::load(&dir.path().join("site.kdl")).expect("site loads");
    let class = |name: &str| site.class(name).expect("class");
    let host = |name: &str, classes: &[&str]| Host {
        name: name.into(),
        address: "10.0.0.1".into(),
        classes: classes.iter().map(|c| class(c)).collect(),
        tags: Default::default(),
    };
    // api runs on x1 by way of two classes: one service, one path, nothing to refuse; app
    // and edge share no host.
    let fleet = vec![
        host("app1", &["app"]),
        host("edge1", &["edge"]),
        host("x1", &["app", "both"]),
    ];
    let hosts = Hosts::new(fleet.clone(), site.classes.len());
    assert!(resolve(&site, &hosts, &Secrets::none()).is_ok());
    // y1 plays app and edge: api and proxy would both place /etc/shared.conf there.
    let mut fleet = fleet;
    fleet.push(host("y1", &["app", "edge"]));
    let hosts = Hosts::new(fleet, site.classes.len());
    let errors = match resolve(&site, &hosts, &Secrets::none()) {
        Ok(_) => panic!("api and proxy share y1"),
        Err(e) => e.errors,
    };
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(
        text[0].ends_with("services `api` and `proxy` both deliver /etc/shared.conf, to host y1"),
        "{text:?}"
    );
}
