//! A plan read back from a file (`deploy plan --out`) is checked before it is carried out: the
//! rollout trusts that every step names a host of the plan that runs its service, and that
//! every step it waits for is one of the plan's.

use super::Plan;
use std::collections::{HashMap, HashSet};

impl Plan {
    /// What does not hold together in the plan, one line each; empty for every plan
    /// [`super::plan`] makes. A step on a host the plan does not list, or a step waiting for a
    /// service it does not hold, would otherwise never run or never wait, without a word.
    pub fn inconsistencies(&self) -> Vec<String> {
        let hosts: HashMap<&str, &[String]> = self
            .hosts
            .iter()
            .map(|h| (&*h.name, h.classes.as_slice()))
            .collect();
        let services: HashSet<&str> = self.services.iter().map(|s| s.name.as_str()).collect();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for s in &self.services {
            if !seen.insert(s.name.as_str()) {
                out.push(format!("service {} is planned twice", s.name));
            }
            let mut stepped = HashSet::new();
            for st in s.waves.iter().flat_map(|w| &w.steps) {
                let at = format!("the step of {} on {}", s.name, st.host);
                match hosts.get(&*st.host) {
                    None => out.push(format!("{at}: no such host in the plan")),
                    Some(classes) if !classes.iter().any(|c| s.classes.contains(c)) => out.push(
                        format!("{at}: the host is of no class that runs {}", s.name),
                    ),
                    Some(_) => {}
                }
                if !stepped.insert(&*st.host) {
                    out.push(format!("{at}: planned twice"));
                }
                if st.to != s.version {
                    out.push(format!(
                        "{at}: goes to version {}, not the service's {}",
                        st.to, s.version
                    ));
                }
                for a in st.after.iter().filter(|a| !services.contains(&***a)) {
                    out.push(format!("{at}: follows {a}, which the plan does not hold"));
                }
                for w in &st.waits {
                    if !services.contains(&*w.service) || !hosts.contains_key(&*w.host) {
                        out.push(format!(
                            "{at}: waits for {} on {}, which the plan does not hold",
                            w.service, w.host
                        ));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{HostStep, PlannedHost, PlannedPolicy, ServicePlan, Step, StepKind, Wave};
    use super::*;
    use crate::site::{Flow, OnFailure, Quota};
    use crate::state::Observed;

    fn host(name: &str, class: &str) -> PlannedHost {
        PlannedHost {
            name: name.into(),
            address: "127.0.0.1".into(),
            classes: vec![class.to_string()],
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
                pause: "0s".into(),
                spread: None,
                on_failure: OnFailure::Rollback,
                flow: Flow::default(),
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

    fn plan(services: Vec<ServicePlan>) -> Plan {
        Plan {
            schema: super::super::SCHEMA,
            site: "shop".into(),
            site_file: "site.kdl".into(),
            site_digest: String::new(),
            platform: "p".into(),
            hosts: vec![host("db1", "db"), host("w1", "web")],
            services,
            max_failed: None,
            max_failed_hosts: None,
        }
    }

    #[test]
    fn a_plan_that_holds_together_has_nothing_to_say() {
        let mut web = step("w1", "2");
        web.after = vec!["db".into()];
        web.waits = vec![HostStep {
            service: "db".into(),
            host: "db1".into(),
        }];
        let p = plan(vec![
            service("db", "db", vec![step("db1", "2")]),
            service("front", "web", vec![web]),
        ]);
        assert!(p.inconsistencies().is_empty(), "{:?}", p.inconsistencies());
    }

    #[test]
    fn every_kind_of_inconsistency_is_named() {
        let mut web = step("w1", "3");
        web.after = vec!["cache".into()];
        web.waits = vec![HostStep {
            service: "db".into(),
            host: "ghost".into(),
        }];
        let p = plan(vec![
            service(
                "db",
                "db",
                vec![step("db1", "2"), step("db1", "2"), step("w1", "2")],
            ),
            service("front", "web", vec![web, step("nowhere", "2")]),
            service("db", "db", Vec::new()),
        ]);
        let got = p.inconsistencies();
        for want in [
            "the step of db on db1: planned twice",
            "the step of db on w1: the host is of no class that runs db",
            "the step of front on w1: goes to version 3, not the service's 2",
            "the step of front on w1: follows cache, which the plan does not hold",
            "the step of front on w1: waits for db on ghost, which the plan does not hold",
            "the step of front on nowhere: no such host in the plan",
            "service db is planned twice",
        ] {
            assert!(got.iter().any(|g| g == want), "{want:?} not in {got:#?}");
        }
        assert_eq!(got.len(), 7, "{got:#?}");
    }
}
