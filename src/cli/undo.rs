//! `deploy undo`: the flags → the run to go back to and its snapshot as a site
//! ([`crate::history::undo`]) → [`crate::apply`] as `deploy apply` drives it.

use super::{Error, UndoArgs};
use crate::apply::{self, Request};
use crate::history::{self, RunId};
use std::sync::Arc;

pub fn run(args: &UndoArgs) -> Result<u8, Error> {
    let current = crate::site::load(&args.site)?;
    let to = match &args.to {
        Some(text) => Some(RunId::parse(text).ok_or_else(|| Error::Usage {
            reason: format!("--to {text:?} is not a run id"),
            help: "name a run as `deploy history SITE` lists it".into(),
        })?),
        None => None,
    };
    let entries = history::entries(&current)?;
    let target = history::undo::target(&entries, to.as_ref())?;
    errln!("undo: back to run {} ({})", target.run, target.started);
    let request = Request {
        target: args.site.clone(),
        yes: args.yes,
        max_connections: args.max_connections,
        break_lock: args.break_lock,
        read_hosts: args.read_hosts,
        read_first: args.read_first,
        ..Request::default()
    };
    let say: apply::Say = Arc::new(|text: &str| errln!("{text}"));
    let prepared = history::undo::prepare(&current, target, request, say.clone())?;
    super::apply::drive(prepared, args.json, Some(target), &say)
}
