//! Delivering a step's files: the contents a host's store lacks are streamed to it over the
//! host's connection, kept only if their source did not change while they were sent, then
//! every file is put in place atomically (`state::files` has the host's side).

use crate::desired::{Content, Delivery};
use crate::state::{
    commit_script, discard_script, missing_script, place_script, receive_script, Inputs, Placed,
    NOTHING_PLACED,
};
use crate::transport::{Link, Payload};

/// What a delivery sent.
pub struct Sent {
    pub contents: usize,
    pub bytes: u64,
}

impl Sent {
    /// `placed 2 files, sent 1 content (420 bytes)`.
    pub fn describe(&self, files: usize) -> String {
        let s = |n: usize| if n == 1 { "" } else { "s" };
        match self.contents {
            0 => format!(
                "placed {files} file{}, the host had every content",
                s(files)
            ),
            n => format!(
                "placed {files} file{}, sent {n} content{} ({} bytes)",
                s(files),
                s(n),
                self.bytes
            ),
        }
    }
}

/// Delivers `files` of `service`; `previous` is what the host recorded the service had.
/// On failure, whether anything may have been put in place, and why.
pub async fn deliver<L: Link>(
    link: &L,
    state_dir: &str,
    service: &str,
    files: &[Delivery],
    previous: Option<&Inputs>,
) -> Result<Sent, (bool, String)> {
    let mut digests: Vec<&str> = files.iter().map(|f| f.digest.as_str()).collect();
    digests.sort_unstable();
    digests.dedup();
    let out = link
        .run(&missing_script(state_dir, &digests))
        .await
        .map_err(|e| (false, e.to_string()))?;
    if !out.success() {
        return Err((false, failed("looking up the host's store", &out.stderr)));
    }
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let missing: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut sent = Sent {
        contents: 0,
        bytes: 0,
    };
    let mut received: Vec<&str> = Vec::new();
    for digest in &missing {
        let Some(f) = files.iter().find(|f| f.digest == *digest) else {
            continue;
        };
        match receive(link, state_dir, digest, f).await {
            Ok(size) => {
                received.push(*digest);
                sent.contents += 1;
                sent.bytes += size;
            }
            Err(e) => {
                // Best effort: the host keeps nothing that will never be committed.
                received.push(*digest);
                let _ = link.run(&discard_script(state_dir, &received)).await;
                return Err((false, e));
            }
        }
    }
    let placed: Vec<Placed> = files
        .iter()
        .map(|f| Placed {
            to: f.to.clone(),
            mode: f.mode,
            digest: f.digest.clone(),
        })
        .collect();
    let known: Vec<Placed> = previous
        .map(|p| {
            p.files()
                .map(|(to, digest, mode)| Placed {
                    to: to.to_string(),
                    mode,
                    digest: digest.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let script =
        commit_script(state_dir, &received) + &place_script(state_dir, service, &placed, &known);
    let out = link.run(&script).await.map_err(|e| (true, e.to_string()))?;
    if !out.success() {
        // Before any target changed, the previous list of what was replaced still stands:
        // nothing to put back (putting it back would restore the placement before last).
        let placed = out.code != Some(NOTHING_PLACED);
        return Err((placed, failed("putting the files in place", &out.stderr)));
    }
    Ok(sent)
}

/// Sends `f`'s content to the host as `digest`'s received copy; its size. A plain file is sent
/// only while its source is what was digested, and what arrived counts only if the source did
/// not change while it was sent (a changed size also fails the host's size check: the stamp
/// says why).
async fn receive<L: Link>(
    link: &L,
    state_dir: &str,
    digest: &str,
    f: &Delivery,
) -> Result<u64, String> {
    let changed = || match &f.content {
        Content::Path { path, stamp } => stamp.check(path).err(),
        Content::Rendered { .. } => None,
    };
    if let Some(why) = changed() {
        return Err(why);
    }
    let (payload, size) = match &f.content {
        Content::Path { path, stamp } => (Payload::File(path), stamp.size()),
        Content::Rendered { text, .. } => (Payload::Bytes(text.as_bytes()), text.len() as u64),
    };
    let out = link
        .send(&receive_script(state_dir, digest, size), payload)
        .await
        .map_err(|e| changed().unwrap_or_else(|| format!("sending {}: {e}", f.to)))?;
    if !out.success() {
        return Err(changed().unwrap_or_else(|| failed(&format!("sending {}", f.to), &out.stderr)));
    }
    match changed() {
        Some(why) => Err(why),
        None => Ok(size),
    }
}

/// `what failed: <the last line of stderr>`.
fn failed(what: &str, stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    match text.lines().rfind(|l| !l.trim().is_empty()) {
        Some(line) => format!("{what} failed: {}", line.trim()),
        None => format!("{what} failed"),
    }
}

#[cfg(test)]
mod tests;
