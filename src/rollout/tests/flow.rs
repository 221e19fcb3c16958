//! A batch as a concurrency limit (`flow "slots"`, the default) on the fake transport: a
//! straggler holds only its own slot, no host starts once the budget is spent, and, over
//! random durations and failures, never more than `batch` hosts switch at once.

use super::*;

#[tokio::test]
async fn a_batch_is_a_concurrency_limit_behind_a_straggler() {
    // The default policy's budget (max-failed 0) is at stake, and still a freed slot goes to
    // the next host at once: `flow "slots"`.
    for policy in ["batch 2", "batch 2; on-failure \"stop\""] {
        let (_, ran) = slow_first_host(policy, Rules::default()).await;
        assert!(ran.summary.converged(), "{policy}: {:?}", ran.summary);
        assert_eq!(
            ran.max_hosts_in_flight("api"),
            2,
            "{policy}: never more than batch"
        );
        let (slow_end, _, _) = ran.step_finished("api", "app1");
        for host in ["app3", "app4", "app5", "app6"] {
            let (end, _, _) = ran.step_finished("api", host);
            assert!(end < slow_end, "{policy}: {host} waited for the straggler");
        }
    }
}

#[tokio::test]
async fn a_batch_as_a_limit_starts_no_new_host_once_the_budget_is_spent() {
    // batch 2, max-failed 0: app1's slow start fails; meanwhile app2's slot
    // has gone to app3. Once app1's failure is seen, no new host starts; app3 ends.
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 6);
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", "batch 2")], &[]);
    let rules = Rules::default()
        .sleep(Some("app1"), "hook start api", 100)
        .fail(Some("app1"), "hook start api")
        .sleep(None, "hook start api", 70);
    let ran = fx.run(rules, 64, true).await;
    let (failed_at, _, ok) = ran.step_finished("api", "app1");
    assert!(!ok);
    // A host launched just before the failure was seen may start its first command after it:
    // at most the one other slot.
    let late: Vec<&str> = ["app2", "app3", "app4", "app5", "app6"]
        .into_iter()
        .filter(|h| {
            ran.first_hook("api", h)
                .is_some_and(|c| c.start > failed_at)
        })
        .collect();
    assert!(late.len() <= 1, "started after the failure: {late:?}");
    let (outcome, succeeded, failed, not_started) = ran.outcome("api");
    assert!(
        matches!(outcome, ServiceOutcome::Halted | ServiceOutcome::Failed),
        "{outcome:?}"
    );
    assert_eq!(failed, 1);
    assert!(succeeded >= 1, "app2 ran beside the straggler");
    assert_eq!(succeeded + failed + not_started, 6);
    assert!(not_started >= 1, "the failure stopped the rest");
    assert!(ran.max_hosts_in_flight("api") <= 2);
}

#[tokio::test]
async fn a_failure_that_ended_with_a_success_is_seen_before_a_host_starts() {
    // batch 2, max-failed 0: app1 passes and app2 fails at the same moment. Both have ended
    // when the scheduler looks: app1's freed slot must not go to app3 before app2's failure
    // is counted.
    let body = format!(
        "class \"app\" {{ service \"api\" }}\n{}",
        svc("api", "policy \"p.kdl\"")
    );
    let hs = hosts("app", "app", 4);
    let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", "batch 2")], &[]);
    for round in 0..8 {
        // The last command of each step: app1's check, app2's record of its failed start.
        let rules = Rules::default()
            .fail(Some("app2"), "hook start api")
            .together(&[
                ("app1", "hook check api"),
                ("app2", "\"outcome\":\"failure\""),
            ]);
        let ran = fx.run(rules, 64, true).await;
        let started: Vec<&str> = ["app3", "app4"]
            .into_iter()
            .filter(|h| ran.first_hook("api", h).is_some())
            .collect();
        assert!(
            started.is_empty(),
            "round {round}: started past the budget: {started:?}"
        );
        assert_eq!(ran.outcome("api").3, 2, "round {round}");
    }
}

mod slots_prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// Whatever the hosts' durations and failures: never more than `batch` hosts switch
        /// at once, no host starts once more than `max-failed` have failed, and every host
        /// ends as succeeded, failed or not started.
        #[test]
        fn never_more_than_batch_and_no_start_past_the_budget(
            durations in proptest::collection::vec(0u64..25, 7),
            failing in proptest::collection::vec(any::<bool>(), 7),
            batch in 1usize..4,
            max_failed in 0usize..3,
        ) {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let body = format!(
                "class \"app\" {{ service \"api\" }}\n{}",
                svc("api", "policy \"p.kdl\"")
            );
            let hs = hosts("app", "app", 7);
            let policy = format!("batch {batch}; max-failed {max_failed}");
            let fx = fixture(&body, &host_refs(&hs), &[("p.kdl", &policy)], &[]);
            let mut rules = Rules::default();
            for (i, (ms, fail)) in durations.iter().zip(&failing).enumerate() {
                let host = format!("app{}", i + 1);
                rules = rules.sleep(Some(&host), "hook start api", *ms);
                if *fail {
                    rules = rules.fail(Some(&host), "hook start api");
                }
            }
            let ran = rt.block_on(fx.run(rules, 64, true));
            prop_assert!(ran.max_hosts_in_flight("api") <= batch);
            let ends = ran.steps_finished("api");
            // Once the failure beyond the budget is seen, no host is launched: only hosts
            // launched before it (at most the other `batch - 1` slots) may start after it.
            if let Some(spent) = ends.iter().filter(|e| !e.3).nth(max_failed) {
                let late = hs
                    .iter()
                    .filter(|(h, _)| ran.first_hook("api", h).is_some_and(|c| c.start > spent.0))
                    .count();
                prop_assert!(
                    late < batch,
                    "{late} hosts started after failure {} (batch {batch}, max-failed {max_failed})",
                    max_failed + 1
                );
            }
            let (s, f, n) = ran.counts();
            prop_assert_eq!(s + f + n, 7);
            prop_assert_eq!(f, ends.iter().filter(|e| !e.3).count());
        }
    }
}
