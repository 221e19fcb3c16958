//! Hooks as they really run, through the `local` transport in a temporary directory: values
//! of any text reach the hook unchanged and never run as code; secrets arrive on standard
//! input and are redacted; a hook past its timeout dies with its whole process group.

use super::hook::step_env;
use super::hook_run::{self, Call, Ran};
use crate::plan::PlannedHost;
use crate::secrets::Secrets;
use crate::state::Observed;
use crate::transport::{AnyLink, AnyTransport, Local, Output, Target, Transport};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const STATE_DIR: &str = "var/lib/drover";

async fn link(root: &Path) -> AnyLink {
    AnyTransport::Local(Local::new(root.to_path_buf()))
        .connect(&Target {
            name: "h1".into(),
            address: "127.0.0.1".into(),
        })
        .await
        .expect("local connect")
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").starts_with(" Z"))
}

/// Pid files that name a running process group: a hook's is marked `ended` when it ends.
fn pid_files(host: &Path) -> usize {
    std::fs::read_dir(host.join(STATE_DIR).join("hooks")).map_or(0, |d| {
        d.flatten()
            .filter(|f| {
                std::fs::read_to_string(f.path())
                    .is_ok_and(|t| !t.trim().is_empty() && !t.trim_end().ends_with(" ended"))
            })
            .count()
    })
}

/// Runs `command` as a hook without secrets, which must outlive `timeout`: how long it was
/// given, and whether its process group was killed.
async fn timed_out(
    link: &AnyLink,
    command: &str,
    timeout: Duration,
) -> (Duration, Result<(), String>) {
    let secrets = Secrets::none();
    let call = Call {
        guard: None,
        env: &[],
        command,
        state_dir: STATE_DIR,
        service: "api",
        secrets: &secrets,
        timeout: Some(timeout),
        then: None,
        stop: None,
        after: false,
    };
    let Ran::TimedOut { after, killed } = hook_run::run(link, &call).await else {
        panic!("the hook must time out");
    };
    (after, killed)
}

/// The pid a hook wrote to `child` on `host`, once that process is gone (or 3 s passed), and
/// whether it is.
async fn child_gone(host: &Path) -> (String, bool) {
    let child = written(host, "child").trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(&child) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = !alive(&child);
    (child, gone)
}

#[tokio::test]
async fn a_hook_that_hangs_is_killed_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let link = link(dir.path()).await;
    // The hook starts a child that would outlive it, records the child's pid, and hangs.
    let started = Instant::now();
    let command = "sleep 300 & echo $! > child; sleep 300";
    let (after, killed) = timed_out(&link, command, Duration::from_millis(300)).await;
    assert_eq!(killed, Ok(()));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        Ran::timeout_reason("start", after, &killed),
        "start timed out after 300ms"
    );
    let host = dir.path().join("h1");
    let (child, gone) = child_gone(&host).await;
    assert!(gone, "the hook's child {child} was killed too");
    assert_eq!(
        pid_files(&host),
        0,
        "the pid file is removed or marked ended"
    );
}

#[tokio::test]
async fn a_hook_whose_leftover_holds_its_output_is_killed_with_it_on_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let link = link(dir.path()).await;
    // The hook's shell ends at once; the process it leaves holds its output, so the command
    // has not ended (as a session would not end) and the hook times out.
    let command = "sleep 300 & echo $! > child";
    let (_, killed) = timed_out(&link, command, Duration::from_millis(500)).await;
    assert_eq!(
        killed,
        Ok(()),
        "its group is still found once its shell is gone"
    );
    let (child, gone) = child_gone(&dir.path().join("h1")).await;
    assert!(gone, "the leftover {child} was killed");
}

#[tokio::test]
async fn a_hook_that_ends_keeps_its_code_gets_its_secrets_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let link = link(dir.path()).await;
    let secrets = Secrets::from_values(
        vec![("PASSWORD".into(), "hunter2'$(touch pwned)".into())],
        BTreeMap::new(),
    );
    let call = Call {
        guard: None,
        env: &[("DEPLOY_X".into(), "x".into())],
        command: "printf '%s|%s' \"$PASSWORD\" \"$DEPLOY_X\" > got; \
                  echo \"pw $PASSWORD\" >&2; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' > args; \
                  cat > stdin; exit 7",
        state_dir: STATE_DIR,
        service: "api",
        secrets: &secrets,
        timeout: Some(Duration::from_secs(10)),
        then: None,
        stop: None,
        after: false,
    };
    let Ran::Done(Ok(out)) = hook_run::run(&link, &call).await else {
        panic!("the hook ends by itself");
    };
    assert_eq!(out.code, Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "pw [redacted]\n");
    let host = dir.path().join("h1");
    assert_eq!(
        std::fs::read_to_string(host.join("got")).unwrap(),
        "hunter2'$(touch pwned)|x"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("stdin")).unwrap(),
        "",
        "the hook's standard input is empty, as without secrets"
    );
    assert!(!host.join("pwned").exists());
    let args = std::fs::read_to_string(host.join("args")).unwrap();
    assert!(args.contains("cat > stdin"), "the command lines were read");
    assert!(
        !args.contains("hunter2"),
        "a secret never shows on a command line"
    );
    assert_eq!(pid_files(&host), 0);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(host.join(STATE_DIR))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the state directory is private");
}

#[test]
fn the_kill_script_never_signals_group_0_or_1() {
    for bad in ["1 5", "0 5", "-1 5", "x 5", "1 5 ended"] {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p.pid");
        std::fs::write(&f, bad).unwrap();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(super::processes::kill_hook_script(
                &f.display().to_string(),
                5,
            ))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{bad:?}");
    }
}

/// Text that tries to run `touch pwned` in every way a shell might be fooled, then anything.
fn hostile() -> impl Strategy<Value = String> {
    let payloads = prop::sample::select(vec![
        "",
        "$(touch pwned)",
        "`touch pwned`",
        "'; touch pwned; '",
        "\"; touch pwned; \"",
        "\n touch pwned\n",
        "$'\\x27'; touch pwned",
        "${IFS}touch${IFS}pwned",
        "\\'; touch pwned #",
        "-- ; touch pwned",
    ]);
    (payloads, "[^\u{0}]{0,24}", "[^\u{0}]{0,8}").prop_map(|(p, a, b)| format!("{a}{p}{b}"))
}

/// What a hook wrote to `name` in the host's directory.
fn written(host: &Path, name: &str) -> String {
    std::fs::read_to_string(host.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const WRITE_ALL: &str = "printf '%s' \"$DEPLOY_NEW_VERSION\" > new; \
    printf '%s' \"$DEPLOY_OLD_VERSION\" > old; printf '%s' \"$DEPLOY_HOST\" > host; \
    printf '%s' \"$DEPLOY_CLASS\" > class; printf '%s' \"$DEPLOY_SITE\" > site; \
    printf '%s' \"$DEPLOY_NEEDS_DB\" > needs; printf '%s' \"$TOKEN\" > secret";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Versions, host names, classes, site names, addresses of needed services and secrets of
    /// any text (quotes, `$(…)`, backticks, newlines: anything but NUL) reach the hook exactly,
    /// through `step_env`, the hook script and the real `local` transport, and run nowhere.
    #[test]
    fn any_value_reaches_a_real_hook_unchanged_and_never_runs(
        new in hostile(),
        old in hostile(),
        name in hostile(),
        class in hostile(),
        site in hostile(),
        needs in hostile(),
        secret in hostile(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let host = PlannedHost {
            name: name.as_str().into(),
            address: "10.0.0.1".into(),
            classes: vec![class.clone()],
            tags: BTreeMap::new(),
            observed: Observed::Fresh,
        };
        let common = vec![
            ("DEPLOY_SITE".to_string(), site.clone()),
            ("DEPLOY_NEEDS_DB".to_string(), needs.clone()),
        ];
        let env = step_env(&common, &host, Some(&old), &new);
        let secrets = Secrets::from_values(vec![("TOKEN".into(), secret.clone())], BTreeMap::new());
        let out: Output = runtime.block_on(async {
            let link = link(dir.path()).await;
            let call = Call {
                guard: None,
                env: &env,
                command: WRITE_ALL,
                state_dir: STATE_DIR,
                service: "api",
                secrets: &secrets,
                timeout: Some(Duration::from_secs(20)),
                then: None,
                stop: None,
                after: false,
            };
            match hook_run::run(&link, &call).await {
                Ran::Done(Ok(out)) => out,
                Ran::Done(Err(e)) => panic!("transport: {e}"),
                Ran::TimedOut { .. } => panic!("timed out"),
            }
        });
        prop_assert!(out.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let h = dir.path().join("h1");
        prop_assert_eq!(written(&h, "new"), new);
        prop_assert_eq!(written(&h, "old"), old);
        prop_assert_eq!(written(&h, "host"), name);
        prop_assert_eq!(written(&h, "class"), class);
        prop_assert_eq!(written(&h, "site"), site);
        prop_assert_eq!(written(&h, "needs"), needs);
        prop_assert_eq!(written(&h, "secret"), secret);
        prop_assert!(!h.join("pwned").exists(), "a value ran as code");
        prop_assert!(!dir.path().join("pwned").exists(), "a value ran as code");
    }
}

#[test]
fn the_default_input_of_a_link_is_a_here_document_the_script_reads_exactly() {
    for input in [
        "",
        "export A='x'\n",
        "no newline",
        "DROVER_INPUT\nDROVER_INPUT_\n",
    ] {
        let script = crate::transport::here_document("cat; echo done", input.as_bytes());
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let want = if input.is_empty() || input.ends_with('\n') {
            format!("{input}done\n")
        } else {
            format!("{input}\ndone\n")
        };
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{input:?}");
    }
}
