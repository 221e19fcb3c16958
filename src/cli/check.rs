//! `deploy check`: site → model, offline.

use super::{code, Error};
use crate::site;
use std::io::IsTerminal;
use std::path::Path;

pub fn run(path: &Path) -> Result<u8, Error> {
    let (site, warnings) = site::check(path)?;
    let style = crate::report::Style {
        color: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        ..crate::report::Style::PLAIN
    };
    for w in &warnings {
        errln!("{}", crate::report::render_diagnostic(w, style));
    }
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
