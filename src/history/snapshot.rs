//! A run's snapshot: every file its site was read from and every file it delivered, each named
//! by its path from the site file's directory and kept by digest; taken from a loaded site, and
//! put back into a directory for the site stage to load again. Secrets are never in it: a
//! secret's source (a variable's name, a file's path) is in the site file, its value is not.

use super::blobs::{Blobs, Digest};
use super::HistoryError;
use crate::site::{normalize_path, Site};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::path::{Component, Path, PathBuf};

/// A path of a snapshot: relative to the site file's directory, `/`-separated, plain names
/// after any leading `..` (a file beside or above the site's directory), never absolute.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SnapPath(String);

impl SnapPath {
    /// `text` if it is such a path.
    pub fn parse(text: &str) -> Option<SnapPath> {
        let parts: Vec<&str> = text.split('/').collect();
        let ups = parts.iter().take_while(|p| **p == "..").count();
        let rest = &parts[ups..];
        let plain = |p: &&str| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\0');
        (!rest.is_empty() && rest.iter().all(plain)).then(|| SnapPath(text.to_string()))
    }

    /// The path from the directory `base` to `path`, both absolute and normalized.
    fn between(base: &Path, path: &Path) -> Option<SnapPath> {
        let names = |p: &Path| -> Option<Vec<String>> {
            p.components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .map(|c| c.as_os_str().to_str().map(str::to_string))
                .collect()
        };
        let (base, path) = (names(base)?, names(path)?);
        let common = base.iter().zip(&path).take_while(|(a, b)| a == b).count();
        let mut parts = vec!["..".to_string(); base.len() - common];
        parts.extend(path[common..].iter().cloned());
        SnapPath::parse(&parts.join("/"))
    }

    /// How many `..` it starts with.
    fn ups(&self) -> usize {
        self.0.split('/').take_while(|p| *p == "..").count()
    }

    /// Where it is when the site file's directory is `dir`.
    pub fn under(&self, dir: &Path) -> PathBuf {
        normalize_path(&dir.join(&self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for SnapPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SnapPath::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not a relative path of a snapshot"))
        })
    }
}

/// One file the site was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub path: SnapPath,
    pub digest: Digest,
}

/// One file a service delivers to its hosts (its source's content; a template is rendered per
/// host from it, and is also among the files the site was read from).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    pub service: String,
    pub to: String,
    pub source: SnapPath,
    pub template: bool,
    pub digest: Digest,
}

/// What a run applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The site file.
    pub site_file: SnapPath,
    /// sha256 over the files the site was read from, as the site stage computes it.
    pub site_digest: String,
    /// The files the site was read from, in reading order: the site file, its platform and
    /// policies, includes, templates.
    pub sources: Vec<Kept>,
    pub delivered: Vec<Delivered>,
}

/// `path` absolute (from the current directory) and normalized, links not followed.
pub(super) fn absolute(path: &Path) -> Result<PathBuf, HistoryError> {
    // `site.kdl`'s directory is the current one.
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    std::path::absolute(path)
        .map(|p| normalize_path(&p))
        .map_err(|source| HistoryError::Read {
            path: path.to_path_buf(),
            source,
        })
}

impl Snapshot {
    /// Keeps every file `site` was read from and every file it delivers in `blobs`, and lists
    /// them. Each is read again here: a file changed since the site was loaded (its digest no
    /// longer the site's) is refused, so the snapshot is what the run applies.
    pub fn take(site: &Site, blobs: &Blobs) -> Result<Snapshot, HistoryError> {
        let base = absolute(site.file.parent().unwrap_or(Path::new("")))?;
        let named = |path: &Path| -> Result<SnapPath, HistoryError> {
            SnapPath::between(&base, &absolute(path)?).ok_or_else(|| HistoryError::Unnamed {
                path: path.to_path_buf(),
            })
        };
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| HistoryError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let keep = |bytes: &[u8]| blobs.put(bytes).map_err(HistoryError::Blob);
        let mut hasher = Sha256::new();
        let mut sources = Vec::with_capacity(site.sources.len());
        for path in &site.sources {
            let bytes = read(path)?;
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
            sources.push(Kept {
                path: named(path)?,
                digest: keep(&bytes)?,
            });
        }
        let digest: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if digest != site.digest {
            return Err(HistoryError::Changed {
                site: site.file.clone(),
            });
        }
        let mut delivered = Vec::new();
        for service in &site.services {
            for f in &service.files {
                delivered.push(Delivered {
                    service: service.name.clone(),
                    to: f.to.clone(),
                    source: named(&f.source)?,
                    template: f.template.is_some(),
                    digest: blobs.put_file(&f.source).map_err(HistoryError::Blob)?,
                });
            }
        }
        Ok(Snapshot {
            site_file: named(&site.file)?,
            site_digest: site.digest.clone(),
            sources,
            delivered,
        })
    }

    /// Every content it names.
    pub fn digests(&self) -> impl Iterator<Item = &Digest> {
        self.sources
            .iter()
            .map(|k| &k.digest)
            .chain(self.delivered.iter().map(|d| &d.digest))
    }

    /// Writes every file back under `dir` (absolute), laid out as they were around the site
    /// file, and returns the site file's path and its directory there. A content `blobs` does
    /// not have is an error naming it.
    pub fn put_back(&self, blobs: &Blobs, dir: &Path) -> Result<(PathBuf, PathBuf), HistoryError> {
        // Deep enough that every leading `..` stays inside `dir`.
        let ups = self
            .sources
            .iter()
            .map(|k| &k.path)
            .chain(self.delivered.iter().map(|d| &d.source))
            .chain([&self.site_file])
            .map(SnapPath::ups)
            .max()
            .unwrap_or(0);
        let mut site_dir = dir.join("site");
        for _ in 0..ups {
            site_dir.push("in");
        }
        let files = self
            .sources
            .iter()
            .map(|k| (&k.path, &k.digest))
            .chain(self.delivered.iter().map(|d| (&d.source, &d.digest)));
        for (path, digest) in files {
            let to = path.under(&site_dir);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|source| HistoryError::Write {
                    path: to.clone(),
                    source,
                })?;
            }
            if !blobs.copy_to(digest, &to).map_err(HistoryError::Blob)? {
                return Err(HistoryError::Missing {
                    path: path.as_str().to_string(),
                    digest: digest.clone(),
                });
            }
        }
        Ok((self.site_file.under(&site_dir), site_dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_snapshot_path_is_relative_and_climbs_only_first() {
        for ok in ["site.kdl", "../platforms/lab.kdl", "../../a/b", "t/x.j2"] {
            assert!(SnapPath::parse(ok).is_some(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a/../../b",
            "a//b",
            "./a",
            "a/",
            "..",
            "a/..",
        ] {
            assert!(SnapPath::parse(bad).is_none(), "{bad}");
        }
        let p = SnapPath::between(Path::new("/w/sites"), Path::new("/w/platforms/lab.kdl"));
        assert_eq!(p.map(|p| p.0), Some("../platforms/lab.kdl".to_string()));
    }

    proptest! {
        /// Any file named from any site directory is found again from that directory, and
        /// a snapshot path never leaves the directory it is put back under when that is
        /// deep enough for its `..`.
        #[test]
        fn a_path_between_two_places_leads_back(
            base in proptest::collection::vec("[a-c]{1,2}", 0..4),
            path in proptest::collection::vec("[a-c]{1,2}", 1..5),
        ) {
            let base = PathBuf::from(format!("/{}", base.join("/")));
            let path = PathBuf::from(format!("/{}", path.join("/")));
            let rel = SnapPath::between(&base, &path);
            // A path that is the base itself (or above it) is no file of the site's.
            if let Some(rel) = rel {
                prop_assert_eq!(rel.under(&base), path);
                let mut deep = PathBuf::from("/root/site");
                for _ in 0..rel.ups() {
                    deep.push("in");
                }
                prop_assert!(rel.under(&deep).starts_with("/root"));
            }
        }
    }
}
