//! A dependent never lists a host where it does not serve, on the fake transport: before a
//! wave of the needed service stops hosts whose port changes (or that a `drain=#true` need
//! lists), each dependent's host drops them; once the wave is over it lists them again, at
//! their new address; each such reconfigure is recorded with the inputs it was given.

use super::pool::planned;
use super::*;
use crate::rollout::Phase;

/// api on app1, app2 (one host per wave) and lb on lb1, each service with its `extra` lines:
/// the hosts run what the site with `old_api` gave them, and the plan is made for `new_api`.
fn changed(old_api: &str, new_api: &str, lb: &str) -> Fixture {
    changed_on(2, "batch 1", old_api, new_api, lb)
}

/// api on `apps` hosts under `policy`, and lb on lb1, as [`changed`].
fn changed_on(apps: usize, policy: &str, old_api: &str, new_api: &str, lb: &str) -> Fixture {
    let body = |api: &str| {
        format!(
            "class \"app\" {{ service \"api\" }}\nclass \"lb\" {{ service \"lb\" }}\n{}{}",
            svc("api", &format!("policy \"one.kdl\"; {api}")),
            svc("lb", lb)
        )
    };
    let mut owned = hosts("app", "app", apps);
    owned.push(("lb1".to_string(), "lb"));
    let hs = host_refs(&owned);
    let policies = [("one.kdl", policy)];
    let old = fixture(&body(old_api), &hs, &policies, &[]);
    let inventory = crate::inventory::resolve(&old.site).expect("inventory");
    let observed: Vec<Observed> = inventory
        .hosts
        .enumerate()
        .map(|(h, host)| Observed::Running {
            services: host
                .classes
                .iter()
                .flat_map(|c| old.site.classes[*c].services.iter().copied())
                .map(|sid| {
                    let s = &old.site.services[sid];
                    let record = ServiceRecord {
                        version: s.version.clone(),
                        configured: None,
                        validated: None,
                        inputs: Some(old.desired.inputs(sid, h)),
                        removal: None,
                        hooks: None,
                    };
                    (s.name.clone(), record)
                })
                .collect(),
        })
        .collect();
    planned(fixture(&body(new_api), &hs, &policies, &[]), &observed)
}

/// `(phase, hosts dropped or listed, hosts of api listed after it)` of lb1's reconfigures
/// during api's waves, in order; each one's recorded `needs:api` as its record says.
fn repoints(ran: &Ran) -> Vec<(Phase, Vec<String>, String)> {
    let mut started = Vec::new();
    let mut recorded = Vec::new();
    for (_, _, e) in &ran.events {
        match e {
            EventKind::RepointStarted {
                host, phase, hosts, ..
            } if host == "lb1" => started.push((*phase, hosts.clone())),
            EventKind::RepointFinished {
                host, ok, record, ..
            } if host == "lb1" => {
                assert!(ok, "lb1's reconfigure passed");
                let entry = record
                    .as_ref()
                    .and_then(|r| r.inputs.as_ref())
                    .and_then(|i| i.get("needs:api"))
                    .unwrap_or("")
                    .to_string();
                recorded.push(entry);
            }
            _ => {}
        }
    }
    assert_eq!(started.len(), recorded.len());
    started
        .into_iter()
        .zip(recorded)
        .map(|((p, h), r)| (p, h, r))
        .collect()
}

/// The hooks run, in order, as `host hook service`, for the hooks that tell the order apart.
fn order(ran: &Ran) -> Vec<String> {
    ran.cmds()
        .iter()
        .filter_map(|c| c.hook().map(|(h, s)| (c.host.clone(), h, s)))
        .filter(|(_, h, s)| matches!((*h, *s), ("stop" | "check", "api") | ("reload", "lb")))
        .map(|(host, h, s)| format!("{host} {h} {s}"))
        .collect()
}

#[tokio::test]
async fn a_port_change_drops_each_wave_from_the_load_balancer_before_it_stops() {
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let fx = changed("port 8080", "port 8081", lb);
    let lb_step = fx
        .service("lb")
        .each_step()
        .next()
        .expect("lb1 is reconfigured");
    assert_eq!(
        lb_step.waits.iter().map(|w| &*w.host).collect::<Vec<_>>(),
        ["app1", "app2"],
        "lb1's own step waits for both api hosts, whose port changes"
    );
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(
        order(&ran),
        [
            "lb1 reload lb",
            "app1 stop api",
            "app1 check api",
            "lb1 reload lb",
            "lb1 reload lb",
            "app2 stop api",
            "app2 check api",
            "lb1 reload lb",
        ]
    );
    // What lb1 was given at each moment, as its record said then: app2 alone at its old port,
    // app1 back at its new one with app2 at its old, app1 alone; then lb1's own step.
    assert_eq!(
        repoints(&ran),
        [
            (
                Phase::Drop,
                vec!["app1".into()],
                "app2=10.0.0.2:8080".into()
            ),
            (
                Phase::List,
                vec!["app1".into()],
                "app1=10.0.0.1:8081 app2=10.0.0.2:8080".into()
            ),
            (
                Phase::Drop,
                vec!["app2".into()],
                "app1=10.0.0.1:8081".into()
            ),
        ]
    );
    let last = ran
        .events
        .iter()
        .rev()
        .find_map(|(_, _, e)| match e {
            EventKind::StepFinished {
                result: StepEnd { service, .. },
                record,
                ..
            } if service == "lb" => record.clone(),
            _ => None,
        })
        .expect("lb1's own step");
    let sid = fx.site.service("lb").expect("lb");
    assert_eq!(
        last.inputs,
        Some(fx.desired.inputs(sid, crate::inventory::HostId::new(2))),
        "lb1 converged"
    );
}

#[tokio::test]
async fn a_drained_upgrade_at_the_same_address_drops_and_lists_each_wave() {
    let lb = "needs \"api\" addressable=\"all\" drain=#true; reload \"hook reload lb\"";
    let fx = changed("port 8080", "port 8080; version \"2.0\"", lb);
    assert_eq!(fx.service("lb").steps(), 0, "lb itself does not change");
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(
        order(&ran),
        [
            "lb1 reload lb",
            "app1 stop api",
            "app1 check api",
            "lb1 reload lb",
            "lb1 reload lb",
            "app2 stop api",
            "app2 check api",
            "lb1 reload lb",
        ]
    );
    let both = "app1=10.0.0.1:8080 app2=10.0.0.2:8080";
    let seen = repoints(&ran);
    assert_eq!(seen.last().map(|r| r.2.as_str()), Some(both));
    assert_eq!(
        seen.iter().map(|r| r.0).collect::<Vec<_>>(),
        [Phase::Drop, Phase::List, Phase::Drop, Phase::List]
    );
}

#[tokio::test]
async fn an_upgrade_without_drain_leaves_the_load_balancer_alone() {
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let fx = changed("port 8080", "port 8080; version \"2.0\"", lb);
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert!(repoints(&ran).is_empty());
    assert!(ran.hosts_with("reload", "lb").is_empty());
}

#[tokio::test]
async fn a_load_balancer_that_cannot_drop_a_host_halts_the_wave_before_it_stops() {
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let fx = changed("port 8080", "port 8081", lb);
    let ran = fx
        .run(
            Rules::default().fail(Some("lb1"), "hook reload lb"),
            8,
            true,
        )
        .await;
    assert!(!ran.summary.converged());
    assert!(
        ran.hosts_with("stop", "api").is_empty(),
        "no api host stops while lb1 lists it"
    );
    let (outcome, ..) = ran.outcome("api");
    assert_eq!(outcome, ServiceOutcome::Halted);
    assert!(
        ran.summary
            .failures
            .iter()
            .any(|f| f.host == "lb1" && f.service == "lb"),
        "{:?}",
        ran.summary.failures
    );
}

/// Checks, in the order things happened, that no api host's `stop` ran while lb1 listed it
/// (every `stop` here moves its host to another port) or while one of lb1's reconfigures
/// ran; returns what lb1 lists at the end, by its last record.
fn never_stopped_while_listed(ran: &Ran) -> String {
    let mut line: Vec<(u64, Option<String>)> = ran
        .cmds()
        .iter()
        .filter(|c| c.hook() == Some(("stop", "api")))
        .map(|c| (c.start, Some(c.host.clone())))
        .collect();
    let mut listed = String::new();
    let mut running = false;
    let mut changes = Vec::new();
    for (at, _, e) in &ran.events {
        match e {
            EventKind::RepointStarted { host, .. } if host == "lb1" => {
                changes.push((*at, None, true));
            }
            EventKind::RepointFinished { host, record, .. } if host == "lb1" => {
                let entry = record
                    .as_ref()
                    .and_then(|r| r.inputs.as_ref())
                    .and_then(|i| i.get("needs:api"))
                    .unwrap_or("")
                    .to_string();
                changes.push((*at, Some(entry), false));
            }
            _ => {}
        }
    }
    line.extend(changes.iter().map(|(at, ..)| (*at, None)));
    line.sort_by_key(|(at, _)| *at);
    let mut next = changes.iter();
    for (at, stop) in line {
        match stop {
            Some(host) => {
                assert!(
                    !running,
                    "{host} stopped at {at} while lb1 was reconfigured"
                );
                assert!(
                    crate::state::member_of(&listed, &host).is_none(),
                    "{host} stopped at {at} while lb1 listed it: {listed}"
                );
            }
            None => {
                let (_, entry, starts) = next.next().expect("a change");
                running = *starts;
                if let Some(entry) = entry {
                    listed = entry.clone();
                }
            }
        }
    }
    listed
}

#[tokio::test]
async fn a_reverted_port_change_is_dropped_before_each_revert_and_listed_where_it_serves() {
    // Waves [app1, app2], [app3, app4]; app4's `stop` refuses (it keeps serving 8080): the
    // budget is spent, app3, app2 and app1 are switched back to 8080, two at a time. lb1's own
    // step never comes (the run stops), so each batch's hosts are dropped and listed by the
    // revert itself, app3 included though the wave's end left it unlisted.
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let policy = "batch 2; max-failed 0; on-failure \"revert\"";
    let fx = changed_on(4, policy, "port 8080", "port 8081", lb);
    let ran = fx
        .run(
            Rules::default().fail(Some("app4"), "hook stop api"),
            8,
            true,
        )
        .await;
    let (outcome, ..) = ran.outcome("api");
    assert_eq!(outcome, ServiceOutcome::Reverted);
    let stops = |host: &str| {
        ran.cmds()
            .iter()
            .filter(|c| c.host == host && c.hook() == Some(("stop", "api")))
            .count()
    };
    for host in ["app1", "app2", "app3"] {
        assert_eq!(stops(host), 2, "{host} switched and switched back");
    }
    let last = never_stopped_while_listed(&ran);
    assert_eq!(
        last, "app1=10.0.0.1:8080 app2=10.0.0.2:8080 app3=10.0.0.3:8080 app4=10.0.0.4:8080",
        "every api host listed where it serves"
    );
}

#[tokio::test]
async fn a_revert_lists_again_the_hosts_a_wave_left_dropped() {
    // One wave [app1, app2]; app2's `stop` refuses. Both were dropped for the wave, and lb1's
    // own step, which would have listed them, never comes: the revert of app1 lists both.
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let policy = "batch \"100%\"; max-failed 0; on-failure \"revert\"";
    let fx = changed_on(2, policy, "port 8080", "port 8081", lb);
    let ran = fx
        .run(
            Rules::default().fail(Some("app2"), "hook stop api"),
            8,
            true,
        )
        .await;
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Reverted);
    let last = never_stopped_while_listed(&ran);
    assert_eq!(last, "app1=10.0.0.1:8080 app2=10.0.0.2:8080");
}

#[tokio::test]
async fn a_port_change_reverted_at_its_deadline_is_dropped_before_each_revert() {
    // app3's check hangs past the progress deadline: every host switched so far runs the new
    // port, none failed back to the old one; the revert still moves each back to 8080, so lb1
    // drops each before its revert stops it and ends listing all three at 8080.
    let lb = "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"";
    let policy = "batch 1; max-failed 1; on-failure \"revert\"; progress-deadline \"300ms\"";
    let fx = changed_on(3, policy, "port 8080", "port 8081", lb);
    let rules = Rules::default().sleep(Some("app3"), "hook check api", 800);
    let ran = fx.run(rules, 8, true).await;
    assert_eq!(ran.outcome("api").0, ServiceOutcome::Reverted);
    let last = never_stopped_while_listed(&ran);
    assert_eq!(
        last,
        "app1=10.0.0.1:8080 app2=10.0.0.2:8080 app3=10.0.0.3:8080"
    );
}
