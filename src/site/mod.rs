//! Site files in, a checked model out: `site` → raw nodes with spans → [`Site`].

mod check;
mod check_files;
mod check_inventory;
mod check_service;
mod check_store;
mod cycle;
pub mod error;
mod ids;
mod include;
pub mod model;
mod raw;
mod raw_inventory;
mod raw_store;
mod read;
mod source;
mod spread;
pub(crate) mod suggest;
mod template;
mod template_names;
#[cfg(test)]
mod tests;
pub mod value;

pub use check_files::{template_error, TEMPLATE_VARIABLES};
pub use error::{SiteError, SiteErrors};
pub(crate) use ids::id_type;
#[cfg(test)]
pub(crate) use ids::ids_of;
pub use ids::{Id, IdVec};
pub use model::*;
pub use source::normalize as normalize_path;
pub use spread::{classes_words, help as spread_help};
pub use value::{duration_text, format_duration, parse_duration, Quota, Round};

use std::path::Path;

/// Reads the site at `path`, its platform and its policies, and checks them all,
/// reporting every problem at once.
pub fn load(path: &Path) -> Result<Site, SiteErrors> {
    check(path).map(|(site, _)| site)
}

/// As [`load`], with what is worth a word but not wrong (`deploy check` says it).
pub fn check(path: &Path) -> Result<(Site, Vec<SiteError>), SiteErrors> {
    let mut checker = check::Checker::new();
    match checker.site(path) {
        Some(site) if checker.errors.is_empty() => Ok((site, checker.warnings)),
        _ => {
            // File by file in the order read (the site first), each in line order.
            let files = checker.sources.files();
            let mut errors = checker.errors;
            errors.sort_by_key(|e| {
                let (file, offset) = e.location();
                (file.map(|f| files.iter().position(|x| x == f)), offset)
            });
            // One problem once, however many routes lead to it.
            let mut seen = std::collections::HashSet::new();
            errors.retain(|e| {
                let (file, offset) = e.location();
                seen.insert((file.map(str::to_string), offset, e.to_string()))
            });
            Err(SiteErrors {
                file: path.display().to_string(),
                errors,
            })
        }
    }
}
