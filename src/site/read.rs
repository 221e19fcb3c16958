//! Typed access to KDL nodes that reports every misuse as a diagnostic instead of stopping.

use super::error::{SiteError, Src};
use super::suggest;
use super::value::{parse_duration, parse_size, Quota};
use kdl::{KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;
use std::time::Duration;

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned<T> {
    pub value: T,
    pub span: SourceSpan,
}

/// Reads nodes of one file, collecting diagnostics.
pub struct Reader<'a> {
    pub src: &'a Src,
    pub errors: &'a mut Vec<SiteError>,
}

impl Reader<'_> {
    pub fn name_span(node: &KdlNode) -> SourceSpan {
        node.name().span()
    }

    /// The child nodes of `node` whose names are in `known`; others are reported.
    pub fn children<'n>(&mut self, node: &'n KdlNode, known: &[&str]) -> Vec<&'n KdlNode> {
        let context = format!("`{}`", node.name().value());
        let Some(doc) = node.children() else {
            return Vec::new();
        };
        self.known_nodes(doc.nodes(), &context, known)
    }

    /// The nodes whose names are in `known`; others are reported as unknown in `context`.
    pub fn known_nodes<'n>(
        &mut self,
        nodes: &'n [KdlNode],
        context: &str,
        known: &[&str],
    ) -> Vec<&'n KdlNode> {
        self.known_nodes_or(nodes, context, known, |_| None)
    }

    /// As [`Reader::known_nodes`], with `misplaced` giving the help for a node that is known
    /// elsewhere (a `service` inside a `template`) instead of a did-you-mean.
    pub fn known_nodes_or<'n>(
        &mut self,
        nodes: &'n [KdlNode],
        context: &str,
        known: &[&str],
        misplaced: impl Fn(&str) -> Option<String>,
    ) -> Vec<&'n KdlNode> {
        let mut out = Vec::with_capacity(nodes.len());
        for n in nodes {
            let name = n.name().value();
            if known.contains(&name) {
                out.push(n);
            } else {
                self.errors.push(SiteError::UnknownNode {
                    name: name.into(),
                    context: context.into(),
                    src: self.src.clone(),
                    span: Self::name_span(n),
                    help: misplaced(name).unwrap_or_else(|| suggest::help(name, "node", known)),
                });
            }
        }
        out
    }

    /// Reports properties outside `allowed`, positional arguments beyond `max_args`,
    /// and a children block when `children` is false.
    pub fn shape(&mut self, node: &KdlNode, max_args: usize, allowed: &[&str], children: bool) {
        let node_name = node.name().value();
        let mut args = 0;
        for e in node.entries() {
            match e.name() {
                Some(key) if !allowed.contains(&key.value()) => {
                    let help = if allowed.is_empty() {
                        format!("`{node_name}` takes no properties")
                    } else {
                        suggest::help(key.value(), "property", allowed)
                    };
                    self.errors.push(SiteError::UnknownProperty {
                        name: key.value().into(),
                        node: node_name.into(),
                        src: self.src.clone(),
                        span: e.span(),
                        help,
                    });
                }
                Some(_) => {}
                None => {
                    args += 1;
                    if args > max_args {
                        self.bad(
                            e.span(),
                            format!("`{node_name}`"),
                            "one value too many".into(),
                            format!("`{node_name}` takes {}", plural(max_args, "value")),
                        );
                    }
                }
            }
        }
        if !children {
            if let Some(doc) = node.children() {
                self.bad(
                    doc.span(),
                    format!("`{node_name}`"),
                    "unexpected block".into(),
                    format!("`{node_name}` takes no children; remove the braces"),
                );
            }
        }
    }

    pub fn bad(&mut self, span: SourceSpan, what: String, reason: String, help: String) {
        self.errors.push(SiteError::BadValue {
            what,
            reason,
            src: self.src.clone(),
            span,
            help,
        });
    }

    pub fn missing(&mut self, span: SourceSpan, what: String, help: String) {
        self.errors.push(SiteError::Missing {
            what,
            src: self.src.clone(),
            span,
            help,
        });
    }

    /// The first positional argument, if present.
    fn arg(node: &KdlNode) -> Option<&KdlEntry> {
        node.entries().iter().find(|e| e.name().is_none())
    }

    /// The property `key`; a repeated key is reported and the last one wins, as in KDL.
    fn prop<'n>(&mut self, node: &'n KdlNode, key: &str) -> Option<&'n KdlEntry> {
        let mut found: Option<&KdlEntry> = None;
        for e in node.entries() {
            if e.name().is_some_and(|n| n.value() == key) {
                if let Some(first) = found {
                    self.errors.push(SiteError::Duplicate {
                        kind: "property".into(),
                        name: key.into(),
                        src: self.src.clone(),
                        first: first.span(),
                        second: e.span(),
                        help: format!("give `{key}` once"),
                    });
                }
                found = Some(e);
            }
        }
        found
    }

    /// The required string argument of `node` (`service "api"`), reported when absent.
    pub fn string_arg(&mut self, node: &KdlNode, what: &str) -> Option<Spanned<String>> {
        match Self::arg(node) {
            Some(e) => self.string(e, what),
            None => {
                let n = node.name().value();
                self.missing(
                    Self::name_span(node),
                    what.into(),
                    format!("write it as `{n} \"…\"`"),
                );
                None
            }
        }
    }

    /// An optional string property.
    pub fn string_prop(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<String>> {
        let e = self.prop(node, key)?;
        self.string(e, &format!("`{key}`"))
    }

    fn string(&mut self, e: &KdlEntry, what: &str) -> Option<Spanned<String>> {
        match e.value() {
            KdlValue::String(s) => Some(Spanned {
                value: s.clone(),
                span: e.span(),
            }),
            other => {
                self.bad(
                    e.span(),
                    what.into(),
                    format!("expected a string, found {}", kind(other)),
                    "put the value in double quotes".into(),
                );
                None
            }
        }
    }

    /// The integer argument or property, within `lo..=hi`.
    pub fn integer(
        &mut self,
        e: &KdlEntry,
        what: &str,
        lo: i128,
        hi: i128,
    ) -> Option<Spanned<u64>> {
        match e.value() {
            KdlValue::Integer(i) if (lo..=hi).contains(i) => Some(Spanned {
                value: u64::try_from(*i).ok()?,
                span: e.span(),
            }),
            KdlValue::Integer(i) => {
                self.bad(
                    e.span(),
                    what.into(),
                    format!("{i} is out of range"),
                    format!("use a whole number from {lo} to {hi}"),
                );
                None
            }
            other => {
                self.bad(
                    e.span(),
                    what.into(),
                    format!("expected a whole number, found {}", kind(other)),
                    format!("use a whole number from {lo} to {hi}, without quotes"),
                );
                None
            }
        }
    }

    /// The required integer argument.
    pub fn integer_arg(
        &mut self,
        node: &KdlNode,
        what: &str,
        lo: i128,
        hi: i128,
    ) -> Option<Spanned<u64>> {
        match Self::arg(node) {
            Some(e) => self.integer(e, what, lo, hi),
            None => {
                self.missing(
                    Self::name_span(node),
                    what.into(),
                    format!("write it as `{} 1`", node.name().value()),
                );
                None
            }
        }
    }

    /// An optional integer property.
    pub fn integer_prop(
        &mut self,
        node: &KdlNode,
        key: &str,
        lo: i128,
        hi: i128,
    ) -> Option<Spanned<u64>> {
        let e = self.prop(node, key)?;
        self.integer(e, &format!("`{key}`"), lo, hi)
    }

    /// A quota: a whole number, `"P%"` or `"all"`.
    fn quota(&mut self, e: &KdlEntry, what: &str) -> Option<Spanned<Quota>> {
        let parsed = match e.value() {
            KdlValue::Integer(i) if *i >= 0 => u64::try_from(*i)
                .map(Quota::Count)
                .map_err(|_| format!("{i} is too large")),
            KdlValue::Integer(i) => Err(format!("{i} is negative")),
            KdlValue::String(s) => Quota::parse(s),
            other => Err(format!(
                "expected a count or a percentage, found {}",
                kind(other)
            )),
        };
        match parsed {
            Ok(value) => Some(Spanned {
                value,
                span: e.span(),
            }),
            Err(reason) => {
                self.bad(
                    e.span(),
                    what.into(),
                    reason,
                    "write a count (3), a percentage in quotes (\"30%\") or \"all\"".into(),
                );
                None
            }
        }
    }

    pub fn quota_arg(&mut self, node: &KdlNode, what: &str) -> Option<Spanned<Quota>> {
        match Self::arg(node) {
            Some(e) => self.quota(e, what),
            None => {
                self.missing(
                    Self::name_span(node),
                    what.into(),
                    format!("write it as `{} \"30%\"`", node.name().value()),
                );
                None
            }
        }
    }

    pub fn quota_prop(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<Quota>> {
        let e = self.prop(node, key)?;
        self.quota(e, &format!("`{key}`"))
    }

    /// A duration in a string: `"30s"`, `"1m30s"`, `"500ms"`.
    fn duration(&mut self, e: &KdlEntry, what: &str) -> Option<Spanned<Duration>> {
        if let KdlValue::Integer(i) = e.value() {
            // "put the value in double quotes" would give `"5"`, still not a duration.
            self.bad(
                e.span(),
                what.into(),
                "a duration needs a unit".into(),
                format!("write it in double quotes with a unit, as in \"{i}s\""),
            );
            return None;
        }
        let s = self.string(e, what)?;
        match parse_duration(&s.value) {
            Ok(value) => Some(Spanned {
                value,
                span: s.span,
            }),
            Err(reason) => {
                let digits = !s.value.is_empty() && s.value.bytes().all(|b| b.is_ascii_digit());
                let help = if digits {
                    format!("add a unit (ms, s, m or h), as in \"{}s\"", s.value)
                } else {
                    "write a number with a unit: ms, s, m or h, as in \"30s\" or \"1m30s\"".into()
                };
                self.bad(s.span, what.into(), reason, help);
                None
            }
        }
    }

    /// An optional size property (`"64MiB"`), or `#false` for none (`Some(None)`).
    pub fn size_or_off_prop(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<Option<u64>>> {
        let e = self.prop(node, key)?;
        let help = format!("write a size with a unit, as in `{key}=\"64MiB\"`, or `{key}=#false`");
        let reason = match e.value() {
            KdlValue::Bool(false) => {
                return Some(Spanned {
                    value: None,
                    span: e.span(),
                })
            }
            KdlValue::String(s) => match parse_size(s) {
                Ok(n) => {
                    return Some(Spanned {
                        value: Some(n),
                        span: e.span(),
                    })
                }
                Err(reason) => reason,
            },
            KdlValue::Integer(_) => "a size needs a unit".into(),
            other => format!("expected a size, found {}", kind(other)),
        };
        self.bad(e.span(), format!("`{key}`"), reason, help);
        None
    }

    /// An optional boolean property (`#true` / `#false`).
    pub fn bool_prop(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<bool>> {
        let e = self.prop(node, key)?;
        match e.value() {
            KdlValue::Bool(b) => Some(Spanned {
                value: *b,
                span: e.span(),
            }),
            other => {
                self.bad(
                    e.span(),
                    format!("`{key}`"),
                    format!("expected a boolean, found {}", kind(other)),
                    format!("write `{key}=#true` or `{key}=#false`"),
                );
                None
            }
        }
    }

    /// A node's boolean argument (`prune #true`).
    pub fn bool_arg(&mut self, node: &KdlNode, what: &str) -> Option<Spanned<bool>> {
        let n = node.name().value();
        let Some(e) = Self::arg(node) else {
            self.missing(
                Self::name_span(node),
                what.into(),
                format!("write it as `{n} #true`"),
            );
            return None;
        };
        match e.value() {
            KdlValue::Bool(b) => Some(Spanned {
                value: *b,
                span: e.span(),
            }),
            other => {
                self.bad(
                    e.span(),
                    what.into(),
                    format!("expected a boolean, found {}", kind(other)),
                    format!("write `{n} #true` or `{n} #false`"),
                );
                None
            }
        }
    }

    pub fn duration_prop(&mut self, node: &KdlNode, key: &str) -> Option<Spanned<Duration>> {
        let e = self.prop(node, key)?;
        self.duration(e, &format!("`{key}`"))
    }

    pub fn duration_arg(&mut self, node: &KdlNode, what: &str) -> Option<Spanned<Duration>> {
        match Self::arg(node) {
            Some(e) => self.duration(e, what),
            None => {
                self.missing(
                    Self::name_span(node),
                    what.into(),
                    format!("write it as `{} \"30s\"`", node.name().value()),
                );
                None
            }
        }
    }

    /// Every property not in `skip`, as strings (numbers and booleans are written out).
    pub fn other_props(&mut self, node: &KdlNode, skip: &[&str]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in node.entries() {
            let Some(key) = e.name() else { continue };
            if skip.contains(&key.value()) {
                continue;
            }
            let value = match e.value() {
                KdlValue::String(s) => s.clone(),
                KdlValue::Integer(i) => i.to_string(),
                KdlValue::Float(f) => f.to_string(),
                KdlValue::Bool(b) => b.to_string(),
                KdlValue::Null => {
                    self.bad(
                        e.span(),
                        format!("tag `{}`", key.value()),
                        "a tag cannot be #null".into(),
                        "give the tag a value or leave it out".into(),
                    );
                    continue;
                }
            };
            out.push((key.value().to_string(), value));
        }
        out
    }

    /// Reports a second node of a name that may appear once; returns whether `node` is the first.
    pub fn once(&mut self, seen: &mut Option<SourceSpan>, node: &KdlNode) -> bool {
        let span = Self::name_span(node);
        match seen {
            Some(first) => {
                let name = node.name().value();
                self.errors.push(SiteError::Duplicate {
                    kind: "setting".into(),
                    name: name.into(),
                    src: self.src.clone(),
                    first: *first,
                    second: span,
                    help: format!("give `{name}` once"),
                });
                false
            }
            None => {
                *seen = Some(span);
                true
            }
        }
    }
}

fn kind(v: &KdlValue) -> &'static str {
    match v {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "a number",
        KdlValue::Float(_) => "a decimal number",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

fn plural(n: usize, word: &str) -> String {
    match n {
        0 => format!("no {word}"),
        1 => format!("one {word}"),
        n => crate::words::count(n, word),
    }
}
