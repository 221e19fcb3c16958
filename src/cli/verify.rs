//! `deploy verify`: every host at its desired versions, and every check passing now
//! ([`crate::apply::verify`]), printed as lines or JSON.

use super::{code, say, Error, SiteArgs};

pub fn run(args: &SiteArgs) -> Result<u8, Error> {
    let verdict = crate::apply::verify(&args.site, args.max_connections, &say())?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&verdict).unwrap_or_default()
        );
    } else if verdict.ok {
        outln!(
            "verified: {} at their desired version, {} passed",
            crate::words::count(verdict.host_services, "host service"),
            crate::words::count(verdict.checks.len(), "check")
        );
    } else {
        outln!(
            "{}:",
            crate::words::count(verdict.problems.len(), "problem")
        );
        for p in &verdict.problems {
            outln!("  {p}");
        }
    }
    Ok(if verdict.ok { code::OK } else { code::FAILED })
}
