//! `deploy plan` for people: per service, what it waits for, its waves, and who is skipped.

use crate::plan::{DroppedWait, Plan, PlannedPolicy, ServicePlan, SkipReason, StepKind, Wave};
use crate::site::{Flow, OnFailure};
use crate::words::{count, plural};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

/// The whole plan as text, deterministic for the same plan.
pub fn plan_text(plan: &Plan) -> String {
    plan_text_with(plan, &[], &[])
}

/// The plan as text when the services `pending` marks (by index) are planned during the run,
/// once their hosts are read: those are named, not planned, and those `early` marks said to
/// start before their plan if their needs hold first.
pub fn plan_text_with(plan: &Plan, pending: &[bool], early: &[bool]) -> String {
    let mut out = String::new();
    let is_pending = |i: usize| pending.get(i).copied().unwrap_or(false);
    let planned = || {
        plan.services
            .iter()
            .enumerate()
            .filter(move |(i, _)| !is_pending(*i))
            .map(|(_, s)| s)
    };
    let steps: usize = planned().map(|s| s.steps()).sum();
    let skipped: usize = planned().map(|s| s.skipped.len()).sum();
    let _ = writeln!(
        out,
        "Plan for site {} on platform {}: {}, {} (digest {})",
        plan.site,
        plan.platform,
        count(plan.hosts.len(), "host"),
        count(plan.services.len(), "service"),
        &plan.site_digest[..12.min(plan.site_digest.len())]
    );
    if let (Some(q), Some(n)) = (plan.max_failed, plan.max_failed_hosts) {
        let _ = writeln!(
            out,
            "Run budget: no new wave of any service once more than {} failed (site max-failed {q}).",
            count(n, "host")
        );
    }
    // Hosts that answered but whose state file cannot be read: skipped as unreachable ones are,
    // but said as what they are.
    let unreadable: BTreeSet<&str> = plan
        .hosts
        .iter()
        .filter(|h| matches!(h.observed, crate::state::Observed::Unreadable { .. }))
        .map(|h| &*h.name)
        .collect();
    for (i, s) in plan.services.iter().enumerate() {
        out.push('\n');
        if is_pending(i) {
            let early = if early.get(i).copied().unwrap_or(false) {
                ";\n  if its needs hold first, it starts, each host stepped once it is read"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{} → {}  (class {}: {} {})\n  planned during the run, once the hosts it is \
                 planned from are read{early}",
                s.name,
                s.version,
                s.classes.join(", "),
                s.hosts,
                plural(s.hosts, "host")
            );
            continue;
        }
        service(&mut out, s, &plan.dropped_waits, &unreadable);
    }
    let waves: usize = planned().map(|s| s.waves.len()).sum();
    let later = pending.iter().filter(|p| **p).count();
    let _ = writeln!(
        out,
        "\n{steps} {} in {waves} {}{}, {skipped} skipped.",
        plural(steps, "step"),
        plural(waves, "wave"),
        if later > 0 { " planned now" } else { "" }
    );
    dropped_waits(&mut out, &plan.dropped_waits);
    super::removals_text::removals(&mut out, plan);
    unknown_hosts(&mut out, plan);
    let unread = plan
        .hosts
        .iter()
        .filter(|h| h.observed == crate::state::Observed::Unread)
        .count();
    if later > 0 {
        let _ = writeln!(
            out,
            "\n{} not read before the run: each is locked and read as the run goes, and {} \
             planned once every host it is planned from is read (--yes, nothing to confirm); \
             each step decided then is printed with what it does and why as it starts.",
            count(unread, "host"),
            if later == 1 {
                "its service is".to_string()
            } else {
                format!("each of {later} services is")
            }
        );
    } else if unread > 0 && steps == 0 {
        let _ = writeln!(
            out,
            "\n{} not read before the run: no service selected would change there.",
            count(unread, "host")
        );
    } else if unread > 0 {
        let _ = writeln!(
            out,
            "\n{} not read before the run (over --max-connections): each is locked and read \
             in the command before its first step, which does nothing if it already runs what \
             the site says; each step decided then is printed with what it does and why as it \
             starts.",
            count(unread, "host")
        );
    }
    if !plan.diffs.is_empty() {
        let _ = writeln!(
            out,
            "\nFile changes (each host's file, read now, against the site's):"
        );
        for d in &plan.diffs {
            if d.diff.starts_with('[') {
                let _ = writeln!(out, "{}:{} ({}): {}", d.host, d.path, d.service, d.diff);
            } else {
                out.push_str(&d.diff);
            }
        }
    }
    out
}

/// Pool waits left out because they would go round, each with why and what it means.
fn dropped_waits(out: &mut String, dropped: &[DroppedWait]) {
    if dropped.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nWaits dropped, as keeping them would make the run's waits go round (records left by \
         runs with --on or stopped partway):"
    );
    for d in dropped {
        let _ = writeln!(out, "  {}.", d.words());
    }
}

/// Hosts nothing is known of (no answer, or a state file that cannot be used), each with why:
/// the reason says what to do about it.
fn unknown_hosts(out: &mut String, plan: &Plan) {
    let unknown: Vec<(&str, &str)> = plan
        .hosts
        .iter()
        .filter_map(|h| match &h.observed {
            crate::state::Observed::Unreachable { reason } => Some((&*h.name, reason.as_str())),
            crate::state::Observed::Unreadable { reason } => Some((&*h.name, reason.as_str())),
            _ => None,
        })
        .collect();
    if unknown.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "
Left alone, nothing known of what they run:"
    );
    for (host, reason) in unknown {
        let _ = writeln!(out, "  {host}: {reason}");
    }
}

fn service(
    out: &mut String,
    s: &ServicePlan,
    dropped: &[DroppedWait],
    unreadable: &BTreeSet<&str>,
) {
    let p = &s.policy;
    let _ = writeln!(
        out,
        "{} → {}  (class {}: {} {})",
        s.name,
        s.version,
        s.classes.join(", "),
        s.hosts,
        plural(s.hosts, "host")
    );
    let rules = policy_rules(p);
    let _ = writeln!(out, "  policy {}: {}", p.name, rules.join(", "));
    if s.waits_for.is_empty() {
        let _ = writeln!(out, "  starts at once");
    }
    for c in &s.waits_for {
        let _ = writeln!(
            out,
            "  waits for {}: {} of {} healthy",
            c.service,
            c.count,
            count(c.of, "host")
        );
    }
    for c in &s.addresses_of {
        let _ = writeln!(
            out,
            "  addresses of {}: {} of {}",
            c.service,
            c.count,
            count(c.of, "host")
        );
    }
    // Steps of a service mostly name the same services: look at each distinct list once.
    let mut after: BTreeSet<&str> = BTreeSet::new();
    let mut last: &[std::sync::Arc<str>] = &[];
    for st in s.each_step() {
        if st.after != last {
            after.extend(st.after.iter().map(|a| &**a));
            last = &st.after;
        }
    }
    if !after.is_empty() {
        let _ = writeln!(
            out,
            "  on each host after: {}",
            after.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    let dropped: Vec<&DroppedWait> = dropped.iter().filter(|d| *d.service == *s.name).collect();
    for (i, w) in s.waves.iter().enumerate() {
        wave(out, i + 1, w, &dropped);
    }
    skips(out, s, unreadable);
}

/// The policy in words, for a service of `waves` waves.
/// The policy's rule, whatever this service's waves are: one policy reads the same for every
/// service of a plan (its counts are of each service's hosts), however many waves each has.
fn policy_rules(p: &PlannedPolicy) -> Vec<String> {
    use crate::rollout::Flowing;
    // Whether a later wave may take a free slot before the whole wave before it has ended,
    // by the scheduler's own rule.
    let flowing = crate::rollout::flowing(p);
    let slots = matches!(flowing, Some(Flowing::Slots { .. }));
    let mut rules = vec![if slots {
        format!(
            "{} switching at once, a freed slot to the next host",
            count(p.batch_hosts, "host")
        )
    } else {
        format!("{} per wave", count(p.batch_hosts, "host"))
    }];
    if p.canary > 0 {
        rules.insert(0, format!("canary {}", p.canary));
    }
    if let Some(tag) = &p.spread {
        rules.push(format!("one {tag} at a time"));
    }
    let unit = if slots { "host" } else { "wave" };
    rules.push(match p.on_failure {
        OnFailure::Rollback => format!(
            "roll back a failed host, no new {unit} after {} failed",
            p.max_failed_hosts + 1
        ),
        OnFailure::Stop => format!("leave a failed host as it is, no new {unit} after a failure"),
        OnFailure::Continue => "roll back a failed host, carry on whatever fails".into(),
        OnFailure::Revert => format!(
            "roll back a failed host; after {} failed, revert every host this run switched \
             (last first) and stop the run",
            p.max_failed_hosts + 1
        ),
    });
    if let (Some(q), false) = (p.wave_max_failed, p.on_failure == OnFailure::Continue) {
        rules.push(format!(
            "no new step of a wave once more than {q} of its hosts failed"
        ));
    }
    if !p.pause.is_none() {
        rules.push(format!("pause {}", p.pause));
    }
    if let Some(d) = p.progress_deadline {
        rules.push(format!(
            "failed once no step started or ended for {}",
            crate::site::format_duration(d)
        ));
    }
    match flowing {
        Some(Flowing::Slots { .. }) => {}
        Some(Flowing::Budget { limit: usize::MAX }) => {
            rules.push("a free slot goes to the next wave at once (flow \"budget\")".into())
        }
        Some(Flowing::Budget { limit }) => rules.push(format!(
            "a free slot goes to the next wave while failed + switching ≤ {limit} (flow \"budget\")"
        )),
        None if p.flow != Flow::Slots => rules.push(format!(
            "each wave waits for the whole one before it (flow \"{}\")",
            p.flow.name()
        )),
        None => {}
    }
    rules
}

fn wave(out: &mut String, n: usize, w: &Wave, dropped: &[&DroppedWait]) {
    let mut label = format!("wave {n}");
    if w.canary {
        label.push_str(" (canary)");
    }
    if let Some(v) = &w.spread {
        label.push_str(&format!(" [{v}]"));
    }
    // One line per distinct starting version and reason (in order of first appearance),
    // hosts in plan order. A wave of thousands of hosts may start from as many versions: look
    // them up in a map once there are more than a few.
    let mut lines: Vec<(String, Vec<&str>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let to = w.steps.first().map(|st| &*st.to).unwrap_or("");
    for st in &w.steps {
        let what = step_words(st, to, dropped);
        let found = if lines.len() <= 8 {
            lines.iter().position(|(g, _)| *g == what)
        } else {
            index.get(&what).copied()
        };
        let i = found.unwrap_or_else(|| {
            index.insert(what.clone(), lines.len());
            lines.push((what, Vec::new()));
            lines.len() - 1
        });
        lines[i].1.push(&st.host);
    }
    for (i, (what, hosts)) in lines.iter().enumerate() {
        let lead = if i == 0 { label.as_str() } else { "" };
        let _ = write!(out, "  {lead:<18} {what}: ");
        for (j, host) in hosts.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(host);
        }
        out.push('\n');
    }
}

/// What a step does, in words: `1.0 → 2.0`, `fresh → 2.0`, or
/// `reconfigure 2.0 (env: MODE; after api on app8)`; a wait dropped (of the service's
/// `dropped`) as `not after api on app9: would go round`.
fn step_words(st: &crate::plan::Step, to: &str, dropped: &[&DroppedWait]) -> String {
    let mut notes: Vec<String> = st.reasons.clone();
    let (mut kept, mut gone) = (Vec::new(), Vec::new());
    for w in &st.waits {
        let on = format!("{} on {}", w.service, w.host);
        match dropped
            .iter()
            .any(|d| d.host == st.host && d.waits_for == *w)
        {
            true => gone.push(on),
            false => kept.push(on),
        }
    }
    if !kept.is_empty() {
        notes.push(format!("after {}", kept.join(", ")));
    }
    if !gone.is_empty() {
        notes.push(format!("not after {}: would go round", gone.join(", ")));
    }
    let mut what = match st.kind {
        StepKind::Reconfigure => format!("reconfigure {to}"),
        StepKind::Repair => format!("repair {to}"),
        StepKind::Unread => format!("read at its step → {to}"),
        _ => format!("{} → {to}", st.from.as_deref().unwrap_or("fresh")),
    };
    if !notes.is_empty() {
        what.push_str(&format!(" ({})", notes.join("; ")));
    }
    if st.kind == StepKind::Reconfigure {
        what.push_str(&path_words(st.path, &st.restarts));
    }
    what
}

/// Which hooks a reconfigure runs, and why: ` by reload`, ` by switch-over, restarting for
/// hook:install, env:MODE`, ` by switch-over, no reload hook`, ` recorded only, …`.
pub(crate) fn path_words(path: Option<crate::plan::Path>, restarts: &[String]) -> String {
    use crate::plan::Path;
    match path {
        Some(Path::Reload) => " by reload".into(),
        Some(Path::Record) => " recorded only, nothing running uses it".into(),
        Some(Path::SwitchOver) | None if restarts.is_empty() => {
            " by switch-over, no reload hook".into()
        }
        Some(Path::SwitchOver) | None => {
            format!(" by switch-over, restarting for {}", restarts.join(", "))
        }
    }
}

fn skips(out: &mut String, s: &ServicePlan, unreadable: &BTreeSet<&str>) {
    for (reason, state_unreadable, text) in [
        (SkipReason::AtVersion, false, "converged"),
        (SkipReason::NotSelected, false, "not selected"),
        (SkipReason::Unreachable, false, "unreachable"),
        (SkipReason::Unreachable, true, "state unreadable"),
    ] {
        let hosts: Vec<&str> = s
            .skipped
            .iter()
            .filter(|k| k.reason == reason && unreadable.contains(&*k.host) == state_unreadable)
            .map(|k| &*k.host)
            .collect();
        if !hosts.is_empty() {
            let _ = writeln!(out, "  skipped, {text}: {}", hosts.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Step;

    fn policy(max_failed_hosts: usize, on_failure: OnFailure, flow: Flow) -> PlannedPolicy {
        PlannedPolicy {
            name: "p".into(),
            batch: crate::site::Quota::Count(2),
            batch_hosts: 2,
            max_failed: crate::site::Quota::Count(max_failed_hosts as u64),
            max_failed_hosts,
            wave_max_failed: None,
            canary: 0,
            pause: crate::site::Pause::Wait(std::time::Duration::ZERO),
            spread: None,
            on_failure,
            flow,
            progress_deadline: None,
        }
    }

    /// The policy's words for how waves flow, if any.
    fn flows(p: &PlannedPolicy) -> Option<String> {
        policy_rules(p)
            .iter()
            .find(|r| {
                r.starts_with("a free slot")
                    || r.starts_with("at most that many")
                    || r.starts_with("each wave waits")
            })
            .cloned()
    }

    #[test]
    fn the_policy_says_how_a_batch_limits_the_hosts_switching() {
        use Flow::Slots;
        let rules = |p: &PlannedPolicy| policy_rules(p).join(", ");
        // The default: a batch is a concurrency limit, whatever the budget.
        assert_eq!(
            rules(&policy(0, OnFailure::Rollback, Slots)),
            "2 hosts switching at once, a freed slot to the next host, roll back a failed host, no new host after 1 failed"
        );
        assert_eq!(
            rules(&policy(2, OnFailure::Stop, Slots)),
            "2 hosts switching at once, a freed slot to the next host, leave a failed host as it is, no new host after a failure"
        );
        assert_eq!(
            rules(&policy(0, OnFailure::Continue, Slots)),
            "2 hosts switching at once, a freed slot to the next host, roll back a failed host, carry on whatever fails"
        );
        assert_eq!(
            rules(&policy(0, OnFailure::Revert, Slots)),
            "2 hosts switching at once, a freed slot to the next host, roll back a failed host; after 1 failed, revert every host this run switched (last first) and stop the run"
        );
        // Whole waves where the policy asks for them, whatever the rule: a pause, a spread.
        let slots = policy(2, OnFailure::Rollback, Slots);
        let waves = |p: &PlannedPolicy| rules(p).starts_with("2 hosts per wave");
        let paused = PlannedPolicy {
            pause: crate::site::Pause::Wait(std::time::Duration::from_secs(10)),
            ..slots.clone()
        };
        assert!(waves(&paused));
        let spread = PlannedPolicy {
            spread: Some("zone".into()),
            ..slots.clone()
        };
        assert!(waves(&spread));
        // The rule, not the waves of one service: a canary changes only its own wave.
        let canary = PlannedPolicy {
            canary: 1,
            ..slots.clone()
        };
        assert!(rules(&canary).starts_with("canary 1, 2 hosts switching at once"));
        assert_eq!(flows(&slots), None, "slots say it in their first words");
    }

    #[test]
    fn the_budget_and_waves_rules_say_so() {
        let budget = policy(2, OnFailure::Rollback, Flow::Budget);
        assert_eq!(
            flows(&budget).as_deref(),
            Some(
                "a free slot goes to the next wave while failed + switching ≤ 2 (flow \"budget\")"
            )
        );
        assert_eq!(
            flows(&policy(0, OnFailure::Continue, Flow::Budget)).as_deref(),
            Some("a free slot goes to the next wave at once (flow \"budget\")")
        );
        // Under `budget`, nothing may fail (the default) or a failure stops: whole waves.
        for p in [
            policy(0, OnFailure::Rollback, Flow::Budget),
            policy(2, OnFailure::Stop, Flow::Budget),
        ] {
            assert_eq!(
                flows(&p).as_deref(),
                Some("each wave waits for the whole one before it (flow \"budget\")")
            );
        }
        assert_eq!(
            flows(&policy(2, OnFailure::Rollback, Flow::Waves)).as_deref(),
            Some("each wave waits for the whole one before it (flow \"waves\")")
        );
    }

    #[test]
    fn a_wave_groups_hosts_by_starting_version_in_order_of_appearance() {
        // More distinct versions than the short linear search handles.
        let steps = (0..40)
            .map(|i| Step {
                host: format!("h{i}").into(),
                from: (i % 13 != 0).then(|| format!("0.{}", i % 12).into()),
                to: "1.0".into(),
                kind: crate::plan::StepKind::Upgrade,
                reasons: Vec::new(),
                path: Some(crate::plan::Path::SwitchOver),
                restarts: Vec::new(),
                after: Vec::new(),
                waits: Vec::new(),
            })
            .collect();
        let w = Wave {
            canary: false,
            spread: None,
            steps,
        };
        let mut out = String::new();
        wave(&mut out, 1, &w, &[]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 13);
        assert_eq!(
            lines[0],
            "  wave 1             fresh → 1.0: h0, h13, h26, h39"
        );
        assert_eq!(lines[1], "                     0.1 → 1.0: h1, h25, h37");
        assert_eq!(lines[12], "                     0.0 → 1.0: h12, h24, h36");
        let hosts: usize = lines
            .iter()
            .map(|l| l.split(": ").nth(1).unwrap().split(", ").count())
            .sum();
        assert_eq!(hosts, 40);
    }
}
