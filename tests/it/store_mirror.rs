//! The pull agents' watched copy of a site's keys (`state::store::Mirror`) against a real
//! etcd: written to while copies are opened, it ends equal to what a read gives (the view,
//! and every key with its create revision); a key deleted and made again under the same name
//! has its new create revision (what admission counts its own slot by); a quiet site keeps
//! its watch, etcd's revision moving on elsewhere. (A member that falls behind its cluster
//! and stops sending, which the copy gives up after asking for its progress, is not tested.)
#![cfg(feature = "etcd")]

use crate::support;

use drover::state::store::{self, Keys, Mirror, Store, Write};
use std::sync::Arc;
use std::time::Duration;
use support::etcd::Etcd;

const PREFIX: &str = "/drover-test";

/// Every key of the copy with its create revision, and its view, as text.
fn said(mirror: &mut Mirror, keys: &Keys) -> (Vec<(String, i64)>, String) {
    let created = mirror
        .created_under(keys.root())
        .map(|(k, c)| (k.to_string(), c))
        .collect();
    (created, format!("{:?}", mirror.view()))
}

/// The same, from a read now.
async fn read(client: &store::Etcd, keys: &Keys) -> (Vec<(String, i64)>, String) {
    let (kvs, _) = client.site_keys(keys).await.expect("read");
    let created = kvs.iter().map(|(k, _, c)| (k.clone(), *c)).collect();
    (
        created,
        format!("{:?}", client.read(keys).await.expect("read")),
    )
}

/// Takes the copy's changes until it says what a read says (or 10 s pass).
async fn settled(client: &store::Etcd, mirror: &mut Mirror, keys: &Keys) {
    let root = [keys.root().to_string()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = read(client, keys).await;
        if said(mirror, keys) == now {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy never caught up:\n{:?}\nagainst\n{now:?}",
            said(mirror, keys)
        );
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            mirror.changed_under(client, &root),
        )
        .await;
    }
}

async fn write(client: &store::Etcd, w: &Write) {
    match w {
        Write::Put { key, value } => client
            .put_unfenced(key, value.as_bytes())
            .await
            .expect("put"),
        Write::Delete { key } => {
            let (kvs, _) = client.site_keys(&keys()).await.expect("read");
            if let Some((_, _, c)) = kvs.iter().find(|(k, _, _)| k == key) {
                client.delete_if(key, *c).await.expect("delete");
            }
        }
    }
}

fn keys() -> Keys {
    Keys::new(PREFIX, "shop")
}

/// Step `i`'s writes: an intent put, a slot made, a host's entry, the intent cleared, and
/// every third time the slot given back.
fn writes(i: usize) -> Vec<Write> {
    let k = keys();
    let host = format!("app{}", i % 7);
    let mut w = vec![
        store::busy(&k, &host, "api", "2.0", "r1", "2026-12-08T00:00:00Z"),
        Write::Put {
            key: k.slot("api", &host),
            value: "{}".into(),
        },
        store::host_seen(
            &k,
            &host,
            "127.0.0.1",
            vec!["api".into()],
            None,
            "r1",
            "2026-12-08T00:00:00Z",
        ),
        Write::Delete { key: k.busy(&host) },
    ];
    if i.is_multiple_of(3) {
        w.push(Write::Delete {
            key: k.slot("api", &host),
        });
    }
    w
}

#[test]
fn a_copy_opened_while_the_site_is_written_ends_equal_to_a_read() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let spec = etcd.spec(PREFIX, Duration::from_secs(3));
        let client = Arc::new(store::Etcd::connect(&spec, "lab").await.expect("connect"));
        let k = keys();
        // A writer going on while copies are opened: each copy starts between two writes.
        let writer = {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..120 {
                    for w in writes(i) {
                        write(&client, &w).await;
                    }
                }
            })
        };
        let mut copies = Vec::new();
        for _ in 0..6 {
            copies.push(client.mirror(&k).await.expect("mirror"));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        writer.await.expect("writer");
        for mirror in &mut copies {
            settled(&client, mirror, &k).await;
        }
    });
}

#[test]
fn a_slot_made_again_under_its_name_has_its_new_revision_and_a_quiet_watch_stays() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let spec = etcd.spec(PREFIX, Duration::from_secs(3));
        let client = store::Etcd::connect(&spec, "lab").await.expect("connect");
        let k = keys();
        let slot = k.slot("api", "app1");
        client.put_unfenced(&slot, b"{}").await.expect("put");
        let mut mirror = client.mirror(&k).await.expect("mirror");
        let first = mirror
            .created_under(&k.slots("api"))
            .find(|(key, _)| *key == slot)
            .map(|(_, c)| c)
            .expect("the slot is in the copy");
        // Given back and taken again by the same name: another create revision.
        write(&client, &Write::Delete { key: slot.clone() }).await;
        client.put_unfenced(&slot, b"{}").await.expect("put");
        settled(&client, &mut mirror, &k).await;
        let again: Vec<i64> = mirror
            .created_under(&k.slots("api"))
            .filter(|(key, _)| *key == slot)
            .map(|(_, c)| c)
            .collect();
        assert_eq!(again.len(), 1, "{again:?}");
        assert!(again[0] > first, "{first} then {again:?}");
        // Quiet for longer than the copy waits before it checks its watch (5 s), while etcd's
        // revision moves on outside the site (another site's key): the copy asks its watch
        // for its progress, which answers; the watch is kept, and the next change arrives.
        client
            .put_unfenced("/drover-test/elsewhere/key", b"x")
            .await
            .expect("put");
        let lock = [k.lock()];
        let quiet = tokio::time::timeout(
            Duration::from_secs(12),
            mirror.changed_under(&client, &lock),
        );
        let later = async {
            tokio::time::sleep(Duration::from_secs(11)).await;
            client.put_unfenced(&k.lock(), b"{}").await.expect("put");
        };
        let (changed, ()) = tokio::join!(quiet, later);
        assert_eq!(changed, Ok(true), "the watch ended or missed the change");
    });
}
