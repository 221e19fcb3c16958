//! Files a host keeps for its services: each content arrives in its target's directory and is
//! renamed over it, so every byte is written once on the host; what drover put where is written
//! down with the target's stamp (`<state-dir>/files/placed/<service>`), so that a file still as
//! it was placed is never sent again; and what a placement replaced is kept in the same
//! directory until the step passes, to be put back by a rename if it fails.
//!
//! Every function builds shell text (POSIX sh and coreutils: `cat`, `cp`, `ln`, `mv`, `rm`,
//! `sync`, `chmod`, `mkdir`, `stat`, `wc`, `grep`, `tr`); every value in it is quoted. Every
//! rename that puts something in place (a file, a list) is followed by a sync of its
//! directory, so that a crash of the host after the step cannot bring the old name back.
//!
//! - What drover writes beside a target `<dir>/<name>` is in `<dir>/.drover/`, a directory of
//!   the user drover logs in as alone (0700; one that is a link, or another user's, is refused):
//!   `<name>.new.<pid>` while a content arrives, `<name>.new` once it arrived whole (until it is
//!   placed), `<name>.tmp` for a copy, `<name>.prev` for what the
//!   last placement replaced (a hard link to it) until its step passes, `<name>.gone.<pid>`
//!   while that is removed ([`let_go_script`]). No one else can plant a link or a FIFO there,
//!   swap a file drover is about to `chmod` or rename, or read a replaced secret by its path.
//! - `placed/<service>`, a line per file: `<digest> <mode in octal> <stamp> <path>`, the stamp
//!   being the target's `stat` (device, inode, size, modification and change times in
//!   nanoseconds) right after it was put in place. Any later write, rename or `chmod` changes
//!   the change time, which nothing can set back: a file whose stamp still holds has the content.
//! - `prev/<service>`: what the service's last placement replaced (until its step passes), a
//!   line per file: `+ <path>` (its previous file is `<dir>/.drover/<name>.prev`) or
//!   `- <path>` (there was none). Paths never hold a newline (the site checker refuses them).
//! - Once the step passed, the last generations of each file (the platform's
//!   `keep-generations`) stay beside it: `<dir>/.drover/<name>.gen.1` is what the last
//!   placement replaced, `.gen.2` the one before ([`let_go_keeping`]).

use crate::transport::quote;
use serde::{Deserialize, Serialize};

/// A file as it must be on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub to: String,
    pub mode: u32,
    pub digest: String,
}

/// The exit code of a placement that failed before it changed any target: there is nothing to
/// put back (a list an earlier placement left was let go of first, never to be put back).
pub const NOTHING_PLACED: i32 = 3;

/// The `stat` format of a target's stamp.
const STAMP: &str = "%d:%i:%s:%.9Y:%.9Z";

/// `<state_dir>/files`.
fn store_dir(state_dir: &str) -> String {
    format!("{state_dir}/files")
}

/// Shell that syncs the directory of `path`, so that a rename in it stays done; never fails (a
/// `sync` that takes no operand, as some busybox builds, syncs everything).
fn sync_dir_of(path: &str) -> String {
    let (dir, _) = split(path);
    format!("{{ sync {} 2>/dev/null || sync; }}", quote(&dir))
}

/// `<store>/<list>/<service>` (a file name safe for any service).
fn list_file(state_dir: &str, list: &str, service: &str) -> String {
    let mut name = String::new();
    for c in service.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            name.push(c);
        } else {
            name.push_str(&format!("%{:02x}", c as u32));
        }
    }
    format!("{}/{list}/{name}", store_dir(state_dir))
}

/// `path` split into its directory and its name.
fn split(path: &str) -> (String, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".to_string(), name),
        Some((dir, name)) => (dir.to_string(), name),
        None => (".".to_string(), path),
    }
}

/// `<dir>/.drover`, where drover keeps what it writes beside the files of `<dir>`.
fn private_dir(to: &str) -> String {
    let (dir, _) = split(to);
    match dir.as_str() {
        "/" => "/.drover".to_string(),
        _ => format!("{dir}/.drover"),
    }
}

/// `<dir>/.drover/<name>.<suffix>`, for the file `to`.
fn beside(to: &str, suffix: &str) -> String {
    let (_, name) = split(to);
    format!("{}/{name}.{suffix}", private_dir(to))
}

/// Where a content for `to` is received: `<dir>/.drover/<name>.new`.
pub fn received_at(to: &str) -> String {
    beside(to, "new")
}

/// Shell text that makes `to`'s directory (parents too) and its [`private_dir`], and fails
/// unless the latter is a directory (not a link) of this user's alone.
fn make_private(to: &str) -> String {
    let (dir, _) = split(to);
    let private = quote(&private_dir(to));
    format!(
        "mkdir -p {dir} && {{ [ -d {private} ] || mkdir -m 700 {private}; }} && {{ [ ! -L {private} ] && [ -O {private} ] && chmod 700 {private} || {{ echo \"drover: {shown} is not a directory of this user's alone: remove it\" >&2; false; }}; }}",
        dir = quote(&dir),
        shown = shown(&private_dir(to)),
    )
}

/// `path` with the characters that would end or expand a double-quoted shell word replaced.
fn shown(path: &str) -> String {
    path.replace(['"', '\\', '$', '`'], "_")
}

/// Prints the stamp of each of `paths` (a line each, `-` for none), then `prev` if a list of
/// what the service's last placement replaced is still there, else `-` ([`replaced_listed`]),
/// then the service's list of what drover placed: what [`kept`] reads.
pub fn survey_script(state_dir: &str, service: &str, paths: &[&str]) -> String {
    let list: Vec<String> = paths.iter().map(|p| quote(p)).collect();
    format!(
        "for p in {list}; do stat -c '{STAMP}' -- \"$p\" 2>/dev/null || echo -; done; if [ -f {prev} ]; then echo prev; else echo -; fi; cat {placed} 2>/dev/null; true",
        list = list.join(" "),
        prev = quote(&list_file(state_dir, "prev", service)),
        placed = quote(&list_file(state_dir, "placed", service)),
    )
}

/// Whether what [`survey_script`] printed for `files` says that a list of what the service's
/// last placement replaced is still on the host: its step never passed (it was cut off), or
/// the command that lets go after a pass did not get through. A step that passes lets go of
/// it even if it placed nothing itself ([`let_go_script`]); one that fails does not put those
/// files back, since it cannot tell which of the two left them.
pub fn replaced_listed(files: &[Placed], survey: &str) -> bool {
    survey.lines().nth(files.len()) == Some("prev")
}

/// From what [`survey_script`] printed for `files`: per file, its line of the list of what was
/// placed when the file is still exactly as drover placed it with this content and mode (so it
/// needs neither sending nor placing), else `None`.
pub fn kept(files: &[Placed], survey: &str) -> Vec<Option<String>> {
    let mut lines = survey.lines();
    let stamps: Vec<&str> = lines.by_ref().take(files.len()).collect();
    // The line [`replaced_listed`] reads.
    lines.next();
    let placed: Vec<&str> = lines.collect();
    files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let stamp = stamps
                .get(i)
                .copied()
                .filter(|s| *s != "-" && !s.is_empty())?;
            let line = placed.iter().rev().find(|l| {
                let mut w = l.splitn(4, ' ');
                let (d, m, s, p) = (w.next(), w.next(), w.next(), w.next());
                p == Some(f.to.as_str())
                    && d == Some(f.digest.as_str())
                    && m == Some(format!("{:o}", f.mode).as_str())
                    && s == Some(stamp)
            })?;
            Some(line.to_string())
        })
        .collect()
}

/// Reads standard input into [`received_at`] `to` (parents made): its size checked against
/// `size` (a cut-off transfer is never kept), given `mode`, synced. It is not in place yet:
/// [`place_script`] renames it over the target, once the controller knows that what it sent is
/// what it digested (its source did not change under it).
///
/// Each attempt writes a part of its own (`<name>.new.<its shell's pid>`) and renames it to
/// `<name>.new` only once its size is right: an earlier attempt for the same file still running
/// on the host (its connection lost, the content resent over another) can neither truncate nor
/// remove this one's bytes. Parts that attempts cut off left behind go first (only names
/// ending in `.new.` and digits: another target's files have other endings). A part that
/// cannot be written whole (a full disk) is removed at once, and the reason names the target
/// and what the write said (`No space left on device`): nothing is left to fill the disk.
pub fn receive_script(to: &str, size: u64, mode: u32) -> String {
    let tmp = quote(&received_at(to));
    format!(
        "umask 077 && {private} && new={tmp} && {{ {leftovers}; true; }} && part=\"$new.$$\" && \
         if why=$(cat 2>&1 >\"$part\"); then \
         got=$(wc -c <\"$part\"); [ \"$got\" -eq {size} ] || {{ rm -f \"$part\"; echo \"drover: received $got of {size} bytes for {shown}\" >&2; exit 1; }}; \
         {{ chmod {mode:o} \"$part\" && {{ sync \"$part\" 2>/dev/null || true; }} && mv -f \"$part\" \"$new\"; }} || {{ rm -f \"$part\"; echo \"drover: cannot keep what was received for {shown}\" >&2; exit 1; }}; \
         else rm -f \"$part\"; why=$(printf '%s' \"$why\" | tr '\\n' ' '); echo \"drover: cannot receive {shown}: ${{why:-the write failed}} (the partial file is removed)\" >&2; exit 1; fi",
        private = make_private(to),
        leftovers = remove_numbered("\"$new\""),
        shown = shown(to),
    )
}

/// Shell that removes every `<stem>.<digits>` (`stem` a shell word): what attempts cut off left
/// behind, parts being received ([`receive_script`]) or previous files being let go of
/// ([`let_go_script`]). Only digits: a name with another ending beside it is another target's.
fn remove_numbered(stem: &str) -> String {
    format!(
        "for g in {stem}.*; do case \"${{g#{stem}.}}\" in ''|*[!0-9]*) ;; *) rm -f -- \"$g\";; esac; done"
    )
}

/// Removes what [`receive_script`] received for `tos`, never to be placed.
pub fn discard_script(tos: &[&str]) -> String {
    let tmps: Vec<String> = tos.iter().map(|t| quote(&received_at(t))).collect();
    format!("rm -f {}", tmps.join(" "))
}

/// Puts `files` in place for `service`: the first file of each digest has received its content
/// ([`receive_script`]), the others are copies of it. First a list of what an earlier
/// placement replaced, if one is left, is let go of ([`let_go_script`]: it is an earlier
/// step's, never this one's), then the list of what each target
/// holds now, for [`restore_script`]: a hard link to it in its directory's [`private_dir`] (a
/// copy where the file system has no links), or "absent"; then each copy is made (given its
/// mode, synced) and each file renamed over its target: a reader sees the old file or the new
/// one, never half of one. Last, the list of what was placed: `kept`'s lines (files left as
/// they were), then a line with each new file's stamp. Stops at the first failure, naming the
/// path: with exit code [`NOTHING_PLACED`] while no target has changed yet. A target that is a
/// directory is refused before anything changes.
pub fn place_script(state_dir: &str, service: &str, files: &[Placed], kept: &[String]) -> String {
    let store = store_dir(state_dir);
    let prev_list = list_file(state_dir, "prev", service);
    let prev = quote(&prev_list);
    let prev_tmp = quote(&format!("{prev_list}.tmp"));
    let placed = list_file(state_dir, "placed", service);
    let placed_tmp = quote(&format!("{placed}.tmp"));
    // A list an earlier placement left (its step cut off, or the let-go after it lost) is
    // let go of first: nothing will put it back, and its targets not placed now would
    // otherwise keep their previous files with no list naming them.
    let mut s = format!(
        "{let_go}\numask 077 && rm -f {prev} && mkdir -p {prev_dir} {placed_dir} && : >{prev_tmp} || exit {NOTHING_PLACED}\n",
        let_go = let_go_script(state_dir, service),
        prev_dir = quote(&format!("{store}/prev")),
        placed_dir = quote(&format!("{store}/placed")),
    );
    for f in files.iter().filter(|f| receives(files, f)) {
        s.push_str(&format!(
            "[ -f {new} ] || {{ echo \"drover: the content received for {shown} is gone\" >&2; exit {NOTHING_PLACED}; }}\n",
            new = quote(&received_at(&f.to)),
            shown = shown(&f.to),
        ));
    }
    for f in files {
        let to = quote(&f.to);
        let link = quote(&beside(&f.to, "prev"));
        s.push_str(&format!(
            "if [ -d {to} ]; then echo \"drover: {shown} is a directory: no file is put in its place\" >&2; exit {NOTHING_PLACED}; fi\n\
             {{ {private} && if [ -e {to} ] || [ -L {to} ]; then {{ ln -f {to} {link} 2>/dev/null || {{ rm -f {link} && cp -pP {to} {link}; }}; }} && printf '+ %s\\n' {to} >>{prev_tmp}; else printf '%s %s\\n' - {to} >>{prev_tmp}; fi; }} || {{ echo \"drover: cannot keep what is at {shown}\" >&2; exit {NOTHING_PLACED}; }}\n",
            private = make_private(&f.to),
            shown = shown(&f.to),
        ));
    }
    s.push_str(&format!(
        "{{ sync {prev_tmp} 2>/dev/null || true; }}; mv -f {prev_tmp} {prev} || exit {NOTHING_PLACED}\n{}\n",
        sync_dir_of(&prev_list),
    ));
    // Copies first: the content they are made from is renamed away below.
    for f in files.iter().filter(|f| !receives(files, f)) {
        let tmp = quote(&beside(&f.to, "tmp"));
        s.push_str(&format!(
            "{{ rm -f {tmp} && cat {new} >{tmp} && chmod {mode:o} {tmp} && {{ sync {tmp} 2>/dev/null || true; }} && mv -f {tmp} {to}; }} || {{ rm -f {tmp}; echo \"drover: cannot put {shown} in place\" >&2; exit 1; }}\n{synced}\n",
            new = quote(&received_at(&first_of(files, f).to)),
            mode = f.mode,
            to = quote(&f.to),
            shown = shown(&f.to),
            synced = sync_dir_of(&f.to),
        ));
    }
    for f in files.iter().filter(|f| receives(files, f)) {
        s.push_str(&format!(
            "mv -f {new} {to} || {{ echo \"drover: cannot put {shown} in place\" >&2; exit 1; }}\n{synced}\n",
            new = quote(&received_at(&f.to)),
            to = quote(&f.to),
            shown = shown(&f.to),
            synced = sync_dir_of(&f.to),
        ));
    }
    s.push_str(&format!("{{ : >{placed_tmp}"));
    for line in kept {
        s.push_str(&format!(
            " && printf '%s\\n' {} >>{placed_tmp}",
            quote(line)
        ));
    }
    for f in files {
        s.push_str(&format!(
            " && printf '%s %s %s %s\\n' {digest} {mode:o} \"$(stat -c '{STAMP}' -- {to})\" {to} >>{placed_tmp}",
            digest = quote(&f.digest),
            mode = f.mode,
            to = quote(&f.to),
        ));
    }
    s.push_str(&format!(
        " && {{ sync {placed_tmp} 2>/dev/null || true; }} && mv -f {placed_tmp} {placed_q}; }} || {{ echo \"drover: cannot write down what was placed\" >&2; exit 1; }}\n{synced}\n",
        placed_q = quote(&placed),
        synced = sync_dir_of(&placed),
    ));
    s
}

/// Whether `f` is the file of `files` that receives its content (the first with it): what
/// [`place_script`] expects of the files it is given.
pub fn receives(files: &[Placed], f: &Placed) -> bool {
    first_of(files, f).to == f.to
}

/// The first of `files` with `f`'s content: the one that received it.
fn first_of<'a>(files: &'a [Placed], f: &'a Placed) -> &'a Placed {
    files.iter().find(|g| g.digest == f.digest).unwrap_or(f)
}

/// Shell that sets `d` and `n` to the directory and name of the path in `p`, as [`split`] does:
/// `$d/.drover/$n.prev` is then the file [`place_script`] kept for it. What [`restore_script`]
/// and [`let_go_script`] read from the list of what was replaced.
const PARTS: &str = "d=\"${p%/*}\"; [ \"$d\" = \"$p\" ] && d=.; n=\"${p##*/}\"";

/// Puts back what [`place_script`] listed for `service` (a rename of the file it kept for each
/// target, unless that is still the target itself; a file that was absent is removed, and what
/// was received or copied for a target and not placed goes too), drops those paths from the list
/// of what was placed, then removes the list. With no list, does nothing and succeeds; run again
/// after an interruption, it finishes what it began (a file already put back has nothing kept
/// for it any more).
pub fn restore_script(state_dir: &str, service: &str) -> String {
    let prev = quote(&list_file(state_dir, "prev", service));
    let placed = list_file(state_dir, "placed", service);
    let placed_tmp = quote(&format!("{placed}.tmp"));
    let placed_synced = sync_dir_of(&placed);
    let placed = quote(&placed);
    format!(
        "[ -f {prev} ] || exit 0\n\
         while IFS= read -r line; do\n\
         \x20 k=\"${{line%% *}}\"; p=\"${{line#? }}\"\n\
         \x20 {PARTS}; l=\"$d/.drover/$n.prev\"\n\
         \x20 rm -f -- \"$d/.drover/$n.new\" \"$d/.drover/$n.tmp\" || exit 1\n\
         \x20 if [ \"$k\" = - ]; then rm -f -- \"$p\" || exit 1; continue; fi\n\
         \x20 if [ -e \"$l\" ] || [ -L \"$l\" ]; then\n\
         \x20   if [ \"$l\" -ef \"$p\" ]; then rm -f -- \"$l\" || exit 1\n\
         \x20   else mv -f -- \"$l\" \"$p\" || {{ echo \"drover: cannot put back $p\" >&2; exit 1; }}; {{ sync \"$d\" 2>/dev/null || sync; }}; fi\n\
         \x20 fi\n\
         done <{prev}\n\
         if [ -f {placed} ]; then\n\
         \x20 : >{placed_tmp} || exit 1\n\
         \x20 while IFS= read -r line; do\n\
         \x20   p=\"${{line#* * * }}\"\n\
         \x20   grep -qxF -e \"+ $p\" -e \"- $p\" {prev} || printf '%s\\n' \"$line\" >>{placed_tmp} || exit 1\n\
         \x20 done <{placed}\n\
         \x20 {{ sync {placed_tmp} 2>/dev/null || true; }}; mv -f {placed_tmp} {placed} || exit 1\n\
         \x20 {placed_synced}\n\
         fi\n\
         rm -f {prev}"
    )
}

/// Lets go of what the service's last placement replaced, once the step that placed it has
/// passed (nothing can ask for it back any more): each kept previous file is renamed out of
/// the way at once (`<dir>/.drover/<name>.gone.<pid>`, so a later placement never meets it)
/// and removed in the background, since freeing a large file's blocks can take a while on a
/// busy disk and nothing waits for it; a removal cut off before (a reboot) is finished by the
/// next one of that file (only names ending in `.gone.` and digits: a target named
/// `<name>.gone.x` beside it is another file's). Then the list goes. Never fails: a previous
/// file left behind only costs its space until the next placement of its target replaces it.
/// Keeps no generation: what [`let_go_keeping`] does with `generations` 1.
pub fn let_go_script(state_dir: &str, service: &str) -> String {
    let_go_keeping(state_dir, service, 1, &[])
}

/// As [`let_go_script`], keeping the last `generations` of each file (the platform's
/// `keep-generations`: the one in place and `generations - 1` it replaced): what the placement
/// replaced becomes `<dir>/.drover/<name>.gen.1`, the one that was `.gen.1` becomes `.gen.2`,
/// and so on; those past `.gen.<generations - 1>` (the oldest, or more kept under a larger
/// setting) go as a let-go file does. Renames in the target's own directory: nothing is copied.
/// The files of `secret` (targets whose content renders a secret) keep no generation: what
/// they replaced goes, as do generations kept of them before.
pub fn let_go_keeping(
    state_dir: &str,
    service: &str,
    generations: usize,
    secret: &[&str],
) -> String {
    let prev = quote(&list_file(state_dir, "prev", service));
    let gone = remove_numbered("\"$d/.drover/$n.gone\"");
    let kept = generations.saturating_sub(1);
    let secret = match secret.is_empty() {
        true => String::new(),
        false => {
            let paths: Vec<String> = secret.iter().map(|p| quote(p)).collect();
            format!(" case \"$p\" in {}) k=0;; esac;", paths.join("|"))
        }
    };
    // Those it would keep past the last (the oldest, or more kept under a larger setting) go;
    // the others move up one, and what was replaced is the first.
    let shift = "for g in \"$b.gen.\"*; do j=\"${g#\"$b.gen.\"}\"; case \"$j\" in ''|*[!0-9]*) ;; *) [ \"$j\" -lt \"$k\" ] || mv -f -- \"$g\" \"$b.gone.$$$j\" 2>/dev/null;; esac; done; \
         if [ \"$k\" -eq 0 ]; then mv -f -- \"$b.prev\" \"$b.gone.$$\" 2>/dev/null; \
         else j=$((k - 1)); while [ \"$j\" -ge 1 ]; do if [ -e \"$b.gen.$j\" ] || [ -L \"$b.gen.$j\" ]; then mv -f -- \"$b.gen.$j\" \"$b.gen.$((j + 1))\"; fi; j=$((j - 1)); done; \
         mv -f -- \"$b.prev\" \"$b.gen.1\" 2>/dev/null; fi";
    format!(
        "if [ -f {prev} ]; then\n\
         \x20 while IFS= read -r line; do\n\
         \x20   case \"$line\" in \"+ \"*)\n\
         \x20     p=\"${{line#+ }}\"; {PARTS}; b=\"$d/.drover/$n\"; k={kept};{secret}\n\
         \x20     if {{ [ -e \"$b.prev\" ] || [ -L \"$b.prev\" ]; }} && {{ {shift}; }}; then\n\
         \x20       {{ {gone}; }} </dev/null >/dev/null 2>&1 &\n\
         \x20     fi;;\n\
         \x20   esac\n\
         \x20 done <{prev}\n\
         \x20 rm -f {prev}\n\
         fi; true"
    )
}

#[cfg(test)]
mod generations_tests;
#[cfg(test)]
mod tests;
