//! The site parser as the fuzzer drives it: one function shared by the fuzz target
//! (`fuzz/fuzz_targets/site.rs`) and the test that replays its corpus and every crash found
//! (`tests/it/fuzz_regressions.rs`). Not part of the stable interface.

use std::path::PathBuf;

/// The platform every fuzzed site may name (`platform "platform.kdl"`): classes `db`, `app`
/// and `lb`, on the local transport.
pub const PLATFORM: &str = r#"platform "fuzz" {
    transport "local" root="hosts"
    state-dir "/var/lib/drover"
    inventory "static" {
        host "db1" address="10.0.0.1" class="db" zone="a"
        host "app1" address="10.0.0.2" class="app" zone="a"
        host "app2" address="10.0.0.3" class="app" zone="b"
        host "lb1" address="10.0.0.4" class="lb" zone="b"
    }
}
"#;

/// A policy every fuzzed site may name (`policy "policy.kdl"`).
pub const POLICY: &str = r#"policy "fuzz" { batch "50%"; max-failed 1; wave-max-failed "50%"; canary 1 }
"#;

/// Writes `input` as `site.kdl` beside [`PLATFORM`] and [`POLICY`] (in a directory of this
/// thread's, made once) and loads it. Must never panic, whatever `input` is; returns how many
/// problems were found (0: a valid site).
pub fn site(input: &[u8]) -> usize {
    thread_local! {
        static DIR: PathBuf = {
            let dir = std::env::temp_dir().join(format!(
                "drover-fuzz-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join("platform.kdl"), PLATFORM);
            let _ = std::fs::write(dir.join("policy.kdl"), POLICY);
            dir
        };
    }
    // An `include` glob walks the file system (`include "/*/*/*/*"` could take minutes): the
    // walk is not the parser, so such inputs are left out; plain includes are fuzzed.
    let has = |needle: &[u8]| input.windows(needle.len()).any(|w| w == needle);
    if has(b"include") && (has(b"*") || has(b"?") || has(b"[")) {
        return 0;
    }
    DIR.with(|dir| {
        let path = dir.join("site.kdl");
        if std::fs::write(&path, input).is_err() {
            return 0;
        }
        match crate::site::load(&path) {
            Ok(_) => 0,
            Err(e) => {
                // Rendering every diagnostic is part of what must not panic.
                let text = crate::report::render_diagnostic(&e, crate::report::Style::PLAIN);
                e.errors.len().max(usize::from(!text.is_empty()))
            }
        }
    })
}
