//! `deploy publish` on a real etcd: a snapshot written once (idempotent), refused while the
//! site's lock is held (naming the holder), over the size limit (naming the biggest file),
//! without a store (naming the platform's line), or with a policy pull mode cannot honour.
#![cfg(feature = "etcd")]

use crate::support;

use support::pull::{flat, text, Pull, HALF, PREFIX, SITE};

#[test]
fn publishing_the_same_content_twice_writes_no_new_contents() {
    let pull = Pull::new(&[("web1", "web"), ("web2", "web")]);
    pull.write_site("1.0", "service \"web\" {\n    start \"true\"\n}\n", HALF);
    let first = pull.publish();
    assert!(first.contains("for 2 hosts: 3 contents, 3 new,"), "{first}");
    let keys = pull.keys("");
    let again = pull.publish();
    assert!(again.contains(", 0 new,"), "{again}");
    assert!(again.contains("already the desired snapshot"), "{again}");
    assert_eq!(pull.keys(""), keys, "no key more");
    let snapshots = pull.keys("snapshots/");
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    let current = pull
        .etcd
        .keys(&format!("{PREFIX}/{SITE}/desired/current"))
        .pop()
        .map(|(_, v)| v)
        .expect("desired/current");
    assert!(
        snapshots[0].contains(&format!("/snapshots/{current}/")),
        "{snapshots:?}"
    );
    // Another version is another snapshot; the contents it shares are not written again.
    pull.write_site("2.0", "service \"web\" {\n    start \"true\"\n}\n", HALF);
    let next = pull.publish();
    assert!(next.contains(", 1 new,"), "{next}");
    assert_eq!(pull.keys("snapshots/").len(), 2);
}

#[test]
fn publish_is_refused_while_the_sites_lock_is_held_and_names_the_holder() {
    let pull = Pull::new(&[("web1", "web")]);
    pull.write_site("1.0", "service \"web\" {\n    start \"true\"\n}\n", HALF);
    // Another controller's apply holds the site's lock (on a long lease, revoked below).
    let lease = support::etcd::grant(&pull.etcd, 60);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"pull"}"#;
    support::etcd::put(
        &pull.etcd,
        &format!("{PREFIX}/{SITE}/lock"),
        holder,
        lease.clone(),
    );
    let out = pull.deploy(&["publish", "site.kdl"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("ops on elsewhere (pid 4242, run r-elsewhere)"),
        "{err}"
    );
    assert!(err.contains(&format!("{PREFIX}/{SITE}/lock")), "{err}");
    assert!(pull.keys("desired/").is_empty(), "nothing published");
    assert!(pull.keys("snapshots/").is_empty(), "nothing published");
    // Once that lock is given back, the same publish goes through.
    support::etcd::revoke(&pull.etcd, &lease);
    pull.publish();
    assert_eq!(pull.keys("desired/current").len(), 1);
    assert!(pull.keys("lock").is_empty(), "the lock is given back");
}

#[test]
fn a_snapshot_over_the_limit_is_refused_naming_the_biggest_file() {
    let pull = Pull::new(&[("web1", "web")]);
    // 65 MiB, sparse: the limit is checked before anything is read or copied.
    let big = std::fs::File::create(pull.path("big.bin")).expect("big file");
    big.set_len(65 * 1024 * 1024).expect("size");
    std::fs::write(pull.path("small.cfg"), "x = 1\n").expect("small file");
    pull.write_site(
        "1.0",
        "service \"web\" {\n    file \"small.cfg\" to=\"/etc/small.cfg\"\n    \
         file \"big.bin\" to=\"/srv/big.bin\"\n    start \"true\"\n}\n",
        HALF,
    );
    let out = pull.deploy(&["publish", "site.kdl"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("over the limit of 64.0 MiB"), "{err}");
    // The biggest first.
    let (_, listed) = err
        .split_once("the biggest files: ")
        .expect("the biggest files listed");
    let first: Vec<&str> = listed.split_whitespace().take(3).collect();
    assert!(first[0].ends_with("big.bin"), "{err}");
    assert_eq!(first[1..], ["(65.0", "MiB)"], "{err}");
    assert!(pull.keys("").is_empty(), "nothing was written");
}

#[test]
fn publish_without_a_store_or_with_a_policy_pull_cannot_honour_is_refused() {
    let pull = Pull::new(&[("web1", "web")]);
    pull.write_platform("state-dir \"/var/lib/drover\"");
    pull.write_site("1.0", "service \"web\" {\n    start \"true\"\n}\n", HALF);
    let out = pull.deploy(&["publish", "site.kdl"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("platform.kdl:1: platform lab has no `store \"etcd\"`"),
        "{err}"
    );
    assert!(err.contains("add to the platform: store \"etcd\""), "{err}");

    pull.write_platform(&pull.etcd.store_node(PREFIX, "2s"));
    let spread = "policy \"c\" {\n    batch 1\n    spread \"zone\"\n    on-failure \"revert\"\n}\n";
    pull.write_site("1.0", "service \"web\" {\n    start \"true\"\n}\n", spread);
    let out = pull.deploy(&["publish", "site.kdl"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("service web: policy \"c\" has spread \"zone\""),
        "{err}"
    );
    assert!(err.contains("on-failure \"revert\""), "{err}");
    assert!(pull.keys("").is_empty(), "nothing was written");
}
