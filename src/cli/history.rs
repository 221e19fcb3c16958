//! `deploy history`: site → its runs (this controller's and the store's) → text or JSON.

use super::{code, Error};
use crate::{history, site};
use std::path::Path;

pub fn run(site: &Path, json: bool) -> Result<u8, Error> {
    let site = site::load(site)?;
    let entries = history::entries(&site)?;
    if json {
        outln!("{}", history::show::json(&site.name, &entries));
    } else {
        out!("{}", history::show::text(&site.name, &entries));
    }
    Ok(code::OK)
}
