//! `deploy publish`: site → the publish stage (its snapshot in etcd) → one line said; with
//! `--follow`, its progress from the store as `apply` shows a run's (bars, lines or NDJSON),
//! and the outcome as `apply`'s exit code.

use super::{code, Error};
use crate::publish::{self, Followed, Published, Request};
use crate::report;
use crate::rollout::Sink;
use std::io::IsTerminal;
use std::path::Path;

pub fn run(site: &Path, json: bool, follow: bool) -> Result<u8, Error> {
    let request = Request {
        site: site.to_path_buf(),
    };
    let sink: Option<Box<dyn Sink>> = follow.then(|| -> Box<dyn Sink> {
        if json {
            Box::new(report::Ndjson)
        } else if std::io::stderr().is_terminal() {
            Box::new(report::Bars::new())
        } else {
            Box::new(report::Lines)
        }
    });
    let said = |p: &Published| {
        if json {
            let value = serde_json::json!({
                "site": p.site,
                "digest": p.digest,
                "key": p.key,
                "hosts": p.hosts,
                "contents": p.contents,
                "new_contents": p.new_contents,
                "bytes": p.bytes,
                "unchanged": p.unchanged,
            });
            // With --follow, the events follow on stdout: this line first (publish's own).
            outln!("{value}");
            return;
        }
        let already = if p.unchanged {
            " (it was already the desired snapshot)"
        } else {
            ""
        };
        let line = format!(
            "published {} snapshot {} for {} hosts: {} contents, {} new, {} bytes; {} names it{already}",
            p.site, p.digest, p.hosts, p.contents, p.new_contents, p.bytes, p.key
        );
        if follow {
            // Progress is on stderr: the line goes with it, before it.
            errln!("{line}");
        } else {
            outln!("{line}");
        }
    };
    let (p, followed) =
        publish::publish_and_follow(&request, &super::say(), sink.as_deref(), &said)?;
    if let Some(f) = &followed {
        if let Some(newer) = &f.superseded {
            errln!(
                "snapshot {} is no longer followed: {newer} was published since, and the agents converge on it",
                p.digest
            );
        } else if f.interrupted {
            errln!("interrupted: no longer followed; the agents carry on");
        }
    }
    Ok(followed.as_ref().map_or(code::OK, exit))
}

/// `apply`'s exit code for how the follow ended.
fn exit(f: &Followed) -> u8 {
    if f.interrupted {
        code::INTERRUPTED
    } else if f.converged {
        code::OK
    } else {
        code::FAILED
    }
}
