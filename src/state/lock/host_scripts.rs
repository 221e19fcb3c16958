//! The shell text that takes a host's lock (`mkdir`), fences it, breaks a stale one and
//! gives it back, run by [`super::FleetLock`] over the transport.

use crate::transport::quote;

/// The exit code of the scripts for a lock held by someone else (its holder on stdout).
pub(super) const HELD: i32 = 10;

/// The exit code of the lock script on a host that has seen a newer fencing token (on stderr).
pub(super) const FENCED: i32 = 13;

/// The first line a lock-taking script with a `then` prints once the lock is taken.
pub(super) const TAKEN: &str = "drover: lock taken\n";

/// What follows the [`TAKEN`] line in a lock command's output, if the lock was taken. The
/// line is looked for at the start of any line: a login shell that prints something of its
/// own first must not make a lock that was taken look refused (it would be left behind).
pub(super) fn after_taken(stdout: &[u8]) -> Option<&[u8]> {
    let marker = TAKEN.as_bytes();
    let at = stdout
        .windows(marker.len())
        .enumerate()
        .find(|(i, w)| *w == marker && (*i == 0 || stdout[i - 1] == b'\n'))
        .map(|(i, _)| i)?;
    Some(&stdout[at + marker.len()..])
}

/// Where a host keeps the run's hook pid files (`rollout::hook_run`): `<state-dir>/hooks`.
pub fn hooks_dir(state_dir: &str) -> String {
    format!("{}/hooks", state_dir.trim_end_matches('/'))
}

/// `mkdir DIR`; on success writes the holder and exits 0 (with `then`: prints [`TAKEN`] and
/// goes on with `then`, whose exit is the script's); else prints the holder, exits 10.
/// The state directory is made with its `hooks` directory in the same `mkdir -p`, so that a
/// host's first hook finds it and starts no `mkdir` of its own.
pub(super) fn acquire_script(state_dir: &str, dir: &str, me: &str, then: Option<&str>) -> String {
    let taken = then.map_or("exit 0".to_string(), |then| {
        format!("printf {}; {then}; exit $?", quote(TAKEN))
    });
    format!(
        "umask 077; d={d}; {{ [ -d {h} ] || mkdir -p {h}; }} || exit 12; \
         if mkdir \"$d\" 2>/dev/null; then printf '%s\\n' {me} > \"$d/holder.json\" || {{ rm -rf \"$d\"; exit 12; }}; {taken}; fi; \
         cat \"$d/holder.json\" 2>/dev/null; exit {HELD}",
        d = quote(dir),
        h = quote(&hooks_dir(state_dir)),
        me = quote(me)
    )
}

/// Refuses (exit [`FENCED`], the host's token on stderr) when the host recorded a fencing token
/// above `token`; else records `token`. Run before the lock is taken, so that a controller
/// whose etcd lock was given to a later run cannot lock the host again.
pub(super) fn fence_script(state_dir: &str, token: i64) -> String {
    format!(
        "umask 077; f={f}; t=0; {{ IFS= read -r t <\"$f\"; }} 2>/dev/null; \
         case \"$t\" in ''|*[!0-9]*) t=0;; esac; \
         if [ \"$t\" -gt {token} ]; then printf '%s\\n' \"$t\" >&2; exit {FENCED}; fi; \
         mkdir -p {d} && printf '%s\\n' {token} >\"$f.tmp\" && mv -f \"$f.tmp\" \"$f\" || exit 12",
        f = quote(&format!("{state_dir}/fence")),
        d = quote(state_dir),
    )
}

/// Sets the lock aside and removes it, only if its holder is still exactly `seen`.
pub(super) fn break_script(dir: &str, seen: &str) -> String {
    format!(
        "d={d}; a=\"$d.broken.$$\"; \
         if mv \"$d\" \"$a\" 2>/dev/null; then \
         if [ \"$(cat \"$a/holder.json\" 2>/dev/null)\" = {seen} ]; then rm -rf \"$a\"; \
         else mv \"$a\" \"$d\" 2>/dev/null || rm -rf \"$a\"; fi; fi",
        d = quote(dir),
        seen = quote(seen)
    )
}

/// Removes the lock if `me` holds it (`holder.json` is one line, read without a process).
/// Also removes the run's hook pid files (`rollout::hook_run`), emptied as each hook ended,
/// and the stop files of chains it left before their end.
pub(super) fn release_script(state_dir: &str, dir: &str, me: &str, pid: u32) -> String {
    format!("{}; exit 0", release_body(state_dir, dir, me, pid))
}

/// [`release_script`] without its `exit`, to end another command with; it ends in success.
pub(super) fn release_body(state_dir: &str, dir: &str, me: &str, pid: u32) -> String {
    let hooks = hooks_dir(state_dir);
    format!(
        "d={d}; h=; {{ IFS= read -r h <\"$d/holder.json\"; }} 2>/dev/null; \
         if [ \"$h\" = {me} ]; then rm -rf \"$d\" {hooks}/{pid}-*.pid {hooks}/{pid}-*.stop; \
         else rm -f {hooks}/{pid}-*.pid {hooks}/{pid}-*.stop; fi 2>/dev/null; :",
        d = quote(dir),
        me = quote(me),
        hooks = quote(&hooks),
    )
}
