//! Files only the controller's user may read: the logs and journals under
//! `.drover/runs/<run>` hold whatever hooks printed (secrets are redacted, but a hook's output
//! may still be sensitive). Directories are created `0700`, files `0600`.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` and its missing parents, each `0700`, and makes `dir` itself `0700` even if it
/// existed.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Opens `file` for appending, creating it `0600` (and its missing directories `0700`).
pub fn append_private(file: &Path) -> io::Result<File> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn logs_and_their_directories_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join(".drover/runs/r1");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&run).unwrap();
        assert_eq!(
            mode(&run),
            0o700,
            "an existing run directory is made private"
        );
        let log = run.join("host 1/api.log");
        use std::io::Write;
        writeln!(append_private(&log).unwrap(), "x").unwrap();
        assert_eq!(mode(log.parent().unwrap()), 0o700);
        assert_eq!(mode(&log), 0o600);
        let fresh = dir.path().join("a/b");
        private_dir(&fresh).unwrap();
        assert_eq!((mode(&dir.path().join("a")), mode(&fresh)), (0o700, 0o700));
    }
}
