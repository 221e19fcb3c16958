//! A service's inputs as a host records them: one entry per thing its hooks are given, so that
//! two sets of inputs can say, in words, how they differ.
//!
//! Keys and values (what counts, and why, is in the book's "Desired state" chapter):
//! `version`, `port` (as written); `address` (the host's, as the inventory gives it: hooks have
//! it as `DEPLOY_ADDRESS`); `hook:<name>` (a digest of its text); `env:<NAME>` (a digest of
//! its value); `needs:<service>` (the `host=address[:port]` list, space-separated, in host name
//! order); `file:<path>` (`<content digest> <mode in octal>`); `secret:<NAME>` (an HMAC under the
//! controller's key, never a plain digest) and `key` (which key: the HMAC of a fixed text).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Everything a service on one host is given, by key (values shared: a pool's member list is
/// the same text for every host that needs it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Inputs(pub BTreeMap<String, Arc<str>>);

impl Inputs {
    /// One digest of every key and value (sha256, 128 bits, hex): what the shared store keeps
    /// of a host's inputs, to tell whether they are the site's without holding them all.
    /// The host's `address` does not count: the store keeps it beside, and compares it with
    /// the inventory's on its own (a record of an older deploy lacks it).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (k, v) in self.0.iter().filter(|(k, _)| *k != "address") {
            h.update((k.len() as u64).to_le_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_le_bytes());
            h.update(v.as_bytes());
        }
        h.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| &**v)
    }

    /// The files these inputs deliver, as `(path, digest, mode)`.
    pub fn files(&self) -> impl Iterator<Item = (&str, &str, u32)> {
        self.0.iter().filter_map(|(k, v)| {
            let path = k.strip_prefix("file:")?;
            let (digest, mode) = v.split_once(' ')?;
            Some((path, digest, u32::from_str_radix(mode, 8).ok()?))
        })
    }

    /// The keys whose values differ between `self` and `was` (either may lack one), in key
    /// order.
    pub fn changed<'a>(&'a self, was: &'a Inputs) -> Vec<&'a str> {
        let mut keys: Vec<&str> = self
            .0
            .iter()
            .filter(|(k, v)| was.0.get(*k) != Some(*v))
            .map(|(k, _)| k.as_str())
            .chain(
                was.0
                    .keys()
                    .filter(|k| !self.0.contains_key(*k))
                    .map(String::as_str),
            )
            .collect();
        keys.sort_unstable();
        keys
    }

    /// How `self` (what the site says now) differs from `was` (what the host records), one
    /// reason per kind, in a fixed order: `port`, `address`, `hooks: start, check`, `env: MODE`,
    /// `needs api: +app8 -app3`, `file: /etc/x`, `secret: TOKEN`. Empty when they are equal.
    pub fn reasons(&self, was: &Inputs) -> Vec<String> {
        let mut out = Vec::new();
        let changed = |key: &str| self.0.get(key) != was.0.get(key);
        if changed("port") {
            let show = |i: &Inputs| {
                i.get("port")
                    .filter(|p| !p.is_empty())
                    .unwrap_or("none")
                    .to_string()
            };
            out.push(format!("port: {} → {}", show(was), show(self)));
        }
        if let (true, Some(then), Some(now)) =
            (changed("address"), was.get("address"), self.get("address"))
        {
            out.push(format!("address: {then} → {now}"));
        }
        let keys = |prefix: &str| -> Vec<String> {
            let mut names: Vec<&str> = self
                .0
                .keys()
                .chain(was.0.keys())
                .filter_map(|k| k.strip_prefix(prefix))
                .filter(|name| changed(&format!("{prefix}{name}")))
                .collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().map(str::to_string).collect()
        };
        let hooks = keys("hook:");
        if !hooks.is_empty() {
            // In the order a switch-over runs them.
            let order = [
                "stop", "install", "migrate", "start", "reload", "check", "rollback", "remove",
            ];
            let mut hooks = hooks;
            hooks.sort_by_key(|h| order.iter().position(|o| o == h).unwrap_or(order.len()));
            out.push(format!("hooks: {}", hooks.join(", ")));
        }
        let env = keys("env:");
        if !env.is_empty() {
            out.push(format!("env: {}", env.join(", ")));
        }
        for service in keys("needs:") {
            let key = format!("needs:{service}");
            let (now, then) = (self.get(&key).unwrap_or(""), was.get(&key).unwrap_or(""));
            out.push(format!("needs {service}: {}", pool_change(now, then)));
        }
        for path in keys("file:") {
            out.push(format!("file: {path}"));
        }
        if changed("key") && was.get("key").is_some() && self.get("key").is_some() {
            out.push("secrets: recorded under another controller's key".into());
        } else {
            for name in keys("secret:") {
                out.push(format!("secret: {name}"));
            }
        }
        if out.is_empty() && self != was {
            // Only the key or an entry of a kind this version does not know.
            out.push("configuration".into());
        }
        out
    }
}

/// What a running service needs to take a change of one of its inputs (book: "Desired state",
/// reload or switch-over).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Takes {
    /// Nothing: no running process uses it (the `rollback` hook, run only when a step fails;
    /// `remove`, run only when the service leaves the host).
    Nothing,
    /// A reload: files, `needs` addresses, the `reload` and `check` hooks.
    Reload,
    /// A restart, the whole switch-over: every other key (a switch-over hook, `env`, `port`,
    /// the host's `address`,
    /// a secret, which the hooks get in their environment, the controller's key, a key of a
    /// kind this version does not know).
    Restart,
}

impl Takes {
    /// How a running service takes a change of the input `key`.
    pub fn of(key: &str) -> Takes {
        match key {
            "hook:rollback" | "hook:remove" => Takes::Nothing,
            "hook:reload" | "hook:check" => Takes::Reload,
            k if k.starts_with("file:") || k.starts_with("needs:") => Takes::Reload,
            _ => Takes::Restart,
        }
    }
}

/// The members of a `needs:` entry (`host=address[:port]`, space-separated).
fn members(entry: &str) -> impl Iterator<Item = &str> {
    entry.split(' ').filter(|m| !m.is_empty())
}

/// A member's host name.
fn host(member: &str) -> &str {
    member.split_once('=').map_or(member, |(h, _)| h)
}

/// The hosts of the `needs:` entry `now` that the entry `was` (if any) did not list, in order.
pub fn added_hosts(now: &str, was: Option<&str>) -> Vec<String> {
    let then: HashSet<&str> = was.map(members).into_iter().flatten().map(host).collect();
    members(now)
        .map(host)
        .filter(|h| !then.contains(h))
        .map(str::to_string)
        .collect()
}

/// The hosts of the `needs:` entry `now` that the entry `was` lists at another address or
/// port, in order.
pub fn moved_hosts(now: &str, was: Option<&str>) -> Vec<String> {
    let Some(was) = was else {
        return Vec::new();
    };
    members(now)
        .filter(|m| member_of(was, host(m)).is_some_and(|then| then != *m))
        .map(|m| host(m).to_string())
        .collect()
}

/// How the `needs:` entry `entry` lists `name`: `name=address[:port]`.
pub fn member_of<'a>(entry: &'a str, name: &str) -> Option<&'a str> {
    members(entry).find(|m| host(m) == name)
}

/// How a pool's entry changed: `+new -gone ~kept=other:address`.
fn pool_change(now: &str, then: &str) -> String {
    let then_members: HashSet<&str> = members(then).collect();
    let now_hosts: HashSet<&str> = members(now).map(host).collect();
    let then_hosts: HashSet<&str> = then_members.iter().copied().map(host).collect();
    let mut parts: Vec<String> = members(now)
        .map(host)
        .filter(|h| !then_hosts.contains(h))
        .map(|h| format!("+{h}"))
        .collect();
    parts.extend(
        members(then)
            .map(host)
            .filter(|h| !now_hosts.contains(h))
            .map(|h| format!("-{h}")),
    );
    // Same hosts, other addresses or port.
    parts.extend(
        members(now)
            .filter(|m| !then_members.contains(m) && then_hosts.contains(host(m)))
            .map(|m| format!("~{m}")),
    );
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(pairs: &[(&str, &str)]) -> Inputs {
        Inputs(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Arc::from(*v)))
                .collect(),
        )
    }

    #[test]
    fn names_every_kind_of_change() {
        let was = inputs(&[
            ("version", "1"),
            ("port", "80"),
            ("hook:start", "a"),
            ("hook:check", "a"),
            ("env:MODE", "a"),
            ("needs:api", "app1=10.0.0.1:8080 app3=10.0.0.3:8080"),
            ("file:/etc/x", "d1 644"),
            ("secret:TOKEN", "h1"),
            ("key", "k"),
        ]);
        let now = inputs(&[
            ("version", "1"),
            ("port", "80"),
            ("hook:start", "b"),
            ("hook:check", "b"),
            ("env:MODE", "b"),
            ("needs:api", "app1=10.0.0.1:8080 app8=10.0.0.8:8080"),
            ("file:/etc/x", "d2 644"),
            ("secret:TOKEN", "h2"),
            ("key", "k"),
        ]);
        assert_eq!(
            now.reasons(&was),
            [
                "hooks: start, check",
                "env: MODE",
                "needs api: +app8 -app3",
                "file: /etc/x",
                "secret: TOKEN"
            ]
        );
        assert_eq!(
            added_hosts(now.get("needs:api").unwrap_or(""), was.get("needs:api")),
            ["app8"]
        );
        assert!(now.reasons(&now).is_empty());
    }

    #[test]
    fn another_key_is_one_reason_not_every_secret() {
        let was = inputs(&[("secret:A", "1"), ("secret:B", "2"), ("key", "k1")]);
        let now = inputs(&[("secret:A", "3"), ("secret:B", "4"), ("key", "k2")]);
        assert_eq!(
            now.reasons(&was),
            ["secrets: recorded under another controller's key"]
        );
    }

    #[test]
    fn files_parse_back() {
        let i = inputs(&[("file:/etc/a b", "abc 600"), ("env:X", "1")]);
        assert_eq!(i.files().collect::<Vec<_>>(), [("/etc/a b", "abc", 0o600)]);
    }
}
