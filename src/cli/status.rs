//! `deploy status`: which version runs where ([`crate::apply::status`]), as a table, the
//! failures, or JSON.

use super::{code, say, Error, StatusArgs};
use crate::apply::StatusRequest;
use crate::report;

pub fn run(args: &StatusArgs) -> Result<u8, Error> {
    let request = StatusRequest {
        site: args.site.site.clone(),
        on: args.on.clone(),
        hosts: args.hosts,
        check: args.check,
        max_connections: args.site.max_connections,
    };
    let mut status = crate::apply::status(&request, &say())?;
    status.undone = crate::history::undone(&request.site, &say());
    if args.failures && args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status.failures()).unwrap_or_default()
        );
    } else if args.failures {
        out!("{}", report::failures_text(&status));
    } else if args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        out!("{}", report::status_text(&status));
    }
    let failing = status
        .checked
        .as_ref()
        .is_some_and(|c| !c.failing.is_empty());
    Ok(if failing { code::FAILED } else { code::OK })
}
