//! Delivering a step's files: the host says which of them are still exactly as drover placed
//! them; the contents of the others are streamed to it over the host's connection, each into
//! its target's directory, kept only if their source did not change while they were sent, then
//! renamed over their targets (`state::files` has the host's side).

use crate::desired::{Content, Delivery};
use crate::state::{
    discard_script, kept, place_script, receive_script, receives, replaced_listed, survey_script,
    Placed, NOTHING_PLACED,
};
use crate::transport::{Link, Payload};

/// What a delivery did.
pub struct Sent {
    /// Contents sent, and their bytes.
    pub contents: usize,
    pub bytes: u64,
    /// Files put in place; the others were as placed before and left alone.
    pub placed: usize,
    /// Nothing was placed, and a list of what an earlier placement replaced is still on the
    /// host ([`replaced_listed`]): left for this step to let go of if it passes.
    pub listed: bool,
}

impl Sent {
    /// `placed 2 files, sent 1 content (420 bytes)`.
    pub fn describe(&self, files: usize) -> String {
        let s = |n: usize| if n == 1 { "" } else { "s" };
        let kept = files.saturating_sub(self.placed);
        match self.contents {
            0 => format!(
                "{kept} file{} in place already, the host had every content",
                s(kept)
            ),
            n => {
                let mut text = format!(
                    "placed {} file{}, sent {n} content{} ({} bytes)",
                    self.placed,
                    s(self.placed),
                    s(n),
                    self.bytes
                );
                if kept > 0 {
                    text.push_str(&format!(", {kept} in place already"));
                }
                text
            }
        }
    }
}

/// Delivers `files` of `service`. On failure, whether anything may have been put in place,
/// and why. Every command that writes on the host starts with `guard` (the run's, refused there
/// unless the run still holds the host).
pub async fn deliver<L: Link>(
    link: &L,
    state_dir: &str,
    service: &str,
    files: &[Delivery],
    guard: &str,
) -> Result<Sent, (bool, String)> {
    let wanted: Vec<Placed> = files
        .iter()
        .map(|f| Placed {
            to: f.to.clone(),
            mode: f.mode,
            digest: f.digest.clone(),
        })
        .collect();
    let paths: Vec<&str> = files.iter().map(|f| f.to.as_str()).collect();
    let out = link
        .run(&survey_script(state_dir, service, &paths))
        .await
        .map_err(|e| (false, e.to_string()))?;
    if !out.success() {
        return Err((false, failed("looking at the host's files", &out.stderr)));
    }
    let survey = String::from_utf8_lossy(&out.stdout);
    let kept = kept(&wanted, &survey);
    let mut sent = Sent {
        contents: 0,
        bytes: 0,
        placed: 0,
        listed: replaced_listed(&wanted, &survey),
    };
    let to_place: Vec<usize> = (0..files.len()).filter(|i| kept[*i].is_none()).collect();
    if to_place.is_empty() {
        return Ok(sent);
    }
    let placing: Vec<Placed> = to_place.iter().map(|&i| wanted[i].clone()).collect();
    // The first file of each content receives it; the others are copies of it on the host.
    let mut received: Vec<&str> = Vec::new();
    for (&i, p) in to_place.iter().zip(&placing) {
        if !receives(&placing, p) {
            continue;
        }
        let f = &files[i];
        received.push(&f.to);
        match receive(link, f, guard).await {
            Ok(size) => {
                sent.contents += 1;
                sent.bytes += size;
            }
            Err(e) => {
                // Best effort: the host keeps nothing that will never be placed.
                let _ = link.run(&discard_script(&received)).await;
                return Err((false, e));
            }
        }
    }
    let left: Vec<String> = kept.into_iter().flatten().collect();
    let script = format!(
        "{guard}{}",
        place_script(state_dir, service, &placing, &left)
    );
    let out = link.run(&script).await.map_err(|e| (true, e.to_string()))?;
    if !out.success() {
        // Before any target changed: nothing to put back (what an earlier placement's list
        // named was let go of first; putting it back would restore the placement before last).
        let placed = out.code != Some(NOTHING_PLACED);
        if !placed {
            let _ = link.run(&discard_script(&received)).await;
        }
        return Err((placed, failed("putting the files in place", &out.stderr)));
    }
    sent.placed = placing.len();
    sent.listed = false;
    Ok(sent)
}

/// Sends `f`'s content to the host, beside its target; its size. A plain file is sent
/// only while its source is what was digested, and what arrived counts only if the source did
/// not change while it was sent (a changed size also fails the host's size check: the stamp
/// says why).
async fn receive<L: Link>(link: &L, f: &Delivery, guard: &str) -> Result<u64, String> {
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
        .send(
            &format!("{guard}{}", receive_script(&f.to, size, f.mode)),
            payload,
        )
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
    match crate::transport::last_line(&text) {
        Some(line) => format!("{what} failed: {}", line.trim()),
        None => format!("{what} failed"),
    }
}

#[cfg(test)]
mod tests;
