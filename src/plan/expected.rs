//! What is known of the plan before any host is read: the order hosts can be expected to be
//! stepped in (services in dependency order, each one's hosts in the order of its waves; over
//! the connection cap, the connections made to lock and read the first of these hosts are kept
//! for their steps), and which hosts' states each service's part of the plan is made from.

use super::{waves, Selection};
use crate::inventory::{HostId, Hosts};
use crate::site::{ClassId, IdVec, ServiceId, Site};

/// The hosts selected, each once, in the order their first step is expected to start if
/// every one has a step: services in the site's dependency order, a service's hosts in the
/// order of its waves (canary, `spread` groups). An estimate: which hosts have steps is only
/// known once they are read, and services that need nothing start together.
pub fn first_hosts(site: &Site, hosts: &Hosts, selection: &Selection) -> Vec<HostId> {
    let mut seen: IdVec<HostId, bool> = vec![false; hosts.hosts.len()].into();
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

/// The hosts whose state `service`'s part of the plan is made from, in id order: its own hosts
/// and those of every service it needs, at runtime or for addresses only (a need for addresses
/// may name a service later in dependency order). Whatever every other host runs, the service's
/// part of the plan is the same (`plan::proptests`): once these hosts are read, the service can
/// be planned before the rest of the fleet is read. (Its steps may still have to wait: a step's
/// `after` and `waits` name other services' steps, which are planned from other hosts.)
pub fn planned_from(site: &Site, hosts: &Hosts, service: ServiceId) -> Vec<HostId> {
    let s = &site.services[service];
    let mut classes = s.classes.clone();
    for need in &s.needs {
        classes.extend(&site.services[need.service].classes);
    }
    hosts.of_classes(&classes)
}

/// Per host: whether `deploy apply` may leave it unread until its first step (level 2 of
/// "connecting each host once", over `--max-connections`). A host may be when every service of
/// its classes may be: its policy has no canary and no `wave-max-failed` (a wave padded with
/// hosts found converged at their step would hold no real change in its canary, and would
/// judge its failures against hosts that had nothing to do) and is not `on-failure "revert"`
/// (a revert switches a host back to what it recorded before the run, which a host read at
/// its step does not hand the run); none of its needs is for addresses, a share of the needed
/// hosts (`healthy` other than all) or drains (its steps would wait for the needed service's
/// steps on the hosts its pools add, or start while the needed service still steps, decided
/// from a record not read yet); and no service needs it with `drain=#true`. Then:
/// - the service's own steps start only once every service it needs has ended (every host of
///   those healthy): none of them waits for a step of another service on another host
///   (`Step::waits`), and none needs a host of its own to be read to be planned but the one
///   it runs on, so each is decided once its host is read ([`super::decide`]);
/// - a dependent read before the run that is handed its addresses decides its drops before
///   each wave from its own record and the site (a host it lists elsewhere than the site says
///   is dropped, whatever the needed host turns out to run), and lists the wave's hosts again
///   where their records say once their steps ended; its steps wait for the unread steps on
///   the hosts its pools add, and its `healthy=` counts the needed hosts as their steps end
///   (a host found converged at its step counts then), as for a host read first;
/// - a dependent that needs it at runtime of every host may be left unread too; any other is
///   read before the run, its plan made from this service's hosts as placeholders (each
///   counted as changing until its step ends). Then it starts only once those steps have
///   ended, after everything this service needs: a service needed by one read before the run
///   is left unread only when no service upstream of it (what it needs, all the way down)
///   has a need other than a plain runtime need, so that this later start closes no round of
///   waits that the plan made from every host would not have.
pub fn deferrable(site: &Site, hosts: &Hosts) -> Vec<bool> {
    let runtime_of_all = |need: &crate::site::Need| {
        need.healthy == Some(crate::site::Quota::All) && need.addressable.is_none() && !need.drain
    };
    let mut may: IdVec<ServiceId, bool> = site
        .services
        .enumerate()
        .map(|(sid, s)| {
            s.policy.canary == 0
                && s.policy.wave_max_failed.is_none()
                && s.policy.on_failure != crate::site::OnFailure::Revert
                && s.needs.iter().all(runtime_of_all)
                && !site
                    .services
                    .iter()
                    .any(|d| d.needs.iter().any(|n| n.drain && n.service == sid))
        })
        .collect();
    // Whether every service a service needs, all the way down, needs only plain runtime needs
    // of every host: no step upstream of it waits for another host's step.
    let mut plain: IdVec<ServiceId, bool> = site
        .services
        .iter()
        .map(|s| s.needs.iter().all(runtime_of_all))
        .collect();
    loop {
        let mut changed = false;
        for (sid, s) in site.services.enumerate() {
            if plain[sid] && s.needs.iter().any(|n| !plain[n.service]) {
                plain[sid] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // A service read before the run that needs one left unread counts it healthy only as its
    // placeholders' steps end, after everything that one needs: a start edge a plan made from
    // every host would not have where it is converged. So that no such edge closes a round of
    // waits the full plan does not have (the run would drop a wait it keeps), the service
    // needed is left unread then only when nothing upstream of it waits for another host's
    // step. Until nothing changes: a service read adds services read.
    loop {
        let class_may: IdVec<ClassId, bool> = site
            .classes
            .iter()
            .map(|c| c.services.iter().all(|&s| may[s]))
            .collect();
        let unread: IdVec<ServiceId, bool> = site
            .services
            .iter()
            .map(|s| s.classes.iter().all(|&c| class_may[c]))
            .collect();
        let mut changed = false;
        for (did, d) in site.services.enumerate() {
            if unread[did] {
                continue;
            }
            for need in &d.needs {
                if may[need.service] && !plain[need.service] {
                    may[need.service] = false;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let class_may: IdVec<ClassId, bool> = site
        .classes
        .iter()
        .map(|c| c.services.iter().all(|&s| may[s]))
        .collect();
    hosts
        .hosts
        .iter()
        .map(|h| !h.classes.is_empty() && h.classes.iter().all(|&c| class_may[c]))
        .collect()
}

/// Per service: whether its steps may wait for the steps of a service whose steps may wait
/// for its own in turn. A step waits for the steps of a service it needs on the hosts that
/// service's pool adds to it, unless that service needs it at runtime ([`super::unread_waits`],
/// [`super::Step::waits`]); needs for addresses may go both ways, and so may such waits. The
/// planner puts the steps that wait in waves after those that do not, so that no wave waits
/// for one that waits for it; a service started under its placeholders, whose waits are only
/// known as its hosts are read, cannot: a service on such a cycle waits for its plan.
pub fn waits_back(site: &Site) -> IdVec<ServiceId, bool> {
    let closure = super::RuntimeClosure::new(site);
    let next: IdVec<ServiceId, Vec<ServiceId>> = site
        .services
        .enumerate()
        .map(|(sid, s)| {
            s.needs
                .iter()
                .map(|n| n.service)
                .filter(|&x| x != sid && !closure.needs(x, sid))
                .collect()
        })
        .collect();
    site.services
        .ids()
        .map(|sid| {
            // Whether `sid` is reached again from what it may wait for.
            let mut seen: IdVec<ServiceId, bool> = vec![false; site.services.len()].into();
            let mut stack = next[sid].clone();
            while let Some(x) = stack.pop() {
                if x == sid {
                    return true;
                }
                if !std::mem::replace(&mut seen[x], true) {
                    stack.extend(&next[x]);
                }
            }
            false
        })
        .collect()
}

/// Per service of `plan`: whether it may start before it is planned, under its placeholders,
/// once its needs hold: its policy is not about which hosts change
/// ([`super::PlannedPolicy::may_start_unread`]), and its steps cannot wait for a service that
/// may wait for it in turn ([`waits_back`]).
pub fn may_start_early(site: &Site, plan: &super::Plan) -> Vec<bool> {
    let back = waits_back(site);
    plan.services
        .iter()
        .map(|s| s.policy.may_start_unread() && site.service(&s.name).is_some_and(|sid| !back[sid]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `web` hosts run `front`, which needs `app`, which needs `db` on the `db` hosts; `db`
    /// is handed the addresses of `front` (a need for addresses, on a later service). The
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
             service \"db\" { port 82; start \"run\"; needs \"front\" addressable=\"all\" }\n",
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
            ..Default::default()
        };
        assert_eq!(names(first_hosts(&site, &hosts, &only)), ["w2"]);
    }

    #[test]
    fn a_service_is_planned_from_its_hosts_and_its_needs_hosts() {
        let (_dir, site, hosts) = site();
        // In id order, which is the hosts' name order.
        let from = |service: &str| -> Vec<String> {
            let sid = site.service(service).expect("service");
            planned_from(&site, &hosts, sid)
                .into_iter()
                .map(|h| hosts.hosts[h].name.to_string())
                .collect()
        };
        // `db` is handed `front`'s addresses: the web hosts too, though `front` comes later.
        assert_eq!(from("db"), ["db1", "db2", "w1", "w2"]);
        // `app` runs on the web hosts and needs `db`.
        assert_eq!(from("app"), ["db1", "db2", "w1", "w2"]);
        // `front` needs `app`, on its own hosts: not `db`'s, which only `app` needs.
        assert_eq!(from("front"), ["w1", "w2"]);
    }

    #[test]
    fn hosts_are_left_unread_only_where_each_dependency_is_a_runtime_need_of_every_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w =
            |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        w(
            "platform.kdl",
            "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
             host \"e1\" address=\"10.0.0.1\" class=\"edge\"\n\
             host \"w1\" address=\"10.0.0.2\" class=\"web\"\n\
             host \"d1\" address=\"10.0.0.3\" class=\"db\"\n\
             host \"c1\" address=\"10.0.0.4\" class=\"probe\"\n\
             host \"m1\" address=\"10.0.0.5\" class=\"meter\"\n\
             host \"l1\" address=\"10.0.0.6\" class=\"lb\"\n\
             host \"a1\" address=\"10.0.0.7\" class=\"app\"\n\
             host \"k1\" address=\"10.0.0.8\" class=\"cache\"\n\
             host \"q1\" address=\"10.0.0.9\" class=\"queue\"\n\
             host \"g1\" address=\"10.0.0.10\" class=\"gate\"\n\
             host \"r1\" address=\"10.0.0.11\" class=\"rev\"\n\
             host \"p1\" address=\"10.0.0.12\" class=\"edge2\"\n\
             host \"b1\" address=\"10.0.0.13\" class=\"back\"\n\
             host \"t1\" address=\"10.0.0.14\" class=\"top\"\n\
             host \"n1\" address=\"10.0.0.15\" class=\"mid\"\n\
             host \"o1\" address=\"10.0.0.16\" class=\"low\"\n} }",
        );
        w("canary.kdl", "policy \"canary\" { canary 1 }\n");
        w("wave.kdl", "policy \"wave\" { wave-max-failed 1 }\n");
        w(
            "revert.kdl",
            "policy \"revert\" { on-failure \"revert\" }\n",
        );
        w(
            "site.kdl",
            "site \"s\" { version \"1\"; platform \"platform.kdl\" }\n\
             class \"edge\" { service \"agent\" }\n\
             class \"web\" { service \"agent\"; service \"front\" }\n\
             class \"db\" { service \"db\" }\n\
             class \"probe\" { service \"probe\" }\n\
             class \"meter\" { service \"meter\" }\n\
             service \"agent\" { start \"run\" }\n\
             service \"front\" { port 80; start \"run\"; needs \"db\" }\n\
             service \"db\" { port 82; start \"run\" }\n\
             service \"probe\" { start \"run\"; policy \"canary.kdl\" }\n\
             service \"meter\" { start \"run\"; policy \"wave.kdl\" }\n\
             class \"lb\" { service \"lb\" }\n\
             class \"app\" { service \"app\" }\n\
             class \"cache\" { service \"cache\" }\n\
             class \"queue\" { service \"queue\" }\n\
             class \"gate\" { service \"gate\" }\n\
             service \"lb\" { start \"run\"; needs \"app\" addressable=\"all\" }\n\
             service \"app\" { port 81; start \"run\"; needs \"cache\" healthy=\"50%\" }\n\
             service \"cache\" { start \"run\" }\n\
             service \"queue\" { start \"run\" }\n\
             service \"gate\" { start \"run\"; needs \"queue\"; policy \"canary.kdl\" }\n\
             class \"rev\" { service \"rev\" }\n\
             service \"rev\" { start \"run\"; policy \"revert.kdl\" }\n\
             class \"edge2\" { service \"proxy\" }\n\
             class \"back\" { service \"back\" }\n\
             service \"proxy\" { start \"run\"; needs \"back\" drain=#true }\n\
             service \"back\" { port 83; start \"run\" }\n\
             class \"top\" { service \"top\" }\n\
             class \"mid\" { service \"mid\" }\n\
             class \"low\" { service \"low\" }\n\
             service \"top\" { start \"run\"; needs \"mid\" healthy=\"50%\" }\n\
             service \"mid\" { start \"run\"; needs \"low\" }\n\
             service \"low\" { start \"run\"; needs \"cache\" addressable=\"all\" }\n",
        );
        let site = crate::site::load(&dir.path().join("site.kdl")).expect("site");
        let hosts = crate::inventory::resolve(&site).expect("hosts");
        let deferred: Vec<(String, bool)> = hosts
            .hosts
            .iter()
            .zip(deferrable(&site, &hosts))
            .map(|(h, d)| (h.name.to_string(), d))
            .collect();
        let want = |name: &str| deferred.iter().find(|(n, _)| n == name).map(|(_, d)| *d);
        // `agent` alone: yes. `w1` also runs `front`, which needs every `db` host at runtime:
        // yes, and `db` too.
        assert_eq!(want("e1"), Some(true));
        assert_eq!(want("w1"), Some(true));
        assert_eq!(want("d1"), Some(true));
        // A need for addresses (lb), or of some hosts only (app on cache): not the service
        // that needs, read before the run; the service needed, yes (its dependent decides its
        // drops from its own record, and counts it healthy as its steps end).
        assert_eq!(want("l1"), Some(false));
        assert_eq!(want("a1"), Some(false));
        assert_eq!(want("k1"), Some(true));
        // A runtime need of every host, by a service read before the run (its canary): the
        // service needed may be left unread all the same.
        assert_eq!(want("g1"), Some(false));
        assert_eq!(want("q1"), Some(true));
        // Drained (`drain=#true`): neither end, since every wave of it drops each host its
        // dependents list, decided from its step.
        assert_eq!(want("p1"), Some(false));
        assert_eq!(want("b1"), Some(false));
        // Needed by a service read before the run (top, a share of it), a service whose own
        // needs are plain but something upstream waits for another host's steps (low is
        // handed cache's addresses): read too, so that top's start does not wait for mid's
        // placeholders, which wait for low's waits.
        assert_eq!(want("t1"), Some(false));
        assert_eq!(want("n1"), Some(false));
        assert_eq!(want("o1"), Some(false));
        // Alone, but reverted as a whole on failure: its hosts' records before the run are
        // what a revert goes back to.
        assert_eq!(want("r1"), Some(false));
        // Alone, but with a canary, or a wave's own failure budget: no.
        assert_eq!(want("c1"), Some(false));
        assert_eq!(want("m1"), Some(false));
    }

    #[test]
    fn only_services_whose_waits_may_come_back_to_them_wait_for_their_plan() {
        // The shop: db is handed front's addresses, but front needs db at runtime (through
        // app), so db's steps never wait for front's: no cycle.
        let (_dir, site, _) = site();
        assert_eq!(waits_back(&site).as_slice(), [false, false, false]);
        // Two services handed each other's addresses, and one that lists the first.
        let dir = tempfile::tempdir().expect("tempdir");
        let w =
            |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
        w(
            "platform.kdl",
            "platform \"p\" { transport \"local\"; inventory \"static\" {\n\
             host \"a1\" address=\"10.0.0.1\" class=\"a\"\n} }",
        );
        w(
            "site.kdl",
            "site \"s\" { version \"1\"; platform \"platform.kdl\" }\n\
             class \"a\" { service \"x\"; service \"y\"; service \"z\" }\n\
             service \"x\" { port 80; start \"run\"; needs \"y\" addressable=\"all\" }\n\
             service \"y\" { port 81; start \"run\"; needs \"x\" addressable=\"all\" }\n\
             service \"z\" { port 82; start \"run\"; needs \"x\" addressable=\"all\" }\n",
        );
        let site = crate::site::load(&dir.path().join("site.kdl")).expect("site");
        let back = |name: &str| waits_back(&site)[site.service(name).expect("service")];
        assert!(back("x") && back("y"));
        assert!(!back("z"), "z waits for x, which never waits for z");
    }
}
