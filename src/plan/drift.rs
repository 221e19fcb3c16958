//! What changed between a saved plan's snapshot and the fleet now; pure.

use super::PlannedHost;
use crate::inventory::Hosts;
use crate::state::Observed;
use std::collections::{BTreeSet, HashMap};

/// Every difference between the hosts a plan saw and the hosts now, one line each, in host
/// name order: hosts gone, added, moved, reclassed, or whose recorded versions changed.
pub fn drift(
    then: &[PlannedHost],
    hosts: &Hosts,
    observed: &[Observed],
    class_names: &[String],
) -> Vec<String> {
    let now: HashMap<&str, crate::inventory::HostId> = hosts
        .hosts
        .enumerate()
        .map(|(i, h)| (&*h.name, i))
        .collect();
    let mut out = Vec::new();
    for h in then {
        let Some(&i) = now.get(&*h.name) else {
            out.push(format!("host {} is gone from the inventory", h.name));
            continue;
        };
        let host = &hosts.hosts[i];
        if host.address != h.address {
            out.push(format!(
                "host {} moved from {} to {}",
                h.name, h.address, host.address
            ));
        }
        let classes: Vec<String> = host
            .classes
            .iter()
            .filter_map(|c| class_names.get(c.index()).cloned())
            .collect();
        if classes != h.classes {
            out.push(format!(
                "host {} was in {} and is now in {}",
                h.name,
                h.classes.join(", "),
                classes.join(", ")
            ));
        }
        out.extend(state_drift(&h.name, &h.observed, &observed[i.index()]));
    }
    let planned: BTreeSet<&str> = then.iter().map(|h| &*h.name).collect();
    for h in hosts.hosts.iter().filter(|h| !planned.contains(&*h.name)) {
        out.push(format!("host {} was added to the inventory", h.name));
    }
    out
}

/// How one host's observed state differs; unreachable or unreadable compare by kind, not text.
fn state_drift(host: &str, then: &Observed, now: &Observed) -> Vec<String> {
    let describe = |o: &Observed| match o {
        Observed::Fresh => "had no state",
        Observed::Running { .. } => "had state",
        Observed::Unreachable { .. } => "did not answer",
        Observed::Unreadable { .. } => "had an unreadable state file",
        Observed::Unread => "was not read",
    };
    match (then, now) {
        (Observed::Running { services: a }, Observed::Running { services: b }) => {
            let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            names
                .into_iter()
                .filter(|s| a.get(*s) != b.get(*s))
                .map(|s| {
                    let v = |r: Option<&crate::state::ServiceRecord>| {
                        r.map_or("nothing".to_string(), |r| {
                            if r.healthy() {
                                r.version.clone()
                            } else {
                                format!("{} (failed)", r.version)
                            }
                        })
                    };
                    format!(
                        "host {host}: {s} was {} when planned, now {}",
                        v(a.get(s)),
                        v(b.get(s))
                    )
                })
                .collect()
        }
        (a, b) if std::mem::discriminant(a) == std::mem::discriminant(b) => Vec::new(),
        (a, b) => vec![format!(
            "host {host} {} when planned, and now {}",
            describe(a),
            describe(b)
                .replace("had", "has")
                .replace("did not", "does not")
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Host;
    use crate::state::ServiceRecord;
    use std::collections::BTreeMap;

    fn planned(name: &str, addr: &str, observed: Observed) -> PlannedHost {
        PlannedHost {
            name: name.into(),
            address: addr.into(),
            classes: vec!["app".into()],
            tags: BTreeMap::new(),
            observed,
        }
    }

    fn host(name: &str, addr: &str) -> Host {
        Host {
            name: name.into(),
            address: addr.into(),
            classes: vec![crate::site::ClassId::new(0)],
            tags: BTreeMap::new(),
        }
    }

    fn running(version: &str) -> Observed {
        Observed::Running {
            services: BTreeMap::from([("api".to_string(), ServiceRecord::at(version))]),
        }
    }

    #[test]
    fn names_every_kind_of_drift() {
        let then = vec![
            planned("a1", "10.0.0.1", running("1.0")),
            planned("a2", "10.0.0.2", Observed::Fresh),
            planned(
                "a3",
                "10.0.0.3",
                Observed::Unreachable {
                    reason: "timeout".into(),
                },
            ),
            planned("a4", "10.0.0.4", Observed::Fresh),
        ];
        let hosts = Hosts::new(
            vec![
                host("a1", "10.0.0.1"),
                host("a2", "10.0.0.9"),
                host("a3", "10.0.0.3"),
                host("a5", "10.0.0.5"),
            ],
            1,
        );
        let observed = vec![
            running("2.0"),
            Observed::Fresh,
            Observed::Unreachable {
                reason: "refused".into(),
            },
            Observed::Fresh,
        ];
        let got = drift(&then, &hosts, &observed, &["app".to_string()]);
        assert_eq!(
            got,
            [
                "host a1: api was 1.0 when planned, now 2.0",
                "host a2 moved from 10.0.0.2 to 10.0.0.9",
                "host a4 is gone from the inventory",
                "host a5 was added to the inventory",
            ]
        );
    }

    #[test]
    fn nothing_changed_means_no_drift() {
        let then = vec![planned("a1", "10.0.0.1", running("1.0"))];
        let hosts = Hosts::new(vec![host("a1", "10.0.0.1")], 1);
        assert!(drift(&then, &hosts, &[running("1.0")], &["app".to_string()]).is_empty());
        let gone_quiet = drift(
            &then,
            &hosts,
            &[Observed::Unreachable { reason: "x".into() }],
            &["app".to_string()],
        );
        assert_eq!(
            gone_quiet,
            ["host a1 had state when planned, and now does not answer"]
        );
    }
}
