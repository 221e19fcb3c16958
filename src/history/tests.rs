//! The history's own pieces: a snapshot taken from a site on disk and put back loads as the
//! same site (secrets' values never in it), entries kept and listed, and which run an undo
//! goes back to.

use super::snapshot::Snapshot;
use super::*;
use std::path::Path;

/// A site in `dir/sites/` with its platform and policy in sibling directories, a template, an
/// include, a plain delivered file and a secret read from a file.
fn write_site(dir: &Path, version: &str, conf: &str) -> PathBuf {
    let w = |p: &str, text: &str| {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    w(
        "platforms/lab.kdl",
        "platform \"lab\" {\n    transport \"local\" root=\"../hosts\"\n    inventory \"static\" {\n        host \"app1\" address=\"127.0.0.1\" class=\"app\"\n    }\n}\n",
    );
    w(
        "policies/all.kdl",
        "policy \"all\" {\n    batch \"100%\"\n}\n",
    );
    w(
        "sites/shop.kdl",
        &format!(
            "site \"shop\" {{\n    version \"{version}\"\n    platform \"../platforms/lab.kdl\"\n    policy \"../policies/all.kdl\"\n}}\ninclude \"services/*.kdl\"\n"
        ),
    );
    w(
        "sites/services/api.kdl",
        "class \"app\" { service \"api\" }\nservice \"api\" {\n    env \"MODE\" \"fast\"\n    secret \"TOKEN\" file=\"../secrets/token\"\n    file \"api.conf.j2\" to=\"/etc/api.conf\" template=#true\n    file \"static/index.html\" to=\"/srv/index.html\"\n    start \"true\"\n}\n",
    );
    w("sites/services/api.conf.j2", "listen {{ address }}\n");
    w("sites/services/static/index.html", conf);
    w("sites/secrets/token", "the-secret-value\n");
    dir.join("sites/shop.kdl")
}

#[test]
fn a_snapshot_put_back_loads_as_the_site_it_was_taken_from_without_secret_values() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_site(dir.path(), "1.0", "<p>v1</p>\n");
    let site = crate::site::load(&file).unwrap();
    let history = History::at(&dir.path().join(".drover"));
    let snap = Snapshot::take(&site, &history.blobs()).unwrap();
    assert_eq!(snap.site_file.as_str(), "shop.kdl");
    let names: Vec<&str> = snap.sources.iter().map(|k| k.path.as_str()).collect();
    assert!(names.contains(&"../platforms/lab.kdl"), "{names:?}");
    assert!(names.contains(&"services/api.conf.j2"), "{names:?}");
    // The secret's value is nowhere in the history; its file is not kept.
    for entry in walk(&dir.path().join(".drover")) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("the-secret-value"),
            "{}",
            entry.display()
        );
    }
    // The site changes; the snapshot still gives back the first.
    write_site(dir.path(), "2.0", "<p>v2</p>\n");
    let work = dir.path().join("work");
    let (back, _) = snap.put_back(&history.blobs(), &work).unwrap();
    let again = crate::site::load(&back).unwrap();
    assert_eq!(again.digest, site.digest);
    assert_eq!(
        again.services[crate::site::ServiceId::new(0)].version,
        "1.0"
    );
    let html = again.services[crate::site::ServiceId::new(0)]
        .files
        .iter()
        .find(|f| f.to == "/srv/index.html")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&html.source).unwrap(),
        "<p>v1</p>\n"
    );
}

#[test]
fn a_site_file_changed_after_it_was_loaded_is_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_site(dir.path(), "1.0", "x");
    let site = crate::site::load(&file).unwrap();
    write_site(dir.path(), "2.0", "x");
    let history = History::at(&dir.path().join(".drover"));
    let err = Snapshot::take(&site, &history.blobs()).unwrap_err();
    assert!(matches!(err, HistoryError::Changed { .. }), "{err}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn entry(run: &str, result: RunResult, undone_to: Option<&str>) -> Entry {
    Entry {
        schema: HISTORY_SCHEMA,
        run: RunId::parse(run).unwrap(),
        site: "shop".into(),
        started: "2026-12-05T13:00:00Z".into(),
        finished: "2026-12-05T13:00:01Z".into(),
        who: Who {
            user: "ops".into(),
            machine: "ctl".into(),
        },
        result,
        changes: Vec::new(),
        undone_to: undone_to.map(|r| RunId::parse(r).unwrap()),
        snapshot: Snapshot {
            site_file: snapshot::SnapPath::parse("shop.kdl").unwrap(),
            site_digest: String::new(),
            sources: Vec::new(),
            delivered: Vec::new(),
        },
    }
}

#[test]
fn undo_goes_back_to_the_last_converged_run_before_the_latest() {
    use RunResult::*;
    let runs = |es: &[Entry], to: Option<&str>| {
        let to = to.map(|t| RunId::parse(t).unwrap());
        undo::target(es, to.as_ref()).map(|e| e.run.to_string())
    };
    let es = vec![
        entry("r1", Converged, None),
        entry("r2", Failed, None),
        entry("r3", Converged, None),
        entry("r4", Converged, None),
    ];
    assert_eq!(runs(&es, None).unwrap(), "r3");
    assert_eq!(runs(&es, Some("r2")).unwrap(), "r2");
    assert!(runs(&es, Some("r9")).is_err());
    assert!(runs(&es[..1], None).is_err());
    assert!(runs(&[], None).is_err());
    // A failed run last: back to the converged one before it.
    assert_eq!(runs(&es[..2], None).unwrap(), "r1");
    // An undo that was interrupted is carried through to the same run.
    let mut more = es.clone();
    more.push(entry("r5", Interrupted, Some("r1")));
    assert_eq!(runs(&more, None).unwrap(), "r1");
    // One that converged is undone in turn: back to the run before it.
    more.push(entry("r6", Converged, Some("r1")));
    assert_eq!(runs(&more, None).unwrap(), "r4");
    assert_eq!(
        undone_to(&more).map(|(to, by)| (to.to_string(), by.run.to_string())),
        Some(("r1".into(), "r6".into()))
    );
}

#[test]
fn entries_are_kept_and_listed_per_site_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let history = History::at(dir.path());
    for run in ["r2", "r1"] {
        history
            .record(&entry(run, RunResult::Converged, None))
            .unwrap();
    }
    let mut other = entry("r3", RunResult::Converged, None);
    other.site = "other".into();
    history.record(&other).unwrap();
    let runs: Vec<String> = history
        .entries("shop")
        .unwrap()
        .iter()
        .map(|e| e.run.to_string())
        .collect();
    assert_eq!(runs, ["r1", "r2"]);
    assert!(RunId::parse("../x").is_none() && RunId::parse("a/b").is_none());
}

#[test]
fn runs_are_in_the_order_they_started_not_in_id_order() {
    // Two runs in one second: their ids compare by process id, as text.
    let mut a = entry("2026-12-05T134452Z-536", RunResult::Converged, None);
    a.started = "2026-12-05T13:44:52.500Z".into();
    let mut b = entry("2026-12-05T134452Z-1021", RunResult::Converged, Some("r1"));
    b.started = "2026-12-05T13:44:52.900Z".into();
    let mut es = vec![b.clone(), a.clone()];
    in_order(&mut es);
    assert_eq!(es, vec![a, b]);
    assert_eq!(
        undone_to(&es).map(|(to, _)| to.to_string()),
        Some("r1".into())
    );
}

/// A sink that keeps nothing.
struct Nowhere;

impl crate::rollout::Sink for Nowhere {
    fn emit(&self, _: crate::rollout::Event) {}
}

#[test]
fn what_a_run_changed_is_tallied_from_its_events() {
    use crate::plan::{Path as HookPath, RemovalWhy, StepKind};
    use crate::rollout::{Event, EventKind, Sink};
    let tally = tally::Tally::new(std::sync::Arc::new(Nowhere));
    let started = |host: &str, from: Option<&str>, kind: StepKind, reasons: &[&str]| {
        Event::now(EventKind::StepStarted {
            intent: crate::rollout::StepIntent {
                service: "api".into(),
                host: host.into(),
                from: from.map(String::from),
                to: if kind == StepKind::Reconfigure {
                    "1.0"
                } else {
                    "2.0"
                }
                .into(),
            },
            kind,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            path: HookPath::SwitchOver,
            restarts: Vec::new(),
            decided: false,
        })
    };
    let finished = |service: &str, host: &str, ok: bool| {
        Event::now(EventKind::StepFinished {
            result: crate::rollout::StepEnd {
                service: service.into(),
                host: host.into(),
                ok,
                failed_hook: (!ok).then(|| "check".into()),
                rolled_back: !ok,
                reason: None,
            },
            log: String::new(),
            record: None,
        })
    };
    // A step's end for a service with no step begun counts nothing.
    tally.emit(finished("web", "w1", false));
    tally.emit(started("app1", Some("1.0"), StepKind::Upgrade, &[]));
    tally.emit(started("app2", None, StepKind::Install, &[]));
    tally.emit(started(
        "app3",
        Some("1.0"),
        StepKind::Reconfigure,
        &["env: MODE"],
    ));
    tally.emit(finished("api", "app1", true));
    tally.emit(finished("api", "app2", false));
    tally.emit(Event::now(EventKind::RevertFinished {
        result: crate::rollout::RevertEnd {
            service: "api".into(),
            host: "app1".into(),
            ok: true,
            failed_hook: None,
            reason: None,
        },
        log: String::new(),
        record: None,
    }));
    // A service taken off a host, and one whose removal failed.
    for (host, ok) in [("app4", true), ("app5", false)] {
        tally.emit(Event::now(EventKind::RemovalStarted {
            service: "cache".into(),
            host: host.into(),
            version: "0.9".into(),
            why: RemovalWhy::LeftSite,
        }));
        tally.emit(Event::now(EventKind::RemovalFinished {
            service: "cache".into(),
            host: host.into(),
            why: RemovalWhy::LeftSite,
            ok,
            failed_hook: None,
            reason: None,
            log: String::new(),
            emptied: false,
        }));
    }
    let changes = tally.changes();
    let kinded = |kind, hosts| Kinded { kind, hosts };
    assert_eq!(
        changes,
        vec![
            Change {
                service: "api".into(),
                hosts: 3,
                from: vec![None, Some("1.0".into())],
                to: vec!["1.0".into(), "2.0".into()],
                failed: 1,
                kinds: vec![
                    kinded(StepKind::Upgrade, 1),
                    kinded(StepKind::Install, 1),
                    kinded(StepKind::Reconfigure, 1)
                ],
                reasons: vec!["env: MODE".into()],
                removed: 0,
                removed_versions: vec![],
                reverted: 1,
            },
            Change {
                service: "cache".into(),
                hosts: 0,
                from: vec![],
                to: vec![],
                failed: 1,
                kinds: vec![],
                reasons: vec![],
                removed: 1,
                removed_versions: vec!["0.9".into()],
                reverted: 0,
            }
        ]
    );
    let entry = Entry {
        changes,
        ..entry("r1", RunResult::Reverted, None)
    };
    let text = show::text("shop", &[entry]);
    assert!(
        text.contains("api: fresh, 1.0 → 1.0, 2.0 on 3 hosts: 1 upgrade, 1 install, 1 reconfigure (env: MODE) (1 failed, 1 reverted)"),
        "{text}"
    );
    assert!(
        text.contains("cache: 0.9 removed from 1 host (1 failed)"),
        "{text}"
    );
    assert!(text.contains("reverted"), "{text}");
}

#[test]
fn an_entry_written_before_kinds_removals_and_reverts_were_kept_still_reads() {
    let old = r#"{"service":"api","hosts":2,"from":["1.0"],"to":["2.0"],"failed":0}"#;
    let change: Change = serde_json::from_str(old).unwrap();
    assert_eq!((change.hosts, change.removed, change.reverted), (2, 0, 0));
    assert!(change.kinds.is_empty() && change.reasons.is_empty());
}
