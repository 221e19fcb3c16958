//! Delivering a plain file to a host of the `local` transport (the real `/bin/sh` in a
//! temporary directory): what arrives is kept only if its source did not change while it was
//! sent.

use super::*;
use crate::desired::{digest_file, Content, Delivery};
use crate::transport::{Local, Output, Target, Transport, TransportError};
use std::path::{Path, PathBuf};

/// A `local` host whose sends can be interfered with: with `change`, the source is rewritten
/// while it is being sent (after the host read it, before `send` returns); with `lose`, what
/// arrived is removed from `<dir>/state/files` before it is committed.
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
            for e in std::fs::read_dir(self.dir.join("state/files"))
                .into_iter()
                .flatten()
            {
                std::fs::remove_file(e.expect("entry").path()).expect("remove");
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
async fn a_source_that_holds_is_stored_under_its_digest_and_placed() {
    let (dir, state, _, files) = setup();
    let link = Host::new(dir.path(), None, false).await;
    let sent = deliver(&link, &state, "app", &files, None)
        .await
        .expect("delivered");
    assert_eq!((sent.contents, sent.bytes), (1, 21));
    let stored = Path::new(&state).join("files").join(&files[0].digest);
    assert_eq!(
        std::fs::read(stored).expect("stored"),
        b"the content digested\n"
    );
    assert_eq!(
        std::fs::read(&files[0].to).expect("placed"),
        b"the content digested\n"
    );
}

#[tokio::test]
async fn a_source_changed_while_it_was_sent_is_neither_stored_nor_placed() {
    let (dir, state, source, files) = setup();
    let link = Host::new(dir.path(), Some(source), false).await;
    let Err((placed, why)) = deliver(&link, &state, "app", &files, None).await else {
        panic!("a delivery of a source that changed while it was sent succeeded");
    };
    assert!(!placed, "nothing was put in place");
    assert!(why.contains("changed after this run read it"), "{why}");
    let store = Path::new(&state).join("files");
    let left: Vec<String> = std::fs::read_dir(&store)
        .expect("the store")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the store keeps nothing of it");
    assert!(!Path::new(&files[0].to).exists());
}

#[tokio::test]
async fn a_commit_that_fails_reports_nothing_placed() {
    let (dir, state, _, files) = setup();
    let link = Host::new(dir.path(), None, true).await;
    let Err((placed, why)) = deliver(&link, &state, "app", &files, None).await else {
        panic!("a delivery whose content could not be committed succeeded");
    };
    // Nothing to put back: the previous list of what was replaced still stands.
    assert!(!placed, "{why}");
    assert!(why.contains("cannot store the received content"), "{why}");
    assert!(!Path::new(&files[0].to).exists());
}
