//! Pull mode's fencing by the snapshot's revision, on a real etcd: a write conditioned on the
//! snapshot `desired/current` named when it was read is refused, and writes nothing, once a
//! newer snapshot is published (the store's own check); and an agent whose step on snapshot A
//! ends after B was published has its records refused, says so, publishes what its host then
//! records under B (the store never says what the host does not), and converges on B.
#![cfg(feature = "etcd")]

use crate::support;

use std::time::Duration;
use support::etcd::Etcd;
use support::pull::{text, timed, Pull, HALF, PREFIX};

#[test]
fn a_write_on_an_older_snapshot_is_refused_once_a_newer_one_is_published() {
    use drover::state::lock::{Holder, Lock};
    use drover::state::store::{self, Keys, LeaseLock, Store, StoreError, Write};
    use std::sync::Arc;

    let etcd = Etcd::start();
    let spec = etcd.spec(PREFIX, Duration::from_secs(10));
    let keys = Keys::new(PREFIX, "fenced");
    let key = keys.running("db", "db1");
    let put = |v: &str| {
        vec![Write::Put {
            key: key.clone(),
            value: v.to_string(),
        }]
    };
    let value_of = |k: &str| etcd.value(k);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = Arc::new(store::Etcd::connect(&spec, "lab").await.expect("connect"));
        client
            .put_unfenced(&keys.current(), b"snapshot-a")
            .await
            .expect("publish A");
        let (_, a) = client
            .value_at(&keys.current())
            .await
            .expect("read")
            .expect("A is there");
        let slot = LeaseLock::at(client.clone(), &keys, keys.slot("db", "db1"), spec.lock_ttl);
        slot.acquire(&Holder::me("fenced", "agent-1"), false)
            .await
            .expect("the slot");
        let fence = slot.fence().expect("held").on_snapshot(keys.current(), a);

        // While A is the desired snapshot, the step's writes land.
        client.write(&fence, &put("1.0")).await.expect("write on A");
        assert_eq!(value_of(&key).as_deref(), Some("1.0"));

        // B published: the same slot, still held, writes nothing more on A.
        client
            .put_unfenced(&keys.current(), b"snapshot-b")
            .await
            .expect("publish B");
        let (_, b) = client
            .value_at(&keys.current())
            .await
            .expect("read")
            .expect("B is there");
        assert!(b > a);
        let refused = client.write(&fence, &put("1.1")).await;
        match &refused {
            Err(StoreError::Superseded {
                key: k,
                revision,
                now,
            }) => {
                assert_eq!((k, *revision, *now), (&keys.current(), a, b));
            }
            other => panic!("a write on A after B was published: {other:?}"),
        }
        let said = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(said.contains("nothing written"), "{said}");
        assert_eq!(
            value_of(&key).as_deref(),
            Some("1.0"),
            "the write on A landed"
        );
        // Nor without the slot: publishing again what the host records is fenced by the
        // snapshot too.
        let again = client
            .write_if_unchanged(&keys.current(), a, &put("1.2"))
            .await;
        assert!(
            matches!(again, Err(StoreError::Superseded { .. })),
            "{again:?}"
        );
        assert_eq!(value_of(&key).as_deref(), Some("1.0"));
        client
            .write_if_unchanged(&keys.current(), b, &put("1.2"))
            .await
            .expect("under B");
        assert_eq!(value_of(&key).as_deref(), Some("1.2"));
        slot.release(&Holder::me("fenced", "agent-1"))
            .await
            .expect("give the slot back");
    });
}

#[test]
fn a_step_whose_snapshot_is_superseded_mid_step_is_not_published_under_it_and_says_so() {
    let mut pull = Pull::new(&[("db1", "db")]);
    let services = |version: &str| {
        let hook = timed("3").replace('\\', "\\\\").replace('"', "\\\"");
        format!("service \"db\" {{\n    start \"{hook}\"\n}}\n// {version}\n")
    };
    pull.write_site("1.0", &services("1.0"), HALF);
    let a = pull.publish();
    pull.start_agent("db1");
    pull.wait("the step on 1.0 starts", Duration::from_secs(120), || {
        !pull.intervals("db1").is_empty()
    });
    // B, published while the step on A sleeps in its hook.
    pull.write_site("2.0", &services("2.0"), HALF);
    let b = pull.publish();
    assert_ne!(a, b);
    pull.wait("db1 runs 2.0", Duration::from_secs(120), || {
        pull.recorded("db1", "db").as_deref() == Some("2.0")
    });
    let logs = pull.agent_logs();
    let ran = pull.intervals("db1");
    // The step on A ended after B was published (its hook slept through the publish), then
    // the step on B: one after the other, each once.
    assert_eq!(ran.len(), 2, "{ran:?}\n{logs}");
    assert!(ran[0].2 < ran[1].1, "{ran:?}");
    assert!(
        logs.contains("the step's records on snapshot")
            && logs.contains("were refused")
            && logs.contains("/desired/current was changed at revision"),
        "the refusal is not said\n{logs}"
    );
    assert!(
        logs.contains("published what this host recorded of its step on snapshot"),
        "{logs}"
    );
    let refused_at = logs.find("were refused").unwrap_or(usize::MAX);
    let again_at = logs.find("published what this host recorded").unwrap_or(0);
    assert!(refused_at < again_at, "{logs}");
    // The store says what the host's state file says, and nothing is left busy.
    let out = pull.deploy(&["status", "site.kdl", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let db = &status["hosts"][0]["services"][0];
    assert_eq!(db["running"], "2.0", "{status}");
    assert_eq!(pull.recorded("db1", "db").as_deref(), Some("2.0"));
    pull.wait("no intent is left", Duration::from_secs(10), || {
        pull.keys("busy/").is_empty()
    });
}
