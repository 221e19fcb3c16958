//! Diagnostics as text: colour on a terminal, plain and fixed-width otherwise.

use miette::{Diagnostic, GraphicalReportHandler, GraphicalTheme};

/// How diagnostics are drawn.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub width: usize,
}

impl Style {
    /// Plain text, 100 columns: what pipes, logs and tests get.
    pub const PLAIN: Style = Style {
        color: false,
        width: 100,
    };
}

/// Renders one diagnostic, and each related one as its own report.
pub fn render_diagnostic(diag: &dyn Diagnostic, style: Style) -> String {
    let theme = if style.color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(style.width)
        .with_links(false);
    let mut out = String::new();
    let related: Vec<&dyn Diagnostic> = diag.related().map(|r| r.collect()).unwrap_or_default();
    if related.is_empty() {
        let _ = handler.render_report(&mut out, diag);
        return out;
    }
    for r in related {
        let _ = handler.render_report(&mut out, r);
        out.push('\n');
    }
    out.push_str(&format!("error: {diag}\n"));
    out
}
