//! A step's log: each hook's exit and output, and lines of its own.

use super::Running;
use crate::transport::{Link, Output, TransportError};
use std::io::Write;

impl<L: Link> Running<'_, L> {
    pub(super) fn log(&self, hook: &str, result: &Result<Output, TransportError>, ms: u64) {
        let write = || -> std::io::Result<()> {
            let mut f = crate::state::append_private(&self.job.log)?;
            match result {
                Ok(out) => {
                    let code = out.code.map_or("signal".to_string(), |c| c.to_string());
                    writeln!(f, "== {hook}: exit {code} after {ms} ms")?;
                    f.write_all(&out.stdout)?;
                    f.write_all(&out.stderr)?;
                }
                Err(e) => writeln!(f, "== {hook}: {e}")?,
            }
            Ok(())
        };
        let _ = write();
    }
}

/// `hook exited 3: <the last line of its stderr>`, or `hook was killed`.
pub(super) fn exit_reason(hook: &str, out: &Output) -> String {
    let tail: String = crate::transport::last_line(&String::from_utf8_lossy(&out.stderr))
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    let code = out
        .code
        .map_or("was killed".to_string(), |c| format!("exited {c}"));
    if tail.is_empty() {
        format!("{hook} {code}")
    } else {
        format!("{hook} {code}: {tail}")
    }
}

/// Appends one line to a step's log, creating it and its directory.
pub fn log_line(log: &std::path::Path, text: &str) {
    let write = || -> std::io::Result<()> {
        let mut f = crate::state::append_private(log)?;
        writeln!(f, "{text}")
    };
    let _ = write();
}
