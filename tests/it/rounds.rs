//! Waits that would go round, on a real sshd fleet: two services handed each other's
//! addresses, and records left by runs with `--on` (made while some hosts were out of the
//! inventory) in which a member runs its service but is not listed by a peer. The full
//! `deploy apply --yes` that follows would make a step wait for a step that waits, through the
//! service's wave order, for it: the plan drops that one wait, says so (text and JSON), and the
//! run converges instead of ending on the engine's stall guard (`… can never run`, exit 1).
//! The same records as the unit reproducer `pool_waits_that_would_go_round_do_not_stall_the_run`
//! (`src/rollout/tests/rounds.rs`), made here by `deploy` itself.

use crate::support;

use serde_json::Value;
use std::path::PathBuf;
use support::fleet::{Fleet, FleetHost};
use support::hooks::write_platform_without;

/// The site: s on class cs (h1, h2) and x on class cx (n, n2), each handed the other's
/// addresses, x at `x_version`; one host at a time. Each hook appends
/// `<ns> <service> <hook> <old> <new> | <addresses it was handed>` to the host's
/// /var/lib/hooks (`<ns>`: when it ran, nanoseconds since the epoch).
/// The platform leaves out the hosts in `hidden`.
fn site(fleet: &Fleet, x_version: &str, hidden: &[&str]) -> PathBuf {
    write_platform_without(fleet, hidden);
    let service = |name: &str, port: u16, needs: &str, version: &str| {
        let hook = |hook: &str| {
            format!(
                "    {hook} #\"echo \"$(date +%s%N) $DEPLOY_SERVICE {hook} ${{DEPLOY_OLD_VERSION:--}} $DEPLOY_NEW_VERSION | $DEPLOY_NEEDS_{}\" >> /var/lib/hooks\"#\n",
                needs.to_uppercase()
            )
        };
        format!(
            "service \"{name}\" {{\n    version \"{version}\"\n    port {port}\n    needs \"{needs}\" addressable=\"all\"\n{}{}{}}}\n",
            hook("stop"),
            hook("install"),
            hook("start")
        )
    };
    let text = format!(
        "site \"rounds\" {{\n    version \"1.0\"\n    platform \"platform.kdl\"\n    policy \"policy.kdl\"\n}}\n\
         class \"cs\" {{ service \"s\" }}\nclass \"cx\" {{ service \"x\" }}\n{}{}",
        service("s", 18080, "x", "1.0"),
        service("x", 18081, "s", x_version),
    );
    fleet.write_site(&text, "policy \"default\" { batch 1; max-failed 0 }\n")
}

/// `deploy ARGS…` in the fleet's directory: exit code, stdout, stderr.
fn deploy(fleet: &Fleet, args: &[&str]) -> (Option<i32>, String, String) {
    support::cli::outcome(support::cli::deploy_in(&fleet.dir).args(args))
}

/// What `host`'s state file records of `service`: its version, and the hosts its `needs:`
/// input lists (names, sorted).
fn recorded(fleet: &Fleet, host: &str, service: &str, needs: &str) -> (String, Vec<String>) {
    let path = fleet.host_root(host).join("var-lib/drover/state.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{host}: {e}"));
    let state: Value = serde_json::from_str(&text).expect("state.json");
    let record = &state["services"][service];
    let mut listed: Vec<String> = record["inputs"][format!("needs:{needs}")]
        .as_str()
        .unwrap_or_else(|| panic!("{host}: no needs:{needs} in {record}"))
        .split_whitespace()
        .filter_map(|m| m.split_once('=').map(|(name, _)| name.to_string()))
        .collect();
    listed.sort();
    assert_eq!(
        record["validated"]["outcome"], "success",
        "{host}: {service} recorded healthy: {record}"
    );
    (
        record["version"].as_str().unwrap_or_default().to_string(),
        listed,
    )
}

/// What the hooks wrote on `host`: `(ns, line without it)`, oldest first.
fn hooks(fleet: &Fleet, host: &str) -> Vec<(u128, String)> {
    fleet
        .lines(host, "var-lib/hooks")
        .iter()
        .map(|l| {
            let (ns, rest) = l.split_once(' ').expect("<ns> <line>");
            (ns.parse().expect("ns"), rest.to_string())
        })
        .collect()
}

#[test]
fn waits_left_going_round_by_on_runs_are_dropped_and_the_run_converges() {
    let fleet = Fleet::start(&[
        FleetHost::new("h1", "cs"),
        FleetHost::new("h2", "cs"),
        FleetHost::new("n", "cx"),
        FleetHost::new("n2", "cx"),
    ]);
    let s = |x: &str, hidden: &[&str]| site(&fleet, x, hidden).display().to_string();
    let apply = |site: &str, on: &[&str]| {
        let mut args = vec!["apply", site, "--yes"];
        args.extend_from_slice(on);
        let (code, out, err) = deploy(&fleet, &args);
        assert_eq!(code, Some(0), "apply {on:?}:\n{out}\n{err}");
    };

    // Every host installed, x at 0.9: each lists every peer.
    apply(&s("0.9", &[]), &[]);
    // Then x goes to 1.0, applied host by host with `--on` while a host was out of the
    // inventory (under maintenance, say): h1 while n was out, n while h2 was, h2 while n2 was.
    // n2 is left at 0.9.
    apply(&s("1.0", &["n"]), &["--on", "host:h1"]);
    apply(&s("1.0", &["h2"]), &["--on", "host:n"]);
    apply(&s("1.0", &["n2"]), &["--on", "host:h2"]);
    let names = |l: &[&str]| l.iter().map(|h| h.to_string()).collect::<Vec<_>>();
    // What the runs left: n runs x but h1 does not list it, h2 is not listed by n, n2 not by h2.
    assert_eq!(
        recorded(&fleet, "h1", "s", "x"),
        ("1.0".into(), names(&["n2"]))
    );
    assert_eq!(
        recorded(&fleet, "n", "x", "s"),
        ("1.0".into(), names(&["h1"]))
    );
    assert_eq!(
        recorded(&fleet, "h2", "s", "x"),
        ("1.0".into(), names(&["n"]))
    );
    assert_eq!(
        recorded(&fleet, "n2", "x", "s"),
        ("0.9".into(), names(&["h1", "h2"]))
    );

    // The whole fleet again. s on h1 would wait for x on n (n is new to h1's pool), which
    // waits for s on h2 (new to n's), in s's wave after h1's: that wait is dropped, said.
    let site = s("1.0", &[]);
    let (code, plan, err) = deploy(&fleet, &["plan", &site]);
    assert_eq!(code, Some(0), "{plan}\n{err}");
    let line = |has: &str| {
        plan.lines()
            .find(|l| l.contains(has))
            .unwrap_or_else(|| panic!("{has}:\n{plan}"))
            .to_string()
    };
    assert!(
        line("(needs x: +n; not after x on n: would go round)").ends_with(": h1"),
        "{plan}"
    );
    assert!(
        line("(needs x: +n2; after x on n2)").ends_with(": h2"),
        "{plan}"
    );
    assert!(
        line("(needs s: +h2; after s on h2)").ends_with(": n"),
        "{plan}"
    );
    assert!(
        plan.contains(
            "  s on h1 does not wait for x on n: x on n waits for s on h2, which is in a later \
             wave than s on h1."
        ),
        "{plan}"
    );
    let (code, json, err) = deploy(&fleet, &["plan", &site, "--json"]);
    assert_eq!(code, Some(0), "{json}\n{err}");
    let json: Value = serde_json::from_str(&json).expect("plan json");
    let dropped = json["dropped_waits"].as_array().expect("dropped_waits");
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(
        (&dropped[0]["service"], &dropped[0]["host"]),
        (&Value::from("s"), &Value::from("h1"))
    );
    assert_eq!(
        dropped[0]["waits_for"],
        serde_json::json!({ "service": "x", "host": "n" })
    );
    let round: Vec<(String, String)> = dropped[0]["round"]
        .as_array()
        .expect("round")
        .iter()
        .map(|l| {
            (
                format!(
                    "{} on {}",
                    l["service"].as_str().unwrap_or("?"),
                    l["host"].as_str().unwrap_or("?")
                ),
                l["by"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    assert_eq!(
        round,
        [
            ("s on h2".to_string(), "waits".to_string()),
            ("s on h1".to_string(), "wave".to_string())
        ],
        "x on n waits for s on h2, a wave after s on h1"
    );

    let before: Vec<usize> = ["h1", "h2", "n", "n2"]
        .iter()
        .map(|h| hooks(&fleet, h).len())
        .collect();
    let (code, out, err) = deploy(&fleet, &["apply", &site, "--yes"]);
    assert_eq!(code, Some(0), "converged, not stalled:\n{out}\n{err}");
    // The plan it shows first (every host read before the run: s and x are planned from
    // each other's hosts) says the dropped wait.
    assert!(
        out.contains("(needs x: +n; not after x on n: would go round)")
            && out.contains("  s on h1 does not wait for x on n: "),
        "the dropped wait said:\n{out}\n{err}"
    );
    assert!(!err.contains("can never run"), "{err}");

    // Every host converged: its record lists every peer at the version, and its hooks ran
    // this run's switch-over once, at 1.0, handed every peer's address.
    // `DEPLOY_NEEDS_*`: `address:port` of each host, in host name order.
    let handed = |hosts: [&str; 2], port: u16| {
        hosts
            .map(|h| format!("{}:{port}", fleet.address(h)))
            .join(" ")
    };
    let (listed_s, listed_x) = (handed(["h1", "h2"], 18080), handed(["n", "n2"], 18081));
    // Per host, when this run's hooks there began and ended.
    let mut span = std::collections::HashMap::new();
    for (i, (host, service, needs, from, peers)) in [
        ("h1", "s", "x", "1.0", ["n", "n2"]),
        ("h2", "s", "x", "1.0", ["n", "n2"]),
        ("n", "x", "s", "1.0", ["h1", "h2"]),
        ("n2", "x", "s", "0.9", ["h1", "h2"]),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(
            recorded(&fleet, host, service, needs),
            ("1.0".into(), names(&peers)),
            "{host}"
        );
        let lines = hooks(&fleet, host);
        let this_run = &lines[before[i]..];
        let ran: Vec<&str> = this_run.iter().map(|(_, l)| l.as_str()).collect();
        if let (Some(first), Some(last)) = (this_run.first(), this_run.last()) {
            span.insert(host, (first.0, last.0));
        }
        let handed = if service == "s" { &listed_x } else { &listed_s };
        assert_eq!(
            ran,
            [
                format!("{service} stop {from} 1.0 | {handed}"),
                format!("{service} install {from} 1.0 | {handed}"),
                format!("{service} start {from} 1.0 | {handed}"),
            ],
            "{host}: {lines:?}"
        );
    }
    // The waits kept held on the hosts: x on n began once s on h2 ended, s on h2 once x on n2
    // ended. The one dropped: s on h1 ended before x on n began, which it could not have
    // waited for.
    let (began, ended) = (|h: &str| span[h].0, |h: &str| span[h].1);
    assert!(ended("h2") < began("n"), "x on n after s on h2: {span:?}");
    assert!(ended("n2") < began("h2"), "s on h2 after x on n2: {span:?}");
    assert!(ended("h1") < began("n"), "{span:?}");
    // Nothing left to do: the next plan has no step, and verify agrees.
    let (code, plan, err) = deploy(&fleet, &["plan", &site]);
    assert_eq!(code, Some(0), "{plan}\n{err}");
    assert!(plan.contains("0 steps in 0 waves, 4 skipped."), "{plan}");
    let (code, out, err) = deploy(&fleet, &["verify", &site]);
    assert_eq!(code, Some(0), "{out}\n{err}");
}
