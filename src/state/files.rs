//! Files a host keeps for its services: a content-addressed store under the state directory
//! (`<state-dir>/files/<digest>`, one file per content, 0600 in a 0700 directory), atomic
//! placement from it, and what each service's last placement replaced, to put it back.
//!
//! Every function builds shell text (POSIX sh and coreutils: `cp`, `mv`, `sync`, `chmod`,
//! `mkdir`, `sha256sum`, `stat`, `wc`); every value in it is quoted.
//!
//! What a placement replaced is listed in `<state-dir>/files/prev/<service>`, a line per file:
//! `<digest> <mode in octal> <path>` for a file that was there (its content is in the store), or
//! `- - <path>` for one that was not. Paths never hold a newline (the site checker refuses them).

use crate::transport::quote;
use serde::{Deserialize, Serialize};

/// A file as it must be on the host: its content is `<store>/<digest>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub to: String,
    pub mode: u32,
    pub digest: String,
}

/// The exit code of a placement (with its commit) that failed before it changed any target:
/// the previous list of what was replaced still stands, so there is nothing to put back.
pub const NOTHING_PLACED: i32 = 3;

/// `<state_dir>/files`.
pub fn store_dir(state_dir: &str) -> String {
    format!("{state_dir}/files")
}

/// The list of what `service`'s last placement replaced (a file name safe for any service).
fn prev_file(state_dir: &str, service: &str) -> String {
    let mut name = String::new();
    for c in service.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            name.push(c);
        } else {
            name.push_str(&format!("%{:02x}", c as u32));
        }
    }
    format!("{}/prev/{name}", store_dir(state_dir))
}

/// Prints, one per line, those of `digests` the store does not have.
pub fn missing_script(state_dir: &str, digests: &[&str]) -> String {
    let list: Vec<String> = digests.iter().map(|d| quote(d)).collect();
    format!(
        "for d in {list}; do [ -e {store}/\"$d\" ] || printf '%s\\n' \"$d\"; done",
        list = list.join(" "),
        store = quote(&store_dir(state_dir)),
    )
}

/// Reads standard input into the store as `digest`'s received copy, `.<digest>.tmp`: its size
/// checked against `size` (a cut-off transfer is never kept) and synced. It is not the stored
/// content yet: [`commit_script`] names it, once the controller knows that what it sent is what
/// it digested (its source did not change under it).
pub fn receive_script(state_dir: &str, digest: &str, size: u64) -> String {
    let tmp = quote(&received(state_dir, digest));
    format!(
        "umask 077 && mkdir -p {store} && cat >{tmp} && {{ [ \"$(wc -c <{tmp})\" -eq {size} ] || {{ echo \"drover: received $(wc -c <{tmp}) of {size} bytes\" >&2; rm -f {tmp}; exit 1; }}; }} && {{ sync {tmp} 2>/dev/null || true; }}",
        store = quote(&store_dir(state_dir)),
    )
}

/// `<store>/.<digest>.tmp`: a received content not yet committed.
fn received(state_dir: &str, digest: &str) -> String {
    format!("{}/.{digest}.tmp", store_dir(state_dir))
}

/// Removes what [`receive_script`] received as `digests`, to be committed never.
pub fn discard_script(state_dir: &str, digests: &[&str]) -> String {
    let tmps: Vec<String> = digests
        .iter()
        .map(|d| quote(&received(state_dir, d)))
        .collect();
    format!("rm -f {}", tmps.join(" "))
}

/// Makes each received content (see [`receive_script`]) the store's content under its digest:
/// a rename each. Run before [`place_script`], in the same command.
pub fn commit_script(state_dir: &str, digests: &[&str]) -> String {
    digests
        .iter()
        .map(|d| {
            format!(
                "mv -f {tmp} {file} || {{ echo \"drover: cannot store the received content {d} in {store}\" >&2; exit {NOTHING_PLACED}; }}\n",
                store = store_dir(state_dir).replace(['"', '\\', '$', '`'], "_"),
                tmp = quote(&received(state_dir, d)),
                file = quote(&format!("{}/{d}", store_dir(state_dir))),
            )
        })
        .collect()
}

/// `path` split into its directory and its name.
fn split(path: &str) -> (String, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".to_string(), name),
        Some((dir, name)) => (dir.to_string(), name),
        None => (".".to_string(), path),
    }
}

/// Shell text that copies `<store>/<digest>` over `to` atomically with `mode` (the digest and
/// mode may be shell words such as `"$d"`, already quoted).
fn copy_in(store: &str, digest: &str, mode: &str, to: &str) -> String {
    let (dir, name) = split(to);
    let tmp = quote(&format!("{dir}/.{name}.drover-tmp"));
    format!(
        "{{ mkdir -p {dir} && cp {store}/{digest} {tmp} && chmod {mode} {tmp} && {{ sync {tmp} 2>/dev/null || true; }} && mv -f {tmp} {to}; }} || {{ echo \"drover: cannot put {shown} in place\" >&2; exit 1; }}",
        dir = quote(&dir),
        store = quote(store),
        to = quote(to),
        shown = to.replace(['"', '\\', '$', '`'], "_"),
    )
}

/// Puts `files` in place for `service`, first listing what each target holds now so that
/// [`restore_script`] can put it back: the entry of `known` (what the host's record says the
/// service had) for that path if its content is in the store; else the target's own content,
/// hashed into the store; else "absent". Each file is copied from the store to a temporary
/// file in its own directory (parents made), given its mode, synced and renamed over the
/// target. Stops at the first failure, naming the path: with exit code [`NOTHING_PLACED`]
/// while no target has been changed yet (the previous list still stands).
pub fn place_script(state_dir: &str, service: &str, files: &[Placed], known: &[Placed]) -> String {
    let store = store_dir(state_dir);
    let prev = prev_file(state_dir, service);
    let tmp_list = quote(&format!("{prev}.tmp"));
    let mut s = format!(
        "umask 077 && mkdir -p {prev_dir} && : >{tmp_list} || exit {NOTHING_PLACED}\n",
        prev_dir = quote(&format!("{store}/prev")),
    );
    for f in files {
        let to = quote(&f.to);
        let known = known
            .iter()
            .find(|k| k.to == f.to)
            .map(|k| (quote(&k.digest), format!("{:o}", k.mode)));
        let hash_in = format!(
            "h=$(sha256sum <{to} | cut -c1-64) && m=$(stat -c %a {to}) && {{ [ -e {store}/\"$h\" ] || {{ cp {to} {store}/.\"$h\".tmp && mv -f {store}/.\"$h\".tmp {store}/\"$h\"; }}; }} && printf '%s %s %s\\n' \"$h\" \"$m\" {to} >>{tmp_list}",
            store = quote(&store),
        );
        let absent = format!(
            "printf '%s\\n' {line} >>{tmp_list}",
            line = quote(&format!("- - {}", f.to))
        );
        let remember = match known {
            Some((d, m)) => format!(
                "if [ -e {store}/{d} ]; then printf '%s %s %s\\n' {d} {m} {to} >>{tmp_list}; elif [ -f {to} ]; then {hash_in}; else {absent}; fi",
                store = quote(&store),
            ),
            None => format!("if [ -f {to} ]; then {hash_in}; else {absent}; fi"),
        };
        s.push_str(&format!(
            "{{ {remember}; }} || {{ echo \"drover: cannot keep what is at {shown}\" >&2; exit {NOTHING_PLACED}; }}\n",
            shown = f.to.replace(['"', '\\', '$', '`'], "_"),
        ));
    }
    s.push_str(&format!(
        "mv -f {tmp_list} {prev} || exit {NOTHING_PLACED}\n",
        prev = quote(&prev)
    ));
    for f in files {
        s.push_str(&copy_in(
            &store,
            &quote(&f.digest),
            &format!("{:o}", f.mode),
            &f.to,
        ));
        s.push('\n');
    }
    s
}

/// Puts back what [`place_script`] listed for `service` (the same atomic copy; a file that was
/// absent is removed), then removes the list. With no list, does nothing and succeeds.
pub fn restore_script(state_dir: &str, service: &str) -> String {
    let store = quote(&store_dir(state_dir));
    let prev = quote(&prev_file(state_dir, service));
    format!(
        "[ -f {prev} ] || exit 0\n\
         while IFS=' ' read -r d m p; do\n\
         \x20 if [ \"$d\" = - ]; then rm -f -- \"$p\" || exit 1; continue; fi\n\
         \x20 dir=\"${{p%/*}}\"; [ \"$dir\" = \"$p\" ] && dir=.; [ -n \"$dir\" ] || dir=/; t=\"$dir/.${{p##*/}}.drover-tmp\"\n\
         \x20 {{ mkdir -p \"$dir\" && cp {store}/\"$d\" \"$t\" && chmod \"$m\" \"$t\" && {{ sync \"$t\" 2>/dev/null || true; }} && mv -f \"$t\" \"$p\"; }} || {{ echo \"drover: cannot put back $p\" >&2; exit 1; }}\n\
         done <{prev}\n\
         rm -f {prev}"
    )
}

#[cfg(test)]
mod tests;
