//! The order hosts can be expected to be stepped in, known before any host is read: services
//! in dependency order, each one's hosts in the order of its waves. Over the connection cap,
//! the connections made to lock and read the first of these hosts are kept for their steps.

use super::{waves, Selection};
use crate::inventory::{HostId, Hosts};
use crate::site::Site;

/// The hosts selected, each once, in the order their first step is expected to start if
/// every one has a step: services in the site's dependency order, a service's hosts in the
/// order of its waves (canary, `spread` groups). An estimate: which hosts have steps is only
/// known once they are read, and services that need nothing start together.
pub fn first_hosts(site: &Site, hosts: &Hosts, selection: &Selection) -> Vec<HostId> {
    let mut seen = vec![false; hosts.hosts.len()];
    let mut out = Vec::new();
    for &sid in &site.order {
        let service = &site.services[sid];
        let mut members = hosts.of_classes(&service.classes);
        members.retain(|&h| selection.has(sid, h));
        for group in waves::waves(hosts, &members, &service.policy, usize::MAX) {
            for h in group.hosts {
                if !std::mem::replace(&mut seen[h], true) {
                    out.push(h);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `web` hosts run `front`, which needs `app`, which needs `db` on the `db` hosts; the
    /// inventory lists the web hosts first.
    fn site() -> (tempfile::TempDir, Site, Hosts) {
        let dir = tempfile::tempdir().expect("tempdir");
        let w =
            |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        w(
            "platform.kdl",
            "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
             host \"w1\" address=\"10.0.0.1\" class=\"web\"\n\
             host \"w2\" address=\"10.0.0.2\" class=\"web\"\n\
             host \"db2\" address=\"10.0.0.4\" class=\"db\"\n\
             host \"db1\" address=\"10.0.0.3\" class=\"db\"\n} }",
        );
        w(
            "site.kdl",
            "site \"shop\" { version \"1\"; platform \"platform.kdl\" }\n\
             class \"web\" { service \"front\"; service \"app\" }\n\
             class \"db\" { service \"db\" }\n\
             service \"front\" { port 80; start \"run\"; needs \"app\" }\n\
             service \"app\" { port 81; start \"run\"; needs \"db\" }\n\
             service \"db\" { port 82; start \"run\" }\n",
        );
        let site = crate::site::load(&dir.path().join("site.kdl")).expect("site");
        let hosts = crate::inventory::resolve(&site).expect("hosts");
        (dir, site, hosts)
    }

    #[test]
    fn services_in_dependency_order_each_host_once_and_only_those_selected() {
        let (_dir, site, hosts) = site();
        let names = |ids: Vec<HostId>| -> Vec<String> {
            ids.into_iter()
                .map(|h| hosts.hosts[h].name.to_string())
                .collect()
        };
        let all = Selection::default();
        assert_eq!(
            names(first_hosts(&site, &hosts, &all)),
            ["db1", "db2", "w1", "w2"]
        );
        // `--only front --on w2`: the one host selected.
        let only = Selection {
            services: site.service("front").map(|s| [s].into()),
            hosts: hosts.find("w2").map(|h| [h].into()),
        };
        assert_eq!(names(first_hosts(&site, &hosts, &only)), ["w2"]);
    }
}
