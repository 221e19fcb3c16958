//! Pool changes on the fake transport: a dependent's step that lists hosts this run adds to a
//! service waits until their steps of that service have ended, also when its host was read
//! during the run; no plan deadlocks on it.

use super::*;

/// Plans `body` on `hosts`: every host but `added` runs each of its services at 1.0 with the
/// inputs it had before `added` joined the inventory; `added` are fresh.
fn grown(body: &str, hosts: &[(&str, &str)], policies: &[(&str, &str)], added: &[&str]) -> Fixture {
    let fx = fixture(body, hosts, policies, &[]);
    let site = fx.site.clone();
    let full = crate::inventory::resolve(&site).expect("inventory");
    let kept: std::collections::BTreeSet<crate::inventory::HostId> = full
        .hosts
        .ids()
        .filter(|h| !added.contains(&&*full.hosts[*h].name))
        .collect();
    let before = full.subset(&kept, site.classes.len());
    let secrets = crate::secrets::Secrets::none();
    let old = crate::desired::resolve(&site, &before, &secrets).expect("desired");
    let observed: Vec<Observed> = full
        .hosts
        .iter()
        .map(|h| {
            let Some(b) = before.find(&h.name) else {
                return Observed::Fresh;
            };
            let services = h
                .classes
                .iter()
                .flat_map(|c| site.classes[*c].services.iter().copied())
                .map(|sid| {
                    (
                        site.services[sid].name.clone(),
                        ServiceRecord {
                            version: site.services[sid].version.clone(),
                            configured: None,
                            validated: None,
                            inputs: Some(old.inputs(sid, b)),
                            removal: None,
                            hooks: None,
                        },
                    )
                })
                .collect();
            Observed::Running { services }
        })
        .collect();
    planned(fx, &observed)
}

/// `fx` planned with every host read to run `observed`.
pub(super) fn planned(fx: Fixture, observed: &[Observed]) -> Fixture {
    let full = crate::inventory::resolve(&fx.site).expect("inventory");
    let secrets = crate::secrets::Secrets::none();
    let desired = crate::desired::resolve(&fx.site, &full, &secrets).expect("desired");
    let plan =
        plan::plan(&fx.site, &full, observed, &desired, &Selection::default()).expect("plan");
    Fixture {
        plan: Arc::new(plan),
        desired: Arc::new(desired),
        ..fx
    }
}

/// api on `apps` hosts (app1…) and lb on `lbs` (lb1…), each service with its `extra` lines,
/// planned with `added` new to the inventory.
fn lb_over_api(
    api: &str,
    lb: &str,
    (apps, lbs): (usize, usize),
    policies: &[(&str, &str)],
    added: &[&str],
) -> Fixture {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\nclass \"lb\" {{ service \"lb\" }}\n{}{}",
        svc("api", api),
        svc("lb", lb)
    );
    let mut hs = hosts("app", "app", apps);
    hs.extend(hosts("lb", "lb", lbs));
    grown(&body, &host_refs(&hs), policies, added)
}

/// The waits dropped as they would go round: the plan's and those the run said it dropped,
/// `(service, host, waited service, waited host)`.
pub(super) fn dropped(fx: &Fixture, ran: &Ran) -> Vec<(String, String, String, String)> {
    let planned = fx.plan.dropped_waits.iter().map(|d| {
        (
            d.service.to_string(),
            d.host.to_string(),
            d.waits_for.service.to_string(),
            d.waits_for.host.to_string(),
        )
    });
    let run = ran.events.iter().filter_map(|(_, _, e)| match e {
        EventKind::WaitDropped {
            service,
            host,
            waits_for,
            ..
        } => Some((
            service.clone(),
            host.clone(),
            waits_for.service.to_string(),
            waits_for.host.to_string(),
        )),
        _ => None,
    });
    planned.chain(run).collect()
}

/// Every waiting step started only after each step it waits for had finished (or was given up
/// without running), but for the waits dropped as they would go round.
pub(super) fn waits_kept(fx: &Fixture, ran: &Ran) -> Result<(), String> {
    let gone = dropped(fx, ran);
    for s in &fx.plan.services {
        for st in s.each_step() {
            let Some(first) = ran.first_hook(&s.name, &st.host) else {
                continue;
            };
            for w in &st.waits {
                let key = (
                    s.name.clone(),
                    st.host.to_string(),
                    w.service.to_string(),
                    w.host.to_string(),
                );
                if gone.contains(&key) {
                    continue;
                }
                let ended = ran
                    .steps_finished(&w.service)
                    .into_iter()
                    .find(|(_, _, h, _)| **h == *w.host)
                    .map(|(seq, ..)| seq);
                // A step given up (its service blocked or halted) never runs: its wait is over.
                let never_ran = ran.first_hook(&w.service, &w.host).is_none();
                match ended {
                    Some(seq) if seq < first.start => {}
                    None if never_ran => {}
                    other => {
                        return Err(format!(
                            "{} on {} started at {} before {} on {} ended ({other:?})",
                            s.name, st.host, first.start, w.service, w.host
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_load_balancer_lists_a_new_member_only_after_its_step_ended() {
    let fx = lb_over_api(
        "port 8080",
        "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"",
        (3, 2),
        &[],
        &["app3"],
    );
    let lb = fx.service("lb");
    let steps: Vec<&plan::Step> = lb.each_step().collect();
    assert_eq!(steps.len(), 2, "both lb hosts are reconfigured");
    for st in &steps {
        assert_eq!(st.kind, plan::StepKind::Reconfigure);
        assert_eq!(st.reasons, ["needs api: +app3"]);
        assert_eq!(st.waits.len(), 1);
        assert_eq!((&*st.waits[0].service, &*st.waits[0].host), ("api", "app3"));
    }
    assert_eq!(
        fx.waves("api"),
        [["app3"]],
        "only the new host installs api"
    );
    // app3's install takes a while; lb must not reload before it ends.
    let ran = fx
        .run(
            Rules::default().sleep(Some("app3"), "hook install api", 150),
            8,
            true,
        )
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    waits_kept(&fx, &ran).expect("waits kept");
    assert_eq!(
        ran.hosts_with("reload", "lb"),
        ["lb1", "lb2"],
        "a reconfigure reloads"
    );
    assert!(
        ran.hosts_with("start", "lb").is_empty(),
        "no start in a reload"
    );
    let (api_done, ..) = ran.step_finished("api", "app3");
    let first = ran.first_hook("lb", "lb1").expect("lb1 ran");
    assert!(api_done < first.start, "lb1 waited for app3");
}

#[tokio::test]
async fn a_member_that_fails_still_ends_the_wait() {
    let fx = lb_over_api(
        "port 8080; policy \"cont.kdl\"",
        "needs \"api\" addressable=\"all\"",
        (2, 1),
        &[("cont.kdl", "batch 1; on-failure \"continue\"")],
        &["app2"],
    );
    let ran = fx
        .run(
            Rules::default().fail(Some("app2"), "hook check api"),
            8,
            true,
        )
        .await;
    assert_eq!(
        ran.failed_hosts(),
        [("app2".to_string(), "api".to_string())]
    );
    // Without `reload`, a reconfigure is the whole switch-over at the same version.
    assert_eq!(ran.hosts_with("stop", "lb"), ["lb1"]);
    assert_eq!(ran.hosts_with("start", "lb"), ["lb1"]);
    waits_kept(&fx, &ran).expect("waits kept");
}

#[tokio::test]
async fn no_wait_when_the_new_members_service_needs_this_one() {
    // api needs lb at runtime: lb cannot wait for api's new hosts (api waits for lb).
    let fx = lb_over_api(
        "port 8080; needs \"lb\"",
        "needs \"api\" addressable=\"all\"",
        (2, 1),
        &[],
        &["app2"],
    );
    let lb = fx.service("lb");
    let st = &lb.waves[0].steps[0];
    assert_eq!(st.reasons, ["needs api: +app2"]);
    assert!(st.waits.is_empty());
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_host_was_read_during_the_run_waits_for_the_new_member_too() {
    let fx = lb_over_api(
        "port 8080",
        "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"",
        (3, 2),
        &[],
        &["app3"],
    );
    // The lb hosts left for the caller to read: lb's steps are placeholders, with no waits.
    let observed: Vec<Observed> = fx.plan.hosts.iter().map(|h| h.observed.clone()).collect();
    let truth: Vec<(Arc<str>, Observed)> = fx
        .plan
        .hosts
        .iter()
        .filter(|h| h.name.starts_with("lb"))
        .map(|h| (h.name.clone(), h.observed.clone()))
        .collect();
    let plan = fx.plan_unread(&observed, &["lb1", "lb2"], &Selection::default());
    let fx = Fixture {
        plan: Arc::new(plan),
        ..fx
    };
    let lb = fx.service("lb");
    assert!(lb
        .each_step()
        .all(|st| st.kind == plan::StepKind::Unread && st.waits.is_empty()));
    let (tx, updates) = tokio::sync::mpsc::unbounded_channel();
    let pending = fx.plan.services.iter().map(|s| s.name == "lb").collect();
    *fx.planning.lock().unwrap() = Some(crate::rollout::Planning { pending, updates });
    // Read at once; lb needs api for its addresses only, so it starts as they are read.
    for (host, observed) in truth {
        let _ = tx.send(crate::rollout::Planned::Read { host, observed });
    }
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(tx);
    });
    let ran = fx
        .run(
            Rules::default().sleep(Some("app3"), "hook install api", 300),
            8,
            true,
        )
        .await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.hosts_with("reload", "lb"), ["lb1", "lb2"]);
    let (api_done, ..) = ran.step_finished("api", "app3");
    for host in ["lb1", "lb2"] {
        let first = ran.first_hook("lb", host).expect("lb ran");
        assert!(
            api_done < first.start,
            "{host} listed app3 before it served"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_placeholder_its_plan_drops_is_over() {
    // app3 joined the inventory already running api 1.0 with its inputs; lb's records do not
    // list it yet. app3 and the lb hosts are left for the caller to read: api's placeholder on
    // app3 counts as a change, so lb's steps, once read, wait for it. api's plan (its canary
    // makes it wait for one) then finds nothing to do on app3.
    let fx = lb_over_api(
        "port 8080; policy \"canary.kdl\"",
        "needs \"api\" addressable=\"all\"; reload \"hook reload lb\"",
        (3, 2),
        &[("canary.kdl", "batch 1; canary 1")],
        &["app3"],
    );
    let resolved = crate::inventory::resolve(&fx.site).expect("inventory");
    let api = fx.site.service("api").expect("api");
    let app3 = resolved.find("app3").expect("app3");
    let mut truth: Vec<Observed> = fx.plan.hosts.iter().map(|h| h.observed.clone()).collect();
    let record = ServiceRecord {
        version: "1.0".into(),
        configured: None,
        validated: None,
        inputs: Some(fx.desired.inputs(api, app3)),
        removal: None,
        hooks: None,
    };
    truth[app3.index()] = Observed::Running {
        services: [("api".to_string(), record)].into_iter().collect(),
    };
    let full = Arc::new(fx.plan_unread(&truth, &[], &Selection::default()));
    assert_eq!(full.services[0].steps(), 0, "api has nothing to do");
    let fx = Fixture {
        plan: Arc::new(fx.plan_unread(&truth, &["app3", "lb1", "lb2"], &Selection::default())),
        ..fx
    };
    let (tx, updates) = tokio::sync::mpsc::unbounded_channel();
    let pending = fx.plan.services.iter().map(|_| true).collect();
    *fx.planning.lock().unwrap() = Some(crate::rollout::Planning { pending, updates });
    let read = |name: &str| crate::rollout::Planned::Read {
        host: name.into(),
        observed: truth[resolved.find(name).expect("host").index()].clone(),
    };
    let (lb1, lb2, app3) = (read("lb1"), read("lb2"), read("app3"));
    tokio::spawn(async move {
        let _ = tx.send(lb1);
        let _ = tx.send(lb2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = tx.send(app3);
        let _ = tx.send(crate::rollout::Planned::Plan {
            plan: full,
            ready: vec![0],
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(tx);
    });
    let ran = fx.run(Rules::default(), 8, true).await;
    assert!(ran.summary.converged(), "{:?}", ran.summary);
    assert_eq!(ran.hosts_with("reload", "lb"), ["lb1", "lb2"]);
    assert!(ran.touched("api").is_empty());
}
