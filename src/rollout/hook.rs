//! The environment every hook sees, built once per service and per step; pure.

use crate::plan::{Plan, PlannedHost, ServicePlan};
use crate::site::Site;
use std::collections::BTreeMap;

/// `DEPLOY_NEEDS_<X>`: upper-cased, `-` and other non-alphanumerics become `_`.
pub fn needs_var(service: &str) -> String {
    let name: String = service
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("DEPLOY_NEEDS_{name}")
}

/// The variables shared by every host of `service`: site, service, port, and the addresses of
/// every service it needs (runtime or data), as `address[:port]`, space-separated.
pub fn service_env(site: &Site, plan: &Plan, service: &ServicePlan) -> Vec<(String, String)> {
    let mut env = vec![
        ("DEPLOY_SITE".to_string(), plan.site.clone()),
        ("DEPLOY_SERVICE".to_string(), service.name.clone()),
    ];
    env.push((
        "DEPLOY_PORT".into(),
        service.port.map(|p| p.to_string()).unwrap_or_default(),
    ));
    let Some(sid) = site.service(&service.name) else {
        return env;
    };
    // The site's and the service's own `env` (never DEPLOY_*: the checker refuses them).
    env.extend(site.services[sid].env.iter().cloned());
    let mut needs: BTreeMap<String, String> = BTreeMap::new();
    for need in &site.services[sid].needs {
        let needed = &site.services[need.service];
        let classes: Vec<&str> = needed
            .classes
            .iter()
            .map(|c| site.classes[*c].name.as_str())
            .collect();
        let addresses: Vec<String> = plan
            .hosts
            .iter()
            .filter(|h| h.classes.iter().any(|c| classes.contains(&c.as_str())))
            .map(|h| match needed.port {
                Some(p) => format!("{}:{p}", h.address),
                None => h.address.to_string(),
            })
            .collect();
        needs.insert(needs_var(&needed.name), addresses.join(" "));
    }
    env.extend(needs);
    env
}

/// The variables of one step: the service's, plus this host and the two versions.
pub fn step_env(
    common: &[(String, String)],
    host: &PlannedHost,
    old: Option<&str>,
    new: &str,
) -> Vec<(String, String)> {
    let mut env = common.to_vec();
    env.push(("DEPLOY_HOST".into(), host.name.to_string()));
    env.push(("DEPLOY_ADDRESS".into(), host.address.to_string()));
    env.push(("DEPLOY_CLASS".into(), host.classes.join(" ")));
    env.push(("DEPLOY_OLD_VERSION".into(), old.unwrap_or("").to_string()));
    env.push(("DEPLOY_NEW_VERSION".into(), new.to_string()));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_names() {
        assert_eq!(needs_var("api"), "DEPLOY_NEEDS_API");
        assert_eq!(needs_var("my-db.v2"), "DEPLOY_NEEDS_MY_DB_V2");
    }
}
