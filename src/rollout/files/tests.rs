//! Delivering a plain file to a host of the `local` transport (the real `/bin/sh` in a
//! temporary directory): what arrives is kept only if its source did not change while it was
//! sent.

use super::*;
use crate::desired::{digest_file, Content, Delivery};
use crate::transport::{Local, Output, Target, Transport, TransportError};
use std::path::{Path, PathBuf};

/// A `local` host whose sends can be interfered with: with `change`, the source is rewritten
/// while it is being sent (after the host read it, before `send` returns); with `lose`, what
/// arrived is removed from beside its target (`<dir>/srv/.drover`) before it is placed.
struct Host {
    link: <Local as Transport>::Link,
    dir: PathBuf,
    change: Option<PathBuf>,
    lose: bool,
}

impl Host {
    async fn new(dir: &Path, change: Option<PathBuf>, lose: bool) -> Host {
        let target = Target {
            name: "host".into(),
            address: "host".into(),
        };
        let link = Local::new(dir.to_path_buf())
            .connect(&target)
            .await
            .expect("a local host");
        Host {
            link,
            dir: dir.to_path_buf(),
            change,
            lose,
        }
    }
}

impl Link for Host {
    async fn run(&self, script: &str) -> Result<Output, TransportError> {
        self.link.run(script).await
    }
    async fn send(&self, script: &str, payload: Payload<'_>) -> Result<Output, TransportError> {
        let out = self.link.send(script, payload).await;
        if let Some(source) = &self.change {
            std::fs::write(source, b"changed while it was sent\n").expect("rewrite the source");
        }
        if self.lose {
            for e in std::fs::read_dir(self.dir.join("srv/.drover"))
                .into_iter()
                .flatten()
            {
                let path = e.expect("entry").path();
                if path.to_string_lossy().ends_with(".new") {
                    std::fs::remove_file(path).expect("remove");
                }
            }
        }
        out
    }
    async fn close(self) {
        self.link.close().await
    }
}

/// A host directory, a source file and its delivery to `<host>/srv/app.conf`.
fn setup() -> (tempfile::TempDir, String, PathBuf, Vec<Delivery>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let source = dir.path().join("app.conf");
    std::fs::write(&source, b"the content digested\n").expect("source");
    let (digest, stamp) = digest_file(&source).expect("digest");
    let files = vec![Delivery {
        to: dir.path().join("srv/app.conf").display().to_string(),
        mode: 0o644,
        digest,
        content: Content::Path {
            path: source.clone(),
            stamp,
        },
    }];
    (dir, state, source, files)
}

#[tokio::test]
async fn a_source_that_holds_is_placed_and_not_sent_again() {
    let (dir, state, _, files) = setup();
    let link = Host::new(dir.path(), None, false).await;
    let sent = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!((sent.contents, sent.bytes, sent.placed), (1, 21, 1));
    assert_eq!(
        std::fs::read(&files[0].to).expect("placed"),
        b"the content digested\n"
    );
    let again = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!((again.contents, again.placed), (0, 0), "in place already");
    assert_eq!(
        again.describe(1),
        "1 file in place already, the host had every content"
    );
    // Changed on the host: sent and placed again.
    std::fs::write(&files[0].to, b"edited by hand\n").expect("edit");
    let third = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!((third.contents, third.placed), (1, 1));
    assert_eq!(
        std::fs::read(&files[0].to).expect("placed"),
        b"the content digested\n"
    );
}

#[tokio::test]
async fn a_source_changed_while_it_was_sent_is_neither_kept_nor_placed() {
    let (dir, state, source, files) = setup();
    let link = Host::new(dir.path(), Some(source), false).await;
    let Err((placed, why)) = deliver(&link, &state, "app", &files, "").await else {
        panic!("a delivery of a source that changed while it was sent succeeded");
    };
    assert!(!placed, "nothing was put in place");
    assert!(why.contains("changed after this run read it"), "{why}");
    let left = |d: &str| -> Vec<String> {
        std::fs::read_dir(dir.path().join(d))
            .expect("a directory")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(left("srv"), [".drover"], "nothing was put in place");
    assert_eq!(left("srv/.drover"), Vec::<String>::new(), "nor kept");
}

#[tokio::test]
async fn a_received_content_lost_before_its_placement_reports_nothing_placed() {
    let (dir, state, _, files) = setup();
    let link = Host::new(dir.path(), None, true).await;
    let Err((placed, why)) = deliver(&link, &state, "app", &files, "").await else {
        panic!("a delivery whose content could not be committed succeeded");
    };
    // Nothing to put back: the previous list of what was replaced still stands.
    assert!(!placed, "{why}");
    assert!(why.contains("is gone"), "{why}");
    assert!(!Path::new(&files[0].to).exists());
}

#[tokio::test]
async fn a_delivery_that_places_nothing_says_whether_a_replaced_list_is_left() {
    let (dir, state, _, files) = setup();
    std::fs::create_dir_all(dir.path().join("srv")).expect("srv");
    std::fs::write(&files[0].to, b"the old content\n").expect("old");
    let link = Host::new(dir.path(), None, false).await;
    let sent = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!(
        (sent.placed, sent.listed),
        (1, false),
        "placed: its own list"
    );
    // The step stopped there, never let go: a redo finds the file in place and places nothing,
    // but the list of what was replaced is still there.
    let redo = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!((redo.placed, redo.listed), (0, true));
    let out = link
        .run(&crate::state::let_go_script(&state, "app"))
        .await
        .expect("let go");
    assert!(out.success(), "{out:?}");
    let after = deliver(&link, &state, "app", &files, "")
        .await
        .expect("delivered");
    assert_eq!(
        (after.placed, after.listed),
        (0, false),
        "nothing left to let go of"
    );
    assert_eq!(
        std::fs::read(&files[0].to).expect("placed"),
        b"the content digested\n"
    );
}
