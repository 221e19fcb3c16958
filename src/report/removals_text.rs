//! The plan's removals as text: always shown, and whether this apply carries them out.

use crate::plan::Plan;
use crate::words::count;
use std::fmt::Write;

/// Appends the plan's removals to `out` (nothing when it has none).
pub fn removals(out: &mut String, plan: &Plan) {
    if plan.removals.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nRemovals (each once every other step of the run has passed: its recorded hooks, \
         then its record deleted):"
    );
    for r in &plan.removals {
        let hooks = match &r.hooks {
            None => "no hook recorded (by an older deploy): nothing is stopped, only its \
                     record is deleted"
                .to_string(),
            Some(h) if h.is_empty() => "no stop or remove hook: its record is deleted".into(),
            Some(h) => format!("runs its recorded {}", h.join(", ")),
        };
        let _ = writeln!(
            out,
            "  remove {} {} from {} ({}): {hooks}",
            r.service,
            r.version,
            r.host,
            r.why.words()
        );
    }
    let n = count(plan.removals.len(), "removal");
    if plan.prune {
        let _ = writeln!(out, "{n} carried out by apply (--prune or `prune #true`).");
    } else {
        let _ = writeln!(
            out,
            "left: {n} (pass --prune to `deploy apply`, or set `prune #true` in the site)"
        );
    }
}
