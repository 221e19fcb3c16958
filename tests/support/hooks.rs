//! What hooks on a fleet's hosts write down, and a platform with some hosts left out: shared by
//! the desired-state tests (`tests/it/desired.rs`, `tests/it/haproxy.rs`).

use super::fleet::Fleet;
use std::path::PathBuf;

/// Shell text that defines `ev WHAT`: appends `<ns> <what> <service>` to the host's
/// /var/lib/events.
pub const EV: &str = r#"ev() { echo "$(date +%s%N) $1 $DEPLOY_SERVICE" >> /var/lib/events; }; "#;

/// `(ns, host, what, service)` of every event the hooks wrote on every host, oldest first.
pub fn events(fleet: &Fleet) -> Vec<(u128, String, String, String)> {
    let mut all = Vec::new();
    for host in fleet.names() {
        let path = fleet.host_root(host).join("var-lib/events");
        for l in std::fs::read_to_string(path).unwrap_or_default().lines() {
            if let [ns, what, service] = l.split(' ').collect::<Vec<_>>()[..] {
                all.push((
                    ns.parse().unwrap_or(0),
                    host.to_string(),
                    what.to_string(),
                    service.to_string(),
                ));
            }
        }
    }
    all.sort();
    all
}

/// Writes the fleet's `platform.kdl` without the hosts in `hidden`; its path.
pub fn write_platform_without(fleet: &Fleet, hidden: &[&str]) -> PathBuf {
    let platform = fleet.write_platform("/var/lib/drover");
    let text = std::fs::read_to_string(&platform).expect("platform");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !hidden.iter().any(|h| l.contains(&format!("host \"{h}\""))))
        .collect();
    std::fs::write(&platform, kept.join("\n") + "\n").expect("platform");
    platform
}
