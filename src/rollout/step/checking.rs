//! A check that must hold (`stable=`): once it passed, run again every interval until it has
//! passed throughout the window; only the last run writes the record (validated).

use super::{Failure, HookCall, Running};
use crate::state::{HostRecord, Outcome};
use crate::transport::Link;
use std::time::Instant;

impl<L: Link> Running<'_, L> {
    /// The check passed once, and its `stable` asks for more: it runs again every interval
    /// (each run with its own timeout) until it has passed throughout `stable`, and that last
    /// run writes the record (validated). A failure meanwhile fails the step, which is then
    /// rolled back like any failed check.
    pub(super) async fn hold(
        &mut self,
        check: &crate::site::Check,
        base: HostRecord,
    ) -> Result<(), Failure> {
        let since = Instant::now();
        loop {
            tokio::time::sleep(check.interval).await;
            let last = since.elapsed() >= check.stable;
            let then =
                last.then(|| self.marked_on(base.clone(), None, Some(Outcome::Success), None));
            let attempt = self
                .hooks(vec![HookCall {
                    name: "check",
                    command: &check.command,
                    timeout: Some(check.timeout),
                    then,
                    last: true,
                    env: None,
                }])
                .await;
            match attempt {
                Ok(()) if last => return Ok(()),
                Ok(()) => {}
                Err(("check", why)) => {
                    let held = crate::site::format_duration(since.elapsed());
                    let stable = crate::site::format_duration(check.stable);
                    return Err((
                        "check",
                        format!("{why} ({held} after it first passed; stable=\"{stable}\")"),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }
}
