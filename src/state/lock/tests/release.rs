//! The order and number of the release commands of a [`FleetLock`]: the host taken first is
//! given back last, and a host locked at two of its steps once.

use super::*;

/// A [`Local`] transport that notes, in order, the hosts whose lock each release command
/// gives back (those whose command reads `holder.json` and runs no `mkdir`), once it ends.
struct Releases {
    inner: Local,
    order: Order,
}

struct ReleasesLink {
    inner: <Local as Transport>::Link,
    host: String,
    order: Order,
}

/// The hosts whose lock was given back, in order.
type Order = Arc<std::sync::Mutex<Vec<String>>>;

impl Releases {
    /// Hosts under `root`, and the order their locks are given back in.
    fn on(root: &std::path::Path) -> (Arc<Releases>, Order) {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let transport = Arc::new(Releases {
            inner: Local::new(root.to_path_buf()),
            order: order.clone(),
        });
        (transport, order)
    }
}

impl Transport for Releases {
    type Link = ReleasesLink;
    async fn connect(
        &self,
        target: &Target,
    ) -> Result<ReleasesLink, crate::transport::TransportError> {
        Ok(ReleasesLink {
            inner: self.inner.connect(target).await?,
            host: target.name.clone(),
            order: self.order.clone(),
        })
    }
}

impl Link for ReleasesLink {
    async fn run(&self, script: &str) -> Result<Output, crate::transport::TransportError> {
        let releasing = script.contains("holder.json") && !script.contains("mkdir");
        // The first host's release would come first if they all ran at once.
        if releasing && self.host != "h1" {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let out = self.inner.run(script).await;
        if releasing {
            self.order.lock().unwrap().push(self.host.clone());
        }
        out
    }
    async fn close(self) {}
}

#[test]
fn the_host_taken_first_is_given_back_last() {
    let dir = tempfile::tempdir().unwrap();
    let (transport, order) = Releases::on(dir.path());
    let hosts = targets(&["h3", "h1", "h2"]);
    let fleet = FleetLock::new(transport, hosts, "var/lib/drover", 8);
    let me = Holder::me("shop", "run-a");
    block_on(fleet.acquire(&me, false)).unwrap();
    assert_eq!(fleet.first_taken().as_deref(), Some("h1"));
    block_on(fleet.release(&me)).unwrap();
    // Another run asks for h1 first, alone: once it has it, this run holds nothing more.
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(order.last().map(String::as_str), Some("h1"), "{order:?}");
    for h in ["h1", "h2", "h3"] {
        assert!(
            !dir.path().join(h).join("var/lib/drover/lock").exists(),
            "{h}"
        );
    }
}

#[test]
fn a_host_locked_at_two_of_its_steps_is_given_back_once() {
    let dir = tempfile::tempdir().unwrap();
    let (transport, order) = Releases::on(dir.path());
    let fleet = FleetLock::new(transport.clone(), targets(&["h1"]), "var/lib/drover", 8);
    let h2 = &targets(&["h2"])[0];
    let me = Holder::me("shop", "run-a");
    block_on(fleet.acquire(&me, false)).unwrap();
    // h2 left unread: locked by the step of each of its two services, the second finding
    // the lock its own.
    block_on(async {
        let link = transport.connect(h2).await.unwrap();
        for _ in 0..2 {
            fleet.lock_at_step(&link, h2, &me).await.expect("locked");
        }
    });
    block_on(fleet.release(&me)).unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(order, ["h2", "h1"], "each given back once, h1 last");
}
