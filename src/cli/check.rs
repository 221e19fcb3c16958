//! `deploy check`: site → model, offline.

use super::{code, Error};
use crate::site;
use std::path::Path;

pub fn run(path: &Path) -> Result<u8, Error> {
    let site = site::load(path)?;
    let hosts = match &site.platform.inventory {
        crate::site::InventorySpec::Static { hosts } => format!("{} hosts", hosts.len()),
        _ => "hosts resolved when planning".to_string(),
    };
    outln!(
        "{}: ok — site {}, {} classes, {} services, {hosts}",
        path.display(),
        site.name,
        site.classes.len(),
        site.services.len(),
    );
    Ok(code::OK)
}
