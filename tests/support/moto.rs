//! Moto's AWS server on a loopback port, for the ec2 inventory tests; and `deploy` run with
//! an environment of the test's own, so that nothing from the developer's AWS setup (keys,
//! profiles, endpoints, instance metadata) reaches it.
//!
//! [`Moto::start`] runs moto's own server (`moto.server.ThreadedMotoServer`, what
//! `python3 -m moto.server` runs) in a `python3` child on `127.0.0.1`, on a port the kernel
//! picks, and waits until it answers. The child holds the read end of a pipe whose write end
//! only the test process holds: when the [`Moto`] is dropped, or the test process dies
//! however it dies, the child sees end-of-file and exits, so no server outlives the test.
//! A missing moto is a test failure that says how to install it (`tests/run.sh` does).
//!
//! Test data is made through moto's API with boto3 (which `moto[server]` pulls in):
//! [`Moto::python`] runs a script with an `ec2` client (and `iam`) already pointed at the
//! server.
#![allow(dead_code)]

use super::cli::Run;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The keys every test uses with moto (moto accepts any, unless started with IAM checks).
pub const KEY_ID: &str = "testing";
pub const SECRET: &str = "testing";
pub const REGION: &str = "us-east-1";

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs as the moto child: prints the port, serves until stdin closes.
const SERVER: &str = r#"
import os, sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # the lifeline: end-of-file once the test process is gone
os._exit(0)
"#;

/// Put before each [`Moto::python`] script.
const PRELUDE: &str = r#"
import json, os, sys, boto3
URL = os.environ["MOTO_URL"]
def client(service, key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"]):
    return boto3.client(service, endpoint_url=URL, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)
ec2 = client("ec2")
"#;

/// A running moto server. Dropping it stops the server.
pub struct Moto {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    child: Child,
    lifeline: Option<ChildStdin>,
}

impl Moto {
    /// Moto on a free loopback port, accepting any keys.
    pub fn start() -> Moto {
        Moto::start_with(&[])
    }

    /// Moto with extra environment, e.g. `INITIAL_NO_AUTH_ACTION_COUNT` to make it check
    /// keys and signatures against its IAM users.
    pub fn start_with(env: &[(&str, &str)]) -> Moto {
        require_moto();
        let mut child = Command::new("python3")
            .args(["-c", SERVER])
            .env_remove("AWS_ENDPOINT_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3 for moto");
        let lifeline = child.stdin.take();
        let mut line = String::new();
        let stdout = child.stdout.take().expect("moto's stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read moto's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("moto printed `{}` instead of its port", line.trim()));
        let moto = Moto {
            url: format!("http://127.0.0.1:{port}"),
            child,
            lifeline,
        };
        moto.wait_until_up(port);
        moto
    }

    fn wait_until_up(&self, port: u16) {
        let start = Instant::now();
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let request = format!(
                    "GET /moto-api/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                );
                let mut answer = String::new();
                if s.write_all(request.as_bytes()).is_ok()
                    && s.read_to_string(&mut answer).is_ok()
                    && answer.starts_with("HTTP/1")
                {
                    return;
                }
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "moto did not answer on 127.0.0.1:{port} within {START_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `script` with python3 after a prelude that defines `URL`, `client(service, key=…,
    /// secret=…)` and `ec2 = client("ec2")` (keys [`KEY_ID`]/[`SECRET`] unless `env` sets
    /// others); returns its stdout, panics with its stderr if it fails.
    pub fn python(&self, script: &str, env: &[(&str, &str)]) -> String {
        let out = Command::new("python3")
            .args(["-c", &format!("{PRELUDE}\n{script}")])
            .env("MOTO_URL", &self.url)
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "python script failed ({}):\n{}\n--- script:\n{script}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("python's stdout is UTF-8")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        drop(self.lifeline.take());
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics with how to install moto if `python3 -c 'import moto.server'` fails.
fn require_moto() {
    let ok = Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "moto is not installed (python3 -c 'import moto.server' failed): these tests need \
         moto's EC2 server. Install it with `python3 -m pip install 'moto[server]'` \
         (tests/run.sh does this)"
    );
}

/// `deploy ARGS…` in `dir`, with only this environment: `PATH`, `NO_COLOR=1`, `HOME=home`,
/// the AWS config and credentials files under `home/.aws`, instance metadata disabled (so
/// nothing is ever sent to 169.254.169.254), and `env`.
pub fn deploy(dir: &Path, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NO_COLOR", "1")
        .env("HOME", home)
        .env("AWS_CONFIG_FILE", home.join(".aws/config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join(".aws/credentials"))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run deploy");
    Run {
        code: out.status.code().expect("deploy exited by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}
