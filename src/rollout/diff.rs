//! `deploy plan --diff`: for each file a step would place with other content than the host
//! recorded, a unified diff of what the host has against what it would get, the host's side
//! read from the host now and the site's rendered for that host. A file that renders a secret
//! is never shown (`[secret changed]`), nor one that is not text, nor one past a size limit.

use crate::desired::{Content, Desired};
use crate::inventory::Hosts;
use crate::plan::{FileDiff, Plan, StepKind};
use crate::secrets::Secrets;
use crate::site::Site;
use crate::transport::{quote, Link, Target, Transport};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The most of a file either side that is diffed; past it, the diff says its size.
const LIMIT: u64 = 256 * 1024;

/// One file to diff: where on the host, and what the site would put there.
struct Wanted {
    service: String,
    path: String,
    on_host: String,
    content: Content,
}

/// The diffs of every file `plan`'s steps would place with content other than the host
/// recorded, in host, service and path order; at most `max_connections` hosts read at once.
pub async fn file_diffs<T: Transport>(
    site: Arc<Site>,
    hosts: &Hosts,
    desired: &Desired,
    plan: &Plan,
    transport: Arc<T>,
    max_connections: usize,
    secrets: &Secrets,
) -> Vec<FileDiff> {
    let gate = Arc::new(Semaphore::new(max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for host in &plan.hosts {
        let Some(hid) = hosts.find(&host.name) else {
            continue;
        };
        let mut wanted = Vec::new();
        for sp in &plan.services {
            let Some(sid) = site.service(&sp.name) else {
                continue;
            };
            let stepped = sp
                .each_step()
                .any(|st| st.host == host.name && st.kind != StepKind::Unread);
            if !stepped || site.services[sid].files.is_empty() {
                continue;
            }
            let recorded = host
                .observed
                .service(&sp.name)
                .and_then(|r| r.inputs.clone())
                .unwrap_or_default();
            let now = desired.inputs(sid, hid);
            let Ok(files) = desired.deliveries(&site, sid, &hosts.hosts[hid], secrets) else {
                continue;
            };
            for d in files {
                let key = format!("file:{}", d.to);
                if now.get(&key) == recorded.get(&key) {
                    continue;
                }
                wanted.push(Wanted {
                    service: sp.name.clone(),
                    on_host: site.platform.host_path(&d.to),
                    path: d.to,
                    content: d.content,
                });
            }
        }
        if wanted.is_empty() {
            continue;
        }
        let (transport, gate) = (transport.clone(), gate.clone());
        let target = Target {
            name: host.name.to_string(),
            address: host.address.to_string(),
        };
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            diff_host(&*transport, &target, wanted).await
        });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.extend(done.unwrap_or_default());
    }
    out.sort_by(|a, b| (&a.host, &a.service, &a.path).cmp(&(&b.host, &b.service, &b.path)));
    out
}

/// Reads each file of `wanted` on the host and diffs it with the site's.
async fn diff_host<T: Transport>(
    transport: &T,
    target: &Target,
    wanted: Vec<Wanted>,
) -> Vec<FileDiff> {
    let link = transport.connect(target).await;
    let mut out = Vec::with_capacity(wanted.len());
    for w in wanted {
        let diff = match &link {
            Err(e) => format!("[not read: {e}]"),
            Ok(link) => match read_on_host(link, &w.on_host).await {
                Err(why) => format!("[not read: {why}]"),
                Ok(old) => diff_text(&target.name, &w.path, old.as_deref(), &w.content),
            },
        };
        out.push(FileDiff {
            host: target.name.clone(),
            service: w.service,
            path: w.path,
            diff,
        });
    }
    if let Ok(link) = link {
        transport.park(&target.name, link).await;
    }
    out
}

/// The file at `path` on the host, at most [`LIMIT`] bytes and one more (to tell it is past
/// the limit); `None` when there is no such file.
async fn read_on_host<L: Link>(link: &L, path: &str) -> Result<Option<Vec<u8>>, String> {
    let p = quote(path);
    let script = format!(
        "if [ -f {p} ]; then head -c {} -- {p}; else exit 3; fi",
        LIMIT + 1
    );
    match link.run(&script).await {
        Ok(out) if out.success() => Ok(Some(out.stdout)),
        Ok(out) if out.code == Some(3) => Ok(None),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// The unified diff of `old` (the host's; `None`: no file there) against `new` (the site's),
/// or what it is instead: `[secret changed]`, `[binary file]`, `[larger than 256 KiB]`.
fn diff_text(host: &str, path: &str, old: Option<&[u8]>, new: &Content) -> String {
    let new: Vec<u8> = match new {
        Content::Rendered { secret: true, .. } => return "[secret changed]".into(),
        Content::Rendered { text, .. } => text.as_bytes().to_vec(),
        Content::Path { path, .. } => {
            match std::fs::metadata(path) {
                Ok(m) if m.len() > LIMIT => return "[larger than 256 KiB]".into(),
                _ => {}
            }
            match std::fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) => return format!("[{} not read: {e}]", path.display()),
            }
        }
    };
    let old_bytes = old.unwrap_or_default();
    if old_bytes.len() as u64 > LIMIT {
        return "[larger than 256 KiB]".into();
    }
    let (Ok(old_text), Ok(new_text)) = (std::str::from_utf8(old_bytes), std::str::from_utf8(&new))
    else {
        return "[binary file]".into();
    };
    if old_text.contains('\0') || new_text.contains('\0') {
        return "[binary file]".into();
    }
    let from = match old {
        Some(_) => format!("{host}:{path}"),
        None => "/dev/null".into(),
    };
    similar::TextDiff::from_lines(old_text, new_text)
        .unified_diff()
        .context_radius(3)
        .header(&from, &format!("{host}:{path} (site)"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_shows_lines_and_never_a_secret() {
        let text = |s: &str| Content::Rendered {
            text: Arc::new(s.to_string()),
            secret: false,
        };
        let d = diff_text("app1", "/etc/x", Some(b"a\nb\n"), &text("a\nc\n"));
        assert_eq!(
            d,
            "--- app1:/etc/x\n+++ app1:/etc/x (site)\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
        );
        let fresh = diff_text("app1", "/etc/x", None, &text("a\n"));
        assert!(fresh.starts_with("--- /dev/null\n"), "{fresh}");
        let secret = Content::Rendered {
            text: Arc::new("TOKEN=hunter2\n".into()),
            secret: true,
        };
        assert_eq!(
            diff_text("app1", "/etc/x", Some(b"TOKEN=old\n"), &secret),
            "[secret changed]"
        );
        assert_eq!(
            diff_text("app1", "/etc/x", Some(b"\xff\xfe"), &text("a\n")),
            "[binary file]"
        );
    }
}
