//! The journal's reader and writer: torn and damaged lines, and writes after a failed one.

use super::*;

fn line(entry: Entry) -> String {
    let line = Line {
        time: "2026-11-28T07:00:00.000Z".into(),
        entry,
    };
    serde_json::to_string(&line).expect("serializes")
}

fn skipped(host: &str, skip: &str) -> String {
    line(Entry::StepSkipped {
        service: "api".into(),
        host: host.into(),
        skip: skip.into(),
        reason: None,
    })
}

#[test]
fn steps_that_found_their_host_at_the_version_count_as_done() {
    let text = [
        line(Entry::ServicePlanned {
            service: "api".into(),
            steps: 4,
        }),
        line(Entry::StepIntent(StepIntent {
            service: "api".into(),
            host: "a1".into(),
            from: Some("1".into()),
            to: "2".into(),
        })),
        line(Entry::StepResult(StepEnd {
            service: "api".into(),
            host: "a1".into(),
            ok: true,
            failed_hook: None,
            rolled_back: false,
            reason: None,
        })),
        skipped("a2", "at-version"),
        skipped("a3", "unreachable"),
    ]
    .join("\n");
    let rec = read("r1", "j", &text);
    assert_eq!((rec.steps, rec.succeeded, rec.skipped), (4, 1, 1));
    assert_eq!(rec.unreachable, 1);
    let said = rec.describe();
    assert!(
        said.contains(": 2 of 4 steps done, 0 failed, 1 left alone (unreachable), none"),
        "{said}"
    );
}

fn result(host: &str) -> Entry {
    Entry::StepResult(StepEnd {
        service: "api".into(),
        host: host.into(),
        ok: true,
        failed_hook: None,
        rolled_back: false,
        reason: None,
    })
}

/// Only a last line cut short (no newline after it) is passed over; a damaged line
/// anywhere else is reported, by line number, and said by `describe`.
#[test]
fn only_a_torn_last_line_is_dropped_any_other_bad_line_is_reported() {
    let good = line(result("a1"));
    let torn = &good[..good.len() / 2];
    let rec = read("r1", "j", &format!("{good}\n{torn}"));
    assert_eq!(rec.succeeded, 1);
    assert!(rec.damaged.is_empty(), "{:?}", rec.damaged);
    let rec = read("r1", "j", &format!("{good}\n{torn}\n\n{good}\n"));
    assert_eq!(rec.succeeded, 2);
    assert_eq!(rec.damaged.len(), 1, "{:?}", rec.damaged);
    assert!(rec.damaged[0].starts_with("line 2: "), "{:?}", rec.damaged);
    let said = rec.describe();
    assert!(said.contains("has 1 damaged line(s)"), "{said}");
    // Cut short but followed by its newline: not the process dying mid-line.
    let rec = read("r1", "j", &format!("{good}\n{torn}\n"));
    assert_eq!(rec.damaged.len(), 1, "{:?}", rec.damaged);
}

/// An append that failed part-way (a full disk) leaves part of a line: the next append
/// starts on a line of its own, so its entry is read, not glued to the fragment.
#[test]
fn an_append_after_a_failed_one_starts_on_a_fresh_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::create(dir.path()).expect("journal");
    let t = "2026-11-28T07:00:00.000Z";
    journal.append(t, result("a1")).expect("first");
    journal.refuse_writes();
    assert!(journal.append(t, result("a2")).is_err());
    // What the failed write got onto the disk before failing.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(journal.path())
        .expect("open");
    f.write_all(br#"{"time":"2026-11-28T07:00:00.000Z","ent"#)
        .expect("fragment");
    journal.accept_writes();
    journal.append(t, result("a3")).expect("after");
    let text = std::fs::read_to_string(journal.path()).expect("read");
    let rec = read("r1", "j", &text);
    assert_eq!(rec.succeeded, 2, "{text}");
    assert_eq!(rec.damaged.len(), 1, "{:?}", rec.damaged);
}

/// Lines as the journal has always written them (each entry's fields beside `time` and
/// `entry`) read as they did: what is in flight, in which hook, and what ended how.
#[test]
fn lines_written_before_read_as_they_did() {
    let text = [
        r#"{"time":"t1","entry":"step-intent","service":"api","host":"a1","from":"1","to":"2"}"#,
        r#"{"time":"t2","entry":"step-intent","service":"api","host":"a2","from":null,"to":"2"}"#,
        r#"{"time":"t3","entry":"hook-started","service":"api","host":"a2","hook":"install"}"#,
        r#"{"time":"t4","entry":"hook-finished","service":"api","host":"a2","hook":"install","ok":true,"code":0,"ms":5}"#,
        r#"{"time":"t5","entry":"hook-started","service":"api","host":"a2","hook":"start"}"#,
        r#"{"time":"t6","entry":"step-result","service":"api","host":"a1","ok":false,"failed_hook":"check","rolled_back":true,"reason":"exit 1"}"#,
        r#"{"time":"t7","entry":"step-blocked","service":"web","host":"w1","reason":"api did not switch"}"#,
        r#"{"time":"t8","entry":"revert-intent","service":"db","host":"d1","from":"2","to":"1"}"#,
        r#"{"time":"t9","entry":"revert-result","service":"db","host":"d1","ok":true,"failed_hook":null,"reason":null}"#,
        r#"{"time":"t10","entry":"interrupted","abort":false,"running":1,"reason":"SIGINT"}"#,
    ]
    .join("\n");
    let rec = read("r1", "j", &format!("{text}\n"));
    assert!(rec.damaged.is_empty(), "{:?}", rec.damaged);
    assert_eq!((rec.succeeded, rec.failed, rec.blocked), (0, 1, 1));
    assert_eq!(rec.last.as_deref(), Some("t10"));
    assert_eq!(
        rec.in_flight,
        [InFlight {
            service: "api".into(),
            host: "a2".into(),
            from: None,
            to: "2".into(),
            hook: Some("start".into()),
        }]
    );
    let line: Line = serde_json::from_str(text.lines().next().unwrap_or_default()).unwrap();
    assert_eq!(
        line.entry,
        Entry::StepIntent(StepIntent {
            service: "api".into(),
            host: "a1".into(),
            from: Some("1".into()),
            to: "2".into(),
        })
    );
    // Written again, a line is what it was.
    assert_eq!(
        serde_json::to_string(&line).unwrap(),
        text.lines().next().unwrap_or_default()
    );
}
