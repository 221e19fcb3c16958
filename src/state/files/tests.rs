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

/// Receives `content` for `to` with `mode`; what it is to be placed as.
pub(super) fn receive(dir: &Path, to: &Path, content: &[u8], mode: u32) -> Placed {
    let to = to.display().to_string();
    let out = sh(
        &receive_script(&to, content.len() as u64, mode),
        dir,
        content,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Placed {
        to,
        mode,
        digest: digest(content),
    }
}

/// Runs `script`, which must succeed.
pub(super) fn ok(script: &str, dir: &Path) {
    let out = sh(script, dir, b"");
    assert!(
        out.status.success(),
        "{}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Which of `files` the host says are still as placed.
fn survey(dir: &Path, state: &str, service: &str, files: &[Placed]) -> Vec<Option<String>> {
    let paths: Vec<&str> = files.iter().map(|f| f.to.as_str()).collect();
    let out = sh(&survey_script(state, service, &paths), dir, b"");
    assert!(out.status.success());
    kept(files, &String::from_utf8_lossy(&out.stdout))
}

/// The names in `dir`, sorted.
pub(super) fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("a directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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
fn a_placed_file_is_kept_until_anything_changes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("var lib/dr'over").display().to_string();
    let to = dir.path().join("srv/app.conf");
    let f = receive(dir.path(), &to, b"a\n", 0o644);
    assert_eq!(
        survey(dir.path(), &state, "app", std::slice::from_ref(&f)),
        [None]
    );
    ok(
        &place_script(&state, "app", std::slice::from_ref(&f), &[]),
        dir.path(),
    );
    let line = survey(dir.path(), &state, "app", std::slice::from_ref(&f));
    assert!(line[0].is_some(), "as placed: kept");
    // Another content or mode wanted at the same path is not kept.
    let other = Placed {
        digest: digest(b"b\n"),
        ..f.clone()
    };
    assert_eq!(survey(dir.path(), &state, "app", &[other]), [None]);
    let chmod = Placed {
        mode: 0o600,
        ..f.clone()
    };
    assert_eq!(survey(dir.path(), &state, "app", &[chmod]), [None]);
    // Another service's list says nothing of it.
    assert_eq!(
        survey(dir.path(), &state, "web", std::slice::from_ref(&f)),
        [None]
    );
    // A write of the same bytes, a chmod there and back, a removal: each changes the stamp
    // (the kernel's clock of file times ticks every few milliseconds: a change within the
    // same tick as the placement, of the same size, would go unseen; hence the waits).
    let tick = || std::thread::sleep(std::time::Duration::from_millis(20));
    tick();
    std::fs::write(&to, b"a\n").expect("rewrite");
    assert_eq!(
        survey(dir.path(), &state, "app", std::slice::from_ref(&f)),
        [None]
    );
    ok(
        &place_script(
            &state,
            "app",
            &[receive(dir.path(), &to, b"a\n", 0o644)],
            &[],
        ),
        dir.path(),
    );
    assert!(survey(dir.path(), &state, "app", std::slice::from_ref(&f))[0].is_some());
    ok(
        &format!("chmod 600 '{0}' && chmod 644 '{0}'", to.display()),
        dir.path(),
    );
    assert_eq!(
        survey(dir.path(), &state, "app", std::slice::from_ref(&f)),
        [None]
    );
    std::fs::remove_file(&to).expect("remove");
    assert_eq!(survey(dir.path(), &state, "app", &[f]), [None]);
}

#[test]
fn a_received_content_is_renamed_into_place_never_copied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let to = dir.path().join("srv/big.bin");
    let f = receive(dir.path(), &to, b"content", 0o640);
    let new = Path::new(&received_at(&f.to)).to_path_buf();
    assert_eq!(std::fs::read(&new).expect("received"), b"content");
    assert_eq!(mode(&new), 0o640, "given its mode as it arrived");
    assert!(!to.exists(), "not in place before the placement");
    let inode =
        |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"));
    let received = inode(&new);
    ok(&place_script(&state, "art", &[f], &[]), dir.path());
    assert_eq!(inode(&to), received, "the bytes written once, then renamed");
    assert!(!new.exists());
}

#[test]
fn a_cut_off_transfer_is_not_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let to = dir.path().join("srv/conf").display().to_string();
    let out = sh(&receive_script(&to, 13, 0o644), dir.path(), b"whole");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("received 5 of 13 bytes"));
    assert!(!Path::new(&received_at(&to)).exists());
    let private = dir.path().join("srv/.drover");
    assert!(names_in(&private).is_empty(), "{:?}", names_in(&private));
}

#[test]
fn each_attempt_receives_into_a_part_of_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let to = dir.path().join("srv/it's app.conf");
    let private = dir.path().join("srv/.drover");
    std::fs::create_dir_all(&private).expect("private");
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    // Left by an attempt cut off earlier: cleared. A name ending otherwise than in digits is
    // no attempt's part (another target's file): kept.
    std::fs::write(private.join("it's app.conf.new.4242"), b"partial").expect("leftover");
    std::fs::write(private.join("it's app.conf.new.x"), b"neighbour").expect("neighbour");
    // An earlier attempt still running for the same file holds the old `.new`: replaced whole,
    // never written into.
    std::fs::write(private.join("it's app.conf.new"), b"stale attempt").expect("stale");
    let content = b"the whole content\n";
    receive(dir.path(), &to, content, 0o640);
    assert_eq!(
        names_in(&private),
        ["it's app.conf.new", "it's app.conf.new.x"],
        "no part left behind, the neighbour kept"
    );
    assert_eq!(
        std::fs::read(received_at(&to.display().to_string())).expect("received"),
        content
    );
    assert_eq!(
        std::fs::read(private.join("it's app.conf.new.x")).expect("neighbour"),
        b"neighbour"
    );
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
    let files = [
        receive(dir.path(), &managed, b"new conf\n", 0o600),
        receive(dir.path(), &odd, b"odd\n", 0o755),
    ];
    ok(&place_script(&state, "web.v2", &files, &[]), dir.path());
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "new conf\n"
    );
    assert_eq!(mode(&managed), 0o600);
    assert_eq!(std::fs::read_to_string(&odd).expect("read"), "odd\n");
    assert_eq!(mode(&odd), 0o755);
    assert!(!dir.path().join("x").exists(), "nothing in a path ran");
    assert!(survey(dir.path(), &state, "web.v2", &files)
        .iter()
        .all(Option::is_some));
    ok(&restore_script(&state, "web.v2"), dir.path());
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "hand written\n"
    );
    assert_eq!(mode(&managed), 0o640, "the old mode is back too");
    assert!(!odd.exists(), "a file that was absent is removed again");
    assert_eq!(
        survey(dir.path(), &state, "web.v2", &files),
        [None, None],
        "what was put back is not what was placed"
    );
    // The list is gone: a second restore changes nothing.
    ok(&restore_script(&state, "web.v2"), dir.path());
    assert_eq!(
        std::fs::read_to_string(&managed).expect("read"),
        "hand written\n"
    );
}

#[test]
fn a_second_place_then_restore_goes_back_one_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let to = dir.path().join("srv/app.conf");
    let other = dir.path().join("srv/other.conf");
    let one = receive(dir.path(), &to, b"one\n", 0o644);
    let kept_file = receive(dir.path(), &other, b"other\n", 0o644);
    ok(
        &place_script(&state, "api", &[one, kept_file.clone()], &[]),
        dir.path(),
    );
    let two = receive(dir.path(), &to, b"two\n", 0o644);
    let now = survey(dir.path(), &state, "api", &[two.clone(), kept_file.clone()]);
    assert!(now[0].is_none() && now[1].is_some(), "{now:?}");
    let left: Vec<String> = now.into_iter().flatten().collect();
    ok(
        &place_script(&state, "api", std::slice::from_ref(&two), &left),
        dir.path(),
    );
    assert_eq!(std::fs::read_to_string(&to).expect("read"), "two\n");
    let list = std::fs::read_to_string(Path::new(&state).join("files/prev/api")).expect("list");
    assert_eq!(list, format!("+ {}\n", to.display()), "only what changed");
    assert!(
        survey(dir.path(), &state, "api", &[two.clone(), kept_file.clone()])
            .iter()
            .all(Option::is_some)
    );
    ok(&restore_script(&state, "api"), dir.path());
    assert_eq!(std::fs::read_to_string(&to).expect("read"), "one\n");
    assert_eq!(std::fs::read_to_string(&other).expect("read"), "other\n");
    let after = survey(dir.path(), &state, "api", &[two, kept_file]);
    assert!(
        after[0].is_none() && after[1].is_some(),
        "the file left alone is still as placed: {after:?}"
    );
}

#[test]
fn files_of_one_content_receive_it_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let a = receive(dir.path(), &dir.path().join("a/conf"), b"same\n", 0o644);
    let b = Placed {
        to: dir.path().join("b/conf").display().to_string(),
        mode: 0o600,
        digest: a.digest.clone(),
    };
    ok(
        &place_script(&state, "app", &[a.clone(), b.clone()], &[]),
        dir.path(),
    );
    assert_eq!(std::fs::read(&a.to).expect("a"), b"same\n");
    assert_eq!(std::fs::read(&b.to).expect("b"), b"same\n");
    assert_eq!(mode(Path::new(&b.to)), 0o600);
    assert!(!Path::new(&received_at(&b.to)).exists());
}

#[test]
fn a_place_that_cannot_write_fails_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let first = receive(dir.path(), &dir.path().join("ok/conf"), b"x", 0o644);
    std::fs::write(dir.path().join("blocker"), "a file, not a directory").expect("write");
    let target = dir.path().join("blocker/conf").display().to_string();
    let copy = Placed {
        to: target.clone(),
        mode: 0o644,
        digest: first.digest.clone(),
    };
    let out = sh(
        &place_script(&state, "api", &[first, copy], &[]),
        dir.path(),
        b"",
    );
    // Its directory cannot be made: found before any target changed.
    assert_eq!(out.status.code(), Some(NOTHING_PLACED));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("cannot keep what is at {target}")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("ok/conf").exists());
}

#[test]
fn a_placement_that_fails_before_any_target_changed_says_so_and_leaves_nothing_to_put_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let to = dir.path().join("etc/app.conf");
    let first = receive(dir.path(), &to, b"first\n", 0o644);
    ok(&place_script(&state, "app", &[first], &[]), dir.path());
    let list = Path::new(&state).join("files/prev/app");
    assert!(
        list.exists(),
        "the list of what the first placement replaced"
    );
    // A content that is not there (never received, or removed) cannot be placed: the command
    // stops before changing anything.
    let never = Placed {
        to: to.display().to_string(),
        mode: 0o644,
        digest: digest(b"never received\n"),
    };
    let out = sh(&place_script(&state, "app", &[never], &[]), dir.path(), b"");
    assert_eq!(out.status.code(), Some(NOTHING_PLACED));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is gone"));
    assert_eq!(std::fs::read(&to).expect("target"), b"first\n");
    // The first placement's list went first: a restore now changes nothing (with that list it
    // would have removed the file the first step placed).
    assert!(!list.exists());
    ok(&restore_script(&state, "app"), dir.path());
    assert_eq!(std::fs::read(&to).expect("target"), b"first\n");
}

#[test]
fn what_is_written_beside_a_target_goes_only_to_a_directory_of_drovers_alone() {
    use std::os::unix::fs::{chown, symlink};
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(&victim).expect("victim");
    // Someone made `.drover` a link to another directory: refused, nothing written there.
    let linked = dir.path().join("linked/app.conf");
    std::fs::create_dir_all(dir.path().join("linked")).expect("dir");
    symlink(&victim, dir.path().join("linked/.drover")).expect("plant a link");
    let to = linked.display().to_string();
    let out = sh(&receive_script(&to, 2, 0o644), dir.path(), b"x\n");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a directory of this user's alone"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(&victim).expect("victim").count(), 0);
    // Another user's `.drover`: refused too (this runs as root or as that directory's owner).
    let theirs = dir.path().join("theirs/app.conf");
    std::fs::create_dir_all(dir.path().join("theirs/.drover")).expect("dir");
    if chown(dir.path().join("theirs/.drover"), Some(65534), Some(65534)).is_ok() {
        let out = sh(
            &receive_script(&theirs.display().to_string(), 2, 0o644),
            dir.path(),
            b"x\n",
        );
        assert!(!out.status.success());
        assert_eq!(
            std::fs::read_dir(dir.path().join("theirs/.drover"))
                .expect("theirs")
                .count(),
            0
        );
    }
    // A placement whose target's `.drover` is refused changes nothing.
    let ok_to = dir.path().join("ok/app.conf");
    let f = receive(dir.path(), &ok_to, b"new\n", 0o644);
    let other = Placed {
        to: to.clone(),
        mode: 0o644,
        digest: f.digest.clone(),
    };
    let out = sh(
        &place_script(&state, "app", &[f, other], &[]),
        dir.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(NOTHING_PLACED));
    assert!(!ok_to.exists());
    assert_eq!(std::fs::read_dir(&victim).expect("victim").count(), 0);
}

#[test]
fn a_restore_after_a_placement_that_stopped_halfway_puts_every_file_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let a = dir.path().join("etc/a.conf");
    let b = dir.path().join("etc/b.conf");
    std::fs::create_dir_all(dir.path().join("etc")).expect("etc");
    std::fs::write(&a, b"old a\n").expect("a");
    std::fs::write(&b, b"old b\n").expect("b");
    let new_a = receive(dir.path(), &a, b"new a\n", 0o644);
    let new_b = receive(dir.path(), &b, b"new b\n", 0o644);
    // `b`'s rename fails (its received content is made a directory after the list is written):
    // `a` was renamed, `b` was not and still shares its inode with what was kept for it.
    std::fs::remove_file(received_at(&new_b.to)).expect("remove");
    std::fs::create_dir_all(format!("{}/x", received_at(&new_b.to))).expect("block");
    let script = place_script(&state, "app", &[new_a, new_b.clone()], &[]).replacen(
        &format!("[ -f {} ] ||", quote(&received_at(&new_b.to))),
        "true ||",
        1,
    );
    let out = sh(&script, dir.path(), b"");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("cannot put {} in place", new_b.to))
    );
    assert_eq!(std::fs::read(&a).expect("a"), b"new a\n");
    assert_eq!(std::fs::read(&b).expect("b"), b"old b\n");
    std::fs::remove_dir_all(received_at(&new_b.to)).expect("unblock");
    ok(&restore_script(&state, "app"), dir.path());
    assert_eq!(std::fs::read(&a).expect("a"), b"old a\n");
    assert_eq!(std::fs::read(&b).expect("b"), b"old b\n");
    let private = names_in(&dir.path().join("etc/.drover"));
    assert!(
        private.is_empty(),
        "nothing kept or received is left: {private:?}"
    );
    assert!(!Path::new(&state).join("files/prev/app").exists());
}

#[test]
fn a_target_that_is_a_directory_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let plain = receive(dir.path(), &dir.path().join("srv/a.conf"), b"a\n", 0o644);
    let target = dir.path().join("srv/conf.d");
    std::fs::create_dir_all(&target).expect("a directory");
    let into = Placed {
        to: target.display().to_string(),
        mode: 0o644,
        digest: plain.digest.clone(),
    };
    let out = sh(
        &place_script(&state, "app", &[plain.clone(), into], &[]),
        dir.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(NOTHING_PLACED));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
    assert!(!Path::new(&plain.to).exists());
    assert_eq!(std::fs::read_dir(&target).expect("dir").count(), 0);
}

#[test]
fn a_passed_step_lets_go_of_what_its_placement_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("var lib/dr'over").display().to_string();
    let to = dir.path().join("srv/my app/app.conf");
    let fresh = dir.path().join("srv/my app/new.conf");
    std::fs::create_dir_all(to.parent().expect("parent")).expect("dir");
    std::fs::write(&to, b"old\n").expect("old");
    let new = receive(dir.path(), &to, b"new\n", 0o644);
    let added = receive(dir.path(), &fresh, b"added\n", 0o600);
    ok(&place_script(&state, "app", &[new, added], &[]), dir.path());
    let private = dir.path().join("srv/my app/.drover");
    assert!(
        private.join("app.conf.prev").exists(),
        "kept until the step passes"
    );
    // A removal cut off earlier (a reboot) left this behind: finished now too. The file kept
    // for another target, named `app.conf.gone.x`, is that target's, and stays.
    std::fs::write(private.join("app.conf.gone.12"), b"older\n").expect("leftover");
    std::fs::write(private.join("app.conf.gone.x.prev"), b"other's\n").expect("other");
    let out = sh(&let_go_script(&state, "app"), dir.path(), b"");
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    // Renamed out of the way at once, so the next placement never meets it; removed in the
    // background.
    assert!(!private.join("app.conf.prev").exists());
    assert!(!Path::new(&state).join("files/prev/app").exists());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let left = || -> Vec<String> {
        let mut names = names_in(&private);
        names.retain(|n| n != "app.conf.gone.x.prev");
        names
    };
    while !left().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(left().is_empty(), "nothing kept: {:?}", left());
    assert_eq!(
        std::fs::read(private.join("app.conf.gone.x.prev")).expect("other's"),
        b"other's\n"
    );
    assert_eq!(std::fs::read(&to).expect("to"), b"new\n");
    assert_eq!(std::fs::read(&fresh).expect("fresh"), b"added\n");
    // Nothing to put back any more: a restore leaves the placed files, and so does a second
    // letting go.
    ok(&restore_script(&state, "app"), dir.path());
    ok(&let_go_script(&state, "app"), dir.path());
    assert_eq!(std::fs::read(&to).expect("to"), b"new\n");
    assert_eq!(std::fs::read(&fresh).expect("fresh"), b"added\n");
}

#[test]
fn a_placement_lets_go_of_what_an_earlier_one_left_listed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let a = dir.path().join("srv/a.conf");
    let b = dir.path().join("srv/b.conf");
    std::fs::create_dir_all(dir.path().join("srv")).expect("srv");
    std::fs::write(&a, b"a0\n").expect("a");
    std::fs::write(&b, b"b0\n").expect("b");
    let first = [
        receive(dir.path(), &a, b"a1\n", 0o644),
        receive(dir.path(), &b, b"b1\n", 0o644),
    ];
    ok(&place_script(&state, "app", &first, &[]), dir.path());
    let private = dir.path().join("srv/.drover");
    assert_eq!(names_in(&private), ["a.conf.prev", "b.conf.prev"]);
    // That step was cut off (never let go). The next places `a` alone: `b`'s previous file,
    // which no list would name any more, is let go of with the old list.
    let second = [receive(dir.path(), &a, b"a2\n", 0o644)];
    ok(&place_script(&state, "app", &second, &[]), dir.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while names_in(&private) != ["a.conf.prev"] && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(names_in(&private), ["a.conf.prev"]);
    assert_eq!(
        std::fs::read(private.join("a.conf.prev")).expect("prev"),
        b"a1\n"
    );
    // A failure now puts back this placement's previous file only.
    ok(&restore_script(&state, "app"), dir.path());
    assert_eq!(std::fs::read(&a).expect("a"), b"a1\n");
    assert_eq!(std::fs::read(&b).expect("b"), b"b1\n");
}
