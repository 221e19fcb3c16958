//! `deploy plan`: the plan of the site ([`crate::apply::plan`]) as text, JSON or a saved file.

use super::{code, say, Error, PlanArgs};
use crate::apply::PlanRequest;
use crate::plan::Plan;
use crate::report;
use std::io::Write;

pub fn run(args: &PlanArgs) -> Result<u8, Error> {
    let request = PlanRequest {
        site: args.site.clone(),
        only: args.only.clone(),
        on: args.on.clone(),
        offline: args.offline,
        read_hosts: args.read_hosts,
        repair: args.repair,
        diff: args.diff,
        max_connections: args.max_connections,
    };
    let plan = crate::apply::plan(&request, &say())?;
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
