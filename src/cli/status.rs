//! `deploy status`: site → inventory → observed state → status table or JSON.

use super::{code, plan::observe, Error, SiteArgs};
use crate::{report, site, state};

pub fn run(args: &SiteArgs) -> Result<u8, Error> {
    let site = site::load(&args.site)?;
    let hosts = super::resolve(&site)?;
    let observed = observe(&site, &hosts, false, args.max_connections)?;
    let status = state::status(&site, &hosts, &observed);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
    } else {
        print!("{}", report::status_text(&status));
    }
    Ok(code::OK)
}
