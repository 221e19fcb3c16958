//! A plan read back from a file (`deploy plan --out`) is checked before it is carried out: the
//! rollout trusts that every step names a host of the plan that runs its service, that every
//! step it follows or waits for is one of the plan's, that a step's `from` and `kind` are what
//! the host recorded, that what a service waits for comes before it, that a wait said dropped
//! is one of the plan's, and that the plan's services are the site's.

use super::{Plan, StepKind};
use crate::inventory::natural_cmp;
use crate::site::Site;
use std::collections::{HashMap, HashSet};

impl Plan {
    /// What does not hold together in the plan, one line each; empty for every plan
    /// [`super::plan`] makes. The rollout trusts a plan: a step on a host the plan does not
    /// list would never run, a step waiting for a step the plan does not hold would never
    /// start, and a step's `from` and `kind` choose which hooks run. Each would go wrong
    /// without a word.
    pub fn inconsistencies(&self) -> Vec<String> {
        let mut out = Vec::new();
        // The hosts in the inventory's order, each once: the rollout finds a host's desired
        // state by its place in this list.
        for pair in self.hosts.windows(2) {
            if natural_cmp(&pair[0].name, &pair[1].name) != std::cmp::Ordering::Less {
                out.push(format!(
                    "hosts {} and {} are out of order or the same",
                    pair[0].name, pair[1].name
                ));
            }
        }
        let hosts: HashMap<&str, &super::PlannedHost> =
            self.hosts.iter().map(|h| (&*h.name, h)).collect();
        let rank: HashMap<&str, usize> = self
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        let steps: HashSet<(&str, &str)> = self
            .services
            .iter()
            .flat_map(|s| s.each_step().map(|st| (s.name.as_str(), &*st.host)))
            .collect();
        let mut seen = HashSet::new();
        for (i, s) in self.services.iter().enumerate() {
            if !seen.insert(s.name.as_str()) {
                out.push(format!("service {} is planned twice", s.name));
            }
            for c in s.waits_for.iter().chain(&s.addresses_of) {
                if !rank.contains_key(c.service.as_str()) {
                    out.push(format!(
                        "service {} needs {}, which the plan does not hold",
                        s.name, c.service
                    ));
                }
            }
            // Runtime needs come first: only pool waits may go round ([`super::go_round`]).
            for c in &s.waits_for {
                if rank.get(c.service.as_str()).is_some_and(|r| *r >= i) {
                    out.push(format!(
                        "service {} waits for {}, which the plan does not hold before it",
                        s.name, c.service
                    ));
                }
            }
            let mut stepped = HashSet::new();
            for (w, wave) in s.waves.iter().enumerate() {
                if wave.steps.is_empty() {
                    out.push(format!("wave {} of {} has no step", w + 1, s.name));
                }
                for st in &wave.steps {
                    let at = format!("the step of {} on {}", s.name, st.host);
                    if !stepped.insert(&*st.host) {
                        out.push(format!("{at}: planned twice"));
                    }
                    match hosts.get(&*st.host) {
                        None => out.push(format!("{at}: no such host in the plan")),
                        Some(h) => {
                            if !s.runs_on(h) {
                                out.push(format!(
                                    "{at}: the host is of no class that runs {}",
                                    s.name
                                ));
                            }
                            out.extend(step_against_record(&at, st, h, &s.name));
                        }
                    }
                    if st.to != s.version {
                        out.push(format!(
                            "{at}: goes to version {}, not the service's {}",
                            st.to, s.version
                        ));
                    }
                    for a in &st.after {
                        if rank.get(&**a).is_none_or(|r| *r >= i) {
                            out.push(format!(
                                "{at}: follows {a}, which the plan does not hold before {}",
                                s.name
                            ));
                        } else if !steps.contains(&(&**a, &*st.host)) {
                            out.push(format!(
                                "{at}: follows the step of {a} on {}, which the plan does not hold",
                                st.host
                            ));
                        }
                    }
                    for w in &st.waits {
                        if !steps.contains(&(&*w.service, &*w.host)) {
                            out.push(format!(
                                "{at}: waits for the step of {} on {}, which the plan does not hold",
                                w.service, w.host
                            ));
                        }
                    }
                }
            }
        }
        for d in &self.dropped_waits {
            let held = self.services.iter().any(|s| {
                s.name == *d.service
                    && s.each_step()
                        .any(|st| st.host == d.host && st.waits.contains(&d.waits_for))
            });
            if !held {
                out.push(format!(
                    "a dropped wait of the step of {} on {} for {} on {}: the step holds no such wait",
                    d.service, d.host, d.waits_for.service, d.waits_for.host
                ));
            }
        }
        out
    }

    /// What in the plan's services differs from `site`'s (the site the plan names, read
    /// again): the services, their versions and classes. A plan whose site files are unchanged
    /// still holds what the site says, unless it was edited.
    pub fn differences_from(&self, site: &Site) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.services {
            let Some(sid) = site.service(&s.name) else {
                out.push(format!("service {} is not in the site", s.name));
                continue;
            };
            let model = &site.services[sid];
            if *s.version != *model.version {
                out.push(format!(
                    "service {} goes to version {}, the site's is {}",
                    s.name, s.version, model.version
                ));
            }
            let classes: Vec<&str> = model
                .classes
                .iter()
                .map(|c| site.classes[*c].name.as_str())
                .collect();
            if s.classes
                .iter()
                .map(String::as_str)
                .ne(classes.iter().copied())
            {
                out.push(format!(
                    "service {} runs on {}, the site's on {}",
                    s.name,
                    s.classes.join(", "),
                    classes.join(", ")
                ));
            }
        }
        for model in &site.services {
            if !self.services.iter().any(|s| s.name == model.name) {
                out.push(format!(
                    "service {} of the site is not in the plan",
                    model.name
                ));
            }
        }
        out
    }
}

/// A step's `from` and `kind` as the planner makes them from the host's record of the service
/// (which the drift check proves is still the host's): they choose which hooks run.
fn step_against_record(
    at: &str,
    st: &super::Step,
    host: &super::PlannedHost,
    service: &str,
) -> Option<String> {
    if !host.observed.known() {
        return Some(format!("{at}: the host's state was not known when planned"));
    }
    let recorded = host.observed.version(service);
    if st.from.as_deref() != recorded {
        return Some(format!(
            "{at}: goes from {}, the host recorded {}",
            st.from.as_deref().unwrap_or("nothing"),
            recorded.unwrap_or("nothing")
        ));
    }
    // Only a reconfigure may run less than the switch-over.
    let quiet = matches!(st.path, Some(super::Path::Reload | super::Path::Record));
    if quiet && st.kind != StepKind::Reconfigure {
        return Some(format!(
            "{at}: only a reconfigure may take another path than the switch-over"
        ));
    }
    let same = st.from.as_deref() == Some(&*st.to);
    let fits = match st.kind {
        StepKind::Install => st.from.is_none(),
        StepKind::Upgrade => st.from.is_some() && !same,
        StepKind::Retry | StepKind::Reconfigure | StepKind::Repair => same,
        // Only a streaming apply plans hosts unread; it saves no plan.
        StepKind::Unread => false,
    };
    let kind = match st.kind {
        StepKind::Install => "an install",
        StepKind::Upgrade => "an upgrade",
        StepKind::Retry => "a retry",
        StepKind::Reconfigure => "a reconfigure",
        StepKind::Repair => "a repair",
        StepKind::Unread => "an unread step",
    };
    (!fits).then(|| {
        format!(
            "{at}: {kind} from {} to {}",
            st.from.as_deref().unwrap_or("nothing"),
            st.to
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::{HostStep, PlannedHost, PlannedPolicy, ServicePlan, Step, StepKind, Wave};
    use super::*;
    use crate::site::{Flow, OnFailure, Quota};
    use crate::state::{Observed, ServiceRecord};

    /// A host that records `version` of `service`.
    fn running(service: &str, version: &str) -> Observed {
        Observed::Running {
            services: [(service.to_string(), ServiceRecord::at(version))].into(),
        }
    }

    fn host(name: &str, classes: &[&str]) -> PlannedHost {
        PlannedHost {
            name: name.into(),
            address: "127.0.0.1".into(),
            classes: classes.iter().map(|c| c.to_string()).collect(),
            tags: Default::default(),
            observed: Observed::Fresh,
        }
    }

    fn step(host: &str, to: &str) -> Step {
        Step {
            host: host.into(),
            from: None,
            to: to.into(),
            kind: StepKind::Install,
            reasons: Vec::new(),
            path: Some(crate::plan::Path::SwitchOver),
            restarts: Vec::new(),
            after: Vec::new(),
            waits: Vec::new(),
        }
    }

    fn service(name: &str, class: &str, steps: Vec<Step>) -> ServicePlan {
        ServicePlan {
            name: name.to_string(),
            version: "2".into(),
            port: None,
            classes: vec![class.to_string()],
            hosts: steps.len(),
            policy: PlannedPolicy {
                name: "default".into(),
                batch: Quota::All,
                batch_hosts: 1,
                max_failed: Quota::Count(0),
                max_failed_hosts: 0,
                wave_max_failed: None,
                canary: 0,
                pause: crate::site::Pause::Wait(std::time::Duration::ZERO),
                spread: None,
                on_failure: OnFailure::Rollback,
                flow: Flow::default(),
                progress_deadline: None,
            },
            waits_for: Vec::new(),
            addresses_of: Vec::new(),
            waves: vec![Wave {
                canary: false,
                spread: None,
                steps,
            }],
            skipped: Vec::new(),
        }
    }

    /// `both1` runs db and front, `db1` db, `w1` front.
    fn plan(services: Vec<ServicePlan>) -> Plan {
        Plan {
            schema: super::super::SCHEMA,
            site: "shop".into(),
            site_file: "site.kdl".into(),
            site_digest: String::new(),
            platform: "p".into(),
            hosts: vec![
                host("both1", &["db", "web"]),
                host("db1", &["db"]),
                host("w1", &["web"]),
            ],
            services,
            max_failed: None,
            max_failed_hosts: None,
            dropped_waits: Vec::new(),
            diffs: Vec::new(),
            removals: Vec::new(),
            prune: false,
        }
    }

    fn good() -> Plan {
        let mut both = step("both1", "2");
        both.after = vec!["db".into()];
        let mut web = step("w1", "2");
        web.waits = vec![HostStep {
            service: "db".into(),
            host: "db1".into(),
        }];
        plan(vec![
            service("db", "db", vec![step("both1", "2"), step("db1", "2")]),
            service("front", "web", vec![both, web]),
        ])
    }

    #[test]
    fn a_plan_that_holds_together_has_nothing_to_say() {
        let p = good();
        assert!(p.inconsistencies().is_empty(), "{:?}", p.inconsistencies());
        // An upgrade from what the host recorded, too.
        let mut p = good();
        p.hosts[2].observed = running("front", "1");
        let st = &mut p.services[1].waves[0].steps[1];
        st.from = Some("1".into());
        st.kind = StepKind::Upgrade;
        assert!(p.inconsistencies().is_empty(), "{:?}", p.inconsistencies());
    }

    #[test]
    fn every_kind_of_inconsistency_is_named() {
        let mut p = good();
        p.hosts.swap(1, 2);
        {
            let front = &mut p.services[1];
            front.waits_for.push(super::super::Condition {
                service: "cache".into(),
                count: 1,
                of: 1,
            });
            let steps = &mut front.waves[0].steps;
            steps[0].after = vec!["cache".into()];
            steps[1].to = "3".into();
            steps[1].waits[0].host = "ghost".into();
            steps[1].from = Some("1".into());
            steps.push(step("nowhere", "2"));
        }
        p.services[0].waves[0].steps.push(step("db1", "2"));
        p.services[0].waves[0].steps.push(step("w1", "2"));
        p.services[0].waits_for.push(super::super::Condition {
            service: "front".into(),
            count: 1,
            of: 1,
        });
        p.services.push(service("db", "db", Vec::new()));
        p.dropped_waits.push(super::super::DroppedWait {
            service: "front".into(),
            host: "both1".into(),
            waits_for: HostStep {
                service: "db".into(),
                host: "db1".into(),
            },
            round: Vec::new(),
        });
        let mut got = p.inconsistencies();
        got.sort();
        let mut want = vec![
            "hosts w1 and db1 are out of order or the same",
            "service front needs cache, which the plan does not hold",
            "the step of front on both1: follows cache, which the plan does not hold before front",
            "the step of front on w1: goes to version 3, not the service's 2",
            "the step of front on w1: goes from 1, the host recorded nothing",
            "the step of front on w1: waits for the step of db on ghost, which the plan does not hold",
            "the step of front on nowhere: no such host in the plan",
            "the step of db on db1: planned twice",
            "the step of db on w1: the host is of no class that runs db",
            "service db is planned twice",
            "wave 1 of db has no step",
            "service db waits for front, which the plan does not hold before it",
            "a dropped wait of the step of front on both1 for db on db1: the step holds no such wait",
        ];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn a_step_that_does_not_fit_the_hosts_record_is_named() {
        // An install over a recorded version, as a hand edit of `from` would make.
        let mut p = good();
        p.hosts[1].observed = running("db", "1");
        assert_eq!(
            p.inconsistencies(),
            ["the step of db on db1: goes from nothing, the host recorded 1"]
        );
        p.services[0].waves[0].steps[1].from = Some("1".into());
        assert_eq!(
            p.inconsistencies(),
            ["the step of db on db1: an install from 1 to 2"]
        );
        // A host whose state was not known has no step.
        let mut p = good();
        p.hosts[1].observed = Observed::Unreachable {
            reason: "refused".into(),
        };
        assert_eq!(
            p.inconsistencies(),
            ["the step of db on db1: the host's state was not known when planned"]
        );
    }
}
