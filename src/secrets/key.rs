//! The controller's fingerprint key: secrets count in a host's recorded inputs only as an HMAC
//! under this key, so that a state file, a plan or a journal holds nothing from which a weak
//! secret could be guessed offline. It never leaves the controller.
//!
//! Where it comes from: `DROVER_FINGERPRINT_KEY` (any text; controllers that deploy the same
//! fleet, a laptop and CI, share it this way), else `$XDG_CONFIG_HOME/drover/fingerprint.key`
//! (`~/.config/…`), made on first use from 32 random bytes, mode 0600.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

/// The environment variable that gives the key.
pub const KEY_VAR: &str = "DROVER_FINGERPRINT_KEY";

/// An HMAC-SHA256 key.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key([hidden])")
    }
}

impl Key {
    /// A key of these bytes.
    pub fn new(bytes: Vec<u8>) -> Key {
        Key(bytes)
    }

    /// The controller's key: from [`KEY_VAR`], else the key file, made if missing.
    pub fn load() -> Result<Key, String> {
        if let Some(v) = std::env::var_os(KEY_VAR).filter(|v| !v.is_empty()) {
            return Ok(Key(v.into_encoded_bytes()));
        }
        let path = key_file().ok_or("neither XDG_CONFIG_HOME nor HOME is set")?;
        private(&path)?;
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() >= 16 => return Ok(Key(bytes)),
            Ok(_) => return Err(format!("{} is shorter than 16 bytes", path.display())),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot read {}: {e}", path.display()))
            }
            Err(_) => {}
        }
        make(&path).map_err(|e| format!("cannot make {}: {e}", path.display()))?;
        std::fs::read(&path)
            .map(Key)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
    }

    /// HMAC-SHA256 of `parts` (each length-prefixed), hex, 128 bits.
    pub fn mac(&self, parts: &[&[u8]]) -> String {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        for p in parts {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        hex(&mac.finalize().into_bytes()[..16])
    }

    /// Names the key without revealing it: two controllers with the same id share the key.
    pub fn id(&self) -> String {
        self.mac(&[b"drover fingerprint key id"])
    }
}

/// Refuses a key file that others may read or write (as ssh refuses such a private key): a key
/// others can read lets them test guesses of every secret against the HMACs hosts record.
fn private(path: &std::path::Path) -> Result<(), String> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} is readable or writable by others (mode {mode:04o}): \
             run `chmod 600 {}` (or give the key in {KEY_VAR})",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

fn key_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("drover").join("fingerprint.key"))
}

/// Writes a new random key to `path` unless one appears there first (two runs at once keep
/// the same key: the new file is linked into place, which fails if one is already there).
fn make(path: &std::path::Path) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
    let tmp = dir.join(format!(".fingerprint.key.{}", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_depend_on_the_key_and_every_part() {
        let a = Key::new(b"key one, long enough".to_vec());
        let b = Key::new(b"key two, long enough".to_vec());
        assert_ne!(a.mac(&[b"x"]), b.mac(&[b"x"]));
        assert_ne!(a.mac(&[b"ab", b"c"]), a.mac(&[b"a", b"bc"]));
        assert_eq!(a.mac(&[b"x"]).len(), 32);
        assert_ne!(a.id(), b.id());
    }

    #[test]
    fn a_key_file_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("drover/fingerprint.key");
        make(&path).expect("made");
        let first = std::fs::read(&path).expect("read");
        make(&path).expect("second make keeps the first");
        assert_eq!(std::fs::read(&path).expect("read"), first);
        assert_eq!(first.len(), 32);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("drover/fingerprint.key");
        make(&path).expect("made");
        assert_eq!(private(&path), Ok(()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = private(&path).expect_err("refused");
        assert!(
            err.contains("mode 0644") && err.contains("chmod 600"),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).expect("chmod");
        assert!(private(&path).is_err());
        // A missing file is made later, private.
        assert_eq!(private(&dir.path().join("none")), Ok(()));
    }
}
