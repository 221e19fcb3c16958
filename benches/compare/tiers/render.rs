//! The three-tier workload's results as Markdown: the table of medians, the ideals, the
//! targets as ratios of medians, and where Drover's time went.

use super::super::stats::median;
use super::super::tiers_fleet::{SEED, STRAGGLER_FACTOR, STRAGGLER_P, WAIT_MIN_MS, WAIT_SPAN_MS};
use super::super::{Args, Machine};
use super::{Ideals, Mode, Sample, Size, MODES};
use std::fmt::Write as _;

/// The report: the medians, the ideals and the targets, per fleet size.
pub(super) fn render(args: &Args, machine: &Machine, results: &[Size]) -> String {
    let mut out = String::new();
    let loads: Vec<f64> = results
        .iter()
        .flat_map(|r| r.1.iter().flat_map(|m| m.1.iter().map(|s| s.load)))
        .collect();
    writeln!(out, "### Three tiers: results of {}\n", machine.date).unwrap();
    writeln!(out, "- command: `{}`", args.command).unwrap();
    writeln!(
        out,
        "- workload: `db` → `api` (`needs \"db\"`) → `web` (`needs \"api\" healthy=\"50%\" \
         addressable=\"all\"`); each host's `install` waits and its server listens only after a \
         readiness wait, each uniform in {:.1} to {:.1} s, both ×{STRAGGLER_FACTOR} on a \
         straggler (probability {STRAGGLER_P}, seed {SEED}); `check` polls the port until it \
         serves the new version; `web`'s `install` writes the api pool",
        WAIT_MIN_MS as f64 / 1000.0,
        (WAIT_MIN_MS + WAIT_SPAN_MS) as f64 / 1000.0
    )
    .unwrap();
    for (n, _, _, shape) in results {
        writeln!(out, "- N = {n}: {shape}").unwrap();
    }
    super::super::tool::environment(&mut out, args, machine, &loads);
    writeln!(
        out,
        "- versions: {} (tree: {}); ansible-core: {}; pyinfra: {}; {}",
        machine.deploy, machine.tree, machine.ansible, machine.pyinfra, machine.openssh
    )
    .unwrap();
    writeln!(
        out,
        "- {} timed run(s) of each, interleaved; wall clock from spawn to exit; median (min to \
         max); the ideal is the policy's schedule with zero overhead (each host exactly its \
         two waits)\n",
        args.runs
    )
    .unwrap();
    let sizes: Vec<usize> = results.iter().map(|r| r.0).collect();
    // The times per fleet size, then the SSH connections (sessions) per host in a run, from
    // the hosts' sshd logs.
    let links = |n: usize| format!("SSH connections (sessions) per host, N = {n}");
    write!(out, "| tool, policy |").unwrap();
    for n in &sizes {
        write!(out, " N = {n} |").unwrap();
    }
    for &n in &sizes {
        write!(out, " {} |", links(n)).unwrap();
    }
    write!(out, "\n| --- |{}\n", " ---: |".repeat(sizes.len() * 2)).unwrap();
    let blank = " |".repeat(sizes.len());
    let samples = |n: usize, mode: Mode| -> &[Sample] {
        results
            .iter()
            .find(|r| r.0 == n)
            .and_then(|r| r.1.iter().find(|m| m.0 == mode))
            .map_or(&[], |(_, s)| s.as_slice())
    };
    let med = |n: usize, mode: Mode| -> Option<f64> {
        let s = samples(n, mode);
        (!s.is_empty()).then(|| median(s.iter().map(|s| s.seconds)))
    };
    for mode in MODES {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| {
                let v: Vec<f64> = samples(n, mode).iter().map(|s| s.seconds).collect();
                let (lo, hi) = v
                    .iter()
                    .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
                if v.is_empty() {
                    String::new()
                } else {
                    format!("{:.2} s ({lo:.2} to {hi:.2})", median(&v))
                }
            })
            .collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        let connected: Vec<String> = sizes
            .iter()
            .map(|&n| {
                let s = samples(n, mode);
                if s.is_empty() {
                    return String::new();
                }
                let connections = median(s.iter().map(|s| s.connections));
                let sessions = median(s.iter().map(|s| s.sessions));
                format!("{connections:.2} ({sessions:.2})")
            })
            .collect();
        writeln!(
            out,
            "| {} | {} | {} |",
            mode.label(),
            cells.join(" | "),
            connected.join(" | ")
        )
        .unwrap();
    }
    type Of = fn(&Ideals) -> f64;
    let ideal_rows: [(&str, Of); 6] = [
        ("ideal of `batch \"30%\"` (Drover's plan)", |i| i.rolling),
        ("… each step also one round trip (`--rtt`)", |i| {
            i.rolling_rtt
        }),
        ("ideal of all at once (Drover's plan)", |i| i.all),
        ("… each step also one round trip (`--rtt`)", |i| i.all_rtt),
        (
            "ideal of Ansible's order (serial batches, tier after tier)",
            |i| i.ansible,
        ),
        (
            "ideal of pyinfra's order (tier after tier, each all at once)",
            |i| i.pyinfra,
        ),
    ];
    let other_rows: [(&str, Of); 2] = [
        ("Drover, `deploy plan` (reads every host; one run)", |i| {
            i.plan
        }),
        (
            "floor: `ssh HOST true` to every host at once (one run)",
            |i| i.connect,
        ),
    ];
    for (label, of) in ideal_rows.into_iter().chain(other_rows) {
        let cells: Vec<String> = results
            .iter()
            .map(|r| format!("{:.2} s", of(&r.2)))
            .collect();
        writeln!(out, "| {label} | {} |{blank}", cells.join(" | ")).unwrap();
    }
    let own: Vec<String> = results
        .iter()
        .map(|r| format!("{:.0} ms", r.2.own * 1000.0))
        .collect();
    writeln!(
        out,
        "| a step's own time beyond its two waits: its four steps in one command on a host, \
         no tool, no round trip (median of 5 api hosts) | {} |{blank}",
        own.join(" | ")
    )
    .unwrap();
    // The targets: ratios of medians (the ideal is one number).
    enum Side {
        Mode(Mode),
        Ideal(&'static str, Of),
    }
    let value = |n: usize, side: &Side| -> Option<f64> {
        match side {
            Side::Mode(m) => med(n, *m),
            Side::Ideal(_, of) => results.iter().find(|r| r.0 == n).map(|r| of(&r.2)),
        }
    };
    let name = |side: &Side| match side {
        Side::Mode(m) => m.label().to_string(),
        Side::Ideal(l, _) => l.to_string(),
    };
    let targets: [(Side, Side, f64); 7] = [
        (
            Side::Mode(Mode::DroverRolling),
            Side::Ideal("its ideal", |i| i.rolling),
            1.15,
        ),
        (
            Side::Mode(Mode::DroverPersist),
            Side::Ideal("its ideal", |i| i.rolling),
            1.15,
        ),
        // Issue 42: under the default cap, within 1.1 × every host kept connected.
        (
            Side::Mode(Mode::DroverRolling),
            Side::Mode(Mode::DroverUncapped),
            1.1,
        ),
        (
            Side::Mode(Mode::DroverRolling),
            Side::Mode(Mode::Pyinfra),
            1.0,
        ),
        (
            Side::Mode(Mode::DroverRolling),
            Side::Mode(Mode::AnsibleFree),
            0.3,
        ),
        (Side::Mode(Mode::DroverAll), Side::Mode(Mode::Pyinfra), 0.7),
        (
            Side::Mode(Mode::DroverAll),
            Side::Ideal("its ideal", |i| i.all),
            1.15,
        ),
    ];
    out.push('\n');
    super::super::header(&mut out, "target (ratio of medians)", &sizes);
    for (ours, theirs, target) in &targets {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| match (value(n, ours), value(n, theirs)) {
                (Some(a), Some(b)) => {
                    let r = a / b;
                    format!("{r:.3} {}", if r <= *target { "met" } else { "**missed**" })
                }
                _ => String::new(),
            })
            .collect();
        if cells.iter().all(String::is_empty) {
            continue;
        }
        writeln!(
            out,
            "| {} ÷ {} ≤ {target} | {} |",
            name(ours),
            name(theirs),
            cells.join(" | ")
        )
        .unwrap();
    }
    // Where Drover's time went: the medians of its runs' phases.
    out.push('\n');
    for (n, samples, _, _) in results {
        for (mode, s) in samples {
            if !matches!(
                mode,
                Mode::DroverRolling | Mode::DroverUncapped | Mode::DroverPersist | Mode::DroverAll
            ) || s.is_empty()
            {
                continue;
            }
            let before = median(s.iter().filter_map(|s| s.phases.before));
            let rollout = median(s.iter().filter_map(|s| s.phases.rollout));
            let replayed = median(s.iter().filter_map(|s| s.phases.replayed));
            let beyond = median(s.iter().filter_map(|s| s.phases.beyond)) * 1000.0;
            let cpu = median(s.iter().map(|s| s.cpu));
            writeln!(
                out,
                "- {} at N = {n}, medians: {before:.2} s before the rollout (load, resolve, \
                 observe every host, plan), {rollout:.2} s of rollout; its steps, each as long \
                 as it took, in the ideal schedule: {replayed:.2} s (the rest of the rollout is \
                 the scheduler's); a step beyond its host's two waits: {beyond:.0} ms; the \
                 machine's CPU during a run {cpu:.1} s",
                mode.label()
            )
            .unwrap();
        }
    }
    out
}
