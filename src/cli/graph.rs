//! `deploy graph`: site → model → graph text or dot.

use super::{code, Error, GraphFormat};
use crate::{report, site};
use std::path::Path;

pub fn run(path: &Path, format: GraphFormat) -> Result<u8, Error> {
    let site = site::load(path)?;
    let text = match format {
        GraphFormat::Text => report::graph_text(&site),
        GraphFormat::Dot => report::graph_dot(&site),
    };
    out!("{text}");
    Ok(code::OK)
}
