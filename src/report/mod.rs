//! Rendering for people and programs: plans, graphs and diagnostics. Nothing here decides anything.

mod diagnostic;
mod events;
mod graph;
mod plan_text;
mod removals_text;
mod status;

pub use diagnostic::{render_diagnostic, Style};
pub use events::{line as event_line, Bars, Lines, Ndjson};
pub use graph::{graph_dot, graph_text};
pub use plan_text::{plan_text, plan_text_with};
pub use status::{failures_text, status_text};
