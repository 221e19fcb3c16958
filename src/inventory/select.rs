//! `--on SELECTOR`: which hosts a command touches. Pure parsing and matching, no I/O.
//!
//! A selector is a comma-separated list of terms, each `class:NAME`, `host:NAME` or
//! `tag:KEY=VALUE`, optionally led by `!` to exclude. The hosts selected are the union of the
//! positive terms (every host when there is none) minus the union of the exclusions. `*` in a
//! name or tag value matches any run of characters. Every term must match at least one host:
//! a misspelt term, positive or excluding, is an error rather than a silently wider or
//! narrower rollout.

use super::{Host, HostId, Hosts};
use crate::site::{suggest, ClassId, Site};
use miette::{NamedSource, SourceSpan};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// The kinds of term, as written before the `:`.
pub const KINDS: [&str; 3] = ["class", "host", "tag"];

const FORMS: &str = "write class:NAME, host:NAME or tag:KEY=VALUE, comma-separated; `!` before one excludes; `*` matches any characters";

/// A parsed `--on` selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The selector as given (several `--on` joined with commas): what errors point into.
    pub text: String,
    pub terms: Vec<Term>,
}

/// One comma-separated part of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// Led by `!`: remove these hosts.
    pub exclude: bool,
    pub matcher: Matcher,
    /// Where the term is in [`Selector::text`].
    pub span: SourceSpan,
}

/// What a term looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// Hosts playing a class whose name matches.
    Class(Glob),
    /// Hosts whose name matches.
    Host(Glob),
    /// Hosts with this tag, its value matching.
    Tag { key: String, value: Glob },
}

/// A name pattern: `*` matches any run of characters (none included); all else is literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(pub String);

impl Glob {
    /// Whether the pattern has a `*`.
    pub fn is_pattern(&self) -> bool {
        self.0.contains('*')
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or("");
        let Some(mut rest) = text.strip_prefix(first) else {
            return false;
        };
        let Some(last) = parts.next_back() else {
            return rest.is_empty();
        };
        // Leftmost match of each middle part leaves the most room for the others.
        for mid in parts {
            match rest.find(mid) {
                Some(i) => rest = &rest[i + mid.len()..],
                None => return false,
            }
        }
        rest.ends_with(last)
    }
}

/// A selector that cannot be used; each is a usage error naming the term at fault.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum SelectError {
    #[error("`{term}` is not a selector: {reason}")]
    #[diagnostic(code(drover::select::malformed), help("{help}"))]
    Malformed {
        term: String,
        reason: String,
        help: String,
        #[source_code]
        selector: Arc<NamedSource<String>>,
        #[label("{reason}")]
        span: SourceSpan,
    },
    #[error("`{term}` names no class of the site")]
    #[diagnostic(code(drover::select::unknown_class), help("{help}"))]
    UnknownClass {
        term: String,
        help: String,
        #[source_code]
        selector: Arc<NamedSource<String>>,
        #[label("no such class")]
        span: SourceSpan,
    },
    #[error("`{term}` matches no host")]
    #[diagnostic(code(drover::select::no_match), help("{help}"))]
    NoMatch {
        term: String,
        help: String,
        #[source_code]
        selector: Arc<NamedSource<String>>,
        #[label("matches no host")]
        span: SourceSpan,
    },
    #[error("--on `{selector}` selects no host")]
    #[diagnostic(
        code(drover::select::empty),
        help("its exclusions remove every host it includes")
    )]
    Empty { selector: String },
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::Class(g) => write!(f, "class:{g}"),
            Matcher::Host(g) => write!(f, "host:{g}"),
            Matcher::Tag { key, value } => write!(f, "tag:{key}={value}"),
        }
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("!")?;
        }
        self.matcher.fmt(f)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            t.fmt(f)?;
        }
        Ok(())
    }
}

fn source(text: &str) -> Arc<NamedSource<String>> {
    Arc::new(NamedSource::new("--on", text.to_string()))
}

impl Selector {
    /// Parses the `--on` values given (each a comma-separated list; several are joined).
    pub fn parse_all(values: &[String]) -> Result<Selector, SelectError> {
        Selector::parse(&values.join(","))
    }

    /// Parses one selector, reporting the first malformed term with a suggestion.
    pub fn parse(text: &str) -> Result<Selector, SelectError> {
        let mut terms = Vec::new();
        let mut start = 0;
        for piece in text.split(',') {
            let lead = piece.len() - piece.trim_start().len();
            let term = piece.trim();
            let span = SourceSpan::from((start + lead, term.len()));
            start += piece.len() + 1;
            let (exclude, matcher) =
                parse_term(term).map_err(|(reason, help)| SelectError::Malformed {
                    // An empty part is shown in the whole selector.
                    term: if term.is_empty() { text } else { term }.to_string(),
                    reason,
                    help,
                    selector: source(text),
                    span,
                })?;
            terms.push(Term {
                exclude,
                matcher,
                span,
            });
        }
        Ok(Selector {
            text: text.to_string(),
            terms,
        })
    }

    /// The hosts selected among `hosts` (which play the classes named `classes`, by id).
    pub fn select(
        &self,
        classes: &[&str],
        hosts: &[Host],
    ) -> Result<BTreeSet<HostId>, SelectError> {
        let mut included: Option<BTreeSet<HostId>> = None;
        let mut excluded = BTreeSet::new();
        for term in &self.terms {
            let matched = self.matches(term, classes, hosts)?;
            if term.exclude {
                excluded.extend(matched);
            } else {
                included.get_or_insert_with(BTreeSet::new).extend(matched);
            }
        }
        let mut chosen = included.unwrap_or_else(|| (0..hosts.len()).map(HostId::new).collect());
        chosen.retain(|h| !excluded.contains(h));
        if chosen.is_empty() {
            return Err(SelectError::Empty {
                selector: self.text.clone(),
            });
        }
        Ok(chosen)
    }

    /// The hosts one term matches: never none.
    fn matches(
        &self,
        term: &Term,
        classes: &[&str],
        hosts: &[Host],
    ) -> Result<BTreeSet<HostId>, SelectError> {
        let bang = if term.exclude { "!" } else { "" };
        let no_match = |help: String| SelectError::NoMatch {
            term: term.to_string(),
            help,
            selector: source(&self.text),
            span: term.span,
        };
        let found: BTreeSet<HostId> = match &term.matcher {
            Matcher::Class(glob) => {
                let ids: Vec<ClassId> = (0..classes.len())
                    .filter(|&c| glob.matches(classes[c]))
                    .map(ClassId::new)
                    .collect();
                if ids.is_empty() {
                    let help = match suggest::closest(&glob.0, classes.iter().copied()) {
                        Some(c) if !glob.is_pattern() => format!("did you mean `{bang}class:{c}`?"),
                        _ => format!("the site's classes: {}", classes.join(", ")),
                    };
                    return Err(SelectError::UnknownClass {
                        term: term.to_string(),
                        help,
                        selector: source(&self.text),
                        span: term.span,
                    });
                }
                let found = select_where(hosts, |h| h.classes.iter().any(|c| ids.contains(c)));
                if found.is_empty() {
                    return Err(no_match(format!(
                        "the inventory has no host of {}",
                        list(ids.iter().map(|&c| classes[c.index()]), "class", "classes")
                    )));
                }
                found
            }
            Matcher::Host(glob) => {
                let found = select_where(hosts, |h| glob.matches(&h.name));
                if found.is_empty() {
                    let names = hosts.iter().map(|h| &*h.name);
                    let n = hosts.len();
                    return Err(no_match(match suggest::closest(&glob.0, names) {
                        Some(c) if !glob.is_pattern() => format!("did you mean `{bang}host:{c}`?"),
                        _ if glob.is_pattern() => {
                            format!("no name of the {n} hosts in the inventory matches `{glob}`")
                        }
                        _ => format!("no host of the {n} in the inventory is named `{glob}`"),
                    }));
                }
                found
            }
            Matcher::Tag { key, value } => {
                let found =
                    select_where(hosts, |h| h.tags.get(key).is_some_and(|v| value.matches(v)));
                if found.is_empty() {
                    return Err(no_match(tag_help(bang, key, value, hosts)));
                }
                found
            }
        };
        Ok(found)
    }

    /// The hosts selected among the site's; a class term that names a service says so.
    pub fn select_in(&self, site: &Site, hosts: &Hosts) -> Result<BTreeSet<HostId>, SelectError> {
        let classes: Vec<&str> = site.classes.iter().map(|c| c.name.as_str()).collect();
        self.select(&classes, hosts.hosts.as_slice())
            .map_err(|e| match e {
                SelectError::UnknownClass {
                    term,
                    help,
                    selector,
                    span,
                } => {
                    let name = term.trim_start_matches('!').trim_start_matches("class:");
                    let help = match site.service(name) {
                        Some(_) => format!(
                        "`{name}` is a service, not a class: select services with `--only {name}`"
                    ),
                        None => help,
                    };
                    SelectError::UnknownClass {
                        term,
                        help,
                        selector,
                        span,
                    }
                }
                e => e,
            })
    }
}

impl Hosts {
    /// Only the hosts `ids`, re-indexed; warnings are kept.
    pub fn subset(&self, ids: &BTreeSet<HostId>, classes: usize) -> Hosts {
        let picked = ids
            .iter()
            .filter_map(|&i| self.hosts.get(i).cloned())
            .collect();
        let mut out = Hosts::new(picked, classes);
        out.warnings = self.warnings.clone();
        out
    }
}

fn select_where(hosts: &[Host], pick: impl Fn(&Host) -> bool) -> BTreeSet<HostId> {
    hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| pick(h))
        .map(|(i, _)| HostId::new(i))
        .collect()
}

/// "class `a`" or "classes `a`, `b`".
fn list<'a>(names: impl Iterator<Item = &'a str>, one: &str, many: &str) -> String {
    let names: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    let kind = if names.len() == 1 { one } else { many };
    format!("{kind} {}", names.join(", "))
}

/// Why `tag:KEY=VALUE` matched nothing: a near value or key, or what there is.
fn tag_help(bang: &str, key: &str, value: &Glob, hosts: &[Host]) -> String {
    const SHOWN: usize = 10;
    let values: BTreeSet<&str> = hosts
        .iter()
        .filter_map(|h| h.tags.get(key).map(String::as_str))
        .collect();
    if values.is_empty() {
        let keys: BTreeSet<&str> = hosts
            .iter()
            .flat_map(|h| h.tags.keys().map(String::as_str))
            .collect();
        return match suggest::closest(key, keys.iter().copied()) {
            Some(k) => format!("no host has a tag `{key}`; did you mean `{bang}tag:{k}={value}`?"),
            None if keys.is_empty() => "no host of the inventory has tags".into(),
            None => format!(
                "no host has a tag `{key}`; the tags are: {}",
                shorten(&keys, SHOWN)
            ),
        };
    }
    match suggest::closest(&value.0, values.iter().copied()) {
        Some(v) if !value.is_pattern() => format!("did you mean `{bang}tag:{key}={v}`?"),
        _ => format!("the values of `{key}` are: {}", shorten(&values, SHOWN)),
    }
}

/// At most `n` names, then how many more.
fn shorten(names: &BTreeSet<&str>, n: usize) -> String {
    let mut out: Vec<&str> = names.iter().copied().take(n).collect();
    let more = names.len().saturating_sub(n);
    let more = format!("… ({more} more)");
    if names.len() > n {
        out.push(&more);
    }
    out.join(", ")
}

/// One term (excluded?, what it matches), or why it is not one and what to write instead.
fn parse_term(term: &str) -> Result<(bool, Matcher), (String, String)> {
    let (exclude, body) = match term.strip_prefix('!') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, term),
    };
    let bang = if exclude { "!" } else { "" };
    if body.is_empty() {
        return Err(if term.is_empty() {
            (
                "an empty part".into(),
                format!("remove the extra comma; {FORMS}"),
            )
        } else {
            (
                "nothing follows `!`".into(),
                format!("write `!host:NAME` and the like; {FORMS}"),
            )
        });
    }
    if body.starts_with('!') {
        return Err((
            "`!` is given twice".into(),
            format!("write `{bang}{}`", body.trim_start_matches('!')),
        ));
    }
    let Some((kind, value)) = body.split_once(':') else {
        let help = match body.split_once('=') {
            Some((k, _)) if !k.is_empty() => format!("did you mean `{bang}tag:{body}`?"),
            _ => {
                format!("write `{bang}host:{body}` for a host, or `{bang}class:{body}` for a class")
            }
        };
        return Err(("it names no kind (class:, host: or tag:)".into(), help));
    };
    let matcher = match kind {
        "class" | "host" if value.is_empty() => {
            return Err((
                format!("nothing follows `{kind}:`"),
                format!("write `{bang}{kind}:NAME`"),
            ))
        }
        "class" => Matcher::Class(Glob(value.into())),
        "host" => Matcher::Host(Glob(value.into())),
        "tag" => match value.split_once('=') {
            Some((key, v)) if !key.is_empty() => Matcher::Tag {
                key: key.into(),
                value: Glob(v.into()),
            },
            _ => {
                let key = if value.is_empty() { "KEY" } else { value };
                return Err((
                    "a tag selector needs a key and a value".into(),
                    format!("write `{bang}tag:{key}=VALUE`, or `{bang}tag:{key}=*` for any value"),
                ));
            }
        },
        other => {
            let help = match suggest::closest(other, KINDS) {
                Some(k) => format!("did you mean `{bang}{k}:{value}`?"),
                None => FORMS.to_string(),
            };
            return Err((format!("`{other}` is not a kind of selector"), help));
        }
    };
    Ok((exclude, matcher))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site::IdVec;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const CLASSES: [&str; 3] = ["db", "app", "lb"];

    fn host(name: &str, classes: &[usize], zone: &str) -> Host {
        Host {
            name: name.into(),
            address: format!("10.0.0.{}", name.len()).into(),
            classes: crate::site::ids_of(classes),
            tags: BTreeMap::from([("zone".to_string(), zone.to_string())]),
        }
    }

    /// db1 db2 app1 app2 app3 lb1, and edge1 (app and lb).
    fn fleet() -> IdVec<HostId, Host> {
        Hosts::new(
            vec![
                host("db1", &[0], "eu-1a"),
                host("db2", &[0], "eu-1b"),
                host("app1", &[1], "eu-1a"),
                host("app2", &[1], "eu-1b"),
                host("app3", &[1], "eu-1a"),
                host("lb1", &[2], "eu-1b"),
                host("edge1", &[1, 2], "eu-1a"),
            ],
            3,
        )
        .hosts
    }

    /// The names of the hosts `selector` picks.
    fn names(selector: &str) -> Result<Vec<String>, SelectError> {
        let hosts = fleet();
        let ids = Selector::parse(selector)?.select(&CLASSES, hosts.as_slice())?;
        Ok(ids.into_iter().map(|i| hosts[i].name.to_string()).collect())
    }

    fn help(e: &SelectError) -> String {
        match e {
            SelectError::Malformed { help, .. }
            | SelectError::UnknownClass { help, .. }
            | SelectError::NoMatch { help, .. } => help.clone(),
            SelectError::Empty { .. } => String::new(),
        }
    }

    #[test]
    fn each_form() {
        assert_eq!(names("class:db").unwrap(), ["db1", "db2"]);
        assert_eq!(names("class:lb").unwrap(), ["edge1", "lb1"]);
        assert_eq!(names("host:app3").unwrap(), ["app3"]);
        assert_eq!(
            names("tag:zone=eu-1a").unwrap(),
            ["app1", "app3", "db1", "edge1"]
        );
    }

    #[test]
    fn union_exclusion_and_globs() {
        assert_eq!(names("class:db,host:app3").unwrap(), ["app3", "db1", "db2"]);
        assert_eq!(
            names("class:app,!host:app3").unwrap(),
            ["app1", "app2", "edge1"]
        );
        assert_eq!(
            names("!class:app, !class:db").unwrap(),
            ["lb1"],
            "only exclusions: every host but those"
        );
        assert_eq!(names("host:app*").unwrap(), ["app1", "app2", "app3"]);
        assert_eq!(
            names("host:*1,!class:d*").unwrap(),
            ["app1", "edge1", "lb1"]
        );
        assert_eq!(names("tag:zone=*b").unwrap(), ["app2", "db2", "lb1"]);
        assert_eq!(names("tag:zone=*").unwrap().len(), 7);
    }

    #[test]
    fn unmatched_terms_are_errors() {
        let e = names("class:db,host:app33").unwrap_err();
        assert!(matches!(e, SelectError::NoMatch { ref term, .. } if term == "host:app33"));
        assert_eq!(help(&e), "did you mean `host:app3`?");
        let e = names("class:app,!host:app9").unwrap_err();
        assert!(matches!(e, SelectError::NoMatch { ref term, .. } if term == "!host:app9"));
        let e = names("class:ap").unwrap_err();
        assert!(matches!(e, SelectError::UnknownClass { .. }));
        assert_eq!(help(&e), "did you mean `class:app`?");
        let e = names("tag:zone=eu-1c").unwrap_err();
        assert_eq!(help(&e), "did you mean `tag:zone=eu-1a`?");
        let e = names("tag:zona=eu-1a").unwrap_err();
        assert_eq!(
            help(&e),
            "no host has a tag `zona`; did you mean `tag:zone=eu-1a`?"
        );
        assert!(matches!(
            names("class:app,!class:app").unwrap_err(),
            SelectError::Empty { .. }
        ));
    }

    #[test]
    fn malformed_terms_suggest_a_fix() {
        let cases = [
            ("zone=a", "did you mean `tag:zone=a`?"),
            ("!zone=a", "did you mean `!tag:zone=a`?"),
            ("klass:app", "did you mean `class:app`?"),
            ("hosts:app1", "did you mean `host:app1`?"),
            (
                "app3",
                "write `host:app3` for a host, or `class:app3` for a class",
            ),
            (
                "tag:zone",
                "write `tag:zone=VALUE`, or `tag:zone=*` for any value",
            ),
            ("class:", "write `class:NAME`"),
            ("!!host:a", "write `!host:a`"),
        ];
        for (text, want) in cases {
            let e = Selector::parse(text).unwrap_err();
            assert!(matches!(e, SelectError::Malformed { .. }), "{text}");
            assert_eq!(help(&e), want, "{text}");
        }
        let e = Selector::parse("class:db,,host:a").unwrap_err();
        let SelectError::Malformed { span, .. } = e else {
            panic!("{e:?}")
        };
        assert_eq!((span.offset(), span.len()), (9, 0));
    }

    #[test]
    fn spans_point_at_the_term() {
        let s = Selector::parse("class:db, !host:app3 ,tag:a=b").unwrap();
        let at: Vec<(usize, usize)> = s
            .terms
            .iter()
            .map(|t| (t.span.offset(), t.span.len()))
            .collect();
        assert_eq!(at, [(0, 8), (10, 10), (22, 7)]);
        assert_eq!(s.to_string(), "class:db,!host:app3,tag:a=b");
    }

    #[test]
    fn globs() {
        let g = |p: &str, s: &str| Glob(p.into()).matches(s);
        assert!(g("app*", "app"));
        assert!(g("app*", "app12"));
        assert!(!g("app*", "ap"));
        assert!(g("*", ""));
        assert!(g("a*b*c", "abc"));
        assert!(g("a*b*c", "axxbyyc"));
        assert!(!g("a*b*c", "axxbyy"));
        assert!(g("*ab", "abab"));
        assert!(!g("ab*ab", "ab"));
        assert!(g("app1", "app1"));
        assert!(!g("app1", "app10"));
    }

    /// The obvious exponential matcher, to check [`Glob::matches`] against.
    fn slow_glob(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| slow_glob(rest, &s[i..])),
            Some((c, rest)) => s.first() == Some(c) && slow_glob(rest, &s[1..]),
        }
    }

    fn term() -> impl Strategy<Value = String> {
        let name = "[a-c*]{1,4}";
        prop_oneof![
            name.prop_map(|n| format!("class:{n}")),
            name.prop_map(|n| format!("host:{n}")),
            (name, name).prop_map(|(k, v)| format!("tag:{}={v}", k.replace('*', "k"))),
        ]
        .prop_flat_map(|t| prop_oneof![Just(t.clone()), Just(format!("!{t}"))])
    }

    proptest! {
        #[test]
        fn glob_agrees_with_the_slow_matcher(p in "[ab*]{0,6}", s in "[ab]{0,8}") {
            prop_assert_eq!(Glob(p.clone()).matches(&s), slow_glob(p.as_bytes(), s.as_bytes()));
        }

        /// Printing a parsed selector and parsing it again gives the same terms.
        #[test]
        fn parse_print_round_trip(terms in prop::collection::vec(term(), 1..5)) {
            let text = terms.join(" , ");
            let s = Selector::parse(&text).unwrap();
            prop_assert_eq!(s.terms.len(), terms.len());
            let again = Selector::parse(&s.to_string()).unwrap();
            let strip = |s: &Selector| s.terms.iter().map(|t| (t.exclude, t.matcher.clone())).collect::<Vec<_>>();
            prop_assert_eq!(strip(&s), strip(&again));
            for (t, written) in s.terms.iter().zip(&terms) {
                prop_assert_eq!(&text[t.span.offset()..t.span.offset() + t.span.len()], written.as_str());
            }
        }

        /// The order of terms never matters, and exclusions alone select the complement.
        #[test]
        fn order_free_and_exclusions_complement(picks in prop::collection::vec(0usize..7, 1..4)) {
            let hosts = fleet().into_vec();
            let terms: Vec<String> = picks.iter().map(|&i| format!("host:{}", hosts[i].name)).collect();
            let mut reversed = terms.clone();
            reversed.reverse();
            let a = Selector::parse(&terms.join(",")).unwrap().select(&CLASSES, &hosts).unwrap();
            let b = Selector::parse(&reversed.join(",")).unwrap().select(&CLASSES, &hosts).unwrap();
            prop_assert_eq!(&a, &b);
            let excluded: Vec<String> = terms.iter().map(|t| format!("!{t}")).collect();
            match Selector::parse(&excluded.join(",")).unwrap().select(&CLASSES, &hosts) {
                Ok(rest) => {
                    prop_assert!(rest.is_disjoint(&a));
                    prop_assert_eq!(rest.len() + a.len(), hosts.len());
                }
                Err(e) => {
                    let empty = matches!(e, SelectError::Empty { .. });
                    prop_assert!(empty && a.len() == hosts.len(), "{e:?}");
                }
            }
        }
    }
}
