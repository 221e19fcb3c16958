//! Removals: a service a host records that the site no longer runs there (the service left the
//! site, the host left every class that runs it, or, known from the store, the inventory). Found from what the hosts record; carried
//! out (its recorded `stop` and `remove` hooks, then its record deleted) only by `apply
//! --prune` or a site with `prune #true`, after every other step of the run has ended.

use super::Selection;
use crate::inventory::Hosts;
use crate::site::Site;
use crate::state::Observed;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A service to take off a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub host: Arc<str>,
    pub service: String,
    /// The version the host records.
    pub version: String,
    pub why: Why,
    /// The hooks the removal runs, as the host recorded them, in order (`stop`, `remove`);
    /// `None`: the host recorded none (a record of an older deploy): the removal runs no hook,
    /// it only deletes the record.
    pub hooks: Option<Vec<String>>,
}

/// Why a host no longer runs a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// The site has no such service any more.
    LeftSite,
    /// The host is in no class that runs it.
    LeftClass,
    /// The host is no longer in the inventory (known from the store).
    LeftInventory,
}

impl Why {
    /// In words, for the plan.
    pub fn words(self) -> &'static str {
        match self {
            Why::LeftSite => "no longer in the site",
            Why::LeftClass => "no class of the host runs it",
            Why::LeftInventory => "the host is no longer in the inventory",
        }
    }
}

/// Every removal: per host read (in host order), each service it records that the site does
/// not run there (in name order). Hosts not read (unreachable, unread) have none; `--on` keeps
/// the hosts it selects, `--only` the services it names (a service no longer in the site is
/// never among them).
pub fn removals(
    site: &Site,
    hosts: &Hosts,
    observed: &[Observed],
    selection: &Selection,
) -> Vec<Removal> {
    let mut out = Vec::new();
    for ((h, host), seen) in hosts.hosts.enumerate().zip(observed) {
        let Observed::Running { services } = seen else {
            continue;
        };
        if selection.hosts.as_ref().is_some_and(|on| !on.contains(&h)) {
            continue;
        }
        for (name, record) in services {
            // A host the store knows and the inventory no longer gives: in no class.
            let gone = host.classes.is_empty();
            let why = match site.service(name) {
                _ if gone => Why::LeftInventory,
                None => Why::LeftSite,
                Some(sid) => {
                    let classes = &site.services[sid].classes;
                    if host.classes.iter().any(|c| classes.contains(c)) {
                        continue;
                    }
                    if selection
                        .services
                        .as_ref()
                        .is_some_and(|only| !only.contains(&sid))
                    {
                        continue;
                    }
                    Why::LeftClass
                }
            };
            if why != Why::LeftClass && selection.services.is_some() {
                continue;
            }
            out.push(Removal {
                host: host.name.clone(),
                service: name.clone(),
                version: record.version.clone(),
                why,
                hooks: record
                    .removal
                    .as_ref()
                    .map(|r| r.hooks().map(|(n, _)| n.to_string()).collect()),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Host;
    use crate::state::{RecordedHook, ServiceRecord};
    use std::collections::BTreeMap;

    fn site() -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        let platform = "platform \"p\" {\n    transport \"local\" root=\"hosts\"\n    \
                        inventory \"static\" {\n        host \"a1\" address=\"10.0.0.1\" \
                        class=\"app\"\n        host \"a2\" address=\"10.0.0.2\" \
                        class=\"spare\"\n    }\n}\n";
        let site = "site \"s\" { platform \"platform.kdl\" }\nclass \"app\" { service \"api\" }\n\
                    class \"spare\" { service \"idle\" }\nservice \"api\" { version \"1\" }\n\
                    service \"idle\" { version \"1\" }\n";
        std::fs::write(dir.path().join("platform.kdl"), platform).expect("platform");
        std::fs::write(dir.path().join("site.kdl"), site).expect("site");
        match crate::site::load(&dir.path().join("site.kdl")) {
            Ok(site) => site,
            Err(e) => panic!("valid site: {e:?}"),
        }
    }

    fn host(name: &str, class: crate::site::ClassId) -> Host {
        Host {
            name: Arc::from(name),
            address: Arc::from("10.0.0.1"),
            classes: vec![class],
            tags: BTreeMap::new(),
        }
    }

    #[test]
    fn a_service_gone_from_the_site_or_from_the_hosts_class_is_a_removal() {
        let site = site();
        let app = site.class("app");
        let spare = site.class("spare");
        let (Some(app), Some(spare)) = (app, spare) else {
            panic!("classes");
        };
        let hosts = Hosts::new(vec![host("a1", app), host("a2", spare)], 2);
        let mut kept = ServiceRecord::at("1");
        kept.removal = Some(crate::state::Removal {
            stop: Some(RecordedHook {
                command: "stop it".into(),
                timeout: None,
            }),
            remove: None,
            env: Vec::new(),
        });
        let running = |names: &[&str]| Observed::Running {
            services: names
                .iter()
                .map(|n| (n.to_string(), kept.clone()))
                .collect(),
        };
        let mut old = running(&["api"]);
        if let Observed::Running { services } = &mut old {
            services.insert("cache".into(), ServiceRecord::at("0.9"));
        }
        let observed = vec![old, running(&["api", "idle"])];
        let all = removals(&site, &hosts, &observed, &Selection::default());
        let said: Vec<(&str, &str, Why, Option<Vec<String>>)> = all
            .iter()
            .map(|r| (&*r.host, r.service.as_str(), r.why, r.hooks.clone()))
            .collect();
        assert_eq!(
            said,
            [
                ("a1", "cache", Why::LeftSite, None),
                ("a2", "api", Why::LeftClass, Some(vec!["stop".to_string()])),
            ]
        );
        // `--on a2` keeps a2's; `--only api` keeps the service still in the site.
        let on = Selection {
            hosts: Some([crate::inventory::HostId::new(1)].into()),
            ..Default::default()
        };
        assert_eq!(removals(&site, &hosts, &observed, &on).len(), 1);
        let only = Selection {
            services: Some([crate::site::ServiceId::new(0)].into()),
            ..Default::default()
        };
        let kept: Vec<String> = removals(&site, &hosts, &observed, &only)
            .into_iter()
            .map(|r| r.service)
            .collect();
        assert_eq!(kept, ["api"]);
    }
}
