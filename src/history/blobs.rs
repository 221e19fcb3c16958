//! A content-addressed store of blobs in one directory: each content kept once, named by its
//! sha256 (`<dir>/<first two hex digits>/<digest>`), written whole or not at all, checked when
//! read back.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The sha256 of a content, 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(hex(&Sha256::digest(bytes)))
    }

    /// `text` as a digest, if it is one (64 lowercase hex digits): a name that can never
    /// leave the store's directory.
    pub fn parse(text: &str) -> Option<Digest> {
        let ok = text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Digest(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Digest::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a sha256 (64 lowercase hex digits)"
            ))
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A blob that is not what its name says.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is damaged: its content's sha256 is {found}")]
    Damaged { path: PathBuf, found: Digest },
}

/// How much of a content is read or written at once.
const BLOCK: usize = 256 * 1024;

/// Numbers each incoming blob's temporary file within this process.
static INCOMING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A blob being written: its bytes go to a temporary file of its own in the store and into
/// its digest; [`Writer::finish`] syncs it and renames it to its digest (a content the store
/// has already is not replaced). Dropped unfinished, it leaves nothing.
pub struct Writer {
    blobs: Blobs,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    hasher: Sha256,
}

impl Writer {
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.hasher.update(bytes);
        let file = self.file.as_mut().ok_or_else(|| BlobError::Write {
            path: self.tmp.clone(),
            source: std::io::Error::other("already finished"),
        })?;
        file.write_all(bytes).map_err(|source| BlobError::Write {
            path: self.tmp.clone(),
            source,
        })
    }

    /// Keeps the blob and returns its digest; with `expected`, only if it is that content
    /// (else nothing is kept, and the error names what it is).
    pub fn finish(mut self, expected: Option<&Digest>) -> Result<Digest, BlobError> {
        let digest = Digest(hex(&self.hasher.clone().finalize()));
        let path = self.blobs.path(&digest);
        if let Some(expected) = expected.filter(|e| **e != digest) {
            return Err(BlobError::Damaged {
                path: self.blobs.path(expected),
                found: digest,
            });
        }
        let file = self.file.take();
        if path.is_file() {
            return Ok(digest);
        }
        let failed = |source| BlobError::Write {
            path: path.clone(),
            source,
        };
        file.map_or(Ok(()), |f| f.sync_all()).map_err(failed)?;
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
            .and_then(|()| std::fs::rename(&self.tmp, &path))
            .map_err(failed)?;
        Ok(digest)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Renamed away when finished; anything else left here is no blob.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// The store: a directory of blobs.
#[derive(Debug, Clone)]
pub struct Blobs {
    dir: PathBuf,
}

impl Blobs {
    pub fn new(dir: impl Into<PathBuf>) -> Blobs {
        Blobs { dir: dir.into() }
    }

    /// Where the blob of `digest` is kept.
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(&digest.as_str()[..2]).join(digest.as_str())
    }

    /// Whether the blob of `digest` is there (not checked).
    pub fn has(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Keeps `bytes` (once: a content already there is not written again) and returns its
    /// digest. Written to a file of its own, synced, then renamed into place: a reader never
    /// sees half a blob, and two writers of one content each put a whole one there.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, BlobError> {
        let mut w = self.writer()?;
        w.write(bytes)?;
        w.finish(None)
    }

    /// Keeps the content of the file at `path`, read a block at a time (a file of any size
    /// is never held whole), and returns its digest.
    pub fn put_file(&self, path: &Path) -> Result<Digest, BlobError> {
        use std::io::Read as _;
        let read_failed = |source| BlobError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read_failed)?;
        let mut w = self.writer()?;
        let mut block = vec![0u8; BLOCK];
        loop {
            let n = file.read(&mut block).map_err(read_failed)?;
            if n == 0 {
                break;
            }
            w.write(&block[..n])?;
        }
        w.finish(None)
    }

    /// A blob to write piece by piece ([`Writer::finish`] names and keeps it).
    pub fn writer(&self) -> Result<Writer, BlobError> {
        let tmp = self.dir.join(format!(
            ".incoming.{}.{}",
            std::process::id(),
            INCOMING.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let file = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::File::create(&tmp))
            .map_err(|source| BlobError::Write {
                path: tmp.clone(),
                source,
            })?;
        Ok(Writer {
            blobs: self.clone(),
            tmp,
            file: Some(file),
            hasher: Sha256::new(),
        })
    }

    /// Copies the blob of `digest` to `to`, a block at a time, checked against its digest (a
    /// damaged one leaves nothing at `to`); `Ok(false)` when the store does not have it.
    pub fn copy_to(&self, digest: &Digest, to: &Path) -> Result<bool, BlobError> {
        use std::io::Read as _;
        let path = self.path(digest);
        let mut from = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(BlobError::Read { path, source }),
        };
        let write_failed = |source| BlobError::Write {
            path: to.to_path_buf(),
            source,
        };
        let mut out = std::fs::File::create(to).map_err(write_failed)?;
        let mut hasher = Sha256::new();
        let mut block = vec![0u8; BLOCK];
        loop {
            let n = from.read(&mut block).map_err(|source| BlobError::Read {
                path: path.clone(),
                source,
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&block[..n]);
            out.write_all(&block[..n]).map_err(write_failed)?;
        }
        let found = Digest(hex(&hasher.finalize()));
        if &found != digest {
            let _ = std::fs::remove_file(to);
            return Err(BlobError::Damaged { path, found });
        }
        Ok(true)
    }

    /// The blob of `digest`, checked against it; `None` when the store does not have it.
    pub fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, BlobError> {
        let path = self.path(digest);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(BlobError::Read { path, source }),
        };
        let found = Digest::of(&bytes);
        if &found != digest {
            return Err(BlobError::Damaged { path, found });
        }
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_digest_is_64_lowercase_hex_digits_and_nothing_else() {
        let d = Digest::of(b"v1");
        assert_eq!(Digest::parse(d.as_str()), Some(d.clone()));
        for bad in [
            "",
            "../../etc/passwd",
            &d.as_str().to_uppercase(),
            &d.as_str()[1..],
        ] {
            assert_eq!(Digest::parse(bad), None, "{bad}");
        }
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"../x\"").is_err());
    }

    #[test]
    fn a_damaged_blob_is_found_out_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(dir.path());
        let d = blobs.put(b"listen 80\n").unwrap();
        std::fs::write(blobs.path(&d), b"listen 81\n").unwrap();
        assert!(matches!(blobs.get(&d), Err(BlobError::Damaged { .. })));
        assert!(blobs.get(&Digest::of(b"other")).unwrap().is_none());
    }

    proptest! {
        /// Any contents come back as they went in, each content is kept once whatever the
        /// number of puts, and the store holds nothing else (no temporary file left).
        #[test]
        fn contents_come_back_each_kept_once(
            contents in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..12),
            repeats in 1usize..3,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let blobs = Blobs::new(dir.path().join("blobs"));
            let mut digests = Vec::new();
            for _ in 0..repeats {
                for c in &contents {
                    digests.push((blobs.put(c).unwrap(), c.clone()));
                }
            }
            for (d, c) in &digests {
                prop_assert_eq!(d, &Digest::of(c));
                prop_assert_eq!(blobs.get(d).unwrap(), Some(c.clone()));
            }
            let distinct: std::collections::BTreeSet<&Vec<u8>> = contents.iter().collect();
            let mut files = 0;
            for sub in std::fs::read_dir(dir.path().join("blobs")).unwrap() {
                for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
                    let name = f.unwrap().file_name().into_string().unwrap();
                    prop_assert!(Digest::parse(&name).is_some(), "{}", name);
                    files += 1;
                }
            }
            prop_assert_eq!(files, distinct.len());
        }
    }
}
