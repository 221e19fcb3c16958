//! The etcd store under faults a kill does not make: a controller whose traffic to etcd is
//! silently dropped mid-rollout (a relay that stops forwarding, `tests/support/relay.rs`)
//! while its SSH to the hosts still works starts no step once its lease can have expired; and
//! what a person reads when etcd is not there.
#![cfg(feature = "etcd")]

use crate::support;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::etcd::Etcd;
use support::fleet::{Fleet, FleetHost};
use support::hooks::EV;
use support::relay::Relay;

const PREFIX: &str = "/drover-test";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn fleet(apps: usize) -> Fleet {
    let hosts: Vec<FleetHost> = (1..=apps)
        .map(|i| FleetHost::new(&format!("app{i}"), "app"))
        .collect();
    Fleet::start(&hosts)
}

/// The fleet's platform with a store at `endpoints`, batch 1, and a site whose every step is
/// one chain of quick hooks (`stop`, `install`, `start`) ending in `start`'s sleep of `sleep`
/// seconds: each hook of a step starts within moments of the step itself.
fn write_site(fleet: &Fleet, endpoints: &str, ttl: &str, version: &str, sleep: &str) -> PathBuf {
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let store =
        format!("store \"etcd\" endpoints=\"{endpoints}\" prefix=\"{PREFIX}\" lock-ttl=\"{ttl}\"");
    let text = text.replacen(
        "platform \"fleet\" {\n",
        &format!("platform \"fleet\" {{\n    {store}\n"),
        1,
    );
    std::fs::write(&platform, text).expect("platform");
    std::fs::write(
        fleet.dir.join("policy.kdl"),
        "policy \"default\" { batch 1; max-failed 10; }\n",
    )
    .expect("policy");
    let site = format!(
        r####"site "shared" {{
    version "{version}"
    platform "platform.kdl"
    policy "policy.kdl"
}}
class "app" {{ service "api" }}
service "api" {{
    stop #"{EV}ev stop"#
    install #"{EV}ev install"#
    start #"{EV}ev start; sleep {sleep}"#
}}
"####
    );
    let path = fleet.dir.join("site.kdl");
    std::fs::write(&path, site).expect("site");
    path
}

fn deploy(fleet: &Fleet, args: &[&str]) -> Output {
    support::cli::deploy_in(&fleet.dir)
        .args(args)
        .output()
        .expect("run deploy")
}

/// The test's clock, in the hooks' unit (`date +%s%N`: the hosts share this machine's clock).
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

// ---------------------------------------------------------------------------------------------
// A lost lease is noticed in time

/// How far past `cut + lock-ttl` a hook's timestamp may be and still pass: the hooks write
/// `date +%s%N` and the test reads `SystemTime` after the relay is cut, on one clock, so only
/// the clock's granularity separates them; 10 ms is far above it.
const CLOCK_MARGIN: Duration = Duration::from_millis(10);

#[test]
fn a_controller_cut_off_from_etcd_starts_no_step_once_its_lease_can_have_expired() {
    let etcd = Etcd::start();
    let upstream = etcd
        .endpoints()
        .trim_start_matches("http://")
        .parse()
        .expect("etcd's address");
    let relay = Relay::start(upstream);
    let fleet = fleet(10);
    let ttl = Duration::from_secs(3);
    let path = write_site(&fleet, &relay.url(), "3s", "1.0", "0");
    let out = deploy(&fleet, &["apply", path.to_str().unwrap(), "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // 2.0: a step a second long, one host after the other.
    let path = write_site(&fleet, &relay.url(), "3s", "2.0", "1");
    let err_file = fleet.dir.join("apply.err");
    let mut run = support::cli::deploy_in(&fleet.dir)
        .args(["apply", path.to_str().unwrap(), "--yes"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_file).expect("stderr file"))
        .spawn()
        .expect("start deploy");
    let before: usize = support::hooks::events(&fleet).len();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Cut once the second step of 2.0 has started (its `stop` hook logged).
    while support::hooks::events(&fleet)[before..]
        .iter()
        .filter(|e| e.2 == "stop")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the rollout did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.cut();
    let cut = now_ns();
    let status = run.wait().expect("wait");
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert_eq!(status.code(), Some(6), "{err}");
    assert!(err.contains("the site's lock in etcd is lost"), "{err}");

    // Said once, in words: what was lost, what the run does, the endpoint and what happened
    // there; no lock left to give back, no debug text.
    assert_eq!(err.matches("etcd does not answer").count(), 1, "{err}");
    assert_eq!(err.matches(&relay.url()).count(), 1, "{err}");
    assert!(
        err.contains(&format!("\n  {}: no answer in ", relay.url())),
        "{err}"
    );
    for debug in [
        "tonic",
        "Os {",
        "Error(",
        "given back",
        "cannot take the lock",
    ] {
        assert!(!err.contains(debug), "{debug:?} in:\n{err}");
    }

    let limit = cut + (ttl + CLOCK_MARGIN).as_nanos();
    let events = support::hooks::events(&fleet);
    if let Some(last) = events[before..].last().filter(|e| e.0 > cut) {
        eprintln!(
            "last hook: {} {}, {:.3} s after the cut",
            last.1,
            last.2,
            (last.0 - cut) as f64 / 1e9
        );
    }
    let after: Vec<String> = events[before..]
        .iter()
        .filter(|e| e.0 > limit)
        .map(|e| {
            format!(
                "{} {} {:.3} s after the cut",
                e.1,
                e.2,
                (e.0 - cut) as f64 / 1e9
            )
        })
        .collect();
    assert!(
        after.is_empty(),
        "hooks started after the lease could have expired (cut + {ttl:?}): {after:?}\n{err}"
    );
    // Not vacuous: the cut came mid-run (the second step had started: its `stop` ran), and
    // the run stopped before its end. (A step said just before the cut may run nothing at
    // all: its intent is not acknowledged, or the run is stopping before its first command.)
    let upgraded = events[before..].iter().filter(|e| e.2 == "stop").count();
    assert!(
        upgraded >= 2,
        "the cut came before the second step: {events:?}"
    );
    assert!(upgraded < 10, "every host was upgraded\n{err}");
}

// ---------------------------------------------------------------------------------------------
// What a person reads when etcd is not there

/// A port on loopback where nothing listens.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn with_nothing_listening_status_and_plan_say_each_endpoint_once_in_words() {
    let dir = tempfile::tempdir().expect("site directory");
    let (a, b) = (closed_port(), closed_port());
    std::fs::write(
        dir.path().join("platform.kdl"),
        format!(
            r#"platform "here" {{
    transport "local"
    store "etcd" endpoints="http://127.0.0.1:{a},http://127.0.0.1:{b}" lock-ttl="2s"
    inventory "static" {{
        host "app1" address="127.0.0.1" class="app"
    }}
}}
"#
        ),
    )
    .expect("platform");
    std::fs::write(
        dir.path().join("site.kdl"),
        "site \"s\" {\n    version \"1.0\"\n    platform \"platform.kdl\"\n}\n\
         class \"app\" { service \"api\"; }\nservice \"api\" {\n    start \"true\"\n}\n",
    )
    .expect("site");
    for command in ["status", "plan"] {
        let out = support::cli::deploy_in(dir.path())
            .args([command, "site.kdl"])
            .output()
            .expect("run deploy");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{command}: {err}");
        for debug in [
            "tonic",
            "Os {",
            "Error(",
            "ConnectError",
            "os error",
            "grpc",
        ] {
            assert!(!err.contains(debug), "{command}: {debug:?} in:\n{err}");
        }
        // One line per endpoint, what happened there in words; each endpoint named once.
        for port in [a, b] {
            let endpoint = format!("http://127.0.0.1:{port}");
            assert_eq!(err.matches(&endpoint).count(), 1, "{command}: {err}");
            let line = err
                .lines()
                .find(|l| l.contains(&endpoint))
                .expect("the endpoint's line");
            assert!(
                line.trim_start_matches([' ', '│'])
                    .starts_with(&format!("{endpoint}: connection refused")),
                "{command}: {line:?} in:\n{err}"
            );
        }
        assert_eq!(
            err.matches("etcd does not answer").count(),
            1,
            "{command}: {err}"
        );
    }
}

/// A late copy of a run's write changes nothing. etcd calls are sent again when an attempt is
/// cut short, and to a second member beside a slow first one (src/state/store/etcd.rs,
/// `call_for`): the first copy of write N can reach etcd after write N + 1 was taken. Here
/// that copy is the very transaction write N sent, handed to etcd after write N + 1: it must
/// not put back what write N said (before the run's count of its writes, it did: the store
/// said 1.0 where the run had last written 2.0). And a copy taken before the writer heard of
/// it (its answer lost) is known as its own: the writer goes on in step.
#[test]
fn a_late_copy_of_a_write_does_not_undo_the_next_one() {
    use drover::state::lock::{Holder, Lock};
    use drover::state::store::{self, Keys, LeaseLock, Store, Write};
    use std::sync::Arc;

    let etcd = Etcd::start();
    let spec = etcd.spec(PREFIX, Duration::from_secs(5));
    let keys = Keys::new(PREFIX, "late");
    let key = keys.running("api", "app1");
    let put = |v: &str| {
        vec![Write::Put {
            key: key.clone(),
            value: v.to_string(),
        }]
    };
    let value_of = |k: &str| etcd.value(k);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = Arc::new(store::Etcd::connect(&spec, "fleet").await.expect("connect"));
        let lock = LeaseLock::new(client.clone(), &keys, spec.lock_ttl);
        lock.acquire(&Holder::me("late", "run-1"), false)
            .await
            .expect("the lock");
        let fence = lock.fence().expect("held");
        let send = |txn: etcd_client::Txn| {
            let client = client.clone();
            async move {
                client
                    .call(|mut c| {
                        let txn = txn.clone();
                        async move { c.txn(txn).await }
                    })
                    .await
                    .expect("etcd answers")
                    .succeeded()
            }
        };

        let first = put("1.0");
        client.write(&fence, &first).await.expect("write 1");
        // What write 1 sent, as a late copy of it would be.
        let copy = store::fenced_txn(&fence, 0, &first.iter().collect::<Vec<_>>());
        client.write(&fence, &put("2.0")).await.expect("write 2");
        assert!(!send(copy).await, "a late copy of write 1 was taken");
        assert_eq!(value_of(&key).as_deref(), Some("2.0"));

        // Write 3's first copy is taken, its answer lost; the writer sends it again.
        let third = put("3.0");
        assert!(
            send(store::fenced_txn(
                &fence,
                2,
                &third.iter().collect::<Vec<_>>()
            ))
            .await
        );
        client
            .write(&fence, &third)
            .await
            .expect("a copy already taken is this write, written");
        client.write(&fence, &put("4.0")).await.expect("write 4");
        assert_eq!(value_of(&key).as_deref(), Some("4.0"));
        assert_eq!(value_of(&fence.counter).as_deref(), Some("4"));
        lock.release(&Holder::me("late", "run-1"))
            .await
            .expect("release");
    });
    // The count went with the lease.
    assert!(etcd.keys(&format!("{PREFIX}/late/writer/")).is_empty());
}
