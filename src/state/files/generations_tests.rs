//! The generations a passed step keeps beside each file it replaced (`keep-generations`), with
//! the real `/bin/sh` in a temporary directory.

use super::tests::{names_in, ok, receive};
use super::*;
use std::path::Path;

/// The `.gen.<j>` files kept beside `to`, as `(j, content)`, in order.
fn generations(to: &Path) -> Vec<(usize, String)> {
    let private = to.parent().expect("parent").join(".drover");
    let name = to.file_name().expect("name").to_string_lossy().into_owned();
    let mut out: Vec<(usize, String)> = names_in(&private)
        .into_iter()
        .filter_map(|n| {
            let j = n.strip_prefix(&format!("{name}.gen."))?.parse().ok()?;
            let text = std::fs::read_to_string(private.join(&n)).ok()?;
            Some((j, text))
        })
        .collect();
    out.sort();
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Placements that pass one after the other, each letting go under some
    /// `keep-generations`: beside the file are exactly the contents it had before, newest as
    /// `.gen.1`, as many as that setting keeps (fewer while there were fewer), never more;
    /// the file itself is the last content placed.
    #[test]
    fn a_passed_step_keeps_the_last_generations_and_prunes_the_rest(
        keeps in proptest::collection::vec(1usize..5, 1..7),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state").display().to_string();
        let to = dir.path().join("srv/app.conf");
        std::fs::create_dir_all(to.parent().expect("parent")).expect("srv");
        std::fs::write(&to, b"v0\n").expect("v0");
        // The contents kept, newest first: each let-go puts the one replaced first and keeps
        // as many as its setting says besides the file in place.
        let mut model: Vec<String> = Vec::new();
        for (i, keep) in keeps.iter().enumerate() {
            let v = i + 1;
            let f = receive(dir.path(), &to, format!("v{v}\n").as_bytes(), 0o644);
            ok(&place_script(&state, "app", &[f], &[]), dir.path());
            ok(&let_go_keeping(&state, "app", *keep, &[]), dir.path());
            proptest::prop_assert_eq!(std::fs::read_to_string(&to).expect("to"), format!("v{v}\n"));
            model.insert(0, format!("v{}\n", v - 1));
            model.truncate(keep - 1);
            let expected: Vec<(usize, String)> =
                model.iter().cloned().enumerate().map(|(j, c)| (j + 1, c)).collect();
            proptest::prop_assert_eq!(generations(&to), expected);
        }
    }
}

#[test]
fn a_file_that_renders_a_secret_keeps_no_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let plain = dir.path().join("srv/app.conf");
    let secret = dir.path().join("srv/it's secret.conf");
    std::fs::create_dir_all(plain.parent().expect("parent")).expect("srv");
    let shown = secret.display().to_string();
    // Placed fresh, then replaced while not rendering a secret, then once it does.
    for (v, renders_secret) in [(1, false), (2, false), (3, true)] {
        let files = [
            receive(dir.path(), &plain, format!("plain {v}\n").as_bytes(), 0o644),
            receive(
                dir.path(),
                &secret,
                format!("token {v}\n").as_bytes(),
                0o600,
            ),
        ];
        ok(&place_script(&state, "app", &files, &[]), dir.path());
        let secrets: Vec<&str> = match renders_secret {
            true => vec![shown.as_str()],
            false => Vec::new(),
        };
        ok(&let_go_keeping(&state, "app", 3, &secrets), dir.path());
        if v == 2 {
            assert_eq!(generations(&secret), [(1, "token 1\n".to_string())]);
        }
    }
    assert_eq!(
        generations(&plain),
        [(1, "plain 2\n".to_string()), (2, "plain 1\n".to_string())]
    );
    assert_eq!(
        generations(&secret),
        [],
        "neither the replaced value nor the kept one"
    );
    assert_eq!(
        std::fs::read_to_string(&secret).expect("secret"),
        "token 3\n"
    );
}
