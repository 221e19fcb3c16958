//! Templates and includes through [`load`]: how a service is merged from the templates it
//! takes, where included nodes land, and problems across files reported once each.

use super::*;
use std::path::PathBuf;

/// Writes `files` (path, text) under a fresh directory, with `platform.kdl` giving one host to
/// each class the site's classes are `app`, `db` and (when `mid` is in the files) `mid`; the
/// site is `site.kdl`.
fn tree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut classes = vec!["app", "db"];
    if files.iter().any(|(_, t)| t.contains("class \"mid\"")) {
        classes.push("mid");
    }
    let hosts: String = classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            format!(
                "        host \"h{i}\" address=\"127.0.99.{}\" class=\"{c}\"\n",
                i + 1
            )
        })
        .collect();
    let platform = format!(
        "platform \"t\" {{\n    transport \"ssh\" user=\"root\"\n    inventory \"static\" {{\n{hosts}    }}\n}}\n"
    );
    std::fs::write(dir.path().join("platform.kdl"), platform).expect("platform");
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dirs");
        std::fs::write(&p, text).expect("write");
    }
    let site = dir.path().join("site.kdl");
    (dir, site)
}

const HEAD: &str = "site \"s\" {\n    version \"1.0\"\n    platform \"platform.kdl\"\n}\n";

fn service<'s>(site: &'s Site, name: &str) -> &'s Service {
    site.services
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

#[test]
fn own_nodes_win_and_repeatable_ones_add_up_along_the_chain() {
    let text = format!(
        "{HEAD}{}",
        r#"
class "db" { service "db" }
class "app" { service "api" }
service "db" { start "db" }
template "base" {
    version "2.0"
    port 1
    env "A" "base"
    env "B" "base"
    stop "base-stop"
    start "base-start"
    check "base-check" timeout="5s"
}
template "http" template="base" {
    port 2
    env "B" "http"
    start "http-start"
    needs "db" addressable="all"
}
service "api" template="http" {
    port 3
    env "C" "own"
    install "own-install"
    needs "db"
}
"#
    );
    let (_dir, path) = tree(&[("site.kdl", &text)]);
    let site = load(&path).unwrap_or_else(|e| panic!("{e:?}"));
    let api = service(&site, "api");
    assert_eq!(api.version, "2.0", "a template's version applies");
    assert_eq!(api.port, Some(3), "the service's own port wins");
    let env: Vec<(&str, &str)> = api
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("A", "base"), ("B", "http"), ("C", "own")]);
    let hook = |h: &Option<Hook>| h.as_ref().map(|h| h.command.clone());
    assert_eq!(hook(&api.hooks.stop).as_deref(), Some("base-stop"));
    assert_eq!(hook(&api.hooks.start).as_deref(), Some("http-start"));
    assert_eq!(hook(&api.hooks.install).as_deref(), Some("own-install"));
    assert_eq!(
        api.hooks.check.as_ref().map(|c| c.command.as_str()),
        Some("base-check")
    );
    assert_eq!(api.needs.len(), 2, "needs add up: {:?}", api.needs);
    assert!(api.needs.iter().any(|n| n.healthy.is_none()));
    assert!(api.needs.iter().any(|n| n.healthy.is_some()));
    // The template's runtime order applies too: db before api.
    let order: Vec<&str> = site
        .order
        .iter()
        .map(|s| site.services[*s].name.as_str())
        .collect();
    assert_eq!(order, ["db", "api"]);
}

#[test]
fn included_nodes_stand_where_their_include_is_and_paths_resolve_beside_their_file() {
    let site = format!(
        "{HEAD}{}",
        r#"
class "db" { service "first" }
include "more/*.kdl"
service "first" { start "x" }
class "app" { service "last" }
service "last" { start "x" }
"#
    );
    let (_dir, path) = tree(&[
        ("site.kdl", &site),
        (
            "more/b.kdl",
            "service \"b\" template=\"t\" {\n    file \"b.conf\" to=\"/etc/b.conf\"\n}\n",
        ),
        (
            "more/a.kdl",
            "class \"mid\" { service \"b\" }\ntemplate \"t\" { start \"x\" }\n",
        ),
        ("more/b.conf", "b\n"),
    ]);
    let loaded = load(&path).unwrap_or_else(|e| panic!("{e:?}"));
    let names: Vec<&str> = loaded.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["b", "first", "last"],
        "b.kdl in place of the include"
    );
    let classes: Vec<&str> = loaded.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        classes,
        ["db", "mid", "app"],
        "a.kdl before b.kdl, in place"
    );
    let b = service(&loaded, "b");
    assert!(
        b.files[0].source.ends_with("more/b.conf"),
        "{:?}",
        b.files[0].source
    );
}

#[test]
fn a_cycle_across_files_and_templates_is_one_problem_naming_every_edge() {
    let site = format!(
        "{HEAD}{}",
        r#"
include "other.kdl"
class "app" { service "a" }
class "db" { service "b" }
template "needs-b" { needs "b" }
service "a" template="needs-b" { start "x" }
"#
    );
    let (_dir, path) = tree(&[
        ("site.kdl", &site),
        ("other.kdl", "service \"b\" {\n    needs \"a\"\n}\n"),
    ]);
    let err = load(&path).expect_err("a cycle");
    assert_eq!(err.errors.len(), 1, "{:?}", err.errors);
    let SiteError::Cycle {
        cycle,
        edges,
        elsewhere,
        ..
    } = &err.errors[0]
    else {
        panic!("not a cycle: {:?}", err.errors[0]);
    };
    assert!(cycle == "a → b → a" || cycle == "b → a → b", "{cycle}");
    let labels: Vec<String> = edges
        .iter()
        .map(|e| e.label().unwrap_or_default().to_string())
        .chain(elsewhere.iter().map(|e| e.to_string()))
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels.iter().any(|l| l.contains("(template `needs-b`)")),
        "{labels:?}"
    );
}

#[test]
fn a_bad_template_used_by_many_services_is_reported_once() {
    let site = format!(
        "{HEAD}{}",
        r#"
class "app" { service "a"; service "b" }
class "db" { service "c" }
template "t" { needs "nope"; port "80" }
service "a" template="t"
service "b" template="t"
service "c" template="t"
"#
    );
    let (_dir, path) = tree(&[("site.kdl", &site)]);
    let err = load(&path).expect_err("bad template");
    assert_eq!(err.errors.len(), 2, "{:#?}", err.errors);
}

#[test]
fn a_changed_template_changes_only_the_services_that_take_it() {
    let site = |check: &str| {
        format!(
            "{HEAD}class \"app\" {{ service \"a\" }}\nclass \"db\" {{ service \"b\" }}\n\
             template \"t\" {{ check \"{check}\" }}\n\
             service \"a\" template=\"t\"\nservice \"b\" {{ check \"x\" }}\n"
        )
    };
    let (_d1, p1) = tree(&[("site.kdl", &site("one"))]);
    let (_d2, p2) = tree(&[("site.kdl", &site("two"))]);
    let (s1, s2) = (load(&p1).expect("one"), load(&p2).expect("two"));
    let check = |s: &Site, n: &str| service(s, n).hooks.check.clone().map(|c| c.command);
    assert_ne!(check(&s1, "a"), check(&s2, "a"));
    assert_eq!(check(&s1, "b"), check(&s2, "b"));
}

#[test]
fn a_need_drains_only_when_it_says_so() {
    let text = format!(
        "{HEAD}{}",
        r#"
class "db" { service "db"; service "cache" }
class "app" { service "api" }
service "db" { start "db" }
service "cache" { start "cache" }
service "api" {
    needs "db" addressable="all" drain=#true
    needs "cache" addressable="all"
}
"#
    );
    let (_dir, path) = tree(&[("site.kdl", &text)]);
    let site = load(&path).unwrap_or_else(|e| panic!("{e:?}"));
    let drains: Vec<(&str, bool)> = service(&site, "api")
        .needs
        .iter()
        .map(|n| (site.services[n.service].name.as_str(), n.drain))
        .collect();
    assert_eq!(drains, [("db", true), ("cache", false)]);
    // Not a flag: refused like any property of the wrong type.
    let wrong = text.replace("drain=#true", "drain=\"yes\"");
    let (_dir, path) = tree(&[("site.kdl", &wrong)]);
    let err = load(&path).expect_err("drain is a boolean");
    assert!(format!("{err:?}").contains("drain"), "{err:?}");
}

#[test]
fn on_failure_revert_is_a_choice_and_a_misspelt_one_is_refused_with_the_choices() {
    let site = |policy: &str| {
        (
            format!("{HEAD}class \"app\" {{ service \"a\" }}\nclass \"db\" {{ service \"a\" }}\nservice \"a\" {{ policy \"p.kdl\" }}\n"),
            format!("policy \"p\" {{ on-failure \"{policy}\" }}\n"),
        )
    };
    let (text, policy) = site("revert");
    let (_dir, path) = tree(&[("site.kdl", &text), ("p.kdl", &policy)]);
    let loaded = load(&path).unwrap_or_else(|e| panic!("{:#?}", e.errors));
    assert_eq!(service(&loaded, "a").policy.on_failure, OnFailure::Revert);
    let (text, policy) = site("revrt");
    let (_dir, path) = tree(&[("site.kdl", &text), ("p.kdl", &policy)]);
    let err = load(&path).expect_err("a misspelt on-failure");
    let said = format!("{:?}", err.errors);
    assert!(said.contains("`revrt` is not a choice"), "{said}");
    assert!(said.contains("revert"), "the choice is named: {said}");
}
