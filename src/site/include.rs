//! The site file and the files it includes, read in place into one raw site.
//!
//! `include "services/*.kdl"` (a path or a glob, relative to the file that names it, matches
//! sorted) brings in `class`, `service`, `template` and further `include` nodes. Each node keeps
//! its own file ([`Origin`]), so every diagnostic points into the file and line it is written in.

use super::error::{line_of, SiteError, Src};
use super::raw::{self, Origin, RawSite, INCLUDED_TOP, SITE_TOP};
use super::read::{Reader, Spanned};
use super::source::{beside, Referrer, Sources};
use kdl::{KdlDocument, KdlNode};
use miette::SourceSpan;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Reads the site file at `path` and every file it includes; `None` when the site file itself
/// cannot be read or parsed (included files that cannot are reported and skipped).
pub fn read(
    sources: &mut Sources,
    errors: &mut Vec<SiteError>,
    path: &Path,
) -> Option<(Src, RawSite)> {
    let (src, doc) = sources.load(path, None, errors)?;
    let origin = Origin {
        src: src.clone(),
        path: path.to_path_buf(),
    };
    let mut walk = Walk {
        sources,
        errors,
        raw: RawSite::default(),
        seen: HashMap::new(),
        stack: Vec::new(),
        seen_site: None,
    };
    walk.seen.insert(identity(path), None);
    walk.file(&origin, &doc, true);
    Some((src, walk.raw))
}

struct Walk<'a> {
    sources: &'a mut Sources,
    errors: &'a mut Vec<SiteError>,
    raw: RawSite,
    /// Every file read, by identity → where it was first included (`None`: the site file).
    seen: HashMap<PathBuf, Option<(Src, SourceSpan)>>,
    /// The files being read, outermost first: identity and the name diagnostics show.
    stack: Vec<(PathBuf, String)>,
    seen_site: Option<SourceSpan>,
}

impl Walk<'_> {
    fn file(&mut self, origin: &Origin, doc: &KdlDocument, is_site: bool) {
        self.stack
            .push((identity(&origin.path), origin.src.name().to_string()));
        let (context, top) = if is_site {
            ("the site file", SITE_TOP)
        } else {
            ("an included file", INCLUDED_TOP)
        };
        let misplaced = |name: &str| {
            (name == "site").then(|| {
                "the `site` node belongs in the site file only; an included file holds \
                 class, service, template and include nodes"
                    .to_string()
            })
        };
        let nodes = Reader {
            src: &origin.src,
            errors: self.errors,
        }
        .known_nodes_or(doc.nodes(), context, top, misplaced);
        for node in nodes {
            let mut r = Reader {
                src: &origin.src,
                errors: self.errors,
            };
            match node.name().value() {
                "site" => {
                    if r.once(&mut self.seen_site, node) {
                        self.raw.site_span = Some(Reader::name_span(node));
                        raw::site_node(&mut r, node, &mut self.raw);
                    }
                }
                "include" => self.include(origin, node),
                _ => raw::unit(&mut r, node, origin, &mut self.raw),
            }
        }
        self.stack.pop();
    }

    /// Reads the files one `include` node names, each in place.
    fn include(&mut self, origin: &Origin, node: &KdlNode) {
        let mut r = Reader {
            src: &origin.src,
            errors: self.errors,
        };
        r.shape(node, 1, &[], false);
        let Some(pattern) = r.string_arg(node, "the file or glob to include") else {
            return;
        };
        let Some(files) = matches(&mut r, &origin.path, &pattern) else {
            return;
        };
        for file in files {
            let id = identity(&file);
            if let Some(at) = self.stack.iter().position(|(f, _)| *f == id) {
                let mut names: Vec<&str> =
                    self.stack[at..].iter().map(|(_, n)| n.as_str()).collect();
                names.push(&self.stack[at].1);
                self.errors.push(SiteError::IncludeCycle {
                    cycle: names.join(" → "),
                    src: origin.src.clone(),
                    span: pattern.span,
                });
                continue;
            }
            if let Some(first) = self.seen.get(&id) {
                let shown = file.display();
                let help = match first {
                    Some((src, span)) => format!(
                        "it is included first at {}:{}; include each file once",
                        src.name(),
                        line_of(src, *span)
                    ),
                    None => "it is the site file; include each file once".into(),
                };
                Reader {
                    src: &origin.src,
                    errors: self.errors,
                }
                .bad(
                    pattern.span,
                    "`include`".into(),
                    format!("{shown} is already included"),
                    help,
                );
                continue;
            }
            self.seen
                .insert(id, Some((origin.src.clone(), pattern.span)));
            let referrer = Referrer {
                src: &origin.src,
                span: pattern.span,
            };
            let Some((src, doc)) = self.sources.load(&file, Some(referrer), self.errors) else {
                continue;
            };
            let child = Origin { src, path: file };
            self.file(&child, &doc, false);
        }
    }
}

/// The files `pattern` names, relative to `named_in`: one path as written, or a glob's
/// matches in sorted order (none is an error).
fn matches(r: &mut Reader<'_>, named_in: &Path, pattern: &Spanned<String>) -> Option<Vec<PathBuf>> {
    let target = beside(named_in, &pattern.value);
    if !pattern.value.contains(['*', '?', '[']) {
        return Some(vec![target]);
    }
    let dir = named_in
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| ".".to_string(), |d| d.display().to_string());
    let found = match glob::glob(&target.to_string_lossy()) {
        Ok(paths) => paths,
        Err(e) => {
            r.bad(
                pattern.span,
                "`include`".into(),
                format!("not a glob: {}", e.msg),
                "write a path or a glob such as \"services/*.kdl\"".into(),
            );
            return None;
        }
    };
    let mut files: Vec<PathBuf> = found
        .filter_map(Result::ok)
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        r.bad(
            pattern.span,
            "`include`".into(),
            format!("`{}` matches no file", pattern.value),
            format!("the pattern is relative to {dir}; fix it or remove the include"),
        );
        return None;
    }
    Some(files)
}

/// A file's identity: its canonical path where it exists, else the path as resolved.
fn identity(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
