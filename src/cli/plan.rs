//! `deploy plan`: site → inventory → observed state → plan → text, JSON or a saved file.

use super::{code, Error, PlanArgs};
use crate::inventory::{HostId, Hosts, Selector};
use crate::plan::{self, Plan, Selection};
use crate::report;
use crate::site::{self, Site};
use crate::state::{Observe, Observed, Offline, Remote};
use crate::transport::AnyTransport;
use std::collections::BTreeSet;
use std::io::Write;

pub fn run(args: &PlanArgs) -> Result<u8, Error> {
    if args.repair && args.offline {
        return Err(Error::Usage {
            reason: "--repair runs the checks on the hosts, and --offline contacts none".into(),
            help: "drop one of them".into(),
        });
    }
    let site = site::load(&args.site)?;
    let mut selection = selection(&site, &args.only)?;
    let on = selector(&args.on)?;
    let hosts = super::resolve_for_plan(&site)?;
    selection.hosts = on_hosts(on.as_ref(), &site, &hosts)?;
    let secrets = super::readable_secrets(&site, false)?;
    let desired = crate::desired::resolve(&site, &hosts, &secrets)?;
    let observed = if args.offline {
        observe(&site, &hosts, true, args.max_connections)?
    } else {
        observe_through_store(
            &site,
            &hosts,
            &desired,
            args.read_hosts,
            args.max_connections,
        )?
    };
    let mut plan = plan::plan(&site, &hosts, &observed, &desired, &selection)?;
    if args.repair {
        let transport = std::sync::Arc::new(AnyTransport::for_platform(
            &site.platform,
            hosts.hosts.len(),
            args.max_connections,
        ));
        plan = super::runtime()?.block_on(crate::rollout::plan_repairs(
            std::sync::Arc::new(site.clone()),
            &hosts,
            &observed,
            &desired,
            &mut selection,
            plan,
            transport,
            args.max_connections,
            std::sync::Arc::new(secrets),
        ))?;
    }
    if let Some(path) = &args.out {
        save(&plan, path)?;
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &plan)
            .map_err(std::io::Error::from)
            .and_then(|_| writeln!(out))
    } else {
        out.write_all(report::plan_text(&plan).as_bytes())
    };
    // A closed pipe (`deploy plan | head`) is not an error worth reporting.
    let _ = written.and_then(|_| out.flush());
    Ok(code::OK)
}

/// What every host runs: read over the platform's transport, or all fresh with `offline`.
pub fn observe(
    site: &Site,
    hosts: &Hosts,
    offline: bool,
    max_connections: usize,
) -> Result<Vec<Observed>, Error> {
    let runtime = super::runtime()?;
    if offline {
        return Ok(runtime.block_on(Offline.observe(site, hosts)));
    }
    let transport = std::sync::Arc::new(AnyTransport::for_platform(
        &site.platform,
        hosts.hosts.len(),
        max_connections,
    ));
    let read = Default::default();
    Ok(runtime.block_on(observe_on(transport, site, hosts, max_connections, read)))
}

/// What every host runs: with a store (and without `read_all`, and unless a run could not
/// publish all its state), the hosts it shows converged are taken as it says, and only the
/// others are read.
pub fn observe_through_store(
    site: &Site,
    hosts: &Hosts,
    desired: &crate::desired::Desired,
    read_all: bool,
    max_connections: usize,
) -> Result<Vec<Observed>, Error> {
    let runtime = super::runtime()?;
    let stale = match (&site.platform.store, read_all) {
        (Some(_), false) => crate::session::unpublished(&site.name),
        _ => None,
    };
    if let Some(run) = &stale {
        errln!(
            "note: {run} could not publish all its state to etcd (.drover/unpublished): the \
             store is stale, every host is read"
        );
    }
    let view = match read_all || stale.is_some() {
        true => None,
        false => runtime
            .block_on(crate::state::store::read(site))
            .map_err(Error::Store)?,
    };
    let Some(view) = view else {
        return observe(site, hosts, false, max_connections);
    };
    let known = crate::state::store::converged(&view, site, hosts, desired);
    let subset = hosts.subset(&crate::state::store::to_read(&known), site.classes.len());
    let read = observe(site, &subset, false, max_connections)?;
    Ok(crate::state::store::merge(known, read))
}

/// What every host runs, read over `transport` (which may keep the links for what follows),
/// on the caller's runtime; hosts in `read` were read already (host → the read's output).
pub async fn observe_on<T: crate::transport::Transport>(
    transport: std::sync::Arc<T>,
    site: &Site,
    hosts: &Hosts,
    max_connections: usize,
    read: std::collections::HashMap<String, crate::transport::Output>,
) -> Vec<Observed> {
    let remote = Remote {
        transport,
        state_dir: site.platform.host_state_dir(),
        max_connections,
        read,
    };
    remote.observe(site, hosts).await
}

/// `--only` names → service ids; an unknown name is an error with a suggestion.
pub fn selection(site: &Site, only: &[String]) -> Result<Selection, Error> {
    if only.is_empty() {
        return Ok(Selection::default());
    }
    let mut services = std::collections::BTreeSet::new();
    for name in only {
        match site.service(name) {
            Some(id) => {
                services.insert(id);
            }
            None => {
                let names: Vec<&str> = site.services.iter().map(|s| s.name.as_str()).collect();
                return Err(Error::UnknownService {
                    name: name.into(),
                    help: format!("services: {}", names.join(", ")),
                });
            }
        }
    }
    Ok(Selection {
        services: Some(services),
        ..Default::default()
    })
}

/// `--on` values → a selector, checked before the inventory is resolved; `None` without any.
pub fn selector(on: &[String]) -> Result<Option<Selector>, Error> {
    if on.is_empty() {
        return Ok(None);
    }
    Ok(Some(Selector::parse_all(on)?))
}

/// The hosts a selector picks (`None`: all); a term matching no host is an error.
pub fn on_hosts(
    on: Option<&Selector>,
    site: &Site,
    hosts: &Hosts,
) -> Result<Option<BTreeSet<HostId>>, Error> {
    let Some(on) = on else {
        return Ok(None);
    };
    Ok(Some(on.select_in(site, hosts)?))
}

/// Writes the plan as compact JSON, atomically.
fn save(plan: &Plan, path: &std::path::Path) -> Result<(), Error> {
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(err)?;
    let mut w = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut w, plan).map_err(|e| err(e.into()))?;
    w.write_all(b"\n").map_err(err)?;
    w.into_inner()
        .map_err(|e| err(e.into_error()))?
        .sync_all()
        .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
