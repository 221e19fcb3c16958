//! The shell text that takes a host's lock (`mkdir`), fences it, breaks a stale one and
//! gives it back, run by [`super::FleetLock`] over the transport.

use super::in_flight;
use super::Holder;
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

/// `mkdir DIR`; on success writes the holder and exits 0 (with `end` or `read`: prints
/// [`TAKEN`] and goes on with them, the script's exit being `read`'s); else prints the holder,
/// exits 10. The state directory is made with its `hooks` directory in the same `mkdir -p`, so
/// that a host's first hook finds it and starts no `mkdir` of its own.
///
/// With a fencing `token` (a run holding the site's lock in etcd): once the lock is taken, and
/// only then, the host's recorded token is compared and set ([`fence_body`]): a host that has
/// seen a newer one is given back at once and refused (exit [`FENCED`], its token on stderr),
/// so that a controller whose etcd lock went to a later run cannot lock the host again. Under
/// the lock no two runs set the token at once, so it never goes back.
///
/// Once the lock is taken: `end` (what ends the hooks of a holder whose lock was broken), then
/// the wait for the commands other runs still have in flight on the host
/// ([`in_flight::settle`], the tag `tag` being this run's), then `read`: nothing another run
/// sent before it lost the lock changes the host after it is read.
pub(super) fn acquire_script(
    state_dir: &str,
    dir: &str,
    me: &str,
    tag: &str,
    token: Option<i64>,
    end: Option<&str>,
    read: Option<&str>,
) -> String {
    let settle = in_flight::settle(&hooks_dir(state_dir), tag);
    let taken = match (end, read) {
        (None, None) => format!("{settle}\nexit 0"),
        (end, read) => format!(
            "printf {}; {}{settle}\n{}",
            quote(TAKEN),
            end.map_or(String::new(), |e| format!("{e}; ")),
            read.map_or("exit 0".to_string(), |r| format!("{r}; exit $?")),
        ),
    };
    let fence = token.map_or(String::new(), |t| {
        format!("{}; ", fence_body(state_dir, me, t))
    });
    format!(
        "umask 077; d={d}; {{ [ -d {h} ] || mkdir -p {h}; }} || exit 12; \
         if mkdir \"$d\" 2>/dev/null; then printf '%s\\n' {me} > \"$d/holder.json\" || {{ rm -rf \"$d\"; exit 12; }}; {fence}\n{taken}\nfi; \
         cat \"$d/holder.json\" 2>/dev/null; exit {HELD}",
        d = quote(dir),
        h = quote(&hooks_dir(state_dir)),
        me = quote(me)
    )
}

/// The fence's check and set, run holding the lock (`$d`, which it gives back when refused):
/// exit [`FENCED`] with the host's token on stderr when it is above `token`; else `token` is
/// written to a temporary file of this shell's own, synced, renamed over the fence and the
/// directory synced, so that neither a crash nor a second writer leaves a torn or older token.
fn fence_body(state_dir: &str, me: &str, token: i64) -> String {
    // The lock is given back only while it is still this run's (a run breaking it meanwhile
    // keeps its own).
    let give_back = format!(
        "_h=; {{ IFS= read -r _h <\"$d/holder.json\"; }} 2>/dev/null; [ \"$_h\" = {} ] && rm -rf \"$d\"",
        quote(me)
    );
    format!(
        "f={f}; t=0; {{ IFS= read -r t <\"$f\"; }} 2>/dev/null; \
         case \"$t\" in ''|*[!0-9]*) t=0;; esac; \
         if [ \"$t\" -gt {token} ]; then {give_back}; printf '%s\\n' \"$t\" >&2; exit {FENCED}; fi; \
         if [ \"$t\" != {token} ]; then \
         printf '%s\\n' {token} >\"$f.$$\" && sync \"$f.$$\" && mv -f \"$f.$$\" \"$f\" && sync {sd} \
         || {{ rm -f \"$f.$$\"; {give_back}; exit 12; }}; fi",
        f = quote(&format!("{state_dir}/fence")),
        sd = quote(state_dir),
    )
}

/// The exit code of a command refused by [`guard_script`]: the run no longer holds the host.
pub const GUARDED: i32 = 14;

/// The start of what a command refused by [`guard_script`] prints on standard error.
pub const GUARD_MARK: &str = "drover: fenced:";

/// The exit code and the start of what a command prints when [`guard_script`] cannot mark it
/// in flight on the host: it changed nothing, and fails as a hook does.
pub const UNMARKED: i32 = 1;
pub const UNMARKED_MARK: &str = "drover: not marked:";

/// The start of what a command refused by [`guard_script`] prints on standard error when the
/// host has no lock of this run's at all: given back (this run's own last command there gave
/// it back, and an answer was lost), or broken and not taken again.
pub const UNLOCKED_MARK: &str = "drover: unlocked:";

/// Shell text that every command changing a host starts with (hooks, file placements, record
/// writes): exit [`GUARDED`] unless the host's lock is held by `me` and (with a `token`) the
/// host has seen no fencing token above it. A run whose lock was broken (`--break-lock`) or
/// given to a later run by etcd then changes nothing more there, whatever it still believes.
/// What it prints says which: [`GUARD_MARK`] (another run holds the host, or a newer token)
/// or [`UNLOCKED_MARK`] (no lock there). Builtins only (`read`, `case`, `[`, a redirect): no
/// process.
///
/// Before it reads the lock, the command marks itself in flight (`<state-dir>/hooks/acting.
/// <tag>.<pid>`, `tag` being the run's, [`in_flight`]): a run taking the lock after the read
/// waits for the command's shell to end before it reads the host. The check and the write
/// after it are then one step as far as a takeover can tell: the guard sees the new lock and
/// refuses, or the write ends before the new holder reads the host.
pub fn guard_script(state_dir: &str, me: &str, tag: &str, token: Option<i64>) -> String {
    let state_dir = state_dir.trim_end_matches('/');
    let lock = quote(&format!("{state_dir}/lock/holder.json"));
    // A mark that cannot be written (the state directory full, or read-only) is this host's
    // failure, not another run's hold on it: the command changes nothing and fails as a hook
    // does, and the failure budgets decide what follows (a fenced command stops the run).
    let unmarked = format!(
        "{{ echo {} >&2; exit {UNMARKED}; }}",
        quote(&format!(
            "{UNMARKED_MARK} this command cannot mark itself in flight in the host's hooks \
             directory (its file system full, or read-only): it changed nothing"
        ))
    );
    let mut out = in_flight::mark(&hooks_dir(state_dir), tag, &unmarked);
    out.push_str(&format!(
        "_h=; {{ IFS= read -r _h <{lock}; }} 2>/dev/null; \
         if [ \"$_h\" != {me} ]; then if [ -z \"$_h\" ]; then echo {} >&2; \
         else echo {} >&2; fi; exit {GUARDED}; fi; ",
        quote(&format!(
            "{UNLOCKED_MARK} this run no longer holds the host's lock (given back, or broken)"
        )),
        quote(&format!(
            "{GUARD_MARK} the host's lock is held by another run (this run's was broken)"
        )),
        me = quote(me),
    ));
    if let Some(token) = token {
        out.push_str(&format!(
            "_t=0; {{ IFS= read -r _t <{f}; }} 2>/dev/null; case \"$_t\" in ''|*[!0-9]*) _t=0;; esac; \
             [ \"$_t\" -gt {token} ] && {{ echo \"{GUARD_MARK} the host has seen fencing token $_t, \
             newer than this run's {token}\" >&2; exit {GUARDED}; }}; ",
            f = quote(&format!("{state_dir}/fence")),
        ));
    }
    out
}

/// What a run's marks of commands in flight are named by on a host ([`in_flight`]): its
/// hooks' tag when it has one fit for shell text unquoted (digits and `-`), else its pid.
pub(super) fn mark_tag(me: &Holder) -> String {
    let safe = !me.hooks.is_empty() && me.hooks.bytes().all(|b| b.is_ascii_digit() || b == b'-');
    if safe {
        me.hooks.clone()
    } else {
        me.pid.to_string()
    }
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
/// Also removes the run's hook pid files (`rollout::processes`), emptied as each hook ended,
/// and the stop files of chains it left before their end.
pub(super) fn release_script(state_dir: &str, dir: &str, me: &Holder) -> String {
    format!("{}; exit 0", release_body(state_dir, dir, me))
}

/// [`release_script`] without its `exit`, to end another command with; it ends in success.
/// The run's marks of commands in flight ([`in_flight`]) go too, unless a command of the run
/// other than this one is still in flight there (sent before, its answer not waited for): the
/// next run to take the lock then waits for it, and removes them.
pub(super) fn release_body(state_dir: &str, dir: &str, me: &Holder) -> String {
    let hooks_raw = hooks_dir(state_dir);
    let hooks = quote(&hooks_raw);
    let files = me.hook_files();
    let files: Vec<String> = std::iter::once(&files.pids)
        .chain(&files.stops)
        .map(|pattern| format!("{hooks}/{pattern}"))
        .collect();
    let files = files.join(" ");
    let tag = mark_tag(me);
    let marks = in_flight::marks_of(&tag).map_or(String::new(), |m| format!(" {hooks}/{m}"));
    format!(
        "{busy}\nd={d}; h=; {{ IFS= read -r h <\"$d/holder.json\"; }} 2>/dev/null; \
         if [ \"$h\" = {me} ]; then if [ -n \"$_wk\" ]; then rm -rf \"$d\" {files}; \
         else rm -rf \"$d\" {files}{marks}; fi; \
         elif [ -n \"$_wk\" ]; then rm -f {files}; else rm -f {files}{marks}; fi 2>/dev/null; :",
        busy = in_flight::own_in_flight(&hooks_raw, &tag),
        d = quote(dir),
        me = quote(&me.json()),
    )
}
