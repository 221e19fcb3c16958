//! Commands in flight on a host: each guarded command marks itself before its guard reads the
//! lock, and a run that takes a host's lock waits for (or ends) the commands of other runs
//! still marked there before it reads the host, so that no write of a run whose lock was
//! broken lands after the read of the run that broke it.
//!
//! The mark is `<state-dir>/hooks/acting.<tag>.<pid>`: the run's tag ([`super::hooks_tag`]),
//! the pid of the command's shell (which leads the command's process group, as every link
//! runs it), and inside, that pid and the shell's start time (the 22nd field of its
//! `/proc/<pid>/stat`, `-` without one). It is made with a redirect of the shell's own before
//! the guard reads the lock ([`mark`]), and taken as over once its shell is gone (no process
//! removes it as the command ends): the run's release removes its marks, and the next run to
//! take the lock removes those of others whose shells are gone.
//!
//! Why that is enough: the guard reads the lock after its mark is made; the taker looks for
//! marks after its lock is made (or the old one set aside). Either the guard's read comes
//! after the taker's lock, and the guard refuses (the lock is not its run's), or the mark
//! came before the taker's look, and the taker sees it and waits for its shell to end. An
//! empty mark (made, not yet written) is of a guard that has not read the lock yet: it will
//! refuse, and is not waited for.

use crate::transport::quote;

/// The start of the line a lock-taking script prints on standard error for process groups of
/// another run it could not end (still running after `TERM` and `KILL`: another user's, or
/// unkillable), followed by their ids; a hook kill script prints it on standard output.
pub const NOT_ENDED: &str = "drover: not ended:";

/// How long a run taking a lock waits for another run's command in flight before it sends it
/// `TERM` (tenths of a second), then `KILL`, then gives up on it.
const WAIT_TERM: u32 = 30;
const WAIT_KILL: u32 = 40;
const WAIT_GIVE_UP: u32 = 50;

/// The marks' names for a run's tag, under the hooks directory: `acting.<tag>.`.
fn prefix(tag: &str) -> String {
    format!("acting.{tag}.")
}

/// Whether a tag may go into shell text as part of a glob pattern, unquoted (digits and `-`).
fn safe(tag: &str) -> bool {
    !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_digit() || b == b'-')
}

/// Shell text that marks this command in flight for the run of tag `tag`: the mark
/// `<hooks>/acting.<tag>.$$` holds `$$` and its shell's start time. Builtins only. Exits
/// `refused` (a guard's exit) when the mark cannot be made.
pub(super) fn mark(hooks: &str, tag: &str, refused: &str) -> String {
    format!(
        "_gm={m}$$; _gs=; {{ read -r{fields} _gs _ </proc/$$/stat; }} 2>/dev/null; \
         {{ printf '%s %s\\n' \"$$\" \"${{_gs:--}}\" >\"$_gm\"; }} 2>/dev/null || {refused}; ",
        m = quote(&format!("{}/{}", hooks.trim_end_matches('/'), prefix(tag))),
        fields = " _".repeat(21),
    )
}

/// Shell text whose status is 0 while the shell of pid `$_wp` and start time `$_ws` (`-`:
/// unknown) runs: its `/proc` entry is there with that start time, not a zombie (on a host
/// without `/proc`, the pid answers `kill -0`). The shell alone, not its group: a process a
/// hook left running in its group (a service started in the background) is no command in
/// flight, and a command's shell waits for what it runs. Builtins only, the fields cut by
/// parameter expansion (as in the hooks' kill script). Uses `_wl`, `_wj`.
fn alive() -> &'static str {
    r#"{ _wl=; { read -r _wl <"/proc/$_wp/stat"; } 2>/dev/null
  if [ -n "$_wl" ]; then _wl=${_wl##*') '}
    case $_wl in Z*|X*) false;; *) [ "$_ws" = - ] || { _wj=0
      while [ $_wj -lt 19 ] && [ "${_wl#* }" != "$_wl" ]; do _wl=${_wl#* }; _wj=$((_wj+1)); done
      [ $_wj = 19 ] && [ "${_wl%% *}" = "$_ws" ]; };; esac
  else [ ! -d /proc/self ] && kill -0 "$_wp" 2>/dev/null; fi; }"#
}

/// Shell text whose status is 0 while a process of group `$<var>` runs (not a zombie),
/// whoever's it is: every `/proc/<pid>/stat` is read for its group (the 5th field); without
/// `/proc`, the group answers `kill -0`. Builtins only. Uses `_wf`, `_wl`, `_wk`.
pub fn group_runs(var: &str) -> String {
    format!(
        r#"{{ _wk=1; if [ -d /proc/self ]; then for _wf in /proc/[0-9]*/stat; do _wl=
  {{ read -r _wl <"$_wf"; }} 2>/dev/null; _wl=${{_wl##*') '}}
  case $_wl in ''|Z*|X*) continue;; esac; _wl=${{_wl#* }}; _wl=${{_wl#* }}
  [ "${{_wl%% *}}" = "${var}" ] && {{ _wk=0; break; }}; done
  else kill -0 "-${var}" 2>/dev/null && _wk=0; fi; [ $_wk = 0 ]; }}"#
    )
}

/// Shell text that waits until no other run than the one of tag `own` has a command in flight
/// on the host (its marks under `hooks`): a mark whose shell is gone is removed; one still
/// running after 3 s has its process group sent `TERM`, after 4 s `KILL`; one whose shell
/// still runs after 5 s is given up on, its group id printed on standard error after
/// [`NOT_ENDED`]. Run by a run that has just taken the host's lock, before it reads the host.
pub(super) fn settle(hooks: &str, own: &str) -> String {
    let own = if safe(own) { own } else { "-" };
    format!(
        r#"_wd={d}; _wi=0; while :; do _wa=
for _wm in "$_wd"/acting.*; do
  [ -f "$_wm" ] || continue
  case ${{_wm##*/}} in {own_prefix}*) continue;; esac
  _wp=; _ws=; {{ read -r _wp _ws _ <"$_wm"; }} 2>/dev/null
  case $_wp in ''|*[!0-9]*|0|1) rm -f "$_wm"; continue;; esac
  if {alive}; then _wa="$_wa $_wp"; else rm -f "$_wm"; fi
done
[ -n "$_wa" ] || break
case $_wi in
{term}) for _wp in $_wa; do kill -TERM "-$_wp" 2>/dev/null || kill -TERM "$_wp" 2>/dev/null; done;;
{kill}) for _wp in $_wa; do kill -KILL "-$_wp" 2>/dev/null || kill -KILL "$_wp" 2>/dev/null; done;;
{give_up}) echo "{NOT_ENDED}$_wa" >&2; break;;
esac
_wi=$((_wi+1)); sleep 0.1
done"#,
        d = quote(hooks.trim_end_matches('/')),
        own_prefix = prefix(own),
        alive = alive(),
        term = WAIT_TERM,
        kill = WAIT_KILL,
        give_up = WAIT_GIVE_UP,
    )
}

/// Glob pattern (under the hooks directory) of the marks of the run of tag `tag`, when the tag
/// is safe unquoted.
pub(super) fn marks_of(tag: &str) -> Option<String> {
    safe(tag).then(|| format!("{}*", prefix(tag)))
}

/// Shell text that sets `_wk` to 1 when a command of the run of tag `tag` other than this
/// shell's is still in flight on the host (its shell still runs): its marks are then kept
/// (for the next run taking the lock to wait for), else removed with the run's other files.
pub(super) fn own_in_flight(hooks: &str, tag: &str) -> String {
    let Some(marks) = marks_of(tag) else {
        return "_wk=1".into();
    };
    format!(
        r#"_wk=; for _wm in {d}/{marks}; do [ -f "$_wm" ] || continue
  [ "${{_wm##*.}}" = "$$" ] && continue
  _wp=; _ws=; {{ read -r _wp _ws _ <"$_wm"; }} 2>/dev/null
  case $_wp in ''|*[!0-9]*|0|1) continue;; esac
  {alive} && {{ _wk=1; break; }}; done"#,
        d = quote(hooks.trim_end_matches('/')),
        alive = alive(),
    )
}
