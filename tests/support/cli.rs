//! Running the `deploy` binary from the repository root, without colour.

use std::process::Command;

/// What a `deploy` run left behind.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `deploy ARGS…` with the repository root as working directory, so relative paths and the
/// file names in diagnostics are stable.
pub fn deploy(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run deploy");
    Run {
        code: out.status.code().expect("deploy exited by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// A finished `deploy`'s standard output then its standard error, once it is known to have
/// exited 0 (else the test fails, showing both).
pub fn ok(out: std::process::Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "deploy failed:\n{text}");
    text
}

/// `deploy` to run in `dir` (a fleet's directory: its logs land in `dir/.drover`), without
/// colour; add the arguments and any environment.
pub fn deploy_in(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deploy"));
    cmd.current_dir(dir).env("NO_COLOR", "1");
    cmd
}

/// A finished `deploy`'s exit code, standard output and standard error.
pub fn outcome(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run deploy");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The events of a `deploy apply --json` run, from its standard output.
pub fn events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("event").is_some())
        .collect()
}
