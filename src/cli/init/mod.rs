//! `deploy init [DIR]`: a small working starter site on the `local` platform, written into DIR.
//!
//! The starter is data ([`starter`]); writing it is a separate step ([`write`]) that checks
//! every path first and writes nothing when any of them is already there.

use super::{code, Error};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One file of the starter: where it goes under DIR, what it is for, and its text.
#[derive(Debug, Clone, Copy)]
pub struct StarterFile {
    pub path: &'static str,
    pub what: &'static str,
    pub contents: &'static str,
}

/// The starter's files, site first: a site of two services (one needing the other) on four
/// hosts in two classes, a `local` platform and a policy, each commented for a first reader.
pub fn starter() -> [StarterFile; 3] {
    [
        StarterFile {
            path: "site.kdl",
            what: "the site: classes, services, their hooks and a dependency",
            contents: include_str!("site.kdl"),
        },
        StarterFile {
            path: "platforms/local.kdl",
            what: "four hosts of this machine, each a directory under hosts/",
            contents: include_str!("local.kdl"),
        },
        StarterFile {
            path: "policies/one-at-a-time.kdl",
            what: "how fast a service's hosts switch versions",
            contents: include_str!("policy.kdl"),
        },
    ]
}

pub fn run(dir: &Path) -> Result<u8, Error> {
    let files = starter();
    write(dir, &files)?;
    let width = files.iter().map(|f| f.path.len()).max().unwrap_or(0);
    let place = if is_here(dir) {
        "the current directory".to_string()
    } else {
        dir.display().to_string()
    };
    outln!("Wrote a starter site in {place}: two services on four hosts of this machine.");
    for f in &files {
        outln!("  {:width$}  {}", f.path, f.what);
    }
    let site = shell_word(&shown(dir, files[0].path));
    outln!();
    outln!("Next:");
    outln!("  deploy check {site}    # validate it, offline");
    outln!("  deploy plan {site}     # what a rollout would do");
    outln!("  deploy apply {site}    # carry it out (shows the plan, asks first)");
    outln!("  deploy verify {site}   # exit 0 only if every host runs its version and is healthy");
    Ok(code::OK)
}

/// Writes `files` under `dir` (created if need be). Every path is checked first: when any of
/// them exists, nothing is written and the error names them all. A file that appears in the
/// meantime is not overwritten either (each is created exclusively), and what this call wrote
/// before such a failure is removed again.
pub fn write(dir: &Path, files: &[StarterFile]) -> Result<(), Error> {
    let existing: Vec<PathBuf> = files
        .iter()
        .map(|f| shown(dir, f.path))
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    if !existing.is_empty() {
        return Err(Error::InitExists {
            files: existing
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join("\n  "),
        });
    }
    let mut written = Vec::new();
    for f in files {
        let path = shown(dir, f.path);
        if let Err(source) = create(&path, f.contents) {
            for p in &written {
                let _ = std::fs::remove_file(p);
            }
            return Err(Error::Write { path, source });
        }
        written.push(path);
    }
    Ok(())
}

/// Creates `path` (and its parent directories) with `contents`; never replaces a file.
fn create(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

fn is_here(dir: &Path) -> bool {
    dir.as_os_str().is_empty() || dir == Path::new(".")
}

/// `dir/relative`, or just `relative` for the current directory: as the user would type it.
fn shown(dir: &Path, relative: &str) -> PathBuf {
    if is_here(dir) {
        PathBuf::from(relative)
    } else {
        dir.join(relative)
    }
}

/// `path` as one shell word: as it is when that is safe, quoted as values sent to hosts are
/// otherwise.
fn shell_word(path: &Path) -> String {
    let s = path.display().to_string();
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./+,:@%=".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s
    } else {
        crate::transport::quote(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starter_paths_are_relative_and_distinct() {
        let files = starter();
        let mut paths: Vec<_> = files.iter().map(|f| f.path).collect();
        assert!(paths.iter().all(|p| Path::new(p).is_relative()));
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), files.len());
        assert!(files.iter().all(|f| f.contents.starts_with("// ")));
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word(Path::new("a/site.kdl")), "a/site.kdl");
        assert_eq!(
            shell_word(Path::new("my dir/site.kdl")),
            "'my dir/site.kdl'"
        );
        assert_eq!(
            shell_word(Path::new("it's/site.kdl")),
            r"'it'\''s/site.kdl'"
        );
    }
}
