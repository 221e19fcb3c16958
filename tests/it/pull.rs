//! Pull mode on a real etcd: `deploy publish` writes a snapshot (idempotent; refused while the
//! site's lock is held, over the size limit, without a store, or with a policy pull mode cannot
//! honour).
#![cfg(feature = "etcd")]

use crate::support;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;
use support::etcd::Etcd;

const PREFIX: &str = "/pull-test";
const SITE: &str = "pull";

/// A site on the `local` platform (each host `hosts/<name>` in a temporary directory), its
/// etcd.
struct Pull {
    etcd: Etcd,
    dir: tempfile::TempDir,
    /// `(host, class)`.
    hosts: Vec<(String, String)>,
}

impl Pull {
    fn new(hosts: &[(&str, &str)]) -> Pull {
        let dir = tempfile::tempdir().expect("site directory");
        let pull = Pull {
            etcd: Etcd::start(),
            dir,
            hosts: hosts
                .iter()
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect(),
        };
        pull.write_platform(&pull.etcd.store_node(PREFIX, "2s"));
        for (h, _) in hosts {
            std::fs::create_dir_all(pull.host_dir(h)).expect("host directory");
        }
        pull
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn host_dir(&self, host: &str) -> PathBuf {
        self.path("hosts").join(host)
    }

    fn write_platform(&self, store: &str) {
        let hosts: String = self
            .hosts
            .iter()
            .enumerate()
            .map(|(i, (h, c))| {
                format!(
                    "        host \"{h}\" address=\"127.0.77.{}\" class=\"{c}\"\n",
                    i + 1
                )
            })
            .collect();
        let text = format!(
            "platform \"lab\" {{\n    transport \"local\" root=\"hosts\"\n    {store}\n    \
             inventory \"static\" {{\n{hosts}    }}\n}}\n"
        );
        std::fs::write(self.path("platform.kdl"), text).expect("platform");
    }

    /// The site at `version`: its services' text, its policy's.
    fn write_site(&self, version: &str, services: &str, policy: &str) {
        std::fs::write(self.path("policy.kdl"), policy).expect("policy");
        let classes: std::collections::BTreeSet<&str> =
            self.hosts.iter().map(|(_, c)| c.as_str()).collect();
        let classes: String = classes
            .iter()
            .map(|c| format!("class \"{c}\" {{ service \"{c}\"; }}\n"))
            .collect();
        let text = format!(
            "site \"{SITE}\" {{\n    version \"{version}\"\n    platform \"platform.kdl\"\n    \
             policy \"policy.kdl\"\n}}\n{classes}{services}"
        );
        std::fs::write(self.path("site.kdl"), text).expect("site");
    }

    fn deploy(&self, args: &[&str]) -> Output {
        support::cli::deploy_in(self.dir.path())
            .args(args)
            .output()
            .expect("run deploy")
    }

    fn publish(&self) -> String {
        let out = self.deploy(&["publish", "site.kdl"]);
        let text = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "publish: {text}");
        text
    }

    fn keys(&self, under: &str) -> Vec<String> {
        self.etcd
            .keys(&format!("{PREFIX}/{SITE}/{under}"))
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A diagnostic as one line: miette's wrapping and margins taken out.
fn flat(err: &str) -> String {
    err.replace('│', " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

const HALF: &str = "policy \"half\" {\n    batch \"50%\"\n    max-failed 0\n}\n";

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
    // Another controller's apply holds the site's lock (its lease lapses in 3 s).
    let lease = support::etcd::grant(&pull.etcd, 3);
    let holder = r#"{"user":"ops","controller":"elsewhere","boot":"","pid":4242,"since":"2026-11-25T00:00:00Z","run":"r-elsewhere","site":"pull"}"#;
    support::etcd::put(&pull.etcd, &format!("{PREFIX}/{SITE}/lock"), holder, lease);
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
    // Once that lease lapsed, the same publish goes through.
    std::thread::sleep(Duration::from_secs(4));
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
    let canary = "policy \"c\" {\n    batch 1\n    canary 1\n    pause \"confirm\"\n}\n";
    pull.write_site("1.0", "service \"web\" {\n    start \"true\"\n}\n", canary);
    let out = pull.deploy(&["publish", "site.kdl"]);
    let err = flat(&text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("service web: policy \"c\" has canary 1"),
        "{err}"
    );
    assert!(err.contains("pause \"confirm\""), "{err}");
    assert!(pull.keys("").is_empty(), "nothing was written");
}
