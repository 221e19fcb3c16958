//! `deploy apply`: the flags → [`crate::apply`] → the plan, questions and summary on the
//! terminal, and the outcome as an exit code.

use super::{code, ApplyArgs, Error};
use crate::apply::{self, Operator, Outcome, Request, Verdict};
use crate::plan::Plan;
use crate::report;
use crate::rollout::{Gate, Sink, Summary};
use crate::session::Ended;
use std::io::{IsTerminal, Write};
use std::sync::Arc;

pub fn run(args: &ApplyArgs) -> Result<u8, Error> {
    let request = Request {
        target: args.target.clone(),
        yes: args.yes,
        only: args.only.clone(),
        on: args.on.clone(),
        max_connections: args.max_connections,
        accept_new_host_keys: args.accept_new_host_keys,
        break_lock: args.break_lock,
        read_hosts: args.read_hosts,
        read_first: args.read_first,
        repair: args.repair,
        prune: args.prune,
        elsewhere: None,
        controller: None,
    };
    // What the session has to say (warnings, what it carried on, why it stopped): stderr.
    let say: apply::Say = Arc::new(|text: &str| errln!("{text}"));
    let prepared = apply::prepare(request, say.clone())?;
    drive(prepared, args.json, None, &say)
}

/// Carries out `prepared` (recorded in the history; `undone_to`: the run an undo goes back
/// to): progress on stderr or NDJSON on stdout, the plan and questions on the terminal.
pub(super) fn drive(
    prepared: apply::Prepared,
    json: bool,
    undone_to: Option<&crate::history::Entry>,
    say: &apply::Say,
) -> Result<u8, Error> {
    let sink: Arc<dyn Sink> = if json {
        Arc::new(report::Ndjson)
    } else if std::io::stderr().is_terminal() {
        Arc::new(report::Bars::new())
    } else {
        Arc::new(report::Lines)
    };
    let terminal = Arc::new(Terminal { json });
    let outcome = crate::history::apply(prepared, sink, terminal, undone_to, say)?;
    if outcome.unchanged() && !json {
        outln!("Nothing to change.");
    }
    Ok(exit(&outcome))
}

/// The exit code of an outcome.
fn exit(outcome: &Outcome) -> u8 {
    match outcome.verdict() {
        Verdict::Converged => code::OK,
        Verdict::Failed => code::FAILED,
        Verdict::Stopped(Ended::Interrupted) => code::INTERRUPTED,
        Verdict::Stopped(Ended::JournalFailed) => code::ENVIRONMENT,
        Verdict::Stopped(Ended::LockLost) => code::LOCK_LOST,
    }
}

/// The operator at a terminal: the plan on stdout (not with `--json`), questions on stderr,
/// answered on stdin.
struct Terminal {
    json: bool,
}

impl Operator for Terminal {
    fn show(&self, plan: &Plan, pending: &[bool], early: &[bool]) {
        if !self.json {
            out!("{}", report::plan_text_with(plan, pending, early));
        }
    }

    fn can_ask(&self) -> bool {
        std::io::stdin().is_terminal()
    }

    fn approve(&self) -> bool {
        ask("Apply this plan?")
    }

    fn ran(&self, summary: &Summary) {
        if self.json {
            return;
        }
        for f in &summary.failures {
            errln!("failed: {} on {}, log: {}", f.service, f.host, f.log);
        }
        for (host, why) in &summary.refused {
            errln!(
                "refused: {host} could not be locked as it was read during the run ({why}); \
                 what ran is recorded; run `deploy apply` again once the other run is over"
            );
        }
    }
}

/// Confirms `pause "confirm"` waves on the terminal.
impl Gate for Terminal {
    fn confirm(&self, service: &str, wave: usize) -> bool {
        ask(&format!("Start wave {wave} of {service}?"))
    }
}

fn ask(question: &str) -> bool {
    err!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let answer = crate::session::read_answer();
    if answer.is_empty() {
        errln!();
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}
