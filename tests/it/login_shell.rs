//! Hosts whose login shell is not `/bin/sh`: root's login shell on these sshd hosts is `zsh`,
//! which reads shell text otherwise than `/bin/sh` (a glob that matches nothing stops the
//! command, `$x` is not split). Every command Drover sends in a session of its own (the first
//! on each connection, a file's delivery, every command with `keep-shell=#false`) reaches the
//! login shell as `exec /bin/sh -c '…'` and runs as it would under `/bin/sh`: a deploy
//! converges, its files arrive, and every lock is given back.

use crate::support;

use std::path::Path;
use support::fleet::{Fleet, FleetHost};

const ZSH: &str = "/usr/bin/zsh";

fn apply(fleet: &Fleet) -> String {
    support::cli::ok(
        support::cli::deploy_in(&fleet.dir)
            .args(["apply", "site.kdl", "--yes"])
            .output()
            .expect("run deploy"),
    )
}

fn site(fleet: &Fleet, version: &str) {
    std::fs::write(fleet.dir.join("conf.txt"), format!("conf {version}\n")).expect("conf");
    let site = format!(
        "site \"zsh\" {{ version \"{version}\"; platform \"platform.kdl\" }}\n\
         class \"box\" {{ service \"app\" }}\n\
         service \"app\" {{\n\
         \x20   file \"conf.txt\" to=\"/opt/app/conf.txt\"\n\
         \x20   install \"mkdir -p /opt/app && echo \\\"$DEPLOY_NEW_VERSION\\\" >/opt/app/version\"\n\
         \x20   check \"test \\\"$(cat /opt/app/version)\\\" = \\\"$DEPLOY_NEW_VERSION\\\"\"\n\
         }}\n"
    );
    std::fs::write(fleet.dir.join("site.kdl"), site).expect("site");
}

/// What each host has at `path` (under its root), as text.
fn on_hosts(fleet: &Fleet, path: &str) -> Vec<String> {
    fleet
        .names()
        .into_iter()
        .map(|h| std::fs::read_to_string(fleet.host_root(h).join(path)).unwrap_or_default())
        .collect()
}

fn locks_left(fleet: &Fleet) -> Vec<String> {
    fleet
        .names()
        .into_iter()
        .filter(|h| fleet.host_root(h).join("var-lib/drover/lock").exists())
        .map(String::from)
        .collect()
}

#[test]
fn a_deploy_converges_and_gives_its_locks_back_under_a_zsh_login_shell() {
    assert!(
        Path::new(ZSH).exists(),
        "{ZSH} is missing: install zsh (tests/run.sh does)"
    );
    let hosts: Vec<FleetHost> = (1..=2)
        .map(|i| FleetHost::new(&format!("h{i}"), "box").login_shell(ZSH))
        .collect();
    let fleet = Fleet::start(&hosts);
    // The hosts' login shell is zsh, which does not run a command whose glob matches nothing.
    let probe = fleet.ssh("h1", "echo \"$ZSH_VERSION\"; rm -f /nothing/here-*.pid");
    assert!(
        !String::from_utf8_lossy(&probe.stdout).starts_with('\n'),
        "not zsh: {probe:?}"
    );
    assert!(
        String::from_utf8_lossy(&probe.stderr).contains("no matches found"),
        "{probe:?}"
    );

    // Every command in a session of its own, then with the shell kept (the first command of
    // each connection still in a session of its own).
    for (keep_shell, version) in [(false, "1.0"), (false, "2.0"), (true, "3.0")] {
        fleet.write_platform_with("/var/lib/drover", &format!("keep-shell=#{keep_shell}"));
        site(&fleet, version);
        let said = apply(&fleet);
        assert_eq!(
            on_hosts(&fleet, "opt/app/version"),
            vec![format!("{version}\n"); 2],
            "keep-shell={keep_shell}: {said}"
        );
        assert_eq!(
            on_hosts(&fleet, "opt/app/conf.txt"),
            vec![format!("conf {version}\n"); 2],
            "keep-shell={keep_shell}: {said}"
        );
        assert_eq!(
            locks_left(&fleet),
            Vec::<String>::new(),
            "keep-shell={keep_shell}: a lock left behind: {said}"
        );
        assert!(!said.contains("took over"), "{said}");
    }
}
