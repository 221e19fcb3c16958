//! `deploy plan`: site → inventory → observed state → plan → text, JSON or a saved file.

use super::{code, say, Error, PlanArgs};
use crate::apply::{observe, observe_through_store, on_hosts, selection, selector};
use crate::plan::{self, Plan};
use crate::report;
use crate::site;
use crate::transport::AnyTransport;
use std::io::Write;

pub fn run(args: &PlanArgs) -> Result<u8, Error> {
    if (args.repair || args.diff) && args.offline {
        return Err(Error::Usage {
            reason: "--repair and --diff read the hosts, and --offline contacts none".into(),
            help: "drop one of them".into(),
        });
    }
    let site = site::load(&args.site)?;
    let mut selection = selection(&site, &args.only)?;
    let on = selector(&args.on)?;
    let hosts = crate::apply::resolve_for_plan(&site, &say)?;
    selection.hosts = on_hosts(on.as_ref(), &site, &hosts)?;
    let secrets = std::sync::Arc::new(super::readable_secrets(&site, false)?);
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
            &say,
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
            secrets.clone(),
        ))?;
    }
    if args.diff {
        let transport = std::sync::Arc::new(AnyTransport::for_platform(
            &site.platform,
            hosts.hosts.len(),
            args.max_connections,
        ));
        plan.diffs = super::runtime()?.block_on(crate::rollout::file_diffs(
            std::sync::Arc::new(site.clone()),
            &hosts,
            &desired,
            &plan,
            transport,
            args.max_connections,
            &secrets,
        ));
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
