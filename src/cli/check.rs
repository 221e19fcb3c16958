//! `deploy check`: site → model, offline.

use super::{code, Error};
use crate::site;
use std::path::Path;

pub fn run(path: &Path) -> Result<u8, Error> {
    let site = site::load(path)?;
    let crate::site::InventorySpec::Static { hosts } = &site.platform.inventory;
    println!(
        "{}: ok — site {}, {} classes, {} services, {} hosts",
        path.display(),
        site.name,
        site.classes.len(),
        site.services.len(),
        hosts.len()
    );
    Ok(code::OK)
}
