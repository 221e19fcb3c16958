//! Site diagnostics: every problem in every file, each pointing at its file, line and column.

use miette::{Diagnostic, LabeledSpan, NamedSource, SourceSpan};
use std::sync::Arc;
use thiserror::Error;

/// A file's text as diagnostics show it.
pub type Src = NamedSource<Arc<String>>;

/// One problem in the site, its platform or its policies.
#[derive(Debug, Error, Diagnostic)]
pub enum SiteError {
    /// A file named by the site (or the site itself) could not be read.
    #[error("cannot read {path}: {reason}")]
    #[diagnostic(code(drover::site::unreadable))]
    Unreadable {
        path: String,
        reason: String,
        #[source_code]
        src: Option<Src>,
        #[label("named here")]
        span: Option<SourceSpan>,
        #[help]
        help: String,
    },

    /// The KDL itself does not parse.
    #[error("{message}")]
    #[diagnostic(code(drover::site::syntax))]
    Syntax {
        message: String,
        #[source_code]
        src: Src,
        #[label("{label}")]
        span: SourceSpan,
        label: String,
        #[help]
        help: Option<String>,
    },

    /// A node that has no meaning where it stands.
    #[error("unknown node `{name}` in {context}")]
    #[diagnostic(code(drover::site::unknown_node))]
    UnknownNode {
        name: String,
        context: String,
        #[source_code]
        src: Src,
        #[label("not a known node here")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// A property a node does not take.
    #[error("unknown property `{name}` on `{node}`")]
    #[diagnostic(code(drover::site::unknown_property))]
    UnknownProperty {
        name: String,
        node: String,
        #[source_code]
        src: Src,
        #[label("not a property of `{node}`")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// A value of the wrong kind, or one that does not parse.
    #[error("bad value for {what}: {reason}")]
    #[diagnostic(code(drover::site::bad_value))]
    BadValue {
        what: String,
        reason: String,
        #[source_code]
        src: Src,
        #[label("{reason}")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// Something required is not there.
    #[error("{what} is missing")]
    #[diagnostic(code(drover::site::missing))]
    Missing {
        what: String,
        #[source_code]
        src: Src,
        #[label("needs {what}")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// Two definitions of one name.
    #[error("{kind} `{name}` is defined twice")]
    #[diagnostic(code(drover::site::duplicate))]
    Duplicate {
        kind: String,
        name: String,
        #[source_code]
        src: Src,
        #[label("first defined here")]
        first: SourceSpan,
        #[label("defined again here")]
        second: SourceSpan,
        #[help]
        help: String,
    },

    /// Two definitions of one name in different files.
    #[error("{kind} `{name}` is defined twice")]
    #[diagnostic(code(drover::site::duplicate))]
    DuplicateElsewhere {
        kind: String,
        name: String,
        #[source_code]
        src: Src,
        #[label("defined again here (first at {first})")]
        span: SourceSpan,
        /// `file:line` of the first definition.
        first: String,
        #[help]
        help: String,
    },

    /// A name that refers to nothing.
    #[error("unknown {kind} `{name}`")]
    #[diagnostic(code(drover::site::unknown_name))]
    UnknownName {
        kind: String,
        name: String,
        #[source_code]
        src: Src,
        #[label("no {kind} of this name")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// A service that no class runs.
    #[error("service `{name}` is in no class")]
    #[diagnostic(code(drover::site::orphan_service))]
    OrphanService {
        name: String,
        #[source_code]
        src: Src,
        #[label("no class runs this service")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// A class the inventory gives no host.
    #[error("class `{name}` has no hosts")]
    #[diagnostic(code(drover::site::empty_class))]
    EmptyClass {
        name: String,
        #[source_code]
        src: Src,
        #[label("no host in {inventory} has class=\"{name}\"")]
        span: SourceSpan,
        inventory: String,
        #[help]
        help: String,
    },

    /// A `file … template=#true` whose template does not compile or uses an unknown variable.
    #[error("template {path}: {message}")]
    #[diagnostic(code(drover::site::template))]
    Template {
        path: String,
        message: String,
        #[source_code]
        src: Src,
        #[label("{label}")]
        span: SourceSpan,
        label: String,
        #[help]
        help: String,
    },

    /// A policy's `spread` tag that no host of a class it rolls out carries (a warning: only
    /// said of a static inventory; when planning, where every inventory's hosts are known, an
    /// error).
    #[error("no host of {classes} carries the tag `{tag}` to spread over")]
    #[diagnostic(code(drover::site::spread_tag), severity(Warning))]
    SpreadTagNowhere {
        tag: String,
        /// "class `app`", "classes `app`, `db`".
        classes: String,
        #[source_code]
        src: Src,
        #[label("no host of {classes} has {tag}=…")]
        span: SourceSpan,
        #[help]
        help: String,
    },

    /// Runtime dependencies that go round in a circle.
    #[error("runtime dependency cycle: {cycle}")]
    #[diagnostic(
        code(drover::site::cycle),
        help("a runtime `needs` orders upgrades, so a cycle can never start; make one edge a data dependency (`needs \"X\" addressable=\"all\"`) if only the addresses are needed")
    )]
    Cycle {
        cycle: String,
        #[source_code]
        src: Src,
        #[label(collection)]
        edges: Vec<LabeledSpan>,
        /// The cycle's edges written in other files (included ones, or templates' files).
        #[related]
        elsewhere: Vec<SiteError>,
    },

    /// One edge of a runtime cycle, in a file other than the cycle's first edge.
    #[error("…and {label}")]
    #[diagnostic(code(drover::site::cycle))]
    CycleEdge {
        label: String,
        #[source_code]
        src: Src,
        #[label("{label}")]
        span: SourceSpan,
    },

    /// Templates that take each other's children, round in a circle.
    #[error("template cycle: {cycle}")]
    #[diagnostic(
        code(drover::site::template_cycle),
        help("a template may take another's children, but never its own; remove one `template=` of the cycle")
    )]
    TemplateCycle {
        cycle: String,
        #[source_code]
        src: Src,
        #[label("this closes the cycle")]
        span: SourceSpan,
    },

    /// Files that include each other.
    #[error("include cycle: {cycle}")]
    #[diagnostic(
        code(drover::site::include_cycle),
        help("a file may not include itself or a file that includes it; remove this include or narrow its pattern")
    )]
    IncludeCycle {
        cycle: String,
        #[source_code]
        src: Src,
        #[label("this includes a file already being read")]
        span: SourceSpan,
    },
}

impl SiteError {
    /// The file the problem is in (`None`: a file that names nothing, such as an unreadable
    /// site) and the offset in it that the problem is reported at.
    pub fn location(&self) -> (Option<&str>, usize) {
        use SiteError::*;
        let (src, span) = match self {
            Unreadable { src, span, .. } => (src.as_ref(), *span),
            Syntax { src, span, .. }
            | UnknownNode { src, span, .. }
            | UnknownProperty { src, span, .. }
            | BadValue { src, span, .. }
            | Missing { src, span, .. }
            | UnknownName { src, span, .. }
            | OrphanService { src, span, .. }
            | EmptyClass { src, span, .. }
            | SpreadTagNowhere { src, span, .. }
            | Template { src, span, .. }
            | DuplicateElsewhere { src, span, .. }
            | CycleEdge { src, span, .. }
            | TemplateCycle { src, span, .. }
            | IncludeCycle { src, span, .. } => (Some(src), Some(*span)),
            Duplicate { src, second, .. } => (Some(src), Some(*second)),
            Cycle { src, edges, .. } => (
                Some(src),
                edges.iter().map(|e| *e.inner()).min_by_key(|s| s.offset()),
            ),
        };
        (src.map(|s| s.name()), span.map_or(0, |s| s.offset()))
    }
}

impl SiteError {
    /// `name` defined again at `span` of `src`, first at `first_span` of `first_src`: one
    /// diagnostic showing both where they are in one file, else naming the first's line.
    pub fn duplicate(
        kind: &str,
        name: &str,
        (first_src, first_span): (&Src, SourceSpan),
        (src, span): (&Src, SourceSpan),
        help: String,
    ) -> SiteError {
        if first_src.name() == src.name() {
            SiteError::Duplicate {
                kind: kind.into(),
                name: name.into(),
                src: src.clone(),
                first: first_span,
                second: span,
                help,
            }
        } else {
            SiteError::DuplicateElsewhere {
                kind: kind.into(),
                name: name.into(),
                src: src.clone(),
                span,
                first: format!("{}:{}", first_src.name(), line_of(first_src, first_span)),
                help,
            }
        }
    }
}

/// The 1-based line `span` starts on in `src`.
pub fn line_of(src: &Src, span: SourceSpan) -> usize {
    let text = src.inner().as_str();
    let end = span.offset().min(text.len());
    text[..end].matches('\n').count() + 1
}

/// Every problem found, in file order.
#[derive(Debug, Error, Diagnostic)]
#[error("{} in {file}", crate::words::count(.errors.len(), "problem"))]
#[diagnostic(code(drover::site::invalid))]
pub struct SiteErrors {
    /// The site file that was checked.
    pub file: String,
    #[related]
    pub errors: Vec<SiteError>,
}
