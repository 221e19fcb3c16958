//! The `inventory` node of a platform, and separate hosts files, as raw nodes with spans.

use super::read::{Reader, Spanned};
use kdl::{KdlDocument, KdlNode};
use std::time::Duration;

/// An `inventory "<backend>" … { … }` node.
#[derive(Debug)]
pub struct RawInventory {
    pub kind: Spanned<String>,
    /// `static`: hosts written inline.
    pub hosts: Vec<RawHost>,
    /// `static`: a separate file of `host` nodes.
    pub file: Option<Spanned<String>>,
    /// `ec2`: per class, the tags its instances carry.
    pub classes: Vec<RawTagClass>,
    pub region: Option<Spanned<String>>,
    pub endpoint: Option<Spanned<String>>,
    pub profile: Option<Spanned<String>>,
    pub address: Option<Spanned<String>>,
    /// `command`: the program and its arguments.
    pub run: Option<Spanned<Vec<String>>>,
    pub timeout: Option<Spanned<Duration>>,
    /// What a class with no hosts is: "error" (default) or "warn".
    pub on_empty: Option<Spanned<String>>,
}

#[derive(Debug)]
pub struct RawHost {
    pub name: Spanned<String>,
    pub address: Option<Spanned<String>>,
    pub class: Option<Spanned<String>>,
    pub tags: Vec<(String, String)>,
}

/// `class "app" tag="role=app"` or `class "app" { tag "role" "app"; tag "env" "prod" }`.
#[derive(Debug)]
pub struct RawTagClass {
    pub name: Spanned<String>,
    pub tags: Vec<(String, String)>,
}

const PROPS: &[&str] = &[
    "file", "region", "endpoint", "profile", "address", "timeout", "on-empty",
];

pub fn inventory(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawInventory> {
    r.shape(n, 1, PROPS, true);
    let kind = r.string_arg(
        n,
        "the inventory backend (\"static\", \"ec2\" or \"command\")",
    )?;
    let mut inv = RawInventory {
        hosts: Vec::new(),
        file: r.string_prop(n, "file"),
        classes: Vec::new(),
        region: r.string_prop(n, "region"),
        endpoint: r.string_prop(n, "endpoint"),
        profile: r.string_prop(n, "profile"),
        address: r.string_prop(n, "address"),
        run: None,
        timeout: r.duration_prop(n, "timeout"),
        on_empty: r.string_prop(n, "on-empty"),
        kind,
    };
    match inv.kind.value.as_str() {
        "ec2" => {
            for c in r.children(n, &["class"]) {
                inv.classes.extend(tag_class(r, c));
            }
        }
        "command" => {
            let mut seen = None;
            for c in r.children(n, &["run"]) {
                if r.once(&mut seen, c) {
                    inv.run = run(r, c);
                }
            }
            if seen.is_none() {
                r.missing(
                    inv.kind.span,
                    "a `run` node".into(),
                    "write `inventory \"command\" { run \"./hosts.py\" \"--json\" }`".into(),
                );
            }
        }
        _ => {
            let nodes = r.children(n, &["host"]);
            inv.hosts = hosts(r, &nodes);
        }
    }
    Some(inv)
}

/// A hosts file: `host` nodes at the top level.
pub fn hosts_file(r: &mut Reader<'_>, doc: &KdlDocument) -> Vec<RawHost> {
    let nodes = r.known_nodes(doc.nodes(), "a hosts file", &["host"]);
    hosts(r, &nodes)
}

fn hosts(r: &mut Reader<'_>, nodes: &[&KdlNode]) -> Vec<RawHost> {
    let mut hosts = Vec::with_capacity(nodes.len());
    for h in nodes {
        if h.children().is_some() {
            r.shape(h, 1, &[], false);
        }
        let Some(name) = r.string_arg(h, "the host's name") else {
            continue;
        };
        let address = r.string_prop(h, "address");
        let class = r.string_prop(h, "class");
        // Written only when needed: a big inventory has a hundred thousand hosts.
        let example = || {
            format!(
                "write it as `host \"{}\" address=\"10.0.0.5\" class=\"app\"`",
                name.value
            )
        };
        if address.is_none() {
            r.missing(name.span, "`address=`".into(), example());
        }
        if class.is_none() {
            r.missing(name.span, "`class=`".into(), example());
        }
        for e in h.entries().iter().filter(|e| e.name().is_none()).skip(1) {
            r.bad(
                e.span(),
                "`host`".into(),
                "one value too many".into(),
                "give properties as key=\"value\"".into(),
            );
        }
        let tags = r.other_props(h, &["address", "class"]);
        hosts.push(RawHost {
            name,
            address,
            class,
            tags,
        });
    }
    hosts
}

fn tag_class(r: &mut Reader<'_>, c: &KdlNode) -> Option<RawTagClass> {
    r.shape(c, 1, &["tag"], true);
    let name = r.string_arg(c, "the class's name")?;
    let mut tags = Vec::new();
    if let Some(t) = r.string_prop(c, "tag") {
        match t.value.split_once('=') {
            Some((k, v)) if !k.is_empty() => tags.push((k.to_string(), v.to_string())),
            _ => r.bad(
                t.span,
                "`tag`".into(),
                "expected key=value".into(),
                "write `tag=\"role=app\"`".into(),
            ),
        }
    }
    for t in r.children(c, &["tag"]) {
        r.shape(t, 2, &[], false);
        let args: Vec<String> = t
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .filter_map(|e| e.value().as_string().map(String::from))
            .collect();
        match args.as_slice() {
            [k, v] => tags.push((k.clone(), v.clone())),
            _ => r.bad(
                Reader::name_span(t),
                "`tag`".into(),
                "expected a key and a value".into(),
                "write `tag \"role\" \"app\"`".into(),
            ),
        }
    }
    if tags.is_empty() {
        r.missing(
            name.span,
            "a tag".into(),
            format!(
                "write `class \"{}\" tag=\"role={}\"`",
                name.value, name.value
            ),
        );
    }
    Some(RawTagClass { name, tags })
}

fn run(r: &mut Reader<'_>, c: &KdlNode) -> Option<Spanned<Vec<String>>> {
    r.shape(c, usize::MAX, &[], false);
    let mut argv = Vec::new();
    for e in c.entries() {
        match e.value().as_string() {
            Some(s) => argv.push(s.to_string()),
            None => r.bad(
                e.span(),
                "`run`".into(),
                "expected a string".into(),
                "quote every word of the command".into(),
            ),
        }
    }
    if argv.is_empty() {
        r.missing(
            Reader::name_span(c),
            "the program to run".into(),
            "write `run \"./hosts.py\"`".into(),
        );
        return None;
    }
    Some(Spanned {
        value: argv,
        span: Reader::name_span(c),
    })
}
