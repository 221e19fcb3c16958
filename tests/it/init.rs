//! `deploy init`, `deploy completions` and `deploy man`: the starter converges at once on the
//! local transport and verifies, an upgrade of it runs `migrate`; `init` never overwrites a
//! file and writes nothing when one is in the way; completions and man pages come from the CLI.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::cli::{deploy, deploy_in, Run};

const STARTER: [&str; 3] = [
    "site.kdl",
    "platforms/local.kdl",
    "policies/one-at-a-time.kdl",
];

/// `deploy ARGS…` run in `dir` (its run logs land in `dir/.drover`).
fn run_in(dir: &Path, args: &[&str]) -> Run {
    let out = deploy_in(dir).args(args).output().expect("run deploy");
    Run {
        code: out.status.code().expect("deploy exited by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

fn ok(run: &Run, what: &str) {
    assert_eq!(
        run.code, 0,
        "{what} failed\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

/// Every file under `dir`, with its contents.
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let contents = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), contents);
            }
        }
    }
    files
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_starter_converges_at_once_then_verifies_and_upgrades() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let init = run_in(dir, &["init", "starter"]);
    ok(&init, "deploy init starter");
    assert!(
        init.stdout.contains("deploy apply starter/site.kdl"),
        "{}",
        init.stdout
    );
    for f in STARTER {
        assert!(dir.join("starter").join(f).is_file(), "{f} not written");
    }

    let check = run_in(dir, &["check", "starter/site.kdl"]);
    ok(&check, "deploy check");
    assert_eq!(
        check.stdout,
        "starter/site.kdl: ok — site starter, 2 classes, 2 services, 4 hosts\n"
    );

    let apply = run_in(dir, &["apply", "--yes", "starter/site.kdl"]);
    ok(&apply, "deploy apply");
    assert!(
        apply
            .stderr
            .contains("run converged: 4 ok (4 installed), 0 failed, 0 not started"),
        "{}",
        apply.stderr
    );
    // What the hooks left on each host (a directory under starter/hosts/).
    let hosts = dir.join("starter/hosts");
    for db in ["db1", "db2"] {
        assert_eq!(read(hosts.join(db).join("srv/store/running")), "2.0.0\n");
    }
    for app in ["app1", "app2"] {
        assert_eq!(read(hosts.join(app).join("srv/api/running")), "1.0.0\n");
        assert_eq!(
            read(hosts.join(app).join("srv/api/stores")),
            "127.0.90.1:5432\n127.0.90.2:5432\n",
            "DEPLOY_NEEDS_STORE on {app}"
        );
    }

    // Converged: nothing left to do, and every check passes now.
    let plan = run_in(dir, &["plan", "starter/site.kdl"]);
    ok(&plan, "deploy plan");
    assert!(
        plan.stdout.contains("0 steps in 0 waves, 4 skipped."),
        "{}",
        plan.stdout
    );
    let again = run_in(dir, &["apply", "--yes", "starter/site.kdl"]);
    ok(&again, "a second deploy apply");
    assert!(
        again.stdout.contains("Nothing to change."),
        "{}",
        again.stdout
    );
    let verify = run_in(dir, &["verify", "starter/site.kdl"]);
    ok(&verify, "deploy verify");
    assert_eq!(
        verify.stdout,
        "verified: 4 host services at their desired version, 4 checks passed\n"
    );
    // Neither apply (its lock's release) nor verify (no lock) leaves a hook pid file behind.
    for host in ["db1", "db2", "app1", "app2"] {
        let hooks = dir
            .join("starter/hosts")
            .join(host)
            .join("var/lib/drover/hooks");
        let left: Vec<_> = std::fs::read_dir(&hooks)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "{host}: {left:?} left in {}",
            hooks.display()
        );
    }

    // As its comments say: change a version, and the next apply upgrades just that service.
    let site = dir.join("starter/site.kdl");
    let text = read(&site);
    assert!(text.contains(r#"version "2.0.0""#));
    std::fs::write(
        &site,
        text.replacen(r#"version "2.0.0""#, r#"version "2.1.0""#, 1),
    )
    .unwrap();
    let upgrade = run_in(dir, &["apply", "--yes", "starter/site.kdl"]);
    ok(&upgrade, "the upgrade");
    assert!(
        upgrade
            .stderr
            .contains("run converged: 2 ok (2 upgraded), 0 failed"),
        "{}",
        upgrade.stderr
    );
    for db in ["db1", "db2"] {
        assert_eq!(read(hosts.join(db).join("srv/store/running")), "2.1.0\n");
        assert_eq!(
            read(hosts.join(db).join("srv/store/migrations")),
            format!("store on {db}: 2.0.0 -> 2.1.0\n")
        );
    }
    ok(
        &run_in(dir, &["verify", "starter/site.kdl"]),
        "deploy verify after the upgrade",
    );
}

#[test]
fn init_refuses_to_overwrite_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let first = run_in(dir, &["init"]);
    ok(&first, "deploy init");
    insta::assert_snapshot!("init-stdout", first.stdout);
    // The user's edits must survive a second `deploy init`.
    std::fs::write(dir.join("site.kdl"), "// mine\n").unwrap();
    let before = files_under(dir);

    let second = run_in(dir, &["init", "."]);
    assert_eq!(second.code, 4, "{}", second.stderr);
    assert_eq!(second.stdout, "");
    insta::assert_snapshot!("init-refused", second.stderr);
    assert_eq!(files_under(dir), before, "the second init changed files");
}

#[test]
fn init_writes_nothing_when_one_file_is_in_the_way() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new");
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/one-at-a-time.kdl"), "// mine\n").unwrap();

    let run = run_in(tmp.path(), &["init", "new"]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert!(
        run.stderr.contains("new/policies/one-at-a-time.kdl"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("new/site.kdl"), "{}", run.stderr);
    let files = files_under(&dir);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [Path::new("policies/one-at-a-time.kdl")]
    );
    assert_eq!(files.values().next().unwrap(), b"// mine\n");
}

#[test]
fn init_into_a_path_that_cannot_be_a_directory_is_an_environment_error() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("file"), "").unwrap();
    let run = run_in(tmp.path(), &["init", "file/starter"]);
    assert_eq!(run.code, 5, "{}", run.stderr);
    assert!(run.stderr.contains("cannot write"), "{}", run.stderr);
    assert_eq!(files_under(tmp.path()).len(), 1);
}

/// Every subcommand of `deploy`.
const COMMANDS: [&str; 11] = [
    "check",
    "plan",
    "apply",
    "status",
    "verify",
    "graph",
    "publish",
    "agent",
    "init",
    "completions",
    "man",
];

#[test]
fn completions_for_each_shell_name_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let run = deploy(&["completions", shell]);
        ok(&run, shell);
        assert!(!run.stdout.trim().is_empty(), "{shell}: no output");
        for command in COMMANDS {
            assert!(run.stdout.contains(command), "{shell}: no `{command}`");
        }
        // Options too, from the same definition.
        assert!(run.stdout.contains("max-connections"), "{shell}");
    }
    let run = deploy(&["completions", "tcsh"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn the_man_page_lists_every_command() {
    let run = deploy(&["man"]);
    ok(&run, "deploy man");
    let title = format!(
        r#".TH deploy 1 " " "Drover {}" "Drover manual""#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(run.stdout.contains(&title), "{}", run.stdout);
    for command in COMMANDS {
        assert!(
            run.stdout.contains(&format!("deploy\\-{command}(1)")),
            "no {command} in\n{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("Exit codes:"));

    let tmp = tempfile::tempdir().unwrap();
    let pages = run_in(tmp.path(), &["man", "--out-dir", "man1"]);
    ok(&pages, "deploy man --out-dir");
    let written: Vec<String> = files_under(&tmp.path().join("man1"))
        .keys()
        .map(|p| p.display().to_string())
        .collect();
    for page in [
        "deploy.1",
        "deploy-apply.1",
        "deploy-init.1",
        "deploy-man.1",
    ] {
        assert!(
            written.iter().any(|w| w == page),
            "{page} not in {written:?}"
        );
        assert!(
            pages.stdout.contains(&format!("man1/{page}\n")),
            "{}",
            pages.stdout
        );
    }
    assert!(!written.iter().any(|w| w == "deploy-help.1"), "{written:?}");
    assert_eq!(
        read(tmp.path().join("man1/deploy.1")),
        run.stdout,
        "the page written is the page printed"
    );
    let init = read(tmp.path().join("man1/deploy-init.1"));
    assert!(init.contains(".TH deploy-init 1 "), "{init}");
    assert!(init.contains("no file there is ever overwritten"), "{init}");
}
