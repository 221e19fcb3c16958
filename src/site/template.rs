//! `template="NAME"`: which templates each service takes, most general first, with unknown
//! names and cycles of templates reported once each.

use super::error::SiteError;
use super::raw::{RawService, RawSite};
use super::suggest;
use std::collections::HashMap;

/// The templates every service and every template takes.
pub struct Chains {
    /// Per service: the indices in `RawSite::templates` of the templates it takes, most
    /// general first (empty: none); `None` when one is unknown or in a cycle.
    pub services: Vec<Option<Vec<usize>>>,
}

/// Resolves every `template=` of `raw`, reporting unknown names, duplicate templates and
/// cycles into `errors`.
pub fn chains(raw: &RawSite, errors: &mut Vec<SiteError>) -> Chains {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut duplicate = vec![false; raw.templates.len()];
    for (i, t) in raw.templates.iter().enumerate() {
        if let Some(&first) = ids.get(t.name.value.as_str()) {
            let first = &raw.templates[first];
            errors.push(SiteError::duplicate(
                "template",
                &t.name.value,
                (&first.origin.src, first.name.span),
                (&t.origin.src, t.name.span),
                "rename one of them or merge them into one `template`".into(),
            ));
            duplicate[i] = true;
        } else {
            ids.insert(&t.name.value, i);
        }
    }
    let names: Vec<&str> = {
        let mut n: Vec<&str> = ids.keys().copied().collect();
        n.sort_unstable();
        n
    };
    let mut walk = Walk {
        raw,
        ids: &ids,
        names: &names,
        state: vec![State::Unvisited; raw.templates.len()],
        stack: Vec::new(),
        errors,
    };
    // Every template, used or not: its unknown names and cycles are reported all the same.
    for t in (0..raw.templates.len()).filter(|t| !duplicate[*t]) {
        walk.resolve(t);
    }
    let services = raw
        .services
        .iter()
        .map(|s| match walk.parent(s) {
            Parent::None => Some(Vec::new()),
            Parent::Unknown => None,
            Parent::Template(p) => walk.resolve(p),
        })
        .collect();
    Chains { services }
}

#[derive(Clone)]
enum State {
    Unvisited,
    Visiting,
    Done(Option<Vec<usize>>),
}

enum Parent {
    None,
    Unknown,
    Template(usize),
}

struct Walk<'a> {
    raw: &'a RawSite,
    ids: &'a HashMap<&'a str, usize>,
    names: &'a [&'a str],
    state: Vec<State>,
    /// The templates being resolved, outermost first.
    stack: Vec<usize>,
    errors: &'a mut Vec<SiteError>,
}

impl Walk<'_> {
    /// The template `node` names, an unknown name reported (once: each node is asked once).
    fn parent(&mut self, node: &RawService) -> Parent {
        let Some(name) = &node.template else {
            return Parent::None;
        };
        match self.ids.get(name.value.as_str()) {
            Some(&p) => Parent::Template(p),
            None => {
                self.errors.push(SiteError::UnknownName {
                    kind: "template".into(),
                    name: name.value.clone(),
                    src: node.origin.src.clone(),
                    span: name.span,
                    help: suggest::help(&name.value, "template", self.names),
                });
                Parent::Unknown
            }
        }
    }

    /// The chain of template `t`, ending with `t` itself.
    fn resolve(&mut self, t: usize) -> Option<Vec<usize>> {
        match &self.state[t] {
            State::Done(chain) => return chain.clone(),
            State::Visiting => {
                // Only reached from `t`'s own descendant: report the cycle at the node that
                // closes it (the last on the stack).
                let at = self.stack.iter().position(|s| *s == t).unwrap_or(0);
                let mut names: Vec<&str> = self.stack[at..]
                    .iter()
                    .map(|s| self.raw.templates[*s].name.value.as_str())
                    .collect();
                names.push(&self.raw.templates[t].name.value);
                let last = &self.raw.templates[*self.stack.last().unwrap_or(&t)];
                if let Some(link) = &last.template {
                    self.errors.push(SiteError::TemplateCycle {
                        cycle: names.join(" → "),
                        src: last.origin.src.clone(),
                        span: link.span,
                    });
                }
                return None;
            }
            State::Unvisited => {}
        }
        self.state[t] = State::Visiting;
        self.stack.push(t);
        let raw = self.raw;
        let chain = match self.parent(&raw.templates[t]) {
            Parent::None => Some(vec![t]),
            Parent::Unknown => None,
            Parent::Template(p) => self.resolve(p).map(|mut c| {
                c.push(t);
                c
            }),
        };
        self.stack.pop();
        self.state[t] = State::Done(chain.clone());
        chain
    }
}
