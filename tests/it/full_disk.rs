//! A full disk on a host, on the sshd fleet: a small tmpfs is mounted in one host's own mount
//! namespace (over a directory of its `/srv`), and a file larger than its space is delivered
//! there. The step fails with a reason that names the path and the disk's own words ("No space
//! left on device"), no partial file is left behind to keep the disk full, the file
//! delivered before is intact, and the host records the step failed in its files.

use crate::support;

use std::process::Output;
use support::fleet::{Fleet, FleetHost};

/// `deploy apply site.kdl --yes` in the fleet's directory.
fn apply(fleet: &Fleet) -> Output {
    support::cli::deploy_in(&fleet.dir)
        .args(["apply", "site.kdl", "--yes"])
        .output()
        .expect("run deploy")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// On `host`, shell `command`'s standard output (it must succeed).
fn on(fleet: &Fleet, host: &str, command: &str) -> String {
    let out = fleet.ssh(host, command);
    assert!(out.status.success(), "{command}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_file_larger_than_the_disk_fails_clearly_leaves_no_partial_file_and_keeps_the_old_one() {
    let fleet = Fleet::start(&[FleetHost::new("h1", "box")]);
    fleet.write_platform_with("/var/lib/drover", "direct-above=#false");
    // A disk of 1 MiB, in h1's own mount namespace only.
    on(
        &fleet,
        "h1",
        "mkdir -p /srv/small && mount -t tmpfs -o size=1m tmpfs /srv/small",
    );
    let site = |version: &str| {
        format!(
            "site \"full\" {{ version \"1.0\"; platform \"platform.kdl\" }}\n\
             class \"box\" {{ service \"art\" }}\n\
             service \"art\" {{\n    version \"{version}\"\n    file \"blob.bin\" to=\"/srv/small/blob.bin\"\n    start \"true\"\n}}\n"
        )
    };
    let old = vec![b'o'; 300 << 10];
    std::fs::write(fleet.dir.join("blob.bin"), &old).expect("blob");
    std::fs::write(fleet.dir.join("site.kdl"), site("1.0")).expect("site");
    let out = apply(&fleet);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let sum = |bytes: &[u8]| format!("{}", bytes.len());
    assert_eq!(
        on(&fleet, "h1", "wc -c </srv/small/blob.bin").trim(),
        sum(&old)
    );
    let record_before = on(&fleet, "h1", "cat /var/lib/drover/state.json");

    // 2 MiB does not fit in what is left (or in the whole disk).
    std::fs::write(fleet.dir.join("blob.bin"), vec![b'n'; 2 << 20]).expect("blob");
    std::fs::write(fleet.dir.join("site.kdl"), site("2.0")).expect("site");
    let out = apply(&fleet);
    let said = text(&out);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("/srv/small/blob.bin") && l.contains("No space left")),
        "the reason names the path and the full disk: {said}"
    );
    // Nothing of the attempt is left on the disk: only the old file, and drover's own
    // directory beside it holds nothing received.
    let left = on(&fleet, "h1", "cd /srv/small && find . -type f | sort");
    assert_eq!(left.trim(), "./blob.bin", "left on the disk: {left}");
    let used = on(&fleet, "h1", "df -k /srv/small | tail -1");
    let used_kib: u64 = used
        .split_whitespace()
        .nth(2)
        .and_then(|u| u.parse().ok())
        .expect("df's used column");
    assert!(used_kib < 400, "the disk is still full: {used}");
    // The previous file is intact, and the host still records 1.0.
    let other = on(&fleet, "h1", "tr -d o </srv/small/blob.bin | wc -c");
    assert_eq!(other.trim(), "0", "the old content is intact");
    assert_eq!(
        on(&fleet, "h1", "wc -c </srv/small/blob.bin").trim(),
        sum(&old)
    );
    // The host records the step as failed in its files (so the next run redoes it).
    let record_after = on(&fleet, "h1", "cat /var/lib/drover/state.json");
    assert_ne!(record_after, record_before);
    assert!(
        record_after.contains(r#""outcome":"failure""#)
            && record_after.contains(r#""hook":"files""#),
        "{record_after}"
    );
}
