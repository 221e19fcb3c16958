//! `env` and `file` nodes → checked variables and files: names, paths, modes, and templates
//! compiled (syntax and variable names) before anything is resolved; two services of a class
//! delivering one path.

use super::error::{SiteError, Src};
use super::model::{File, Template};
use super::raw::{RawEnv, RawFile, RawSite};
use super::read::{Reader, Spanned};
use super::source::{beside, Sources};
use miette::SourceSpan;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// The variables a template may use (`deploy check` refuses any other).
pub const TEMPLATE_VARIABLES: &[&str] = &[
    "site", "host", "address", "classes", "tags", "service", "version", "port", "env", "needs",
    "secrets",
];

/// Whether `name` may be an environment variable a hook is given (letters, digits, `_`).
pub fn variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `name` may be a variable hooks are given (an environment variable name, not one
/// of drover's own `DEPLOY_*`); reported at its span when not. `example` is a good name.
pub fn variable(r: &mut Reader<'_>, name: &Spanned<String>, what: &str, example: &str) -> bool {
    let reason = if !variable_name(&name.value) {
        format!("`{}` is not an environment variable name", name.value)
    } else if name.value.starts_with("DEPLOY_") {
        "names starting with DEPLOY_ are drover's own variables".to_string()
    } else {
        return true;
    };
    let help = if variable_name(&name.value) {
        format!("choose another name, as in \"{example}\"")
    } else {
        format!("use letters, digits and `_`, not starting with a digit, as in \"{example}\"")
    };
    r.bad(name.span, what.into(), reason, help);
    false
}

/// Checks one scope's `env` nodes (the site's or a service's): valid names, not drover's own,
/// each once. Returns them in the order written.
pub fn env(r: &mut Reader<'_>, raw: &[RawEnv]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
    for e in raw {
        let name = &e.name.value;
        if !variable(r, &e.name, "the variable's name", "MAXCONN") {
            continue;
        }
        if let Some(first) = seen.get(name.as_str()) {
            r.errors.push(SiteError::Duplicate {
                kind: "env variable".into(),
                name: name.clone(),
                src: r.src.clone(),
                first: *first,
                second: e.name.span,
                help: "give each variable once in a scope (a service's own `env` overrides the site's)".into(),
            });
            continue;
        }
        seen.insert(name, e.name.span);
        out.push((name.clone(), e.value.clone()));
    }
    out
}

/// The service's environment: the site's variables, overridden by its own, sorted by name.
pub fn merged_env(site: &[(String, String)], own: &[(String, String)]) -> Vec<(String, String)> {
    let mut all: std::collections::BTreeMap<String, String> = site.iter().cloned().collect();
    all.extend(own.iter().cloned());
    all.into_iter().collect()
}

/// Checks one service's `file` nodes; sources are relative to `named_in`, the file that names
/// them. Template sources are read (into `sources`: the site's digest covers them) and compiled.
pub fn files(
    r: &mut Reader<'_>,
    sources: &mut Sources,
    named_in: &Path,
    raw: &[RawFile],
) -> (Vec<File>, Vec<Place>) {
    let mut out = Vec::new();
    let mut places = Vec::new();
    let mut seen: HashMap<&str, SourceSpan> = HashMap::new();
    for f in raw {
        let mut ok = true;
        let to = match &f.to {
            None => {
                r.missing(
                    f.span,
                    "`to=`, where the file goes on the host".into(),
                    format!(
                        "write `file \"{}\" to=\"/etc/…\"`",
                        f.source.value.replace('"', "\\\"")
                    ),
                );
                None
            }
            Some(to) if !to.value.starts_with('/') || to.value.ends_with('/') => {
                r.bad(
                    to.span,
                    "`to`".into(),
                    "not an absolute file path".into(),
                    "give the file's absolute path on the host, as in \"/etc/haproxy/haproxy.cfg\""
                        .into(),
                );
                None
            }
            Some(to) if to.value.contains(['\n', '\0']) => {
                r.bad(
                    to.span,
                    "`to`".into(),
                    "a path with a newline or NUL".into(),
                    "give a path without control characters".into(),
                );
                None
            }
            Some(to) if !normal(&to.value) => {
                r.bad(
                    to.span,
                    "`to`".into(),
                    "a path with an empty, `.` or `..` component (`//`, `/./`, `/../`)".into(),
                    "write the path as it resolves, as in \"/etc/haproxy/haproxy.cfg\": one path, \
                     one way of writing it (two files of one path must be seen as one)"
                        .into(),
                );
                None
            }
            Some(to) => match seen.get(to.value.as_str()) {
                Some(first) => {
                    r.errors.push(SiteError::Duplicate {
                        kind: "file destination".into(),
                        name: to.value.clone(),
                        src: r.src.clone(),
                        first: *first,
                        second: to.span,
                        help: "deliver one file to each path".into(),
                    });
                    None
                }
                None => {
                    seen.insert(&to.value, to.span);
                    places.push(Place {
                        to: to.value.clone(),
                        src: r.src.clone(),
                        span: to.span,
                    });
                    Some(to.value.clone())
                }
            },
        };
        let mode = match &f.mode {
            None => None,
            Some(m) => match parse_mode(&m.value) {
                Some(mode) => Some(mode),
                None => {
                    r.bad(
                        m.span,
                        "`mode`".into(),
                        format!("`{}` is not an octal file mode", m.value),
                        "write the mode in octal, as in mode=\"0644\" or mode=\"0750\"".into(),
                    );
                    ok = false;
                    None
                }
            },
        };
        let source = beside(named_in, &f.source.value);
        let unreadable = |r: &mut Reader<'_>, reason: String| {
            r.errors.push(SiteError::Unreadable {
                path: source.display().to_string(),
                reason,
                src: Some(r.src.clone()),
                span: Some(f.source.span),
                help: "a file's source is relative to the file that names it; check the path and that `deploy` may read it".into(),
            });
        };
        let template = if f.template {
            match sources.read_text(&source) {
                Ok(src) => compile(r, &src).map(Arc::new),
                Err(e) => {
                    unreadable(r, e.to_string());
                    None
                }
            }
        } else {
            match std::fs::File::open(&source).and_then(|file| file.metadata()) {
                Ok(meta) if meta.is_file() => None,
                Ok(_) => {
                    unreadable(r, "not a regular file".into());
                    ok = false;
                    None
                }
                Err(e) => {
                    unreadable(r, e.to_string());
                    ok = false;
                    None
                }
            }
        };
        if f.template && template.is_none() {
            ok = false;
        }
        if let (Some(to), true) = (to, ok) {
            out.push(File {
                source,
                to,
                mode,
                template,
            });
        }
    }
    (out, places)
}

/// Where one `file`'s `to=` is written (a path the checker accepted).
#[derive(Clone)]
pub struct Place {
    pub to: String,
    pub src: Src,
    pub span: SourceSpan,
}

/// A `file` delivered into the platform's `state-dir` (where each host keeps its record, its
/// lock, its fencing token and the files' own store) could overwrite what `deploy` trusts the
/// host to say: refused, once per place.
pub fn outside_state_dir(state_dir: &str, places: &[Vec<Place>], errors: &mut Vec<SiteError>) {
    // As a path is compared: `//`, `/./` and `/../` resolved (a `to=` is refused unless
    // written so already).
    let mut parts: Vec<&str> = Vec::new();
    for part in state_dir.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    let dir = format!("/{}", parts.join("/"));
    let dir = dir.trim_end_matches('/');
    let mut seen: HashSet<(String, usize)> = HashSet::new();
    for p in places.iter().flatten() {
        let inside = dir.is_empty()
            || p.to == dir
            || p.to
                .strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with('/'));
        if !inside || !seen.insert((p.src.name().to_string(), p.span.offset())) {
            continue;
        }
        Reader {
            src: &p.src,
            errors,
        }
        .bad(
            p.span,
            "`to`".into(),
            format!(
                "{} is inside the platform's state-dir {state_dir}, where each host keeps its \
                 record, lock and fencing token",
                p.to
            ),
            format!(
                "deliver the file outside {state_dir}, or give the platform another `state-dir`"
            ),
        );
    }
}

/// Two services of one class delivering one path: each puts back what it replaced when its
/// own step fails, so on every host of the class they would undo each other. `places[sid]`:
/// service `sid`'s files, templates' included. One diagnostic per class and path, at two of
/// the places in file order, or, when every service has the path from one template, at that
/// template's `to=`. (A host in two classes is only known with the hosts:
/// `desired::resolve` refuses that case.)
pub fn shared(
    raw: &RawSite,
    ids: &HashMap<&str, super::ServiceId>,
    places: &[Vec<Place>],
    errors: &mut Vec<SiteError>,
) {
    let mut classes_seen: HashSet<&str> = HashSet::new();
    let mut reported: HashSet<(&str, Vec<usize>)> = HashSet::new();
    for class in &raw.classes {
        // A class defined twice is refused, and only its first definition counts.
        if !classes_seen.insert(class.name.value.as_str()) {
            continue;
        }
        let mut sids: Vec<usize> = Vec::new();
        for m in &class.services {
            if let Some(sid) = ids.get(m.value.as_str()).map(|id| id.index()) {
                if !sids.contains(&sid) {
                    sids.push(sid);
                }
            }
        }
        let mut by_to: BTreeMap<&str, Vec<(usize, &Place)>> = BTreeMap::new();
        for &sid in &sids {
            for p in &places[sid] {
                by_to.entry(p.to.as_str()).or_default().push((sid, p));
            }
        }
        for (to, mut users) in by_to.into_iter().filter(|(_, u)| u.len() > 1) {
            users.sort_by_key(|(sid, _)| *sid);
            if !reported.insert((to, users.iter().map(|(sid, _)| *sid).collect())) {
                continue;
            }
            let names: Vec<String> = users
                .iter()
                .map(|(sid, _)| format!("`{}`", raw.services[*sid].name.value))
                .collect();
            let names = match names.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let why = format!(
                "class `{}` runs {}, and a path belongs to one service (what it replaced is put \
                 back if that service's step fails)",
                class.name.value, names
            );
            let mut at: Vec<&Place> = users.iter().map(|(_, p)| *p).collect();
            at.sort_by_key(|p| (p.src.name().to_string(), p.span.offset()));
            at.dedup_by(|a, b| a.src.name() == b.src.name() && a.span == b.span);
            match at.as_slice() {
                [one] => Reader {
                    src: &one.src,
                    errors,
                }
                .bad(
                    one.span,
                    "`to`".into(),
                    format!("{to} is delivered by {names}, all from this template"),
                    format!("{why}: move this file into one of the services"),
                ),
                [first, second, ..] => errors.push(SiteError::duplicate(
                    "file destination",
                    to,
                    (&first.src, first.span),
                    (&second.src, second.span),
                    format!("{why}: deliver {to} from one of them"),
                )),
                [] => {}
            }
        }
    }
}

/// Whether an absolute path is written one way only: no empty, `.` or `..` component.
fn normal(path: &str) -> bool {
    path.split('/')
        .skip(1)
        .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// `"0644"`, `"644"` or `"0o644"` → 0o644; at most 0o7777.
fn parse_mode(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 5 {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|m| *m <= 0o7777)
}

/// Compiles a template: syntax, and every variable it reads from outside one of
/// [`TEMPLATE_VARIABLES`].
fn compile(r: &mut Reader<'_>, src: &Src) -> Option<Template> {
    let text = src.inner().as_str();
    let mut env = minijinja::Environment::new();
    env.set_keep_trailing_newline(true);
    let path = src.name().to_string();
    let template = match env.template_from_str(text) {
        Ok(t) => t,
        Err(e) => {
            r.errors.push(template_error(src, &e));
            return None;
        }
    };
    let used = template.undeclared_variables(false);
    let mut ok = true;
    for name in used
        .iter()
        .filter(|v| !TEMPLATE_VARIABLES.contains(&v.as_str()))
    {
        let span = word_span(text, name);
        let close = super::suggest::closest(name, TEMPLATE_VARIABLES.iter().copied());
        let help = match close {
            Some(c) => format!(
                "did you mean `{c}`? A template sees {}",
                TEMPLATE_VARIABLES.join(", ")
            ),
            None => format!("a template sees {}", TEMPLATE_VARIABLES.join(", ")),
        };
        r.errors.push(SiteError::Template {
            path: path.clone(),
            message: format!("unknown variable `{name}`"),
            src: src.clone(),
            span,
            label: "not a template variable".into(),
            help,
        });
        ok = false;
    }
    ok.then(|| Template {
        text: text.to_string(),
        secret: used.contains("secrets"),
    })
}

/// A minijinja error as a diagnostic pointing into the template.
pub fn template_error(src: &Src, e: &minijinja::Error) -> SiteError {
    let text = src.inner().as_str();
    let span = match e.range() {
        Some(range) => SourceSpan::from(range.start.min(text.len())..range.end.min(text.len())),
        None => line_span(text, e.line().unwrap_or(1)),
    };
    SiteError::Template {
        path: src.name().to_string(),
        message: e
            .detail()
            .map_or_else(|| e.kind().to_string(), str::to_string),
        src: src.clone(),
        span,
        label: e.kind().to_string(),
        help: "see https://docs.rs/minijinja for the template syntax".into(),
    }
}

/// The first place `word` stands on its own in `text` (the start when nowhere).
fn word_span(text: &str, word: &str) -> SourceSpan {
    let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
    let found = text.match_indices(word).find(|(i, _)| {
        boundary(text[..*i].chars().next_back()) && boundary(text[i + word.len()..].chars().next())
    });
    match found {
        Some((i, _)) => SourceSpan::from(i..i + word.len()),
        None => SourceSpan::from(0..0),
    }
}

/// The whole of line `line` (1-based).
fn line_span(text: &str, line: usize) -> SourceSpan {
    let mut start = 0;
    for (n, l) in text.split_inclusive('\n').enumerate() {
        if n + 1 == line {
            return SourceSpan::from(start..start + l.trim_end().len());
        }
        start += l.len();
    }
    SourceSpan::from(0..0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644"), Some(0o644));
        assert_eq!(parse_mode("750"), Some(0o750));
        assert_eq!(parse_mode("0o600"), Some(0o600));
        assert_eq!(parse_mode("0888"), None);
        assert_eq!(parse_mode("17777"), None);
        assert_eq!(parse_mode(""), None);
    }

    #[test]
    fn service_env_wins_and_is_sorted() {
        let site = vec![("TZ".into(), "UTC".into()), ("MODE".into(), "a".into())];
        let own = vec![("MODE".into(), "b".into())];
        assert_eq!(
            merged_env(&site, &own),
            vec![
                ("MODE".to_string(), "b".to_string()),
                ("TZ".to_string(), "UTC".to_string())
            ]
        );
    }

    #[test]
    fn a_path_is_written_one_way() {
        assert!(normal("/etc/haproxy/haproxy.cfg"));
        assert!(normal("/etc/.hidden"));
        assert!(normal("/etc/..foo") && normal("/etc/..."));
        for p in [
            "/etc//x",
            "/etc/./x",
            "/etc/a/../x",
            "/etc/.",
            "/etc/..",
            "//x",
        ] {
            assert!(!normal(p), "{p}");
        }
    }

    #[test]
    fn words() {
        let t = "{{ hosts }} {{ host }}";
        assert_eq!(word_span(t, "host"), SourceSpan::from(15..19));
    }
}
