//! Tests of the loopback SSH test fleet itself (`tests/support/fleet.rs`).
//!
//! These need root, util-linux and openssh-server; they panic, not skip,
//! without them.

use crate::support;

use std::fs;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use support::fleet::{Fleet, FleetHost, SSH_PORT};

/// db×3, app×6, lb×3 spread over zones a, b and c.
fn twelve_hosts() -> Vec<FleetHost> {
    let zones = ["a", "b", "c"];
    [("db", 3), ("app", 6), ("lb", 3)]
        .into_iter()
        .flat_map(|(class, n)| {
            (0..n).map(move |i| {
                FleetHost::new(&format!("{class}{}", i + 1), class).tag("zone", zones[i % 3])
            })
        })
        .collect()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_success(host: &str, out: &Output) {
    assert!(
        out.status.success(),
        "ssh to {host} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Processes on the controller whose command line contains `needle` (as one
/// of its arguments, or part of one).
fn processes_matching(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!("{}: {cmdline}", name.to_string_lossy()));
        }
    }
    found
}

fn assert_refused(address: &str) {
    let err = TcpStream::connect((address, SSH_PORT))
        .expect_err("connection to a stopped host succeeded");
    assert_eq!(
        err.kind(),
        ErrorKind::ConnectionRefused,
        "connecting to {address}:{SSH_PORT}: {err}"
    );
}

#[test]
fn every_host_has_its_own_name_and_directories() {
    for path in [
        "/var/lib/marker",
        "/srv/marker",
        "/opt/marker",
        "/root/marker",
    ] {
        assert!(
            !Path::new(path).exists(),
            "{path} exists on the controller; remove it before running this test"
        );
    }
    let hosts = twelve_hosts();
    let started = Instant::now();
    let fleet = Fleet::start(&hosts);
    eprintln!("fleet: 12 hosts up in {:?}", started.elapsed());

    // The hosts' bind mounts and hostnames stay inside their namespaces.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(fleet.dir.to_str().unwrap()),
        "a fleet mount leaked into the controller's mount namespace:\n{mountinfo}"
    );
    let own_hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        !hosts.iter().any(|h| h.name == own_hostname.trim()),
        "the controller's hostname changed"
    );

    let ssh_started = Instant::now();
    std::thread::scope(|s| {
        for host in &hosts {
            let fleet = &fleet;
            s.spawn(move || {
                let name = &host.name;
                let out = fleet.ssh(name, "hostname; cat /var/lib/marker 2>/dev/null; echo ok");
                assert_success(name, &out);
                assert_eq!(stdout(&out), format!("{name}\nok\n"), "on {name}");

                let out = fleet.ssh(
                    name,
                    &format!(
                        "echo {name} > /var/lib/marker && echo {name} > /srv/marker && \
                         echo {name} > /opt/marker && echo {name} > /root/marker"
                    ),
                );
                assert_success(name, &out);

                let out = fleet.ssh(name, "hostname; cat /var/lib/marker 2>/dev/null; echo ok");
                assert_success(name, &out);
                assert_eq!(stdout(&out), format!("{name}\n{name}\nok\n"), "on {name}");
            });
        }
    });
    eprintln!(
        "fleet: 36 ssh commands (12 hosts in parallel) in {:?}",
        ssh_started.elapsed()
    );

    // Each host's files landed in its own directories only.
    for host in &hosts {
        let root = fleet.host_root(&host.name);
        for sub in ["var-lib", "srv", "opt", "root"] {
            let marker = fs::read_to_string(root.join(sub).join("marker"))
                .unwrap_or_else(|e| panic!("{}/{sub}/marker: {e}", host.name));
            assert_eq!(
                marker,
                format!("{}\n", host.name),
                "{}/{sub}/marker",
                host.name
            );
        }
    }
    for path in [
        "/var/lib/marker",
        "/srv/marker",
        "/opt/marker",
        "/root/marker",
    ] {
        assert!(
            !Path::new(path).exists(),
            "a host wrote the controller's {path}"
        );
    }

    // The platform file is KDL 2.0 describing this fleet.
    let platform = fs::read_to_string(fleet.write_platform("/var/lib/drover")).unwrap();
    let doc = kdl::KdlDocument::parse_v2(&platform).unwrap_or_else(|e| panic!("{e:?}\n{platform}"));
    let node = doc.get("platform").expect("platform node");
    assert_eq!(node.get(0).and_then(|v| v.as_string()), Some("fleet"));
    let body = node.children().expect("platform body");
    let transport = body.get("transport").expect("transport");
    assert_eq!(transport.get(0).and_then(|v| v.as_string()), Some("ssh"));
    assert_eq!(
        transport.get("user").and_then(|v| v.as_string()),
        Some("root")
    );
    assert_eq!(
        transport.get("port").and_then(|v| v.as_integer()),
        Some(SSH_PORT.into())
    );
    assert_eq!(
        transport.get("config").and_then(|v| v.as_string()),
        fleet.ssh_config().to_str()
    );
    assert_eq!(
        transport.get("known-hosts").and_then(|v| v.as_string()),
        fleet.known_hosts().to_str()
    );
    assert_eq!(
        transport.get("identity").and_then(|v| v.as_string()),
        fleet.identity().to_str()
    );
    assert_eq!(
        body.get("state-dir")
            .and_then(|n| n.get(0))
            .and_then(|v| v.as_string()),
        Some("/var/lib/drover")
    );
    let inventory = body.get("inventory").expect("inventory");
    assert_eq!(inventory.get(0).and_then(|v| v.as_string()), Some("static"));
    let listed = inventory.children().expect("inventory body").nodes();
    assert_eq!(listed.len(), hosts.len());
    for (node, host) in listed.iter().zip(&hosts) {
        assert_eq!(node.name().value(), "host");
        assert_eq!(
            node.get(0).and_then(|v| v.as_string()),
            Some(host.name.as_str())
        );
        assert_eq!(
            node.get("address").and_then(|v| v.as_string()),
            Some(fleet.address(&host.name).as_str())
        );
        assert_eq!(
            node.get("class").and_then(|v| v.as_string()),
            Some(host.class.as_str())
        );
        assert_eq!(
            node.get("zone").and_then(|v| v.as_string()),
            Some(host.tags[0].1.as_str())
        );
    }
}

#[test]
fn host_keys_are_checked_strictly() {
    let fleet = Fleet::start(&[FleetHost::new("solo", "app")]);
    assert_success("solo", &fleet.ssh("solo", "true"));

    let run_with_known_hosts = |contents: String| {
        let file = fleet.dir.join("other_known_hosts");
        fs::write(&file, contents).unwrap();
        fleet
            .ssh_command()
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", file.display()))
            .args(["solo", "--", "true"])
            .output()
            .unwrap()
    };

    let out = run_with_known_hosts(String::new());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "ssh with an empty known_hosts succeeded"
    );
    assert!(
        stderr.contains("Host key verification failed"),
        "unexpected ssh error: {stderr}"
    );

    // A known_hosts that lists another key for the host (the client's own).
    let client_key = fs::read_to_string(fleet.identity().with_extension("pub")).unwrap();
    let client_key: Vec<&str> = client_key.split_whitespace().take(2).collect();
    let out = run_with_known_hosts(format!(
        "[{}]:{SSH_PORT} {}\n",
        fleet.address("solo"),
        client_key.join(" ")
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ssh with a wrong host key succeeded");
    assert!(
        stderr.contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "unexpected ssh error: {stderr}"
    );
}

#[test]
fn killing_a_host_or_dropping_the_fleet_leaves_nothing_running() {
    let hosts = [
        FleetHost::new("keep", "app"),
        FleetHost::new("doomed", "app"),
        FleetHost::new("third", "db"),
    ];
    let fleet = Fleet::start(&hosts);
    let addresses: Vec<String> = hosts.iter().map(|h| fleet.address(&h.name)).collect();
    let dir = fleet.dir.clone();

    // A daemon on a host (detached from the ssh session) must die with it.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let sleep = format!("sleep 3600.{}{}", std::process::id(), nanos % 10_000);
    for host in ["keep", "doomed"] {
        let out = fleet.ssh(
            host,
            &format!("setsid {sleep} >/dev/null 2>&1 </dev/null &"),
        );
        assert_success(host, &out);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes_matching(&sleep).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the daemons did not start: {:?}",
            processes_matching(&sleep)
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    fleet.kill_host("doomed");
    assert_refused(&fleet.address("doomed"));
    assert_eq!(
        processes_matching(&sleep).len(),
        1,
        "the killed host's daemon survived"
    );
    assert_success("keep", &fleet.ssh("keep", "hostname"));
    fleet.kill_host("doomed"); // idempotent

    let dropped = Instant::now();
    drop(fleet);
    eprintln!(
        "fleet: 2 remaining hosts stopped in {:?}",
        dropped.elapsed()
    );
    for address in &addresses {
        assert_refused(address);
    }
    assert_eq!(
        processes_matching(&sleep),
        Vec::<String>::new(),
        "a host's daemon survived the fleet"
    );
    let dir_text = dir.to_str().unwrap();
    assert_eq!(
        processes_matching(dir_text),
        Vec::<String>::new(),
        "a fleet process survived"
    );
    if std::env::var_os("DROVER_FLEET_KEEP").is_none() {
        assert!(
            !dir.exists(),
            "the fleet directory {dir_text} was not removed"
        );
    }
}
