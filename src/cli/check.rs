//! `deploy check`: site → model, offline.

use super::{code, Error};
use crate::site;
use crate::words::count;
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
        crate::site::InventorySpec::Static { hosts } => count(hosts.len(), "host"),
        _ => "hosts resolved when planning".to_string(),
    };
    outln!(
        "{}: ok — site {}, {}, {}, {hosts}",
        path.display(),
        site.name,
        count(site.classes.len(), "class"),
        count(site.services.len(), "service"),
    );
    Ok(code::OK)
}
