//! The kept shell run by the real `/bin/sh` on this machine.

use super::*;
use crate::transport::quote;
use std::process::Stdio;
use std::time::Duration;

/// A shell started as the `ssh` link starts one, here with a local `/bin/sh`; `path` is its
/// `PATH`.
fn open(path: &str) -> Shell {
    let token = token();
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(loop_script(&token))
        .env("PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sh starts");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    Shell::new(
        token,
        Box::new(stdin),
        Box::new(stdout),
        Box::new(stderr),
        Box::new(child),
    )
}

fn shell() -> Shell {
    open(&std::env::var("PATH").unwrap_or_default())
}

/// Counts the times what is written to the shell is flushed: one per [`Shell::submit`].
struct Flushes {
    inner: Writer,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AsyncWrite for Flushes {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let done = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        if done.is_ready() {
            self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        done
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn run(shell: &mut Shell, script: &str) -> Output {
    shell.run(script, None).await.expect("the shell runs it")
}

#[tokio::test]
async fn each_command_gets_its_own_output_and_exit_code() {
    let mut sh = shell();
    let a = run(&mut sh, "echo one; echo two >&2; exit 3").await;
    assert_eq!(
        (a.code, a.stdout.as_slice(), a.stderr.as_slice()),
        (Some(3), &b"one\n"[..], &b"two\n"[..])
    );
    // No trailing newline, nothing at all, a multi-line script with quotes and a here-document.
    let b = run(&mut sh, "printf 'no newline'; printf 'err' >&2").await;
    assert_eq!(
        (b.stdout.as_slice(), b.stderr.as_slice()),
        (&b"no newline"[..], &b"err"[..])
    );
    let c = run(&mut sh, "true").await;
    assert_eq!((c.code, c.stdout.len(), c.stderr.len()), (Some(0), 0, 0));
    let d = run(&mut sh, "x='a b'\ncat <<'E'\n$x \\ 'q'\nE\necho \"$x\"").await;
    assert_eq!(d.stdout, b"$x \\ 'q'\na b\n");
    // `exit` ends the command, not the shell.
    let e = run(&mut sh, "exit 0").await;
    assert!(e.success());
    assert_eq!(run(&mut sh, "echo still").await.stdout, b"still\n");
}

#[tokio::test]
async fn large_output_on_both_streams_does_not_block() {
    let mut sh = shell();
    let out = run(
        &mut sh,
        "i=0; while [ $i -lt 20000 ]; do echo 'out line of some length'; echo 'err line' >&2; i=$((i+1)); done",
    )
    .await;
    assert_eq!(out.stdout.len(), 20000 * 24);
    assert_eq!(out.stderr.len(), 20000 * 9);
}

#[tokio::test]
async fn input_reaches_standard_input_and_commands_have_none_otherwise() {
    let mut sh = shell();
    let out = sh
        .run(
            "eval \"$(cat)\"; echo \"$SECRET\"",
            Some(b"export SECRET='s3 cr\n et'\n"),
        )
        .await
        .expect("runs");
    assert_eq!(out.stdout, b"s3 cr\n et\n");
    // Without input, standard input is empty: the next header is not read as the command's.
    let out = run(&mut sh, "cat; echo end").await;
    assert_eq!(out.stdout, b"end\n");
    assert_eq!(run(&mut sh, "echo next").await.stdout, b"next\n");
}

#[tokio::test]
async fn each_command_leads_a_process_group_of_its_own() {
    let mut sh = shell();
    let script = "read -r _ _ _ _ g _ </proc/$$/stat; echo \"$$ $g\"";
    let a = String::from_utf8(run(&mut sh, script).await.stdout).expect("text");
    let b = String::from_utf8(run(&mut sh, script).await.stdout).expect("text");
    let ids = |t: &str| -> (String, String) {
        let mut w = t.split_whitespace().map(str::to_string);
        (w.next().unwrap_or_default(), w.next().unwrap_or_default())
    };
    let ((pid_a, group_a), (pid_b, group_b)) = (ids(&a), ids(&b));
    assert_eq!(pid_a, group_a, "{a}");
    assert_eq!(pid_b, group_b, "{b}");
    assert_ne!(group_a, group_b);
}

#[tokio::test]
async fn a_host_without_setsid_runs_nothing_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sh = open(&dir.path().display().to_string());
    let marker = dir.path().join("ran");
    let script = format!("/usr/bin/touch {}", marker.display());
    match sh.run(&script, None).await {
        Err(ShellError::Unavailable(why)) => assert_eq!(why, "no-setsid"),
        other => panic!("expected Unavailable, got {:?}", other.map(|o| o.code)),
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!marker.exists(), "the command must not have run");
}

#[tokio::test]
async fn a_command_the_shell_cannot_carry_is_refused_unrun_and_the_shell_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sh = shell();
    let marker = dir.path().join("ran");
    let script = format!("cat > {}", marker.display());
    for (script, input) in [
        (script.as_str(), Some(&b"\xff\xfe not text"[..])),
        (script.as_str(), Some(&b"a\0b"[..])),
        ("echo a\0b", None),
    ] {
        match sh.run(script, input).await {
            Err(ShellError::Unsuitable(_)) => {}
            other => panic!("expected Unsuitable, got {:?}", other.map(|o| o.code)),
        }
        assert!(!sh.out_of_step());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!marker.exists(), "nothing was run");
    let out = run(&mut sh, "echo still here").await;
    assert_eq!(out.stdout, b"still here\n");
}

#[tokio::test]
async fn a_command_cut_off_leaves_the_shell_out_of_step_and_a_lost_shell_is_an_error() {
    let mut sh = shell();
    assert!(!sh.out_of_step());
    let cut = tokio::time::timeout(Duration::from_millis(200), sh.run("sleep 5", None)).await;
    assert!(cut.is_err());
    assert!(sh.out_of_step());

    let mut sh = shell();
    run(&mut sh, "true").await;
    // The command kills the shell that runs it.
    match sh.run("kill -KILL $PPID; sleep 1", None).await {
        Err(ShellError::Lost(_)) => {}
        other => panic!("expected Lost, got {:?}", other.map(|o| o.code)),
    }
}

#[tokio::test]
async fn a_command_ends_once_what_it_left_running_lets_go_of_its_output() {
    let mut sh = shell();
    // Left holding standard output, then standard error: waited for, as a session would be,
    // and what it wrote is the command's.
    let out = run(&mut sh, "(sleep 0.3; echo late) & echo now").await;
    assert_eq!(out.stdout, b"now\nlate\n");
    let out = run(&mut sh, "(sleep 0.3; echo late >&2) >/dev/null &").await;
    assert_eq!(out.stderr, b"late\n");
    // Left running with its output elsewhere: not waited for.
    let out = run(&mut sh, "sleep 30 >/dev/null 2>&1 & echo $!").await;
    let pid = String::from_utf8(out.stdout).expect("text");
    let pid = pid.trim();
    let alive = std::process::Command::new("kill")
        .args(["-0", pid])
        .status()
        .expect("kill runs");
    let _ = std::process::Command::new("kill").arg(pid).status();
    assert!(
        alive.success(),
        "the command came back while {pid} still ran"
    );
    assert_eq!(run(&mut sh, "echo next").await.stdout, b"next\n");
}

#[tokio::test]
async fn a_chain_is_sent_at_once_and_stops_at_the_first_command_that_fails() {
    let mut sh = shell();
    let flushes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stdin = std::mem::replace(&mut sh.stdin, Box::new(tokio::io::sink()));
    sh.stdin = Box::new(Flushes {
        inner: stdin,
        count: flushes.clone(),
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let ran = |name: &str| dir.path().join(name);
    let touch = |name: &str| format!("touch {}", quote(&ran(name).display().to_string()));
    let (a, b, c) = (
        format!("{}; echo one", touch("a")),
        format!("{}; echo two >&2; exit 3", touch("b")),
        touch("c"),
    );
    let sent = sh
        .submit(&[
            (a.as_str(), None),
            (b.as_str(), Some(&b"input\n"[..])),
            (c.as_str(), None),
        ])
        .await
        .expect("sent");
    // All three went to the host before the first one's output was read: one round trip.
    assert_eq!(flushes.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(sh.out_of_step(), "not collected yet");
    let one = sh.collect(sent[0]).await.expect("collects").expect("ran");
    assert_eq!((one.code, one.stdout.as_slice()), (Some(0), &b"one\n"[..]));
    let two = sh.collect(sent[1]).await.expect("collects").expect("ran");
    assert_eq!((two.code, two.stderr.as_slice()), (Some(3), &b"two\n"[..]));
    // The command after the one that failed is skipped, and says so.
    assert!(sh.collect(sent[2]).await.expect("collects").is_none());
    assert!(!sh.out_of_step(), "every command collected");
    assert!(ran("a").exists() && ran("b").exists());
    assert!(!ran("c").exists(), "ran after a command that failed");
    // A command that is not chained runs whatever the one before it did.
    assert_eq!(run(&mut sh, "echo next").await.stdout, b"next\n");
    // A chain whose first command fails runs none of the rest.
    let (d, e) = (touch("d"), touch("e"));
    let sent = sh
        .submit(&[("exit 1", None), (d.as_str(), None), (e.as_str(), None)])
        .await
        .expect("sent");
    let first = sh.collect(sent[0]).await.expect("collects").expect("ran");
    assert_eq!(first.code, Some(1));
    for n in &sent[1..] {
        assert!(sh.collect(*n).await.expect("collects").is_none());
    }
    assert!(!ran("d").exists() && !ran("e").exists());
    // A chain of commands that pass runs them all, in order.
    let sent = sh
        .submit(&[("echo 1", None), ("echo 2", None), ("echo 3", None)])
        .await
        .expect("sent");
    let mut outputs = Vec::new();
    for n in sent {
        outputs.extend(sh.collect(n).await.expect("collects").expect("ran").stdout);
    }
    assert_eq!(outputs, b"1\n2\n3\n");
}

#[tokio::test]
async fn a_chain_the_shell_cannot_carry_sends_nothing() {
    let mut sh = shell();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", quote(&marker.display().to_string()));
    match sh
        .submit(&[(touch.as_str(), None), ("echo a\0b", None)])
        .await
    {
        Err(ShellError::Unsuitable(_)) => {}
        other => panic!("expected Unsuitable, got {:?}", other.map(|n| n.len())),
    }
    assert!(!sh.out_of_step());
    assert_eq!(
        run(&mut sh, "echo still here").await.stdout,
        b"still here\n"
    );
    assert!(!marker.exists(), "nothing of the chain was run");
}
