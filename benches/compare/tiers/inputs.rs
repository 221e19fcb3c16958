//! What every tool is given for the three-tier workload: the hosts' scripts and waits, the
//! Drover site, the Ansible playbook and the pyinfra deploy.

use super::super::CONNECT_TIMEOUT_S;
use super::scripts::{CHECK_SCRIPT, SERVE_C, STEP_SCRIPT};
use super::{TierBench, TierHost, PORT, STEPS, TIERS};
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

impl TierBench<'_> {
    /// Each host's scripts and waits, in its own `/srv/tier` (untimed).
    pub(super) fn write_hosts(&self) {
        let source = self.work.join("serve.c");
        let serve = self.work.join("serve");
        fs::write(&source, SERVE_C).unwrap();
        let cc = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&serve)
            .arg(&source)
            .status();
        assert!(
            cc.is_ok_and(|s| s.success()),
            "cc could not build the hosts' server ({})",
            source.display()
        );
        for h in &self.hosts {
            let dir = self.fleet.host_root(&h.name).join("srv/tier");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("step"), STEP_SCRIPT).unwrap();
            fs::write(dir.join("check"), CHECK_SCRIPT).unwrap();
            fs::copy(&serve, dir.join("serve")).unwrap();
            fs::create_dir_all(
                self.fleet
                    .host_root(&h.name)
                    .join("srv")
                    .join(TIERS[h.tier]),
            )
            .unwrap();
            let fifo = dir.join("fifo");
            if !fifo.exists() {
                let made = Command::new("mkfifo").arg(&fifo).status();
                assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
            }
            fs::write(dir.join("address"), format!("{}\n", h.address)).unwrap();
            fs::write(
                dir.join("wait"),
                format!(
                    "{}.{:03} {}.{:03}\n",
                    h.install_ms / 1000,
                    h.install_ms % 1000,
                    h.ready_ms / 1000,
                    h.ready_ms % 1000
                ),
            )
            .unwrap();
        }
    }

    /// The api hosts' `address:port`, space-separated (the order is not checked).
    pub(super) fn pool(&self) -> String {
        let mut api: Vec<&TierHost> = self.hosts.iter().filter(|h| h.tier == 1).collect();
        api.sort_by(|a, b| a.name.cmp(&b.name));
        api.iter()
            .map(|h| format!("{}:{PORT}", h.address))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Every tool's inputs but the Drover site, which carries the version.
    pub(super) fn write_inputs(&self) {
        let w = &self.work;
        let write = |name: &str, text: String| fs::write(w.join(name), text).unwrap();
        let platform = self.fleet.write_platform("/var/lib/drover");
        let text = fs::read_to_string(&platform).unwrap().replacen(
            "transport \"ssh\" ",
            &format!("transport \"ssh\" connect-timeout=\"{CONNECT_TIMEOUT_S}s\" "),
            1,
        );
        // The same platform, each host's connection kept 5 minutes after a command.
        let persist = text.replacen("transport \"ssh\" ", "transport \"ssh\" persist=\"5m\" ", 1);
        fs::write(platform.with_file_name("platform-persist.kdl"), persist).unwrap();
        fs::write(&platform, text).unwrap();
        // Drover: a new user's policies, nothing but the batch.
        write(
            "rolling.kdl",
            "policy \"rolling\" {\n    batch \"30%\"\n}\n".into(),
        );
        write(
            "all.kdl",
            "policy \"all\" {\n    batch \"100%\"\n    max-failed \"100%\"\n    on-failure \"continue\"\n}\n"
                .into(),
        );
        // Ansible: one group per tier, one play per tier in order, at its best (free
        // strategy, pipelining, ControlPersist, forks for every host).
        let mut inventory = String::new();
        for (tier, name) in TIERS.iter().enumerate() {
            writeln!(inventory, "[{name}]").unwrap();
            for h in self.hosts.iter().filter(|h| h.tier == tier) {
                writeln!(inventory, "{} ansible_host={}", h.name, h.address).unwrap();
            }
        }
        write("inventory.ini", inventory);
        write(
            "ansible.cfg",
            super::super::tool::ansible_cfg(&w.join("inventory.ini"), self.n.max(5), &self.fleet),
        );
        let pool = self.pool();
        let mut playbook = String::new();
        for tier in TIERS {
            write!(
                playbook,
                "- hosts: {tier}\n  gather_facts: false\n  serial: \"30%\"\n  strategy: free\n  tasks:\n"
            )
            .unwrap();
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    format!(" \"{pool}\"")
                } else {
                    String::new()
                };
                let text = format!("sh /srv/tier/step {step} {{{{ version }}}} {tier}{extra}");
                writeln!(
                    playbook,
                    "    - name: {tier} {step}\n      ansible.builtin.shell: {}",
                    serde_json::to_string(&text).unwrap()
                )
                .unwrap();
            }
        }
        write("playbook.yml", playbook);
        // pyinfra: one group per tier, its operations under `if "<tier>" in host.groups`; run
        // once per tier (see `pyinfra`).
        let mut inventory = super::super::tool::pyinfra_common(&self.fleet);
        for (tier, name) in TIERS.iter().enumerate() {
            writeln!(inventory, "\n{name} = [").unwrap();
            for h in self.hosts.iter().filter(|h| h.tier == tier) {
                writeln!(
                    inventory,
                    "    ({:?}, {{**common, \"ssh_hostname\": {:?}}}),",
                    h.name, h.address
                )
                .unwrap();
            }
            inventory.push_str("]\n");
        }
        write("inventory.py", inventory);
        let mut deploy = format!(
            "from pyinfra import host\nfrom pyinfra.operations import server\n\n\
             POOL = {pool:?}\nversion = host.data.version\n"
        );
        for tier in TIERS {
            writeln!(deploy, "\nif {tier:?} in host.groups:").unwrap();
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    " + ' \"' + POOL + '\"'"
                } else {
                    ""
                };
                writeln!(
                    deploy,
                    "    server.shell(name=\"{tier} {step}\", commands=[f\"sh /srv/tier/step {step} {{version}} {tier}\"{extra}])"
                )
                .unwrap();
            }
        }
        write("deploy.py", deploy);
    }

    /// The Drover site at `version` under the given policy file.
    pub(super) fn write_site(&self, policy: &str, version: u64) -> PathBuf {
        self.write_site_on(policy, "platform.kdl", version)
    }

    /// The Drover site at `version` under the given policy file, on the given platform file.
    pub(super) fn write_site_on(&self, policy: &str, platform: &str, version: u64) -> PathBuf {
        let mut site = format!(
            "site \"tiers\" {{\n    version \"{version}\"\n    platform \"{}\"\n    policy \"{policy}\"\n}}\n\n",
            self.fleet.dir.join(platform).display(),
        );
        for tier in TIERS {
            writeln!(site, "class \"{tier}\" {{ service \"{tier}\" }}").unwrap();
        }
        for tier in TIERS {
            write!(site, "\nservice \"{tier}\" {{\n    port {PORT}\n").unwrap();
            match tier {
                "api" => site.push_str("    needs \"db\"\n"),
                "web" => site.push_str("    needs \"api\" healthy=\"50%\" addressable=\"all\"\n"),
                _ => {}
            }
            for step in STEPS {
                let extra = if tier == "web" && step == "install" {
                    " \"$DEPLOY_NEEDS_API\""
                } else {
                    ""
                };
                let timeout = if step == "check" {
                    " timeout=\"60s\""
                } else {
                    ""
                };
                writeln!(
                    site,
                    "    {step} #\"sh /srv/tier/step {step} \"$DEPLOY_NEW_VERSION\" {tier}{extra}\"#{timeout}"
                )
                .unwrap();
            }
            site.push_str("}\n");
        }
        let path = self.work.join("site.kdl");
        fs::write(&path, site).unwrap();
        path
    }
}
