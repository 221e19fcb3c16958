//! A benchmark, not a test: what one command costs the host's CPU in the kept shell, by the
//! size of its text (the loop reads a command's lines with the shell's `read`, which takes a
//! pipe one byte per system call). Run alone, in a release build, and read what it prints:
//!
//! ```sh
//! cargo test --release --lib shell::cost -- --ignored --nocapture
//! ```

use super::{loop_script, token, Shell};
use std::process::Stdio;
use std::time::Instant;

/// CPU time of this process's children that ended and were waited for, in seconds.
fn children_cpu() -> f64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Runs `command` `n` times in a kept shell of the local `/bin/sh`; returns the wall time and
/// the CPU (the loop and everything it started) per command.
async fn measure(command: &str, n: u32) -> (f64, f64) {
    let token = token();
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(loop_script(&token))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh starts");
    let (stdin, stdout, stderr) = (
        child.stdin.take().expect("stdin"),
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let mut shell = Shell::new(
        token,
        Box::new(stdin),
        Box::new(stdout),
        Box::new(stderr),
        Box::new(()),
    );
    shell.wait_ready().await.expect("the shell starts");
    let cpu = children_cpu();
    let start = Instant::now();
    for _ in 0..n {
        let out = shell.run(command, None).await.expect("runs");
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let wall = start.elapsed().as_secs_f64();
    drop(shell);
    child.wait().await.expect("the shell ends");
    let n = f64::from(n);
    (wall / n, (children_cpu() - cpu) / n)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: run alone with --ignored --nocapture"]
async fn cost_of_a_command_by_its_size() {
    let n = 1000;
    println!("| the command's text | wall per command | host CPU per command |");
    println!("| ---: | ---: | ---: |");
    // `:` and a comment as long as a hook's command (600 bytes), a `start` with its record
    // (1,500) and a `check` with its record and the lock's release (2,400), on one line or on
    // lines of 80 bytes.
    for (size, width) in [(0, 0), (600, 0), (1500, 0), (2400, 0), (2400, 80)] {
        let mut command = String::from(":");
        if size > 0 {
            command.push_str("\n#");
            for i in 0..size {
                command.push(if width > 0 && i % width == width - 1 {
                    '\n'
                } else {
                    'x'
                });
                if width > 0 && i % width == width - 1 {
                    command.push('#');
                }
            }
        }
        let (wall, cpu) = measure(&command, n).await;
        let lines = if width > 0 { ", lines of 80" } else { "" };
        println!(
            "| {} bytes{lines} | {:.2} ms | {:.2} ms |",
            command.len(),
            wall * 1e3,
            cpu * 1e3
        );
    }
}
