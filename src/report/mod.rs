//! Rendering for people and programs: plans, graphs and diagnostics. Nothing here decides anything.

mod diagnostic;
mod graph;
mod plan_text;

pub use diagnostic::{render_diagnostic, Style};
pub use graph::{graph_dot, graph_text};
pub use plan_text::plan_text;
