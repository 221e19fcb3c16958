//! Replays the site parser's fuzzing inputs through the same function the fuzz target calls
//! (`drover::fuzzing::site`): the seeds (`fuzz/seeds`), every input that once crashed it
//! (`fuzz/regressions`, one file each, never removed), and a local corpus if one was grown
//! (`fuzz/corpus/site`, not committed). None may panic.
//!
//! To fuzz for real: `cargo install cargo-fuzz`, then
//! `cargo fuzz run --sanitizer none site fuzz/corpus/site fuzz/seeds -- -max_total_time=300`
//! (the book's Testing chapter).

use std::path::Path;

fn inputs(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.path().display().to_string(),
                std::fs::read(e.path()).expect("read input"),
            )
        })
        .collect();
    out.sort();
    out
}

fn replay(dir: &str) -> usize {
    let all = inputs(dir);
    for (name, data) in &all {
        let outcome = std::panic::catch_unwind(|| drover::fuzzing::site(data));
        assert!(outcome.is_ok(), "{name} panics the site parser");
    }
    all.len()
}

#[test]
fn seeds_load_without_panicking() {
    assert!(replay("fuzz/seeds") >= 5, "the seeds are there");
    // The safety seed is a valid site: the fuzzer starts from real sites, not only errors.
    let seed = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/safety.kdl"))
        .expect("safety seed");
    assert_eq!(drover::fuzzing::site(&seed), 0, "the safety seed is valid");
}

#[test]
fn every_input_that_once_crashed_loads_without_panicking() {
    replay("fuzz/regressions");
}

#[test]
fn a_local_corpus_loads_without_panicking() {
    replay("fuzz/corpus/site");
}

#[test]
fn odd_inputs_load_without_panicking() {
    let odd: &[&[u8]] = &[
        b"",
        b"\xff\xfe\x00",
        b"site",
        b"site \"s\" { platform \"platform.kdl\" }",
        b"site \"s\" { platform \"platform.kdl\"; version \"1\"; max-failed \"100.00%\"; hook-timeout \"0s\" }\nclass \"app\" { service \"a\" }\nservice \"a\" { secret \"A\" env=\"\" }",
        b"/-/-/-/-",
        b"site \"s\" { platform \"\" }",
        b"site \"s\" { platform \".\" }",
        b"site \"s\" { platform \"platform.kdl\" policy \"site.kdl\" }",
        b"(t)site #\"\"#",
        "site \"\u{202e}\" { version \"\u{10ffff}\" }".as_bytes(),
    ];
    for input in odd {
        let outcome = std::panic::catch_unwind(|| drover::fuzzing::site(input));
        assert!(
            outcome.is_ok(),
            "{:?} panics the site parser",
            String::from_utf8_lossy(input)
        );
    }
}
