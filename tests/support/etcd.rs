//! A real etcd (Debian's `etcd-server`, 3.4) on loopback for tests: one member or a cluster of
//! three, on ports of their own (a system etcd may hold 2379), data in a temporary directory,
//! `--unsafe-no-fsync` for speed; optionally TLS with a CA the test makes (openssl), or etcd's
//! own users (`auth`: a `deploy` user allowed only the tests' prefix, tokens of a short TTL).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a member keeps its data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// `--unsafe-no-fsync`: tests.
    Never,
    /// etcd's default, fsync per commit: benchmarks.
    Durable,
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Mutex<Option<Child>>,
}

/// A running etcd; every member is killed when dropped.
pub struct Etcd {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    /// With TLS: the CA's certificate (`tls ca=`).
    pub ca: Option<PathBuf>,
    sync: Sync,
    /// With `auth`: the simple tokens' TTL in seconds.
    auth: Option<u32>,
}

/// With `auth`: the user the platform names, and its password (in [`PASSWORD_ENV`]).
pub const USER: &str = "deploy";
pub const PASSWORD: &str = "deploy-secret";
pub const PASSWORD_ENV: &str = "ETCD_PASSWORD";
/// The root user, for the test's own reads.
const ROOT_PASSWORD: &str = "root-secret";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run openssl");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a server certificate for 127.0.0.1 signed by it, in `dir`.
fn make_certs(dir: &Path) {
    let p = |n: &str| dir.join(n);
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=drover test CA",
        ])
        .arg("-keyout")
        .arg(p("ca-key.pem"))
        .arg("-out")
        .arg(p("ca.pem")));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .arg("-keyout")
        .arg(p("server-key.pem"))
        .arg("-out")
        .arg(p("server.csr")));
    std::fs::write(
        p("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("san");
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca-key.pem"))
        .arg("-out")
        .arg(p("server.pem"))
        .arg("-extfile")
        .arg(p("san.ext")));
}

impl Etcd {
    /// One member.
    pub fn start() -> Etcd {
        Etcd::launch(1, false)
    }

    /// One member that syncs every commit to disk, as etcd does by default (benchmarks).
    pub fn start_durable() -> Etcd {
        Etcd::launch_with(1, false, Sync::Durable, None)
    }

    /// Three members.
    pub fn cluster() -> Etcd {
        Etcd::launch(3, false)
    }

    /// `n` members.
    pub fn cluster_of(n: usize) -> Etcd {
        Etcd::launch(n, false)
    }

    /// One member serving clients over TLS, its certificate signed by a CA made here.
    pub fn start_tls() -> Etcd {
        Etcd::launch(1, true)
    }

    /// One member with etcd's `auth` enabled: simple tokens that lapse after `token_ttl`
    /// seconds unused (`--auth-token-ttl`), a root user, and the user [`USER`] whose role may
    /// read and write only under `prefix` (as a site's own etcd user would).
    pub fn start_auth(token_ttl: u32, prefix: &str) -> Etcd {
        let etcd = Etcd::launch_with(1, false, Sync::Never, Some(token_ttl));
        etcd.enable_auth(prefix);
        etcd
    }

    fn launch(n: usize, tls: bool) -> Etcd {
        Etcd::launch_with(n, tls, Sync::Never, None)
    }

    fn launch_with(n: usize, tls: bool, sync: Sync, auth: Option<u32>) -> Etcd {
        let dir = tempfile::tempdir().expect("etcd dir");
        if tls {
            make_certs(dir.path());
        }
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: Mutex::new(None),
            })
            .collect();
        let etcd = Etcd {
            ca: tls.then(|| dir.path().join("ca.pem")),
            members,
            dir,
            sync,
            auth,
        };
        for i in 0..n {
            etcd.spawn(i, "new");
        }
        etcd.wait_ready(Duration::from_secs(30));
        etcd
    }

    /// `etcdctl` on the first member, as `user` (root when `None` before auth is on).
    fn etcdctl(&self, user: Option<&str>, args: &[&str]) {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoints().split(',').next().unwrap_or_default());
        if let Some(user) = user {
            cmd.arg("--user").arg(user);
        }
        let out = cmd
            .args(args)
            .output()
            .expect("run etcdctl (Debian's etcd-client; tests/run.sh installs it)");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn enable_auth(&self, prefix: &str) {
        let root_pw = format!("--new-user-password={ROOT_PASSWORD}");
        let deploy_pw = format!("--new-user-password={PASSWORD}");
        let under = format!("{}/", prefix.trim_end_matches('/'));
        for args in [
            vec!["user", "add", "root", &root_pw],
            vec!["user", "grant-role", "root", "root"],
            vec!["role", "add", "drover"],
            vec![
                "role",
                "grant-permission",
                "drover",
                "--prefix=true",
                "readwrite",
                &under,
            ],
            vec!["user", "add", USER, &deploy_pw],
            vec!["user", "grant-role", USER, "drover"],
            vec!["auth", "enable"],
        ] {
            self.etcdctl(None, &args);
        }
    }

    /// A token of the root user, for the JSON gateway (`None` without `auth`).
    fn token(&self, port: u16) -> Option<String> {
        self.auth?;
        let body = format!("{{\"name\":\"root\",\"password\":\"{ROOT_PASSWORD}\"}}");
        let reply = http_post(port, "/v3/auth/authenticate", &body, None);
        let json: serde_json::Value = serde_json::from_str(&reply).expect("token JSON");
        Some(json["token"].as_str().expect("a token").to_string())
    }

    fn scheme(&self) -> &'static str {
        if self.ca.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn spawn(&self, i: usize, state: &str) {
        let m = &self.members[i];
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let client = format!("{}://127.0.0.1:{}", self.scheme(), m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name)))
            .expect("etcd log");
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "drover-test"])
            .args(["--logger", "zap"]);
        if self.sync == Sync::Never {
            cmd.arg("--unsafe-no-fsync");
        }
        if let Some(ttl) = self.auth {
            cmd.args([
                "--auth-token",
                "simple",
                "--auth-token-ttl",
                &ttl.to_string(),
            ]);
        }
        if self.ca.is_some() {
            let p = |n: &str| self.dir.path().join(n);
            cmd.arg("--cert-file")
                .arg(p("server.pem"))
                .arg("--key-file")
                .arg(p("server-key.pem"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd (is etcd-server installed? tests/run.sh installs it)");
        *m.child.lock().unwrap() = Some(child);
    }

    /// Until every running member serves clients (its log says so and its port answers).
    fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for m in &self.members {
            if m.child.lock().unwrap().is_none() {
                continue;
            }
            let log = self.dir.path().join(format!("{}.log", m.name));
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let serving = text.contains("serving client traffic");
                let health = self.ca.is_some() || healthy(m.client);
                if serving && health {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} did not start:\n{text}",
                    m.name
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// What every member logged so far.
    pub fn log(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name)))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The client URLs, comma-separated (`endpoints=`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme(), m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The platform's `store` node.
    pub fn store_node(&self, prefix: &str, ttl: &str) -> String {
        let mut children = Vec::new();
        if let Some(ca) = &self.ca {
            children.push(format!("tls ca=\"{}\";", ca.display()));
        }
        if self.auth.is_some() {
            children.push(format!(
                "auth user=\"{USER}\" password-env=\"{PASSWORD_ENV}\";"
            ));
        }
        let children = match children.is_empty() {
            true => String::new(),
            false => format!(" {{ {} }}", children.join(" ")),
        };
        format!(
            "store \"etcd\" endpoints=\"{}\" prefix=\"{prefix}\" lock-ttl=\"{ttl}\"{children}",
            self.endpoints()
        )
    }

    /// Member `i`'s client address, `127.0.0.1:<port>` (for a relay in front of it).
    pub fn client_addr(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.members[i].client))
    }

    /// The member that leads now: each running member's status names the leader's id, and
    /// its own (etcd's JSON gateway, plain HTTP only).
    pub fn leader(&self) -> usize {
        let status = |m: &Member| -> serde_json::Value {
            let reply = http_post(m.client, "/v3/maintenance/status", "{}", None);
            serde_json::from_str(&reply).expect("etcd's status JSON")
        };
        let running: Vec<(usize, serde_json::Value)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.lock().unwrap().is_some())
            .map(|(i, m)| (i, status(m)))
            .collect();
        let leader = running
            .iter()
            .find_map(|(_, s)| s["leader"].as_str().filter(|l| *l != "0"))
            .expect("a member names a leader")
            .to_string();
        running
            .iter()
            .find(|(_, s)| s["header"]["member_id"].as_str() == Some(leader.as_str()))
            .map(|(i, _)| *i)
            .expect("the leader is a running member")
    }

    /// Kills member `i` (SIGKILL: a member left without quorum may ignore SIGTERM).
    pub fn kill(&self, i: usize) {
        if let Some(mut c) = self.members[i].child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills every member.
    pub fn stop(&self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Starts every member that was stopped again, on its data.
    pub fn restart(&self) {
        for i in 0..self.members.len() {
            if self.members[i].child.lock().unwrap().is_none() {
                self.spawn(i, "existing");
            }
        }
        self.wait_ready(Duration::from_secs(30));
    }

    /// A platform's `store` for this etcd (plain HTTP, no auth): keys under `prefix`, the lock's
    /// lease of `lock_ttl`.
    pub fn spec(&self, prefix: &str, lock_ttl: Duration) -> drover::site::StoreSpec {
        drover::site::StoreSpec {
            endpoints: self.endpoints().split(',').map(str::to_string).collect(),
            prefix: prefix.into(),
            lock_ttl,
            tls: None,
            auth: None,
        }
    }

    /// The value of `key` itself (not of the keys it is a prefix of), if it is there.
    pub fn value(&self, key: &str) -> Option<String> {
        self.keys(key)
            .into_iter()
            .find(|(name, _)| name == key)
            .map(|(_, v)| v)
    }

    /// Every key under `prefix` with its value, through etcd's JSON gateway (plain HTTP only).
    pub fn keys(&self, prefix: &str) -> Vec<(String, String)> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = format!(
            "{{\"key\":\"{}\",\"range_end\":\"{}\"}}",
            b64.encode(prefix),
            b64.encode(&end)
        );
        let m = self
            .members
            .iter()
            .find(|m| m.child.lock().unwrap().is_some())
            .expect("a running member");
        let reply = http_post(m.client, "/v3/kv/range", &body, self.token(m.client));
        let json: serde_json::Value = serde_json::from_str(&reply).expect("etcd's JSON");
        json["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| {
                        let dec = |v: &serde_json::Value| {
                            String::from_utf8(b64.decode(v.as_str().unwrap_or("")).unwrap())
                                .unwrap()
                        };
                        (dec(&kv["key"]), dec(&kv["value"]))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.contains("\"health\":\"true\"")
}

/// `body` posted to etcd's JSON gateway, with `token` (etcd's `auth`) if any; the reply's body.
fn http_post(port: u16, path: &str, body: &str, token: Option<String>) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to etcd");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read");
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Etcd {
    fn any_client_port(&self) -> u16 {
        self.members
            .iter()
            .find(|m| m.child.lock().unwrap().is_some())
            .expect("a running member")
            .client
    }
}

/// A lease of `ttl` seconds, granted through the JSON gateway; its id.
pub fn grant(etcd: &Etcd, ttl: u64) -> String {
    let port = etcd.any_client_port();
    let reply = http_post(
        port,
        "/v3/lease/grant",
        &format!("{{\"TTL\":{ttl}}}"),
        etcd.token(port),
    );
    let json: serde_json::Value = serde_json::from_str(&reply).expect("lease JSON");
    json["ID"].as_str().expect("lease id").to_string()
}

/// Revokes `lease` (its keys are deleted at once).
pub fn revoke(etcd: &Etcd, lease: &str) {
    let port = etcd.any_client_port();
    let reply = http_post(
        port,
        "/v3/lease/revoke",
        &format!("{{\"ID\":\"{lease}\"}}"),
        etcd.token(port),
    );
    assert!(reply.contains("header"), "revoke: {reply}");
}

/// Puts `key` = `value` under `lease`.
pub fn put(etcd: &Etcd, key: &str, value: &str, lease: String) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = format!(
        "{{\"key\":\"{}\",\"value\":\"{}\",\"lease\":\"{lease}\"}}",
        b64.encode(key),
        b64.encode(value)
    );
    let port = etcd.any_client_port();
    let reply = http_post(port, "/v3/kv/put", &body, etcd.token(port));
    assert!(reply.contains("header"), "put: {reply}");
}
