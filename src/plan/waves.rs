//! Cutting a service's hosts into waves: canary first, then batches, one spread value per wave.

use crate::inventory::{natural_cmp, HostId, Hosts};
use crate::site::Policy;
use std::collections::BTreeMap;

/// Hosts that go together, before they become steps.
#[derive(Debug, PartialEq, Eq)]
pub struct Group {
    pub canary: bool,
    pub spread: Option<String>,
    pub hosts: Vec<HostId>,
}

/// Waves for the hosts in `todo` (in name order), at most `batch` hosts each.
pub fn waves(hosts: &Hosts, todo: &[HostId], policy: &Policy, batch: usize) -> Vec<Group> {
    let mut out = Vec::new();
    for (value, members) in spread_groups(hosts, todo, policy.spread.as_deref()) {
        let mut rest: &[HostId] = &members;
        // No canary wave when there is nothing to change: a wave is never empty.
        if out.is_empty() && policy.canary > 0 && !rest.is_empty() {
            let n = usize::try_from(policy.canary)
                .unwrap_or(usize::MAX)
                .min(rest.len());
            out.push(Group {
                canary: true,
                spread: value.clone(),
                hosts: rest[..n].to_vec(),
            });
            rest = &rest[n..];
        }
        for chunk in rest.chunks(batch) {
            out.push(Group {
                canary: false,
                spread: value.clone(),
                hosts: chunk.to_vec(),
            });
        }
    }
    out
}

/// The hosts grouped by their value of the `spread` tag (one group without spread).
/// Hosts without the tag form their own group, after the others.
fn spread_groups(
    hosts: &Hosts,
    todo: &[HostId],
    spread: Option<&str>,
) -> Vec<(Option<String>, Vec<HostId>)> {
    let Some(tag) = spread else {
        return vec![(None, todo.to_vec())];
    };
    let mut groups: BTreeMap<Option<&str>, Vec<HostId>> = BTreeMap::new();
    for &h in todo {
        let value = hosts.hosts[h].tags.get(tag).map(String::as_str);
        groups.entry(value).or_default().push(h);
    }
    let mut groups: Vec<(Option<&str>, Vec<HostId>)> = groups.into_iter().collect();
    groups.sort_by(|(a, _), (b, _)| match (a, b) {
        (Some(a), Some(b)) => natural_cmp(a, b),
        (a, b) => b.is_some().cmp(&a.is_some()),
    });
    groups
        .into_iter()
        .map(|(v, hs)| (v.map(str::to_string), hs))
        .collect()
}
