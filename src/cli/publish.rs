//! `deploy publish`: site → the publish stage (its snapshot in etcd) → one line said.

use super::{code, Error};
use crate::publish::{self, Request};
use std::path::Path;

pub fn run(site: &Path, json: bool) -> Result<u8, Error> {
    let request = Request {
        site: site.to_path_buf(),
    };
    let p = publish::publish(&request, &super::say())?;
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
        outln!("{value}");
        return Ok(code::OK);
    }
    let already = if p.unchanged {
        " (it was already the desired snapshot)"
    } else {
        ""
    };
    outln!(
        "published {} snapshot {} for {} hosts: {} contents, {} new, {} bytes; {} names it{already}",
        p.site,
        p.digest,
        p.hosts,
        p.contents,
        p.new_contents,
        p.bytes,
        p.key
    );
    Ok(code::OK)
}
