//! Running the tools under test, shared by the workloads: their configuration for the fleet,
//! a timed run with its output in the logs, the failure report, the Ansible masters a run
//! leaves, `deploy`'s cap on connections, the SSH connections and sessions the hosts' sshd
//! logs count.

use super::fleet::Fleet;
use super::{py_string, Args, Machine, CONNECT_TIMEOUT_S};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Runs `cmd` in `work` with its output in `logs/<stem>.out` and `.err`; the seconds it took.
/// Panics, with the output's tail, when it fails.
pub fn timed(mut cmd: Command, work: &Path, logs: &Path, stem: &str, what: &str) -> f64 {
    cmd.current_dir(work)
        .stdin(Stdio::null())
        .stdout(fs::File::create(logs.join(format!("{stem}.out"))).unwrap())
        .stderr(fs::File::create(logs.join(format!("{stem}.err"))).unwrap());
    let started = Instant::now();
    let status = cmd.status().unwrap_or_else(|e| panic!("run {what}: {e}"));
    let seconds = started.elapsed().as_secs_f64();
    require(status.success(), what, logs, stem);
    seconds
}

/// `deploy`'s default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Whether a fleet of the sizes asked for is larger than the default cap: only then does a
/// run with every host kept connected differ from one under the cap.
pub fn over_cap(args: &Args) -> bool {
    args.hosts.iter().any(|&n| n > DEFAULT_MAX_CONNECTIONS)
}

/// Keeps every host of a fleet of `n` connected for the whole run: `--max-connections` N, or
/// the default cap (256) when that is larger.
pub fn uncapped(cmd: &mut Command, n: usize) {
    cmd.arg("--max-connections")
        .arg(n.max(DEFAULT_MAX_CONNECTIONS).to_string());
}

/// An sshd log line per connection accepted …
pub const ACCEPTED: &str = "Accepted publickey";
/// … and per session (command) started.
pub const SESSION: &str = "Starting session: command";

/// Lines of every host's sshd log so far that start with `what` ([`ACCEPTED`] or
/// [`SESSION`]; the fleet's sshd logs at `LogLevel VERBOSE`).
pub fn sshd_lines(fleet: &Fleet, what: &str) -> usize {
    fleet
        .names()
        .into_iter()
        .map(|name| {
            fs::read_to_string(fleet.host_root(name).join("sshd.log"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with(what))
                .count()
        })
        .sum()
}

/// Panics unless `ok`, with the last lines of the run's output in `logs`.
pub fn require(ok: bool, what: &str, logs: &Path, stem: &str) {
    if ok {
        return;
    }
    let tail = |ext: &str| {
        let text = fs::read_to_string(logs.join(format!("{stem}.{ext}"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    panic!(
        "{what} failed ({stem}); its output is in {}:\n{}\n{}",
        logs.display(),
        tail("out"),
        tail("err")
    );
}

/// Closes the ssh masters an Ansible run left in its control directory, so that every run
/// starts without connections, as every other tool does.
pub fn close_masters(control: &Path) {
    for socket in fs::read_dir(control).into_iter().flatten().flatten() {
        let _ = Command::new("ssh")
            .arg("-S")
            .arg(socket.path())
            .args(["-O", "exit", "ignored"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Ansible's configuration for the fleet: strict host-key checking through the fleet's
/// ssh_config, pipelining, ControlPersist, `forks` at once, no fact gathering.
pub fn ansible_cfg(inventory: &Path, forks: usize, fleet: &Fleet) -> String {
    format!(
        "[defaults]\ninventory = {inv}\nforks = {forks}\nhost_key_checking = True\n\
         timeout = {CONNECT_TIMEOUT_S}\n\
         gathering = explicit\ninterpreter_python = /usr/bin/python3\n\
         retry_files_enabled = False\nnocolor = True\n\n\
         [ssh_connection]\npipelining = True\n\
         ssh_args = -F {cfg} -o ControlMaster=auto -o ControlPersist=60s\n",
        inv = inventory.display(),
        cfg = fleet.ssh_config().display(),
    )
}

/// The start of a pyinfra inventory: `common`, every host's connection settings (the fleet's
/// key, its known_hosts with strict checking, its ssh_config).
pub fn pyinfra_common(fleet: &Fleet) -> String {
    format!(
        "common = {{\n    \"ssh_port\": {port},\n    \"ssh_user\": \"root\",\n    \
         \"ssh_key\": {key},\n    \"ssh_known_hosts_file\": {known},\n    \
         \"ssh_strict_host_key_checking\": \"yes\",\n    \"ssh_config_file\": {cfg},\n    \
         \"ssh_allow_agent\": False,\n    \"ssh_look_for_keys\": False,\n    \
         \"ssh_paramiko_connect_kwargs\": {{\"timeout\": {t}, \"banner_timeout\": {t}, \"auth_timeout\": {t}}},\n}}\n",
        t = CONNECT_TIMEOUT_S,
        port = super::fleet::SSH_PORT,
        key = py_string(&fleet.identity()),
        known = py_string(&fleet.known_hosts()),
        cfg = py_string(&fleet.ssh_config()),
    )
}

/// The timed runs of one fleet size: one untimed run of each mode first so that every tool
/// starts warm (page cache, Python bytecode; not for the smoke test nor with `--no-warm-up`),
/// then `--runs` rounds, interleaved and rotated from round to round so that a change in the
/// machine's load does not fall on one tool only. `run(mode, what)` runs a mode once;
/// `record(round, mode, sample)` sees each timed sample. The samples, by mode.
pub fn rounds<M: Copy + PartialEq, S>(
    args: &Args,
    modes: &[M],
    mut run: impl FnMut(M, &str) -> S,
    mut record: impl FnMut(usize, M, &S),
) -> Vec<(M, Vec<S>)> {
    if !args.smoke && args.warm_up {
        for &mode in modes {
            run(mode, "warm-up");
        }
    }
    let mut samples: Vec<(M, Vec<S>)> = modes.iter().map(|m| (*m, Vec::new())).collect();
    for r in 0..args.runs {
        let mut order = modes.to_vec();
        order.rotate_left(r % modes.len().max(1));
        for mode in order {
            let sample = run(mode, &format!("run{}", r + 1));
            record(r + 1, mode, &sample);
            if let Some((_, s)) = samples.iter_mut().find(|(m, _)| *m == mode) {
                s.push(sample);
            }
        }
    }
    samples
}

/// The lines of a report that say where it ran: the round trip added (if any), the machine,
/// and its load before and during the timed runs (`loads`, one per run).
pub fn environment(out: &mut String, args: &Args, machine: &Machine, loads: &[f64]) {
    use std::fmt::Write as _;
    if args.rtt_ms > 0 {
        writeln!(
            out,
            "- every SSH connection through `benches/compare/delay.py`: {} ms added to each \
             round trip",
            args.rtt_ms
        )
        .unwrap();
    }
    writeln!(out, "- machine: {}", machine.summary()).unwrap();
    writeln!(
        out,
        "- load average before: {}; 1-minute load at the start of the timed runs: median {:.2}",
        machine.load_before,
        super::stats::median(loads)
    )
    .unwrap();
}
