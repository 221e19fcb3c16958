//! Reading site, platform and policy files and parsing them as KDL 2.0.

use super::error::{SiteError, Src};
use kdl::KdlDocument;
use miette::{NamedSource, SourceSpan};
use sha2::{Digest, Sha256};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// A running digest over every file read so far.
#[derive(Default)]
pub struct Sources {
    hasher: Sha256,
}

/// Where a file was named, for "cannot read" diagnostics.
pub struct Referrer<'a> {
    pub src: &'a Src,
    pub span: SourceSpan,
}

impl Sources {
    /// Reads and parses `path`; reports an unreadable file or KDL syntax errors into `errors`.
    pub fn load(
        &mut self,
        path: &Path,
        from: Option<Referrer<'_>>,
        errors: &mut Vec<SiteError>,
    ) -> Option<(Src, KdlDocument)> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                errors.push(SiteError::Unreadable {
                    path: shown,
                    reason: e.to_string(),
                    src: from.as_ref().map(|r| r.src.clone()),
                    span: from.as_ref().map(|r| r.span),
                    help: "check the path; paths in a file are relative to that file's directory"
                        .into(),
                });
                return None;
            }
        };
        self.hasher.update(shown.as_bytes());
        self.hasher.update([0]);
        self.hasher.update(text.as_bytes());
        let src = NamedSource::new(&shown, Arc::new(text));
        match KdlDocument::parse_v2(src.inner()) {
            Ok(doc) => Some((src, doc)),
            Err(e) => {
                errors.extend(e.diagnostics.into_iter().map(|d| SiteError::Syntax {
                    message: d.message.unwrap_or_else(|| "invalid KDL".into()),
                    label: d.label.unwrap_or_else(|| "here".into()),
                    help: d.help,
                    span: d.span,
                    src: src.clone(),
                }));
                None
            }
        }
    }

    /// sha256 over every file read, hex.
    pub fn digest(&self) -> String {
        let bytes = self.hasher.clone().finalize();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// `relative` resolved against the directory of `file`, with `.` and `..` folded lexically.
pub fn beside(file: &Path, relative: &str) -> PathBuf {
    let joined = match file.parent() {
        Some(dir) => dir.join(relative),
        None => PathBuf::from(relative),
    };
    normalize(&joined)
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let last_is_normal =
                    matches!(out.components().next_back(), Some(Component::Normal(_)));
                if last_is_normal {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_beside_their_file() {
        assert_eq!(
            beside(Path::new("sites/a.kdl"), "../platforms/lab.kdl"),
            PathBuf::from("platforms/lab.kdl")
        );
        assert_eq!(
            beside(Path::new("a.kdl"), "../p.kdl"),
            PathBuf::from("../p.kdl")
        );
        assert_eq!(
            beside(Path::new("/x/sites/a.kdl"), "./p.kdl"),
            PathBuf::from("/x/sites/p.kdl")
        );
        assert_eq!(
            beside(Path::new("s/a.kdl"), "/abs/p.kdl"),
            PathBuf::from("/abs/p.kdl")
        );
    }
}
