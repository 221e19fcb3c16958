//! Consumers of rollout events: plain timestamped lines, NDJSON, or progress bars on a terminal.

use crate::rollout::{
    Event, EventKind, Interruption, RevertEnd, RevertIntent, ServiceOutcome, Sink, Skips,
    StepBlocked, StepEnd, StepIntent,
};
use crate::words::count;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

/// One JSON object per line on stdout.
pub struct Ndjson;

impl Sink for Ndjson {
    fn emit(&self, event: Event) {
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// Plain lines on stderr, one per event that matters to a person.
pub struct Lines;

impl Sink for Lines {
    fn emit(&self, event: Event) {
        if let Some(text) = line(&event.kind) {
            let time = event.time.get(11..23).unwrap_or(&event.time);
            let _ = writeln!(std::io::stderr().lock(), "{time} {text}");
        }
    }
}

/// The text of an event as a plain line; `None` for events too fine to print.
pub fn line(kind: &EventKind) -> Option<String> {
    Some(match kind {
        EventKind::RunStarted {
            run,
            site,
            steps,
            hosts,
            log_dir,
            ..
        } => format!(
            "run {run}: site {site}, {} on {}, logs in {log_dir}",
            count(*steps, "step"),
            count(*hosts, "host")
        ),
        EventKind::ServiceWaiting { service, waits_for } => {
            let conds: Vec<String> = waits_for
                .iter()
                .map(|c| format!("{} {}/{} healthy", c.service, c.count, c.of))
                .collect();
            format!("{service}: waiting for {}", conds.join(", "))
        }
        EventKind::ServicePlanned {
            service,
            waves,
            steps,
            skipped,
            unread: None,
        } => format!(
            "{service}: planned once its hosts were read, {} in {}, {skipped} skipped",
            count(*steps, "step"),
            count(*waves, "wave")
        ),
        EventKind::ServicePlanned {
            service,
            waves,
            steps,
            skipped,
            unread: Some(unread),
        } => format!(
            "{service}: started before its hosts were all read, {} in {}, {skipped} skipped; \
             {} once {} read",
            count(*steps, "step"),
            count(*waves, "wave"),
            count(*unread, "step"),
            if *unread == 1 { "its host is" } else { "their hosts are" }
        ),
        EventKind::Refused { host, reason } => format!(
            "REFUSED: {host} cannot be locked ({reason}); no new step starts"
        ),
        EventKind::ServiceStarted {
            service,
            waves,
            steps,
        } => format!(
            "{service}: started, {} in {}",
            count(*steps, "step"),
            count(*waves, "wave")
        ),
        EventKind::WaveStarted {
            service,
            wave,
            canary,
            hosts,
        } => format!(
            "{service}: wave {wave}{} started: {}",
            if *canary { " (canary)" } else { "" },
            hosts.join(", ")
        ),
        // A step decided once its host was read: what it does, and why, as the plan shows
        // for the hosts read before the run.
        EventKind::StepStarted {
            intent:
                StepIntent {
                    service,
                    host,
                    from,
                    to,
                },
            kind,
            reasons,
            path,
            restarts,
            decided: true,
        } => {
            let step = Decided {
                from: from.as_deref(),
                to,
                kind: *kind,
                reasons,
                path: *path,
                restarts,
            };
            decided_line(service, host, &step)
        }
        EventKind::StepStarted { .. }
        | EventKind::HookStarted { .. }
        | EventKind::HookFinished { .. } => return None,
        EventKind::StepFinished {
            result:
                StepEnd {
                    service,
                    host,
                    ok: true,
                    ..
                },
            ..
        } => format!("{service}: {host} ok"),
        EventKind::StepFinished {
            result:
                StepEnd {
                    service,
                    host,
                    reason,
                    rolled_back,
                    ..
                },
            log,
            ..
        } => {
            let rb = if *rolled_back { ", rolled back" } else { "" };
            format!(
                "{service}: {host} FAILED: {}{rb} (log: {log})",
                reason.as_deref().unwrap_or("failed")
            )
        }
        EventKind::StepBlocked(StepBlocked {
            service,
            host,
            reason,
        }) => format!("{service}: {host} not started: {reason}"),
        EventKind::WaitDropped { service, why, .. } => {
            format!("{service}: a wait dropped, as it would go round: {why}")
        }
        EventKind::StepSkipped {
            service,
            host,
            skip: crate::plan::SkipReason::AtVersion,
            ..
        } => format!("{service}: {host} already converged, nothing to do"),
        EventKind::StepSkipped {
            service,
            host,
            reason,
            ..
        } => format!(
            "{service}: {host} left alone: {}",
            reason.as_deref().unwrap_or("unreachable")
        ),
        EventKind::RepointStarted {
            service,
            host,
            needs,
            phase,
            hosts,
            ..
        } => match phase {
            crate::rollout::Phase::Drop => format!(
                "{service}: {host} drops {} of {needs} before {} stop{}",
                hosts.join(", "),
                if hosts.len() == 1 { "it" } else { "they" },
                if hosts.len() == 1 { "s" } else { "" }
            ),
            crate::rollout::Phase::List => {
                format!("{service}: {host} lists {} of {needs} again", hosts.join(", "))
            }
        },
        EventKind::RepointFinished { ok: true, .. } => return None,
        EventKind::RepointFinished {
            service,
            host,
            needs,
            reason,
            log,
            ..
        } => format!(
            "{service}: {host} FAILED to change its hosts of {needs}: {} (log: {log})",
            reason.as_deref().unwrap_or("failed")
        ),
        EventKind::ServiceReverting {
            service,
            reason,
            hosts,
            left,
        } => {
            let mut text = format!(
                "{service}: REVERTING ({reason}): switching back {}",
                match hosts.is_empty() {
                    true => "no host".to_string(),
                    false => hosts.join(", "),
                }
            );
            if !left.is_empty() {
                text.push_str(&format!(
                    "; {} installed by this run, left as {}",
                    left.join(", "),
                    if left.len() == 1 { "it is" } else { "they are" }
                ));
            }
            text.push_str("; nothing else of the run starts");
            text
        }
        EventKind::RevertStarted {
            intent:
                RevertIntent {
                    service,
                    host,
                    from,
                    to,
                },
            hooks,
            secrets,
        } => {
            let mut text = format!("{service}: {host} reverting {from} → {to}");
            if hooks == "site" {
                text.push_str(" with the site's hooks and env (it recorded none before this run)");
            }
            if !secrets.is_empty() {
                let (noun, value) = match secrets.len() {
                    1 => ("secret", "value"),
                    _ => ("secrets", "values"),
                };
                text.push_str(&format!(
                    "; {noun} {} changed in this run: the site's current {value}",
                    secrets.join(", ")
                ));
            }
            text
        }
        EventKind::RevertFinished {
            result:
                RevertEnd {
                    service,
                    host,
                    ok: true,
                    ..
                },
            ..
        } => format!("{service}: {host} reverted"),
        EventKind::RevertFinished {
            result:
                RevertEnd {
                    service,
                    host,
                    reason,
                    ..
                },
            log,
            ..
        } => format!(
            "{service}: {host} revert FAILED: {} (log: {log})",
            reason.as_deref().unwrap_or("failed")
        ),
        EventKind::WaveFinished {
            service,
            wave,
            failed,
        } => format!("{service}: wave {wave} finished ({failed} failed so far)"),
        EventKind::ServiceFinished {
            service,
            outcome,
            reason,
            succeeded,
            failed,
            not_started,
        } => {
            let word = match outcome {
                ServiceOutcome::Done => "done",
                ServiceOutcome::Failed => "finished with failures",
                ServiceOutcome::Halted => "HALTED",
                ServiceOutcome::Blocked => "BLOCKED",
                ServiceOutcome::Interrupted => "INTERRUPTED",
                ServiceOutcome::Reverted => "REVERTED",
            };
            let why = reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            format!("{service}: {word}{why} ({succeeded} ok, {failed} failed, {not_started} not started)")
        }
        EventKind::Interrupted(Interruption {
            abort: false,
            running,
            reason,
        }) => format!(
            "INTERRUPTED ({reason}): no new step starts; waiting for {} to finish (interrupt again to abort {})",
            count(*running, "running step"),
            if *running == 1 { "it" } else { "them" }
        ),
        EventKind::Interrupted(Interruption {
            abort: true,
            running,
            reason,
        }) => format!(
            "ABORTING ({reason}): killing the hooks of {} on their hosts",
            count(*running, "running step")
        ),
        EventKind::RemovalStarted {
            service,
            host,
            version,
            why,
        } => format!("{service}: {host} remove {version} ({})", why.words()),
        EventKind::RemovalFinished {
            service,
            host,
            ok: true,
            ..
        } => format!("{service}: {host} removed"),
        EventKind::RemovalFinished {
            service,
            host,
            reason,
            log,
            ..
        } => format!(
            "{service}: {host} removal FAILED: {} (log: {log})",
            reason.as_deref().unwrap_or("failed")
        ),
        EventKind::RemovalsLeft { count: n, reason } => {
            format!("left: {}: {reason}", count(*n, "removal"))
        }
        EventKind::RunFinished {
            converged,
            succeeded,
            failed,
            not_started,
            unreachable,
            unreadable,
            refused,
            reverted,
            not_reverted,
            kinds,
            skips,
            ms,
            ..
        } => {
            let word = if *converged {
                "converged"
            } else {
                "NOT converged"
            };
            let mut more = String::new();
            let done = match kinds.text() {
                Some(kinds) => format!("{succeeded} ok ({kinds})"),
                None => format!("{succeeded} ok"),
            };
            // `skipped` (hosts found converged at their step) is in `skips`, with every other
            // host left alone.
            if let Some(text) = skipped_text(skips, *unreachable, *unreadable) {
                more.push_str(&format!(", {text}"));
            }
            if *refused > 0 {
                more.push_str(&format!(", {} refused", count(*refused, "host")));
            }
            if *reverted > 0 {
                more.push_str(&format!(", {} reverted", count(*reverted, "host")));
            }
            if *not_reverted > 0 {
                more.push_str(&format!(", {} NOT reverted", count(*not_reverted, "host")));
            }
            format!(
                "run {word}: {done}, {failed} failed, {not_started} not started{more} \
                 in {:.1}s",
                *ms as f64 / 1000.0
            )
        }
    })
}

/// The hosts the run left alone, for its closing line: `4 skipped (1 converged, 2 on 1
/// unreachable host, 1 not selected)`, each of a service's hosts once per service, with the
/// hosts that did not answer (`unreachable`, of which `unreadable` answered but their state
/// file could not be read) counted as hosts too; `None` when none.
fn skipped_text(skips: &Skips, unreachable: usize, unreadable: usize) -> Option<String> {
    let mut parts = Vec::new();
    if skips.converged > 0 {
        parts.push(format!("{} converged", skips.converged));
    }
    // A host whose state file cannot be read answered: it is said apart.
    let answering = unreachable.saturating_sub(unreadable);
    match (skips.unreachable, answering) {
        (0, 0) => {}
        (n, 0) => parts.push(format!("{n} unreachable")),
        (0, hosts) => parts.push(format!("{} unreachable", count(hosts, "host"))),
        (n, 1) => parts.push(format!("{n} on 1 unreachable host")),
        (n, hosts) => parts.push(format!("{n} on {hosts} unreachable hosts")),
    }
    match (skips.unreadable, unreadable) {
        (0, 0) => {}
        (n, 0) => parts.push(format!("{n} with an unreadable state file")),
        (0, hosts) => parts.push(format!(
            "{} with an unreadable state file",
            count(hosts, "host")
        )),
        (n, hosts) => parts.push(format!(
            "{n} on {} with an unreadable state file",
            count(hosts, "host")
        )),
    }
    if skips.not_selected > 0 {
        parts.push(format!("{} not selected", skips.not_selected));
    }
    (!parts.is_empty()).then(|| format!("{} skipped ({})", skips.total(), parts.join(", ")))
}

/// A step decided during the run, as its `step-started` event says it.
struct Decided<'a> {
    from: Option<&'a str>,
    to: &'a str,
    kind: crate::plan::StepKind,
    reasons: &'a [String],
    path: crate::plan::Path,
    restarts: &'a [String],
}

fn decided_line(service: &str, host: &str, step: &Decided<'_>) -> String {
    use crate::plan::StepKind;
    let Decided {
        from,
        to,
        kind,
        reasons,
        path,
        restarts,
    } = *step;
    let what = match kind {
        StepKind::Install => format!("install {to}"),
        StepKind::Upgrade => format!("upgrade {} → {to}", from.unwrap_or("?")),
        StepKind::Retry => format!("retry {to}"),
        StepKind::Reconfigure => format!("reconfigure {to}"),
        StepKind::Repair => format!("repair {to}"),
        StepKind::Unread => format!("step {to}"),
    };
    let why = if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join("; "))
    };
    let by = match kind {
        StepKind::Reconfigure => super::plan_text::path_words(Some(path), restarts),
        _ => String::new(),
    };
    format!("{service}: {host} {what}{why}{by}, decided once read")
}

/// One bar per service (hosts done of hosts planned), with failures and notable lines above.
pub struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<String, ProgressBar>>,
    style: ProgressStyle,
}

impl Bars {
    pub fn new() -> Bars {
        let style = ProgressStyle::with_template("{prefix:>16.bold} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10)),
            bars: Mutex::new(HashMap::new()),
            style,
        }
    }

    fn bar(&self, service: &str, len: u64) -> ProgressBar {
        let mut bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        bars.entry(service.to_string())
            .or_insert_with(|| {
                let b = self.multi.add(
                    ProgressBar::new(len)
                        .with_style(self.style.clone())
                        .with_prefix(service.to_string()),
                );
                b.set_message("waiting");
                b
            })
            .clone()
    }
}

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

impl Sink for Bars {
    fn emit(&self, event: Event) {
        match &event.kind {
            EventKind::ServiceWaiting { service, waits_for } => {
                let conds: Vec<String> = waits_for
                    .iter()
                    .map(|c| format!("{} {}/{}", c.service, c.count, c.of))
                    .collect();
                self.bar(service, 0)
                    .set_message(format!("waiting for {}", conds.join(", ")));
            }
            EventKind::ServiceStarted { service, steps, .. } => {
                let bar = self.bar(service, *steps as u64);
                bar.set_length(*steps as u64);
                bar.set_message("running");
            }
            EventKind::WaveStarted {
                service,
                wave,
                hosts,
                ..
            } => self
                .bar(service, 0)
                .set_message(format!("wave {wave}: {}", count(hosts.len(), "host"))),
            EventKind::StepFinished {
                result: StepEnd { service, ok, .. },
                ..
            } => {
                self.bar(service, 0).inc(1);
                if !ok {
                    let _ = self.multi.println(line(&event.kind).unwrap_or_default());
                }
            }
            EventKind::StepSkipped { service, skip, .. } => {
                self.bar(service, 0).inc(1);
                if *skip != crate::plan::SkipReason::AtVersion {
                    let _ = self.multi.println(line(&event.kind).unwrap_or_default());
                }
            }
            EventKind::StepStarted { decided: true, .. }
            | EventKind::StepBlocked { .. }
            | EventKind::WaitDropped { .. }
            | EventKind::RepointFinished { ok: false, .. }
            | EventKind::ServiceReverting { .. }
            | EventKind::RevertStarted { .. }
            | EventKind::RevertFinished { .. }
            | EventKind::RunStarted { .. }
            | EventKind::ServicePlanned { .. }
            | EventKind::Refused { .. }
            | EventKind::RemovalStarted { .. }
            | EventKind::RemovalFinished { .. }
            | EventKind::RemovalsLeft { .. }
            | EventKind::Interrupted { .. } => {
                let _ = self.multi.println(line(&event.kind).unwrap_or_default());
            }
            EventKind::ServiceFinished { service, .. } => {
                let b = self.bar(service, 0);
                b.finish_with_message(
                    line(&event.kind)
                        .unwrap_or_default()
                        .split_once(": ")
                        .map(|(_, m)| m.to_string())
                        .unwrap_or_default(),
                );
            }
            EventKind::RunFinished { .. } => {
                let _ = self.multi.println(line(&event.kind).unwrap_or_default());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::Kinds;

    fn finished(unreachable: usize, unreadable: usize, skips: Skips) -> EventKind {
        let kinds = Kinds {
            reconfigured: 2,
            skipped: skips.total(),
            ..Kinds::default()
        };
        EventKind::RunFinished {
            converged: unreachable == 0,
            succeeded: 2,
            failed: 0,
            not_started: 0,
            skipped: 1,
            unreachable,
            unreadable,
            refused: 0,
            reverted: 0,
            not_reverted: 0,
            kinds,
            skips,
            ms: 1500,
        }
    }

    #[test]
    fn the_closing_line_counts_every_host_left_alone_by_why() {
        let none = finished(0, 0, Skips::default());
        assert_eq!(
            line(&none).as_deref(),
            Some("run converged: 2 ok (2 reconfigured), 0 failed, 0 not started in 1.5s")
        );
        let converged = finished(
            0,
            0,
            Skips {
                converged: 3,
                not_selected: 1,
                ..Skips::default()
            },
        );
        assert_eq!(
            line(&converged).as_deref(),
            Some(
                "run converged: 2 ok (2 reconfigured), 0 failed, 0 not started, \
                 4 skipped (3 converged, 1 not selected) in 1.5s"
            )
        );
        // A host that does not answer, running two services, and one whose state file cannot
        // be read: their services counted, and the hosts.
        let away = finished(
            2,
            1,
            Skips {
                converged: 1,
                unreachable: 2,
                unreadable: 1,
                not_selected: 0,
            },
        );
        assert_eq!(
            line(&away).as_deref(),
            Some(
                "run NOT converged: 2 ok (2 reconfigured), 0 failed, 0 not started, \
                 4 skipped (1 converged, 2 on 1 unreachable host, 1 on 1 host with an \
                 unreadable state file) in 1.5s"
            )
        );
    }

    #[test]
    fn run_finished_counts_the_hosts_left_alone_among_its_kinds() {
        let event = finished(
            0,
            0,
            Skips {
                converged: 3,
                ..Skips::default()
            },
        );
        let json = serde_json::to_value(&event).expect("json");
        assert_eq!(json["kinds"]["skipped"], 3);
        assert_eq!(json["kinds"]["reconfigured"], 2);
        assert_eq!(json["skips"]["converged"], 3);
        assert_eq!(json["skips"]["not_selected"], 0);
        // Its fields as before: `skipped` those found converged at their step.
        assert_eq!(json["skipped"], 1);
    }
}
