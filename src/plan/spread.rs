//! The policies' `spread` tags against the hosts the inventory gave: a tag that no host of a
//! class carries groups nothing and is most likely a typo, so no plan is made with it.

use crate::inventory::Hosts;
use crate::site::{ClassId, Policy, Site};
use crate::words::count;
use miette::Diagnostic;
use std::collections::BTreeSet;
use std::sync::Arc;
use thiserror::Error;

/// A policy's `spread` tag that no host of the classes it rolls out carries.
#[derive(Debug, Error, Diagnostic)]
#[error("{at}: policy {policy} spreads over the tag `{tag}`, which no host of {classes} carries")]
#[diagnostic(code(drover::plan::spread_tag))]
pub struct SpreadTagError {
    /// `file:line` of the `spread` node.
    pub at: String,
    pub policy: String,
    pub tag: String,
    /// "class `app`", "classes `app`, `db`".
    pub classes: String,
    #[help]
    pub help: String,
}

/// Every `spread` tag that no host of a class of its service carries.
#[derive(Debug, Error, Diagnostic)]
#[error("{}: no plan is made", count(.problems.len(), "spread tag on no host"))]
#[diagnostic(code(drover::plan::spread_tags))]
pub struct SpreadTagErrors {
    #[related]
    pub problems: Vec<SpreadTagError>,
}

/// Checks each policy's `spread` tag against the hosts of the classes it rolls out (every
/// host, whatever the selection: which hosts change must not decide whether the policy is
/// right), one problem per policy.
pub fn check(site: &Site, hosts: &Hosts) -> Result<(), SpreadTagErrors> {
    let mut problems: Vec<SpreadTagError> = Vec::new();
    let mut seen: Vec<&Arc<Policy>> = Vec::new();
    for service in &site.services {
        let policy = &service.policy;
        let Some(tag) = &policy.spread else {
            continue;
        };
        if seen.iter().any(|p| Arc::ptr_eq(p, policy)) {
            continue;
        }
        seen.push(policy);
        let classes: BTreeSet<ClassId> = site
            .services
            .iter()
            .filter(|s| Arc::ptr_eq(&s.policy, policy))
            .flat_map(|s| s.classes.iter().copied())
            .collect();
        let mut lacking: Vec<&str> = Vec::new();
        let mut carried: BTreeSet<&str> = BTreeSet::new();
        for class in classes {
            let members = hosts.by_class.get(class).map_or(&[][..], Vec::as_slice);
            let tags: BTreeSet<&str> = members
                .iter()
                .flat_map(|&h| hosts.hosts[h].tags.keys().map(String::as_str))
                .collect();
            if !members.is_empty() && !tags.contains(tag.as_str()) {
                lacking.push(&site.classes[class].name);
                carried.extend(tags);
            }
        }
        if lacking.is_empty() {
            continue;
        }
        problems.push(SpreadTagError {
            at: policy
                .spread_at
                .clone()
                .unwrap_or_else(|| format!("policy {}", policy.name)),
            policy: policy.name.clone(),
            tag: tag.clone(),
            classes: crate::site::classes_words(&lacking),
            help: crate::site::spread_help(tag, &carried),
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SpreadTagErrors { problems })
    }
}
