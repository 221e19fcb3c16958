//! `deploy status`: site → inventory (`--on`: some hosts) → observed state → table or JSON.

use super::{code, plan::observe, Error, StatusArgs};
use crate::{report, site, state};

pub fn run(args: &StatusArgs) -> Result<u8, Error> {
    let site = site::load(&args.site.site)?;
    let on = super::plan::selector(&args.on)?;
    let mut hosts = super::resolve(&site)?;
    if let Some(ids) = super::plan::on_hosts(on.as_ref(), &site, &hosts)? {
        hosts = hosts.subset(&ids, site.classes.len());
    }
    let observed = observe(&site, &hosts, false, args.site.max_connections)?;
    let mut status = state::status(&site, &hosts, &observed);
    status.unfinished_run = super::recovery::unfinished(&site.name);
    if args.site.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        out!("{}", report::status_text(&status));
    }
    Ok(code::OK)
}
