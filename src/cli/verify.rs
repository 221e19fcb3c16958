//! `deploy verify`: every host at its desired versions, and every check passing now.

use super::{code, say, Error, SiteArgs};
use crate::apply::observe;
use crate::plan::{self, Selection};
use crate::rollout;
use crate::transport::AnyTransport;
use crate::{site, state};
use std::sync::Arc;

pub fn run(args: &SiteArgs) -> Result<u8, Error> {
    let site = site::load(&args.site)?;
    // The checks get the site's secrets, as during apply; one that cannot be read here is
    // taken as each host records it, as by `plan` and `status`.
    let secrets = Arc::new(super::readable_secrets(&site, true)?);
    let hosts = crate::apply::resolve(&site, &say)?;
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let observed = observe(&site, &hosts, false, args.max_connections)?;
    let status = state::status(&site, &hosts, &observed, &desired);
    let plan = plan::plan(&site, &hosts, &observed, &desired, &Selection::default())?;
    let transport = Arc::new(AnyTransport::for_platform(
        &site.platform,
        hosts.hosts.len(),
        args.max_connections,
    ));
    let checks = super::runtime()?.block_on(rollout::verify(
        Arc::new(site),
        Arc::new(plan),
        transport,
        args.max_connections,
        secrets,
    ));
    let mut problems = Vec::new();
    for h in &status.hosts {
        for s in h.services.iter().filter(|s| !s.ok) {
            let why = match s.running.as_deref() {
                _ if !s.diverged.is_empty() => {
                    format!("diverged from the site: {}", s.diverged.join("; "))
                }
                None => format!("runs nothing, desired {}", s.desired),
                Some(v) if v == s.desired => {
                    format!("runs {v}, but its last switch-over did not pass its check")
                }
                Some(v) => format!("runs {v}, desired {}", s.desired),
            };
            problems.push(format!("{} {}: {why}", h.host, s.service));
        }
    }
    for u in &status.unaccounted {
        problems.push(format!("{}: {}", u.host, u.reason));
    }
    for c in checks.iter().filter(|c| !c.ok) {
        problems.push(format!("{} {}: {}", c.host, c.service, c.detail));
    }
    problems.sort();
    problems.dedup();
    if args.json {
        let out = serde_json::json!({ "schema": 1, "ok": problems.is_empty(), "problems": problems, "checks": checks });
        outln!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else if problems.is_empty() {
        outln!(
            "verified: {} at their desired version, {} passed",
            crate::words::count(status.total, "host service"),
            crate::words::count(checks.len(), "check")
        );
    } else {
        outln!("{}:", crate::words::count(problems.len(), "problem"));
        for p in &problems {
            outln!("  {p}");
        }
    }
    Ok(if problems.is_empty() {
        code::OK
    } else {
        code::FAILED
    })
}
