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
    /// The name of every file read, in the order read.
    files: Vec<String>,
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
        self.files.push(shown.clone());
        // Contents only, in reading order: the same files give the same digest from any
        // directory, however their paths are spelt.
        self.hasher.update((text.len() as u64).to_le_bytes());
        self.hasher.update(text.as_bytes());
        let src = NamedSource::new(&shown, Arc::new(text));
        match KdlDocument::parse_v2(src.inner()) {
            Ok(doc) => Some((src, doc)),
            Err(e) => {
                let unclosed = e
                    .diagnostics
                    .iter()
                    .any(|d| d.message.as_deref() == Some(UNCLOSED));
                errors.extend(
                    e.diagnostics
                        .into_iter()
                        // kdl follows an unclosed block with a second report spanning its body.
                        .filter(|d| !(unclosed && d.message.as_deref() == Some(NOT_FOUND_AFTER)))
                        .map(|d| syntax(&src, d)),
                );
                None
            }
        }
    }

    /// Reads a file that is not KDL (a template) into the digest and the list of files read.
    pub fn read_text(&mut self, path: &Path) -> std::io::Result<Src> {
        let text = std::fs::read_to_string(path)?;
        let shown = path.display().to_string();
        self.files.push(shown.clone());
        self.hasher.update((text.len() as u64).to_le_bytes());
        self.hasher.update(text.as_bytes());
        Ok(NamedSource::new(&shown, Arc::new(text)))
    }

    /// The files read so far, as diagnostics name them, in the order read.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// sha256 over every file read, hex.
    pub fn digest(&self) -> String {
        let bytes = self.hasher.clone().finalize();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

const UNCLOSED: &str = "No closing '}' for child block";
const NOT_FOUND_AFTER: &str = "Closing '}' was not found after nodes";

/// One KDL parse error as a site diagnostic, with kdl's wording and spans made plainer.
fn syntax(src: &Src, d: kdl::KdlDiagnostic) -> SiteError {
    let text = src.inner().as_str();
    let mut span = d.span;
    // kdl sometimes starts the span of a half-parsed value at the start of the document;
    // narrow it to the token that ends it (`timeout=30s` → `30s`).
    let end = (span.offset() + span.len()).min(text.len());
    if span.offset() == 0 && text[..end].contains('\n') {
        let start = text[..end]
            .char_indices()
            .rfind(|(_, c)| c.is_whitespace() || *c == '=')
            .map_or(0, |(i, c)| i + c.len_utf8());
        let stop = text[end..]
            .find(|c: char| c.is_whitespace() || matches!(c, ';' | '{' | '}'))
            .map_or(text.len(), |i| end + i);
        span = (start..stop).into();
    }
    let token = text
        .get(span.offset()..span.offset() + span.len())
        .unwrap_or("");
    // kdl's own wording ("Expected property value", label "not property value"), lower-cased.
    let unclosed = d.message.as_deref() == Some(UNCLOSED);
    let kdl_label = d.label.unwrap_or_else(|| "here".into());
    let kdl_message = message_case(d.message.as_deref().unwrap_or("invalid KDL"));
    let expected = |what: &str| format!("expected {what}");
    let (message, label, help) = match token {
        _ if unclosed => (
            "a block is never closed".to_string(),
            "this `{` has no matching `}`".to_string(),
            "add the `}` that ends this block".to_string(),
        ),
        "}" => (
            "a `}` closes no block".into(),
            "nothing may follow here".into(),
            "remove it, or add the `{` it belongs to".into(),
        ),
        "true" | "false" | "null" => (
            format!("bare `{token}` is not a KDL 2.0 value"),
            expected("`#true`, `#false`, `#null` or a quoted string"),
            format!("write `#{token}`, or `\"{token}\"` if it is a string"),
        ),
        _ if token.starts_with(|c: char| c.is_ascii_digit())
            && token.contains(|c: char| !c.is_ascii_digit()) =>
        {
            (
                format!("`{token}` is not a number, and a string needs quotes"),
                "put this in double quotes".into(),
                format!("durations, percentages and versions are strings, as in `\"{token}\"`"),
            )
        }
        _ => {
            let label = match kdl_label.strip_prefix("not ") {
                Some("EOF") => "expected the end of the file".into(),
                Some(what) => expected(what),
                None => kdl_label,
            };
            let help = d
                .help
                .unwrap_or_else(|| "site files are KDL 2.0; see https://kdl.dev".into());
            (kdl_message, label, help)
        }
    };
    SiteError::Syntax {
        message,
        label,
        help: Some(help),
        span,
        src: src.clone(),
    }
}

/// "Expected property value" → "expected property value".
fn message_case(message: &str) -> String {
    let mut chars = message.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
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

/// `path` with `.` dropped and each `..` taking off the component before it, if there is one
/// (lexically: links are not followed).
pub fn normalize(path: &Path) -> PathBuf {
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

    /// Every syntax diagnostic of `text` as (message, label, help, spanned text).
    fn syntax_errors(text: &str) -> Vec<(String, String, String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.kdl");
        std::fs::write(&path, text).unwrap();
        let mut errors = Vec::new();
        assert!(Sources::default().load(&path, None, &mut errors).is_none());
        errors
            .into_iter()
            .map(|e| match e {
                SiteError::Syntax {
                    message,
                    label,
                    help,
                    span,
                    ..
                } => (
                    message,
                    label,
                    help.unwrap_or_default(),
                    text[span.offset()..span.offset() + span.len()].to_string(),
                ),
                other => panic!("not a syntax error: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_unclosed_block_is_one_problem_at_its_brace() {
        let found = syntax_errors("a 1\nb {\n    c 1\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "a block is never closed");
        assert_eq!(found[0].3, "{");
    }

    #[test]
    fn a_stray_brace_says_so() {
        let found = syntax_errors("a 1\nb { c 1; }}\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "a `}` closes no block");
        assert_eq!(found[0].3, "}");
    }

    #[test]
    fn bare_keywords_point_at_kdl2_spelling() {
        let found = syntax_errors("a 1\nb enabled=true\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].2.contains("`#true`"), "{found:?}");
        assert_eq!(found[0].3, "true");
    }

    #[test]
    fn unquoted_durations_are_pointed_at_exactly() {
        // kdl spans this error from the start of the document.
        let found = syntax_errors("a 1\nb {\n    check \"x\" timeout=30s\n}\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].3, "30s");
        assert!(found[0].2.contains("`\"30s\"`"), "{found:?}");
        let found = syntax_errors("a 1\nb 8.0.0\n");
        assert_eq!(found[0].3, "8.0.0");
        assert!(found[0].2.contains("`\"8.0.0\"`"), "{found:?}");
    }

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
