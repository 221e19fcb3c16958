//! The `command` backend: a program, run on this machine, prints the hosts as JSON.
//!
//! The program runs without a shell, in the platform file's directory, with stdin closed and
//! in its own process group, so that a timeout kills it and everything it started. Its output
//! (schema in the book, "Inventory backends"):
//!
//! ```json
//! {"schema": 1, "hosts": [{"name": "app1", "address": "10.0.0.6", "classes": ["app", "lb"], "tags": {"zone": "a"}}]}
//! ```

use super::{Host, Inventory, InventoryError};
use crate::site::{format_duration, suggest, CommandSpec, InventorySpec, Site};
use miette::{NamedSource, SourceSpan};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The version of the output schema this backend reads.
pub const SCHEMA: u64 = 1;
/// How many of the last lines of stderr a failure shows.
const STDERR_LINES: usize = 10;

/// Hosts printed by the platform's `run` program.
pub struct Command;

impl Inventory for Command {
    fn hosts(&self, site: &Site) -> Result<Vec<Host>, InventoryError> {
        let InventorySpec::Command(spec) = &site.platform.inventory else {
            return Ok(Vec::new());
        };
        let program = display(&spec.argv);
        let stdout = run(spec, &program)?;
        let classes: Vec<&str> = site.classes.iter().map(|c| c.name.as_str()).collect();
        parse(&stdout, &program, &classes)
    }
}

/// The command as the operator would type it.
fn display(argv: &[String]) -> String {
    let plain = |a: &str| {
        !a.is_empty()
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b))
    };
    argv.iter()
        .map(|a| {
            if plain(a) {
                a.clone()
            } else {
                crate::transport::quote(a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the program to completion within its timeout; its stdout.
fn run(spec: &CommandSpec, program: &str) -> Result<Vec<u8>, InventoryError> {
    let dir = if spec.dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        &spec.dir
    };
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let exe = beside(&dir, &spec.argv[0]);
    let failed = |status: String, stderr: &[u8]| InventoryError::CommandFailed {
        program: program.to_string(),
        status,
        stderr: tail(stderr),
    };
    let mut child = std::process::Command::new(&exe)
        .args(&spec.argv[1..])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            // As the operator can find it: a path from the platform file's directory.
            let shown = beside(&spec.dir, &spec.argv[0]);
            failed(format!("cannot start {}: {e}", shown.display()), b"")
        })?;
    let (tx, rx) = mpsc::channel();
    let readers = [
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    ];
    for (i, reader) in readers.into_iter().enumerate() {
        let tx = tx.clone();
        let mut reader = reader.expect("piped");
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = reader.read_to_end(&mut buf);
            let _ = tx.send((i, buf));
        });
    }
    drop(tx);
    let deadline = Instant::now() + spec.timeout;
    let mut outputs: [Option<Vec<u8>>; 2] = [None, None];
    let mut status: Option<ExitStatus> = None;
    let mut tick = Duration::from_millis(1);
    while status.is_none() || outputs.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            kill(&mut child);
            return Err(InventoryError::CommandTimeout {
                program: program.to_string(),
                after: format_duration(spec.timeout),
            });
        }
        if outputs.iter().any(Option::is_none) {
            if let Ok((i, buf)) = rx.recv_timeout(tick.min(left)) {
                outputs[i] = Some(buf);
            }
        } else {
            std::thread::sleep(tick.min(left));
        }
        if status.is_none() {
            status = match child.try_wait() {
                Ok(s) => s,
                Err(e) => {
                    kill(&mut child);
                    return Err(failed(format!("cannot wait for it: {e}"), b""));
                }
            };
        }
        tick = (tick * 2).min(Duration::from_millis(20));
    }
    let [Some(stdout), Some(stderr)] = outputs else {
        unreachable!("the loop ends with both outputs read");
    };
    match status {
        Some(s) if s.success() => Ok(stdout),
        Some(s) => Err(failed(describe(s), &stderr)),
        None => unreachable!("the loop ends with the status known"),
    }
}

/// The program: a path (with a `/`) is taken from `dir`; a bare name is looked up in PATH.
fn beside(dir: &Path, program: &str) -> PathBuf {
    if !program.contains('/') {
        return PathBuf::from(program);
    }
    let path = Path::new(program);
    let relative: PathBuf = path
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect();
    dir.join(relative)
}

/// Kills the program and everything in its process group, and reaps it.
fn kill(child: &mut Child) {
    // std has no killpg; the POSIX shell's `kill` signals a group given as `-PGID`.
    let _ = std::process::Command::new("/bin/sh")
        .args(["-c", "kill -s KILL -- \"-$1\" 2>/dev/null", "kill"])
        .arg(child.id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

/// The last lines of stderr, indented under the error; empty when there are none.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    if lines.iter().all(|l| l.trim().is_empty()) {
        return String::new();
    }
    let skipped = lines.len().saturating_sub(STDERR_LINES);
    let mut out = String::from(", its stderr ending:");
    if skipped > 0 {
        out.push_str(&format!("\n  … ({skipped} lines before)"));
    }
    for l in &lines[skipped..] {
        out.push_str("\n  ");
        out.push_str(l);
    }
    out
}

/// The output: `{"schema": 1, "hosts": […]}`; `schema` is optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Output {
    #[serde(default)]
    schema: Option<u64>,
    hosts: Vec<RawHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: String,
    address: String,
    #[serde(default)]
    class: Option<String>,
    #[serde(default)]
    classes: Option<Vec<String>>,
    #[serde(default)]
    tags: BTreeMap<String, serde_json::Value>,
}

/// Checks and converts the program's output into hosts with class ids from `classes`.
pub fn parse(stdout: &[u8], program: &str, classes: &[&str]) -> Result<Vec<Host>, InventoryError> {
    let text = match std::str::from_utf8(stdout) {
        Ok(t) => t,
        Err(e) => {
            let text = String::from_utf8_lossy(stdout).into_owned();
            // Lossy decoding keeps every valid byte before the first bad one in place.
            let at = e.valid_up_to();
            return Err(bad(program, &text, "it is not UTF-8".into(), Some((at, 1))));
        }
    };
    if text.trim().is_empty() {
        return Err(InventoryError::BadOutput {
            program: program.to_string(),
            reason: "it printed nothing".into(),
            output: Arc::new(NamedSource::new(source_name(program), String::new())),
            span: None,
        });
    }
    let out: Output = serde_json::from_str(text).map_err(|e| {
        let message = e.to_string();
        let reason = match message.rfind(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        bad(program, text, reason, Some(error_span(text, &e)))
    })?;
    let find = |path: &[Step]| locate(text, path);
    if let Some(s) = out.schema.filter(|s| *s != SCHEMA) {
        return Err(bad(
            program,
            text,
            format!("schema {s} is not {SCHEMA}, the one this deploy reads"),
            find(&[Step::Key("schema")]),
        ));
    }
    let mut hosts = Vec::with_capacity(out.hosts.len());
    for (i, h) in out.hosts.into_iter().enumerate() {
        let at = |key: &str| find(&[Step::Key("hosts"), Step::Index(i), Step::Key(key)]);
        if !good_name(&h.name) {
            return Err(bad(
                program,
                text,
                "a host name must be a non-empty word without `/`".into(),
                at("name"),
            ));
        }
        if h.address.trim().is_empty() || h.address.chars().any(char::is_whitespace) {
            return Err(bad(
                program,
                text,
                format!("host `{}` has no address", h.name),
                at("address"),
            ));
        }
        let names: Vec<(String, Option<(usize, usize)>)> = match (h.class, h.classes) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    program,
                    text,
                    format!("host `{}` has both `class` and `classes`", h.name),
                    at("classes"),
                ))
            }
            (Some(c), None) => vec![(c, at("class"))],
            (None, Some(list)) if !list.is_empty() => list
                .into_iter()
                .enumerate()
                .map(|(j, c)| {
                    let path = [
                        Step::Key("hosts"),
                        Step::Index(i),
                        Step::Key("classes"),
                        Step::Index(j),
                    ];
                    (c, find(&path))
                })
                .collect(),
            (None, _) => {
                return Err(bad(
                    program,
                    text,
                    format!("host `{}` has no `class` or `classes`", h.name),
                    at("name"),
                ))
            }
        };
        let mut ids = Vec::with_capacity(names.len());
        for (class, span) in names {
            let Some(id) = classes
                .iter()
                .position(|c| *c == class)
                .map(crate::site::ClassId::new)
            else {
                let help = match suggest::closest(&class, classes.iter().copied()) {
                    Some(c) => format!("did you mean `{c}`?"),
                    None => format!(
                        "the site's classes are {}: declare the class in the site, or fix the program's output",
                        classes.join(", ")
                    ),
                };
                return Err(InventoryError::UnknownClass {
                    host: h.name,
                    class,
                    help,
                    output: Arc::new(NamedSource::new(source_name(program), text.to_string())),
                    span: span.map(SourceSpan::from),
                });
            };
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut tags = BTreeMap::new();
        for (key, value) in h.tags {
            let value = match value {
                serde_json::Value::String(s) => s,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => {
                    let path = [
                        Step::Key("hosts"),
                        Step::Index(i),
                        Step::Key("tags"),
                        Step::Key(&key),
                    ];
                    return Err(bad(
                        program,
                        text,
                        format!(
                            "tag `{key}` of host `{}` is not a string, number or boolean",
                            h.name
                        ),
                        find(&path),
                    ));
                }
            };
            tags.insert(key, value);
        }
        hosts.push(Host {
            name: h.name.into(),
            address: h.address.into(),
            classes: ids,
            tags,
        });
    }
    Ok(hosts)
}

fn source_name(program: &str) -> String {
    format!("stdout of {program}")
}

fn bad(program: &str, text: &str, reason: String, span: Option<(usize, usize)>) -> InventoryError {
    InventoryError::BadOutput {
        program: program.to_string(),
        reason,
        output: Arc::new(NamedSource::new(source_name(program), text.to_string())),
        span: span.map(SourceSpan::from),
    }
}

/// A name usable as a file name on this machine: no `/`, no spaces or control characters.
fn good_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// Where serde_json's error is: the byte it names for a syntax error; for a data error (a
/// wrong type, a missing or unknown field), the value or key it is about.
fn error_span(text: &str, e: &serde_json::Error) -> (usize, usize) {
    if e.is_eof() {
        return (text.trim_end().len(), 0);
    }
    // A syntax error names the byte it stopped at; a data error the last byte it read, just
    // before or at the end of what it is about.
    let at = offset(text, e.line(), e.column());
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || b"+-.".contains(&c);
    if !e.is_data() {
        return (at, char_len(text, at));
    }
    match b.get(at) {
        Some(b'"') => {
            // Back to the opening quote: the first `"` not escaped by an odd run of `\`.
            let mut i = at;
            while i > 0 {
                i -= 1;
                let slashes = b[..i].iter().rev().take_while(|c| **c == b'\\').count();
                if b[i] == b'"' && slashes % 2 == 0 {
                    break;
                }
            }
            (i, at + 1 - i)
        }
        Some(&c) if word(c) => {
            let mut i = at;
            while i > 0 && word(b[i - 1]) {
                i -= 1;
            }
            (i, at + 1 - i)
        }
        Some(b' ' | b'\t' | b'\n' | b'\r' | b':' | b',' | b'[') => {
            let start = skip_ws(b, at + 1);
            match skip_value(b, start) {
                Some(end) if !text[start..end].contains('\n') => (start, end - start),
                _ => (start, char_len(text, start)),
            }
        }
        _ => (at, char_len(text, at)),
    }
}

/// The byte offset of serde_json's 1-based line and column (columns count bytes; column 0 is
/// the line break before the line).
fn offset(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let at = match column {
        0 => start.saturating_sub(1),
        c => start + c - 1,
    };
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The length of the character at `at` (0 at the end).
fn char_len(text: &str, at: usize) -> usize {
    text[at..].chars().next().map_or(0, char::len_utf8)
}

/// A step into a JSON document.
#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The byte range (offset, length) of the value at `path` in `json`, which serde_json has
/// already accepted as valid.
fn locate(json: &str, path: &[Step]) -> Option<(usize, usize)> {
    let b = json.as_bytes();
    let mut at = skip_ws(b, 0);
    for step in path {
        match (step, b.get(at)?) {
            (Step::Key(want), b'{') => {
                at = skip_ws(b, at + 1);
                loop {
                    if *b.get(at)? != b'"' {
                        return None;
                    }
                    let key_end = skip_value(b, at)?;
                    let key: String = serde_json::from_str(&json[at..key_end]).ok()?;
                    at = skip_ws(b, skip_ws(b, key_end) + 1); // past the `:`
                    if key == *want {
                        break;
                    }
                    at = skip_ws(b, skip_value(b, at)?);
                    if *b.get(at)? != b',' {
                        return None;
                    }
                    at = skip_ws(b, at + 1);
                }
            }
            (Step::Index(want), b'[') => {
                at = skip_ws(b, at + 1);
                for _ in 0..*want {
                    at = skip_ws(b, skip_value(b, at)?);
                    if *b.get(at)? != b',' {
                        return None;
                    }
                    at = skip_ws(b, at + 1);
                }
                if *b.get(at)? == b']' {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some((at, skip_value(b, at)? - at))
}

fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while matches!(b.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the value starting at `at` ends.
fn skip_value(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => {
            let mut i = at + 1;
            loop {
                match b.get(i)? {
                    b'\\' => i += 2,
                    b'"' => return Some(i + 1),
                    _ => i += 1,
                }
            }
        }
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = skip_value(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = at;
            while b
                .get(i)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLASSES: [&str; 3] = ["db", "app", "lb"];

    fn ok(json: &str) -> Vec<Host> {
        parse(json.as_bytes(), "hosts", &CLASSES).unwrap()
    }

    /// The reason and the text the error points at.
    fn err(json: &str) -> (String, String) {
        match parse(json.as_bytes(), "hosts", &CLASSES).unwrap_err() {
            InventoryError::BadOutput { reason, span, .. } => {
                let at = span.map_or(String::new(), |s| {
                    json[s.offset()..s.offset() + s.len()].to_string()
                });
                (reason, at)
            }
            InventoryError::UnknownClass {
                class, help, span, ..
            } => {
                let at = span.map_or(String::new(), |s| {
                    json[s.offset()..s.offset() + s.len()].to_string()
                });
                (format!("unknown class {class}: {help}"), at)
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn reads_hosts() {
        let hosts = ok(r#"{"schema": 1, "hosts": [
            {"name": "db1", "address": "10.0.0.5", "class": "db"},
            {"name": "edge1", "address": "10.0.0.9", "classes": ["app", "lb", "app"],
             "tags": {"zone": "a", "rack": 12, "spot": true}}
        ]}"#);
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0].classes, crate::site::ids_of(&[0]));
        assert_eq!(hosts[1].classes, crate::site::ids_of(&[1, 2]));
        assert_eq!(
            hosts[1].tags,
            BTreeMap::from([
                ("rack".to_string(), "12".to_string()),
                ("spot".to_string(), "true".to_string()),
                ("zone".to_string(), "a".to_string()),
            ])
        );
        assert!(ok(r#"{"hosts": []}"#).is_empty());
    }

    #[test]
    fn points_at_the_problem() {
        let cases = [
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db",}]}"#,
                "trailing comma",
                "}",
            ),
            (
                r#"{"hosts": {"name": "a"}}"#,
                "invalid type: map, expected a sequence",
                r#"{"name": "a"}"#,
            ),
            (
                r#"{"hosts": [{"name": 5, "address": "x", "class": "db"}]}"#,
                "invalid type: integer `5`",
                "5",
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db", "schema": "1"}]}"#,
                "unknown field `schema`",
                r#""schema""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db"}], "schema": "1"}"#,
                "invalid type: string",
                r#""1""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db"}"#,
                "EOF",
                "",
            ),
            (
                "{\n  \"hosts\": [\n    {\"name\": \"a\"}\n  ]\n}",
                "missing field `address`",
                "}",
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db"} {"name": "b"}]}"#,
                "expected `,` or `]`",
                "{",
            ),
            (r#"{"hosts": [], "schema": 2}"#, "schema 2 is not 1", "2"),
            (
                r#"{"hosts": [{"name": "a", "address": "", "class": "db"}]}"#,
                "has no address",
                r#""""#,
            ),
            (
                r#"{"hosts": [{"name": "a/b", "address": "x", "class": "db"}]}"#,
                "host name",
                r#""a/b""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x"}]}"#,
                "no `class` or `classes`",
                r#""a""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "classes": []}]}"#,
                "no `class` or `classes`",
                r#""a""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db", "classes": ["db"]}]}"#,
                "both",
                r#"["db"]"#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "ap"}]}"#,
                "did you mean `app`?",
                r#""ap""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "classes": ["db", "zz"]}]}"#,
                "unknown class zz",
                r#""zz""#,
            ),
            (
                r#"{"hosts": [{"name": "a", "address": "x", "class": "db", "tags": {"k": [1]}}]}"#,
                "tag `k`",
                "[1]",
            ),
            (
                r#"{"hosts": [{"name": "a", "adress": "x", "class": "db"}]}"#,
                "unknown field `adress`",
                r#""adress""#,
            ),
        ];
        for (json, want, at) in cases {
            let (reason, got) = err(json);
            assert!(reason.contains(want), "{json}: {reason}");
            assert_eq!(got, at, "{json}: {reason}");
        }
    }

    #[test]
    fn locates_values() {
        let json = r#" { "a" : [ 1 , {"b\"c": "x,}", "d": [true, null]} ] , "e": -2.5e3 } "#;
        let at = |path: &[Step]| locate(json, path).map(|(o, l)| &json[o..o + l]);
        assert_eq!(at(&[Step::Key("e")]), Some("-2.5e3"));
        assert_eq!(at(&[Step::Key("a"), Step::Index(0)]), Some("1"));
        assert_eq!(
            at(&[Step::Key("a"), Step::Index(1), Step::Key("b\"c")]),
            Some(r#""x,}""#)
        );
        assert_eq!(
            at(&[
                Step::Key("a"),
                Step::Index(1),
                Step::Key("d"),
                Step::Index(1)
            ]),
            Some("null")
        );
        assert_eq!(at(&[Step::Key("a"), Step::Index(2)]), None);
        assert_eq!(at(&[Step::Key("z")]), None);
    }

    #[test]
    fn line_and_column_to_offset() {
        let text = "ab\ncdé\nf";
        assert_eq!(offset(text, 1, 1), 0);
        assert_eq!(offset(text, 2, 2), 4);
        assert_eq!(offset(text, 3, 1), 8);
        assert_eq!(offset(text, 9, 9), text.len());
    }

    #[test]
    fn shows_commands_as_typed() {
        let argv = ["python3", "hosts.py", "--env", "prod east", ""].map(String::from);
        assert_eq!(display(&argv), "python3 hosts.py --env 'prod east' ''");
    }
}
