//! Failure budgets per wave (`wave-max-failed`) and per run (the site's `max-failed`), and
//! hooks that outlive their timeout, over the fake transport of the scheduler's tests.

use super::*;

/// `fx` with `settings` added to its site node, loaded and planned again from the same
/// observed state.
fn with_site_settings(fx: Fixture, settings: &str) -> Fixture {
    let path = fx.dir.path().join("site.kdl");
    let text = std::fs::read_to_string(&path).expect("site.kdl");
    let text = text.replacen(
        "    policy \"default.kdl\"\n}",
        &format!("    policy \"default.kdl\"\n    {settings}\n}}"),
        1,
    );
    std::fs::write(&path, text).expect("write site.kdl");
    let site = match site::load(&path) {
        Ok(site) => site,
        Err(e) => panic!("site with {settings} does not load: {:?}", e.errors),
    };
    let resolved = crate::inventory::resolve(&site).expect("inventory");
    let observed: Vec<Observed> = fx.plan.hosts.iter().map(|h| h.observed.clone()).collect();
    let desired = crate::desired::resolve(&site, &resolved, &Default::default()).expect("desired");
    let mut observed = observed;
    desired.stamp(&site, &mut observed);
    let plan =
        plan::plan(&site, &resolved, &observed, &desired, &Selection::default()).expect("plan");
    Fixture {
        dir: fx.dir,
        site: Arc::new(site),
        plan: Arc::new(plan),
        desired: Arc::new(desired),
        release: None,
        signal_at_confirm: false,
        lock_at_step: None,
        planning: Mutex::default(),
    }
}

/// `(host, reason)` of every step of `service` that was not started, in order.
fn blocked(ran: &Ran, service: &str) -> Vec<(String, String)> {
    ran.events
        .iter()
        .filter_map(|(_, _, e)| match e {
            EventKind::StepBlocked(StepBlocked {
                service: s,
                host,
                reason,
            }) if s == service => Some((host.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

fn halt_reason(ran: &Ran, service: &str) -> Option<String> {
    ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::ServiceFinished {
            service: s, reason, ..
        } if s == service => reason.clone(),
        _ => None,
    })
}

/// api on app1..app4 in one wave; app3 and app4 are busy with `slow` first, so their api steps
/// are still pending when app1 and app2 fail their install.
async fn wave_of_four(policy: &str) -> Ran {
    let body = format!(
        "class \"app\" {{ service \"api\" }}\nclass \"busy\" {{ service \"slow\"; service \"api\" }}\n{}{}",
        svc("slow", ""),
        svc("api", "policy \"p.kdl\"")
    );
    let hs = [
        ("app1", "app"),
        ("app2", "app"),
        ("app3", "busy"),
        ("app4", "busy"),
    ];
    let fx = fixture(&body, &hs, &[("p.kdl", policy)], &[]);
    assert_eq!(fx.waves("api").len(), 1, "one wave of four");
    let rules = Rules::default()
        .sleep(None, "hook install slow", 40)
        .fail(Some("app1"), "hook install api")
        .fail(Some("app2"), "hook install api");
    fx.run(rules, 64, true).await
}

#[tokio::test]
async fn a_wave_over_its_budget_starts_no_more_steps() {
    let ran = wave_of_four("batch \"100%\"; max-failed 10; wave-max-failed \"25%\"").await;
    // 25% of 4 is 1: the second failure exceeds it; app3 and app4 were still waiting for slow.
    assert_eq!(ran.touched("api"), names(&["app1", "app2"]));
    let cut = blocked(&ran, "api");
    assert_eq!(
        cut.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        ["app3", "app4"]
    );
    assert_eq!(
        cut[0].1,
        "2 of the 4 hosts of wave 1 failed, more than wave-max-failed 25% allows (1)"
    );
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Failed, 0, 2, 2));
    assert_eq!(ran.outcome("slow"), (ServiceOutcome::Done, 2, 0, 0));
    assert_eq!(ran.counts(), (2, 2, 2));
}

#[tokio::test]
async fn a_wave_within_its_budget_runs_every_step() {
    let ran = wave_of_four("batch \"100%\"; max-failed 10; wave-max-failed 2").await;
    assert_eq!(ran.touched("api"), names(&["app1", "app2", "app3", "app4"]));
    assert!(blocked(&ran, "api").is_empty());
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Failed, 2, 2, 0));
}

#[tokio::test]
async fn continue_ignores_the_wave_budget() {
    let ran =
        wave_of_four("batch \"100%\"; max-failed 0; wave-max-failed 0; on-failure \"continue\"")
            .await;
    assert_eq!(ran.touched("api").len(), 4);
    assert!(blocked(&ran, "api").is_empty());
}

/// db on db1..db3 and api on app1..app3, one host per wave each, independent; the site's
/// run budget is `max-failed 1`, each policy allows 5.
async fn two_services_under_a_run_budget() -> Ran {
    let body = db_and_api("policy \"p.kdl\"", "policy \"p.kdl\"");
    let mut hs = hosts("db", "db", 3);
    hs.extend(hosts("app", "app", 3));
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("p.kdl", "batch 1; max-failed 5")],
        &[],
    );
    let fx = with_site_settings(fx, "max-failed 1");
    assert_eq!(fx.plan.max_failed_hosts, Some(1));
    // db1 fails at once; db2 takes long; app1 fails while db2 runs.
    let rules = Rules::default()
        .fail(Some("db1"), "hook install db")
        .sleep(Some("db2"), "hook install db", 60)
        .sleep(Some("app1"), "hook install api", 20)
        .fail(Some("app1"), "hook install api");
    fx.run(rules, 64, true).await
}

#[tokio::test]
async fn the_run_budget_stops_new_waves_of_every_service() {
    let ran = two_services_under_a_run_budget().await;
    // db1 failing (1 host) is within the run's budget: db's wave 2 starts. app1 is the second
    // failed host: no service opens another wave, whatever its own policy allows.
    assert_eq!(ran.touched("db"), names(&["db1", "db2"]));
    assert_eq!(ran.touched("api"), names(&["app1"]));
    assert_eq!(ran.outcome("db"), (ServiceOutcome::Halted, 1, 1, 1));
    assert_eq!(ran.outcome("api"), (ServiceOutcome::Halted, 0, 1, 2));
    let why = "2 hosts failed in this run, more than the site's max-failed 1 allows (1)";
    assert_eq!(halt_reason(&ran, "db").as_deref(), Some(why));
    assert_eq!(halt_reason(&ran, "api").as_deref(), Some(why));
    assert_eq!(ran.counts(), (1, 2, 3));
}

#[tokio::test]
async fn without_a_run_budget_each_service_keeps_its_own() {
    let body = db_and_api("policy \"p.kdl\"", "policy \"p.kdl\"");
    let mut hs = hosts("db", "db", 3);
    hs.extend(hosts("app", "app", 3));
    let fx = fixture(
        &body,
        &host_refs(&hs),
        &[("p.kdl", "batch 1; max-failed 5")],
        &[],
    );
    assert_eq!(fx.plan.max_failed_hosts, None);
    let rules = Rules::default()
        .fail(Some("db1"), "hook install db")
        .fail(Some("app1"), "hook install api");
    let ran = fx.run(rules, 64, true).await;
    assert_eq!(ran.touched("db").len(), 3);
    assert_eq!(ran.touched("api").len(), 3);
}

// ---------------------------------------------------------------------------------------------
// Hung hooks

/// api on app1 (running 0.9) whose `install` hangs; `install_timeout` is its own `timeout=`,
/// `site` extra settings of the site node.
async fn hanging_install(install_timeout: &str, site: &str) -> Ran {
    let body = format!(
        r#"class "app" {{ service "api" }}
service "api" {{
    install "hook install api" {install_timeout}
    stop "hook stop api"
    start "hook start api"
    rollback "hook rollback api"
}}
"#
    );
    let fx = fixture(&body, &[("app1", "app")], &[], &[("app1", "api", "0.9")]);
    let fx = if site.is_empty() {
        fx
    } else {
        with_site_settings(fx, site)
    };
    let rules = Rules::default().sleep(Some("app1"), "hook install api", 3000);
    fx.run(rules, 64, true).await
}

fn reason_of(ran: &Ran, service: &str, host: &str) -> Option<String> {
    ran.events.iter().find_map(|(_, _, e)| match e {
        EventKind::StepFinished {
            result:
                StepEnd {
                    service: s,
                    host: h,
                    reason,
                    ..
                },
            ..
        } if s == service && h == host => reason.clone(),
        _ => None,
    })
}

#[tokio::test]
async fn a_hook_past_its_timeout_is_killed_fails_the_step_and_rolls_back() {
    let ran = hanging_install("timeout=\"40ms\"", "").await;
    assert_eq!(
        reason_of(&ran, "api", "app1").as_deref(),
        Some("install timed out after 40ms")
    );
    assert_eq!(ran.counts(), (0, 1, 0));
    assert_eq!(ran.hosts_with("rollback", "api"), names(&["app1"]));
    // Right after the install gave up: the kill of its process group, on the same host.
    let cmds = ran.cmds();
    let install = cmds
        .iter()
        .position(|c| c.is("install", "api"))
        .expect("install ran");
    let next = &cmds[install + 1];
    assert_eq!(next.host, "app1");
    assert!(
        next.script.contains("kill -TERM \"-$p\""),
        "{}",
        next.script
    );
    assert!(
        ran.ended - cmds[install].started < Duration::from_secs(2),
        "the install was not waited for"
    );
}

#[tokio::test]
async fn the_sites_hook_timeout_applies_to_hooks_without_their_own() {
    let ran = hanging_install("", "hook-timeout \"30ms\"").await;
    assert_eq!(
        reason_of(&ran, "api", "app1").as_deref(),
        Some("install timed out after 30ms")
    );
    // A hook's own timeout wins over the site's.
    let ran = hanging_install("timeout=\"50ms\"", "hook-timeout \"10m\"").await;
    assert_eq!(
        reason_of(&ran, "api", "app1").as_deref(),
        Some("install timed out after 50ms")
    );
}
