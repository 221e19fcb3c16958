//! `deploy undo`: which run to go back to, and its snapshot loaded as a site by the site stage,
//! to be applied as any site is: today's platform (the hosts as they are now, reached as they
//! are now) and today's policies, everything the hosts run (versions, hooks, env, files) as the
//! snapshot has it.

use super::{shared, snapshot::absolute, Entry, History, HistoryError, RunId, RunResult};
use crate::site::{ClassId, InventorySpec, Platform, SecretSource, Site};
use std::path::{Path, PathBuf};

/// The run to go back to: the one named (`--to`), else the last converged run before the
/// latest; when the latest is an undo that did not converge (interrupted, failed), the run it
/// went back to, to carry it through.
pub fn target<'e>(entries: &'e [Entry], to: Option<&RunId>) -> Result<&'e Entry, HistoryError> {
    let listed = "`deploy history SITE` lists the runs kept";
    if let Some(to) = to {
        return entries
            .iter()
            .find(|e| &e.run == to)
            .ok_or_else(|| HistoryError::NoRun {
                reason: format!("no run {to} in the site's history"),
                help: listed.into(),
            });
    }
    let Some((latest, before)) = entries.split_last() else {
        return Err(HistoryError::NoRun {
            reason: "the site's history has no run".into(),
            help: "a run is kept once `deploy apply` has changed hosts".into(),
        });
    };
    if let (Some(again), false) = (&latest.undone_to, latest.result == RunResult::Converged) {
        return target(entries, Some(again));
    }
    before
        .iter()
        .rev()
        .find(|e| e.result == RunResult::Converged)
        .ok_or_else(|| HistoryError::NoRun {
            reason: format!("no converged run before the latest ({})", latest.run),
            help: format!("name one with `--to RUN`; {listed}"),
        })
}

/// The snapshot of `entry` as a site to apply now: its files put back under
/// `.drover/history/work/<run>/` (brought from the store first when this controller lacks
/// them) and loaded by the site stage; then given `current`'s platform, policies and site
/// file name, and its secrets' files read where `current`'s are.
pub fn load(current: &Site, entry: &Entry) -> Result<Site, HistoryError> {
    let history = History::default();
    let blobs = history.blobs();
    let digests: Vec<_> = entry.snapshot.digests().collect();
    shared::fetch(current, &blobs, &digests)?;
    let work = absolute(&history.work(&entry.run))?;
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|source| HistoryError::Write {
            path: work.clone(),
            source,
        })?;
    }
    let (file, site_dir) = entry.snapshot.put_back(&blobs, &work)?;
    let mut site = crate::site::load(&file)?;
    let here = absolute(current.file.parent().unwrap_or(Path::new("")))?;
    adopt(&mut site, current, &work, &site_dir, &here);
    Ok(site)
}

/// [`load`]s `entry`'s snapshot and prepares its apply ([`crate::apply::prepare_site`]: the
/// site's locks taken, its hosts read, the plan made); what was put back goes again if that
/// fails (after the run, [`super::apply`] removes it).
pub fn prepare(
    current: &Site,
    entry: &Entry,
    request: crate::apply::Request,
    say: crate::apply::Say,
) -> Result<crate::apply::Prepared, HistoryError> {
    let site = load(current, entry)?;
    crate::apply::prepare_site(request, site, say).map_err(|e| {
        let _ = std::fs::remove_dir_all(History::default().work(&entry.run));
        HistoryError::Apply(e)
    })
}

/// `snap` (loaded from `site_dir` under `work`) with `current`'s platform, policies and file
/// name; a secret file of the snapshot's tree read where the current site's tree (`here`) has
/// it: a secret's value is never in a snapshot.
fn adopt(snap: &mut Site, current: &Site, work: &Path, site_dir: &Path, here: &Path) {
    snap.platform = platform_for(current, snap);
    for s in &mut snap.services {
        if let Some(id) = current.service(&s.name) {
            s.policy = current.services[id].policy.clone();
        }
    }
    snap.max_failed = current.max_failed;
    snap.file = current.file.clone();
    let moved = |p: &mut PathBuf| {
        if let (true, Some(rel)) = (p.starts_with(work), climb(site_dir, p)) {
            *p = crate::site::normalize_path(&here.join(rel));
        }
    };
    let secrets = snap
        .secrets
        .iter_mut()
        .chain(snap.services.iter_mut().flat_map(|s| s.secrets.iter_mut()));
    for secret in secrets {
        if let SecretSource::File(p) = &mut secret.source {
            moved(p);
        }
    }
}

/// The path from `dir` up to `path` (beside or above it): `../../x`.
fn climb(dir: &Path, path: &Path) -> Option<PathBuf> {
    let mut up = PathBuf::new();
    let mut base = dir;
    loop {
        if let Ok(rest) = path.strip_prefix(base) {
            return Some(up.join(rest));
        }
        base = base.parent()?;
        up.push("..");
    }
}

/// `current`'s platform for the snapshot's site: its hosts' classes are the snapshot's of the
/// same name (a host of a class the snapshot does not have is left out).
fn platform_for(current: &Site, snap: &Site) -> Platform {
    let mut p = current.platform.clone();
    let class = |c: ClassId| snap.class(&current.classes.get(c)?.name);
    match &mut p.inventory {
        InventorySpec::Static { hosts } => hosts.retain_mut(|h| match class(h.class) {
            Some(c) => {
                h.class = c;
                true
            }
            None => false,
        }),
        InventorySpec::Ec2(spec) => {
            spec.classes = spec
                .classes
                .iter()
                .filter_map(|(c, tags)| Some((class(*c)?, tags.clone())))
                .collect();
        }
        InventorySpec::Command(_) => {}
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn climbing_out_of_a_directory_names_the_way_back() {
        let got = climb(Path::new("/w/site/in"), Path::new("/w/site/secrets/k"));
        assert_eq!(got, Some(PathBuf::from("../secrets/k")));
    }
}
