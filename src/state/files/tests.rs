//! The host store's scripts, run with the real `/bin/sh` in a temporary directory.

use super::*;
use std::path::Path;

fn sh(script: &str, dir: &Path, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sh runs");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    child.wait_with_output().expect("sh ends")
}

fn digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    crate::secrets::hex(&sha2::Sha256::digest(bytes))
}

/// Receives `content` into the store of `state` and commits it; its digest.
fn receive(dir: &Path, state: &str, content: &[u8]) -> String {
    let d = digest(content);
    let out = sh(
        &receive_script(state, &d, content.len() as u64),
        dir,
        content,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sh(&commit_script(state, &[&d]), dir, b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn the_store_says_what_it_lacks_and_keeps_what_it_receives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("var lib/dr'over").display().to_string();
    let a = digest(b"a");
    let b = digest(b"b");
    let out = sh(&missing_script(&state, &[&a, &b]), dir.path(), b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{a}\n{b}\n"));
    receive(dir.path(), &state, b"a");
    let out = sh(&missing_script(&state, &[&a, &b]), dir.path(), b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{b}\n"));
    let stored = Path::new(&state).join("files").join(&a);
    assert_eq!(std::fs::read(&stored).expect("stored"), b"a");
    assert_eq!(mode(&stored), 0o600);
    assert_eq!(mode(&Path::new(&state).join("files")), 0o700);
}

#[test]
fn a_received_content_is_not_stored_until_it_is_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let d = digest(b"content");
    let out = sh(&receive_script(&state, &d, 7), dir.path(), b"content");
    assert!(out.status.success());
    let out = sh(&missing_script(&state, &[&d]), dir.path(), b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{d}\n"));
    assert!(sh(&commit_script(&state, &[&d]), dir.path(), b"")
        .status
        .success());
    let out = sh(&missing_script(&state, &[&d]), dir.path(), b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert_eq!(
        std::fs::read(Path::new(&state).join("files").join(&d)).expect("stored"),
        b"content"
    );
}

#[test]
fn a_cut_off_transfer_is_not_stored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let d = digest(b"whole content");
    let out = sh(&receive_script(&state, &d, 13), dir.path(), b"whole");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("received 5 of 13 bytes"));
    assert!(!Path::new(&state).join("files").join(&d).exists());
    assert!(!Path::new(&state)
        .join("files")
        .join(format!(".{d}.tmp"))
        .exists());
}

#[test]
fn place_makes_parents_sets_modes_and_restore_puts_back_exactly_what_was_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let root = dir.path().join("etc");
    std::fs::create_dir_all(&root).expect("etc");
    // An unmanaged file already there, and a path with quotes and spaces that is not.
    let managed = root.join("app.conf");
    std::fs::write(&managed, "hand written\n").expect("write");
    std::fs::set_permissions(
        &managed,
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .expect("chmod");
    let odd = root.join("new dir/it's \"odd\" $(x).txt");
    let new_conf = receive(dir.path(), &state, b"new conf\n");
    let odd_content = receive(dir.path(), &state, b"odd\n");
    let files = [
        Placed {
            to: managed.display().to_string(),
            mode: 0o600,
            digest: new_conf.clone(),
        },
        Placed {
            to: odd.display().to_string(),
            mode: 0o755,
            digest: odd_content,
        },
    ];
    let out = sh(
        &place_script(&state, "web.v2", &files, &[]),
        dir.path(),
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "new conf\n"
    );
    assert_eq!(mode(&managed), 0o600);
    assert_eq!(std::fs::read_to_string(&odd).expect("read"), "odd\n");
    assert_eq!(mode(&odd), 0o755);
    assert!(!dir.path().join("x").exists(), "nothing in a path ran");
    let out = sh(&restore_script(&state, "web.v2"), dir.path(), b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "hand written\n"
    );
    assert_eq!(mode(&managed), 0o640, "the old mode is back too");
    assert!(!odd.exists(), "a file that was absent is removed again");
    // The list is gone: a second restore changes nothing.
    let out = sh(&restore_script(&state, "web.v2"), dir.path(), b"");
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "hand written\n"
    );
}

#[test]
fn a_second_place_then_restore_goes_back_one_step_using_the_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let target = dir.path().join("srv/app.conf").display().to_string();
    let one = receive(dir.path(), &state, b"one\n");
    let two = receive(dir.path(), &state, b"two\n");
    let first = [Placed {
        to: target.clone(),
        mode: 0o644,
        digest: one.clone(),
    }];
    assert!(
        sh(&place_script(&state, "api", &first, &[]), dir.path(), b"")
            .status
            .success()
    );
    let second = [Placed {
        to: target.clone(),
        mode: 0o644,
        digest: two,
    }];
    // The record says `one` is there: it is taken from the store, not hashed again.
    let script = place_script(&state, "api", &second, &first);
    assert!(sh(&script, dir.path(), b"").status.success());
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "two\n");
    let list = std::fs::read_to_string(Path::new(&state).join("files/prev/api")).expect("list");
    assert_eq!(list, format!("{one} 644 {target}\n"));
    assert!(sh(&restore_script(&state, "api"), dir.path(), b"")
        .status
        .success());
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "one\n");
}

#[test]
fn a_place_that_cannot_write_fails_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    std::fs::write(dir.path().join("blocker"), "a file, not a directory").expect("write");
    let d = receive(dir.path(), &state, b"x");
    let target = dir.path().join("blocker/conf").display().to_string();
    let files = [Placed {
        to: target.clone(),
        mode: 0o644,
        digest: d,
    }];
    let out = sh(&place_script(&state, "api", &files, &[]), dir.path(), b"");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("cannot put {target} in place")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_placement_that_fails_before_any_target_changed_says_so_and_keeps_the_previous_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let to = dir.path().join("etc/app.conf").display().to_string();
    let a = receive(dir.path(), &state, b"first\n");
    let first = [Placed {
        to: to.clone(),
        mode: 0o644,
        digest: a,
    }];
    let out = sh(&place_script(&state, "app", &first, &[]), dir.path(), b"");
    assert!(out.status.success());
    let list = Path::new(&state).join("files/prev/app");
    let before = std::fs::read(&list).expect("the list of what was replaced");
    // A content never received cannot be committed: the command stops before placing.
    let never = digest(b"never received\n");
    let second = [Placed {
        to: to.clone(),
        mode: 0o644,
        digest: never.clone(),
    }];
    let script = commit_script(&state, &[&never]) + &place_script(&state, "app", &second, &first);
    let out = sh(&script, dir.path(), b"");
    assert_eq!(out.status.code(), Some(NOTHING_PLACED));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&never));
    assert_eq!(std::fs::read(&list).expect("still there"), before);
    assert_eq!(std::fs::read(&to).expect("target"), b"first\n");
}
