//! A policy's `spread` tag against the tags its service's hosts carry: a tag no host of the
//! class carries groups nothing, and is most likely a typo.

use super::error::{SiteError, Src};
use super::model::{ClassId, InventorySpec, Site};
use super::suggest;
use miette::SourceSpan;
use std::collections::BTreeSet;
use std::sync::Arc;

/// What to do about a `spread` tag that none of the hosts carries, given the tags they do.
pub fn help(tag: &str, carried: &BTreeSet<&str>) -> String {
    if carried.is_empty() {
        return format!(
            "these hosts carry no tags: give each a `{tag}=` in the inventory, or remove `spread`"
        );
    }
    let list: Vec<&str> = carried.iter().copied().collect();
    let known = format!("the hosts carry {}", quoted(&list));
    match suggest::closest(tag, list.iter().copied()) {
        Some(near) => format!("did you mean `{near}`? ({known})"),
        None => format!("{known}: spread over one of them, or remove `spread`"),
    }
}

fn quoted(names: &[&str]) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    names.join(", ")
}

/// Where each policy's `spread` is written, recorded as the policies are read.
pub type Written = Vec<(Arc<super::model::Policy>, Src, SourceSpan)>;

/// "class `app`", "classes `app`, `db`".
pub fn classes_words(names: &[&str]) -> String {
    format!(
        "{} {}",
        crate::words::plural(names.len(), "class"),
        quoted(names)
    )
}

/// Warnings for a static inventory whose hosts of a class carry none of the `spread` tag of a
/// policy of a service of that class, one per policy (other inventories' hosts are only known
/// when planning, where the same finding is an error).
pub fn warnings(site: &Site, written: &Written) -> Vec<SiteError> {
    let InventorySpec::Static { hosts } = &site.platform.inventory else {
        return Vec::new();
    };
    let mut out: Vec<SiteError> = Vec::new();
    for (policy, src, span) in written {
        let Some(tag) = &policy.spread else {
            continue;
        };
        let classes: BTreeSet<ClassId> = site
            .services
            .iter()
            .filter(|s| Arc::ptr_eq(&s.policy, policy))
            .flat_map(|s| s.classes.iter().copied())
            .collect();
        let mut lacking: Vec<&str> = Vec::new();
        let mut carried: BTreeSet<&str> = BTreeSet::new();
        for class in classes {
            let of_class: Vec<_> = hosts.iter().filter(|h| h.class == class).collect();
            let tags: BTreeSet<&str> = of_class
                .iter()
                .flat_map(|h| h.tags.keys().map(String::as_str))
                .collect();
            if !of_class.is_empty() && !tags.contains(tag.as_str()) {
                lacking.push(&site.classes[class].name);
                carried.extend(tags);
            }
        }
        if lacking.is_empty() {
            continue;
        }
        out.push(SiteError::SpreadTagNowhere {
            tag: tag.clone(),
            classes: classes_words(&lacking),
            src: src.clone(),
            span: *span,
            help: help(tag, &carried),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_the_near_tag_and_those_carried() {
        let carried: BTreeSet<&str> = ["rack", "zone"].into_iter().collect();
        assert_eq!(
            help("zonee", &carried),
            "did you mean `zone`? (the hosts carry `rack`, `zone`)"
        );
        assert_eq!(
            help("datacenter", &carried),
            "the hosts carry `rack`, `zone`: spread over one of them, or remove `spread`"
        );
        assert!(help("zone", &BTreeSet::new()).contains("carry no tags"));
    }
}
