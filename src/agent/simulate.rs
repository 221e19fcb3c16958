//! `deploy agent --simulate N`: N agents as tasks of one process, for benchmarks. Each is the
//! real agent ([`super::start`], then [`super::watch`]) on a thread of its own: its own etcd
//! connection, its own watch on `desired/`, its own slots' leases, its own state directory
//! (`<state-dir>/<host>`) and host directory (`<root>/<host>`), its hooks run as the site says.
//! Only the runtime that carries their etcd traffic, and the stop signal, are shared. The
//! hosts are the first N of the snapshot `desired/current` names (publish first).

use super::{load, start, Agent, AgentError, Place, Request};
use crate::apply::Say;
use crate::state::store::{Etcd, Keys};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};

/// Each agent's thread: the apply stage runs on it, as on an agent's main thread.
const STACK: usize = 4 << 20;

/// Runs agents for the first `n` hosts of the current snapshot until SIGINT or SIGTERM; says
/// `simulating N agents` once every one is connected and watching.
pub fn simulate(request: &Request, n: usize, say: Say) -> Result<(), AgentError> {
    let runtime =
        Arc::new(crate::session::runtime().map_err(|e| AgentError::io(&request.state_dir, e))?);
    let stop = Arc::new(AtomicBool::new(false));
    runtime.block_on(super::signals(stop.clone()))?;
    let hosts = runtime.block_on(published_hosts(request, n))?;
    for h in &hosts {
        super::check_host(h)?;
    }
    let (started, starts) = mpsc::channel::<Result<(), AgentError>>();
    let mut threads = Vec::with_capacity(hosts.len());
    for host in hosts {
        let at = Place {
            state_dir: request.state_dir.join(&host),
            root: request.root.join(&host),
            host: host.clone(),
        };
        let (mine, runtime, stop, started) = (
            request.clone(),
            runtime.clone(),
            stop.clone(),
            started.clone(),
        );
        let said = say.clone();
        let prefixed: Say = Arc::new(move |text: &str| said(&format!("{host}: {text}")));
        let thread = std::thread::Builder::new()
            .name(format!("agent-{}", at.host))
            .stack_size(STACK)
            .spawn(move || {
                std::fs::create_dir_all(&at.root).map_err(|e| AgentError::io(&at.root, e))?;
                let agent: Agent = match start(&mine, &at, runtime, stop, prefixed) {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = started.send(Err(AgentError::Usage {
                            reason: format!("{}: {e}", at.host),
                            help: "the other agents are stopped".into(),
                        }));
                        return Err(e);
                    }
                };
                let _ = started.send(Ok(()));
                super::watch(&agent)
            })
            .map_err(|e| AgentError::io(&request.state_dir, e))?;
        threads.push(thread);
    }
    drop(started);
    let mut failed = None;
    for _ in 0..threads.len() {
        match starts.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed = Some(e);
                break;
            }
            Err(_) => break,
        }
    }
    if let Some(e) = failed {
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in threads {
            let _ = t.join();
        }
        return Err(e);
    }
    say(&format!(
        "simulating {} agents (site {}, state under {}, hosts under {})",
        threads.len(),
        request.site,
        request.state_dir.display(),
        request.root.display()
    ));
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => say(&format!("error: {e}")),
            Err(_) => say("error: an agent's thread panicked"),
        }
    }
    Ok(())
}

/// The first `n` hosts of the snapshot `desired/current` names, in the manifest's order.
async fn published_hosts(request: &Request, n: usize) -> Result<Vec<String>, AgentError> {
    let etcd = Etcd::connect(&request.spec(), "agent").await?;
    let keys = Keys::new(&request.prefix, &request.site);
    let Some(digest) = etcd.value(&keys.current()).await? else {
        return Err(AgentError::Usage {
            reason: format!(
                "--simulate: nothing is published at {}: the simulated hosts are the snapshot's",
                keys.current()
            ),
            help: "publish the site first with `deploy publish SITE`".into(),
        });
    };
    let digest = String::from_utf8_lossy(&digest).trim().to_string();
    let manifest = load::manifest(&etcd, &keys, &digest).await?;
    Ok(manifest
        .hosts
        .iter()
        .take(n)
        .map(|h| h.name.clone())
        .collect())
}
