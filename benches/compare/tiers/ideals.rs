//! The yardsticks of the three-tier workload: the ideal schedule of each policy, the same
//! with one round trip a step, the steps' own time on a host, `deploy plan` and the handshake
//! floor.

/// The ideal schedules, seconds: of Drover's two policies (its own planner's plan, through
/// `drover::rollout::ideal_makespan`) and of the order Ansible and pyinfra follow.
pub(super) struct Ideals {
    pub rolling: f64,
    pub all: f64,
    pub ansible: f64,
    pub pyinfra: f64,
    /// `deploy plan` (reads every host), and one `ssh HOST true` to every host at once:
    /// seconds, once, untimed against the rest.
    pub plan: f64,
    pub connect: f64,
    /// The workload's own time beyond its waits: the four steps of an upgrade to the version a
    /// host runs, run on the host in one command and timed there (no round trip, no tool),
    /// median of a few api hosts, seconds.
    pub own: f64,
    /// Drover's two policies again, each step its two waits and one round trip (`--rtt`):
    /// the least a tool that must tell a host to start a step, and hear that it ended, can do.
    pub rolling_rtt: f64,
    pub all_rtt: f64,
}

use super::super::stats::median;
use super::super::CONNECT_TIMEOUT_S;
use super::{TierBench, TierHost, TIERS};
use drover::plan::Plan;
use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

impl TierBench<'_> {
    /// The ideal schedule of each policy for the next upgrade (the same every run): Drover's
    /// from the plan `deploy plan` makes now, Ansible's and pyinfra's from their order.
    pub(super) fn ideals(&self) -> Ideals {
        let work_of = |host: &str| {
            self.hosts
                .iter()
                .find(|h| h.name == host)
                .map_or(Duration::ZERO, TierHost::work)
        };
        let ideal_of = |policy: &str| {
            let site = self.write_site(policy, self.version + 1);
            let saved = self.work.join(format!("plan-{policy}.json"));
            let started = Instant::now();
            let out = Command::new(&self.tools.deploy)
                .arg("plan")
                .arg(&site)
                .arg("--out")
                .arg(&saved)
                .current_dir(&self.work)
                .output()
                .expect("run deploy plan");
            assert!(
                out.status.success(),
                "deploy plan failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let planned = started.elapsed().as_secs_f64();
            let plan: Plan =
                serde_json::from_slice(&fs::read(&saved).unwrap()).expect("a saved plan");
            let ideal = drover::rollout::ideal_makespan(&plan, |_, host| work_of(host));
            let rtt = Duration::from_millis(self.args.rtt_ms);
            let with_rtt = drover::rollout::ideal_makespan(&plan, |_, host| work_of(host) + rtt);
            (ideal.as_secs_f64(), with_rtt.as_secs_f64(), planned)
        };
        let tier_hosts = |tier: usize| -> Vec<&TierHost> {
            self.hosts.iter().filter(|h| h.tier == tier).collect()
        };
        // Ansible: per play, `serial` batches in inventory order (30 %, rounded down, at least
        // one), each waiting for its slowest host (free strategy within the batch).
        let ansible = (0..TIERS.len())
            .map(|t| {
                let hs = tier_hosts(t);
                let batch = (hs.len() * 3 / 10).max(1);
                hs.chunks(batch)
                    .map(|c| c.iter().map(|h| h.work()).max().unwrap_or_default())
                    .sum::<Duration>()
            })
            .sum::<Duration>();
        // pyinfra: tier after tier, every host of a tier at once, so each tier its slowest host.
        let pyinfra = (0..TIERS.len())
            .map(|t| {
                tier_hosts(t)
                    .iter()
                    .map(|h| h.work())
                    .max()
                    .unwrap_or_default()
            })
            .sum::<Duration>();
        let (rolling, rolling_rtt, plan) = ideal_of("rolling.kdl");
        let (all, all_rtt, _) = ideal_of("all.kdl");
        Ideals {
            rolling,
            all,
            ansible: ansible.as_secs_f64(),
            pyinfra: pyinfra.as_secs_f64(),
            plan,
            connect: self.connect_all(),
            own: self.own_overhead(),
            rolling_rtt,
            all_rtt,
        }
    }

    /// What the steps themselves take beyond their two waits, with no tool and no round trip:
    /// `stop`, `install`, `start` and `check` of the version a host already runs, one after
    /// the other in one command on the host, timed there; the median of five api hosts, one
    /// after the other, seconds. (Drover's records are not touched; the hosts stay at their
    /// version.)
    fn own_overhead(&self) -> f64 {
        let script = format!(
            "t0=$(date +%s%N) && for s in stop install start check; do              sh /srv/tier/step $s {} api || exit 1; done && echo $(( $(date +%s%N) - t0 ))",
            self.version
        );
        let api: Vec<&TierHost> = self.hosts.iter().filter(|h| h.tier == 1).take(5).collect();
        median(api.iter().map(|h| {
            let out = self
                .fleet
                .ssh_command()
                .arg("-o")
                .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                .args([h.name.as_str(), script.as_str()])
                .output()
                .expect("run ssh");
            assert!(
                out.status.success(),
                "the steps on {}: {}",
                h.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let ns: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("nanoseconds from the host");
            ns / 1e9 - h.work().as_secs_f64()
        }))
    }

    /// The handshake floor: one plain `ssh HOST true` to every host at once, seconds.
    fn connect_all(&self) -> f64 {
        let started = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .hosts
                .iter()
                .map(|h| {
                    let mut cmd = self.fleet.ssh_command();
                    cmd.arg("-o")
                        .arg(format!("ConnectTimeout={CONNECT_TIMEOUT_S}"))
                        .args([&h.name, "true"]);
                    s.spawn(move || cmd.output())
                })
                .collect();
            for h in handles {
                let out = h.join().unwrap().expect("run ssh");
                assert!(
                    out.status.success(),
                    "ssh: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        });
        started.elapsed().as_secs_f64()
    }
}
