//! `deploy resume`: site → the resume stage (the waves a `pause "confirm"` waits on,
//! confirmed in etcd) → one line per wave said.

use super::{code, Error};
use crate::publish::{resume, ResumeRequest};
use std::path::Path;

pub fn run(site: &Path, json: bool) -> Result<u8, Error> {
    let done = resume(&ResumeRequest {
        site: site.to_path_buf(),
    })?;
    if json {
        let waves: Vec<_> = done
            .resumed
            .iter()
            .map(|(service, wave, key)| serde_json::json!({"service": service, "wave": wave, "key": key}))
            .collect();
        let value = serde_json::json!({"site": done.site, "digest": done.digest, "resumed": waves});
        outln!("{value}");
        return Ok(code::OK);
    }
    for (service, wave, key) in &done.resumed {
        outln!(
            "resumed {}: wave {wave} of {service} may start (snapshot {}, {key})",
            done.site,
            done.digest
        );
    }
    Ok(code::OK)
}
