//! Secrets: read on the controller when a run starts, handed to hooks as environment
//! variables on their standard input (never on a command line, never in a plan), and
//! replaced by `[redacted]` in everything drover writes or prints: logs, events, errors.

mod key;

pub use key::{hex, Key, KEY_VAR};

use crate::site::{Secret, SecretSource, Site};
use crate::transport::quote;
use std::collections::BTreeMap;
use std::path::PathBuf;
use thiserror::Error;

/// What redacted text shows instead of a secret.
pub const REDACTED: &str = "[redacted]";

/// Lines of a multi-line secret shorter than this are not redacted on their own (a line such
/// as `-----` would blank out unrelated text); the whole value always is.
const MIN_LINE: usize = 8;

/// The secrets of a run, by scope, with their values.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Every service's hooks get these.
    site: Vec<(String, String)>,
    /// Only this service's hooks get these (a name here wins over the site's).
    services: BTreeMap<String, Vec<(String, String)>>,
    /// What to redact, longest first.
    patterns: Vec<Vec<u8>>,
    /// The controller's fingerprint key; loaded only for a site that has secrets.
    key: Option<Key>,
    /// Secrets that could not be read (names).
    unknown: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    /// Names only: a secret's value never reaches a debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .site
            .iter()
            .chain(self.services.values().flatten())
            .map(|(n, _)| n.as_str())
            .collect();
        f.debug_struct("Secrets").field("names", &names).finish()
    }
}

/// A secret that cannot be read; names the secret and its source, never a value.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum SecretError {
    #[error("secret `{name}`: the environment variable `{var}` is not set")]
    #[diagnostic(
        code(drover::secret::env),
        help("set `{var}` in the environment `deploy` runs in, or change the secret's source in {site}")
    )]
    EnvMissing {
        name: String,
        var: String,
        site: String,
    },
    #[error("secret `{name}`: cannot read {path}: {reason}")]
    #[diagnostic(
        code(drover::secret::file),
        help("make the file readable by the user running `deploy` (paths are relative to the site file), or change the secret's source in {site}")
    )]
    File {
        name: String,
        path: PathBuf,
        reason: String,
        site: String,
    },
    #[error("the fingerprint key: {reason}")]
    #[diagnostic(
        code(drover::secret::key),
        help("secrets count in a host's recorded inputs only as an HMAC under this controller's key; set {var} (shared by every controller of the fleet) or make ~/.config/drover writable", var = KEY_VAR)
    )]
    Key { reason: String },
    #[error("secret `{name}` ({source_text}): {reason}")]
    #[diagnostic(
        code(drover::secret::value),
        help("a secret is handed to hooks as an environment variable: non-empty UTF-8 text without NUL bytes")
    )]
    Value {
        name: String,
        source_text: String,
        reason: String,
    },
}

impl Secrets {
    /// No secrets.
    pub fn none() -> Secrets {
        Secrets::default()
    }

    /// Reads every secret the site declares, from the controller's environment and files.
    pub fn load(site: &Site) -> Result<Secrets, SecretError> {
        let (secrets, mut errors) = Secrets::load_available(site);
        match errors.is_empty() {
            true => Ok(secrets),
            false => Err(errors.remove(0)),
        }
    }

    /// Reads the secrets that can be read here; those that cannot are left out, named in
    /// [`Secrets::unknown`], with why. For commands that only look (`plan`, `status`,
    /// `verify`): whether such a secret changed cannot be told, and is not guessed.
    pub fn load_available(site: &Site) -> (Secrets, Vec<SecretError>) {
        let site_file = site.file.display().to_string();
        let mut errors = Vec::new();
        let mut unknown = Vec::new();
        let mut read_all = |list: &[Secret]| -> Vec<(String, String)> {
            let mut out = Vec::new();
            for s in list {
                match read(s, &site_file) {
                    Ok(v) => out.push((s.name.clone(), v)),
                    Err(e) => {
                        unknown.push(s.name.clone());
                        errors.push(e);
                    }
                }
            }
            out
        };
        let mut services = BTreeMap::new();
        let site_secrets = read_all(&site.secrets);
        for s in &site.services {
            if !s.secrets.is_empty() {
                services.insert(s.name.clone(), read_all(&s.secrets));
            }
        }
        let mut secrets = Secrets::from_values(site_secrets, services);
        unknown.sort();
        unknown.dedup();
        secrets.unknown = unknown;
        if !secrets.is_empty()
            || site.services.iter().any(|s| {
                s.files
                    .iter()
                    .any(|f| f.template.as_ref().is_some_and(|t| t.secret))
            })
        {
            match Key::load() {
                Ok(key) => secrets.key = Some(key),
                Err(reason) => errors.push(SecretError::Key { reason }),
            }
        }
        (secrets, errors)
    }

    /// The secrets that could not be read ([`Secrets::load_available`]).
    pub fn unknown(&self) -> &[String] {
        &self.unknown
    }

    /// These secrets, with `key` for their fingerprints.
    pub fn with_key(mut self, key: Key) -> Secrets {
        self.key = Some(key);
        self
    }

    /// The fingerprint key, if the site has secrets.
    pub fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    /// The HMAC of `parts` under the fingerprint key; a key made for this run alone when none
    /// was loaded (what it keys then never matches a recorded one: never a plain digest).
    pub fn mac(&self, parts: &[&[u8]]) -> String {
        static EPHEMERAL: std::sync::OnceLock<Key> = std::sync::OnceLock::new();
        let key = self.key.as_ref().unwrap_or_else(|| {
            EPHEMERAL.get_or_init(|| {
                let mut bytes = vec![0u8; 32];
                let _ = std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
                Key::new(bytes)
            })
        });
        key.mac(parts)
    }

    /// Secrets with these values: `site` for every service, `services` for one each.
    pub fn from_values(
        site: Vec<(String, String)>,
        services: BTreeMap<String, Vec<(String, String)>>,
    ) -> Secrets {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for (_, value) in site.iter().chain(services.values().flatten()) {
            patterns.push(value.as_bytes().to_vec());
            if value.contains('\n') {
                patterns.extend(
                    value
                        .lines()
                        .map(str::trim)
                        .filter(|l| l.len() >= MIN_LINE)
                        .map(|l| l.as_bytes().to_vec()),
                );
            }
        }
        patterns.retain(|p| !p.is_empty());
        patterns.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        patterns.dedup();
        Secrets {
            site,
            services,
            patterns,
            key: None,
            unknown: Vec::new(),
        }
    }

    /// Whether there is nothing to hand over or redact.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The secrets the hooks of `service` get, by name (the service's own win over the site's).
    pub fn for_service(&self, service: &str) -> Vec<(String, String)> {
        let own = self.services.get(service).map_or(&[][..], Vec::as_slice);
        let mut out: Vec<(String, String)> = self
            .site
            .iter()
            .filter(|(n, _)| own.iter().all(|(m, _)| m != n))
            .cloned()
            .collect();
        out.extend(own.iter().cloned());
        out
    }

    /// What a hook of `service` reads on its standard input: one `export` of every secret it
    /// gets, each value quoted; `None` when it gets none.
    pub fn input(&self, service: &str) -> Option<Vec<u8>> {
        let vars = self.for_service(service);
        if vars.is_empty() {
            return None;
        }
        let mut out = String::from("export");
        for (name, value) in &vars {
            out.push(' ');
            out.push_str(name);
            out.push('=');
            out.push_str(&quote(value));
        }
        out.push('\n');
        Some(out.into_bytes())
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn redact(&self, text: &[u8]) -> Vec<u8> {
        let mut out = text.to_vec();
        for p in &self.patterns {
            out = replace(&out, p, REDACTED.as_bytes());
        }
        out
    }

    /// [`Secrets::redact`] for text.
    pub fn redact_str(&self, text: &str) -> String {
        if self.patterns.is_empty() {
            return text.to_string();
        }
        String::from_utf8_lossy(&self.redact(text.as_bytes())).into_owned()
    }
}

fn read(secret: &Secret, site_file: &str) -> Result<String, SecretError> {
    let (raw, source_text) = match &secret.source {
        SecretSource::Env(var) => match std::env::var_os(var) {
            Some(v) => (
                v.into_encoded_bytes(),
                format!("environment variable `{var}`"),
            ),
            None => {
                return Err(SecretError::EnvMissing {
                    name: secret.name.clone(),
                    var: var.clone(),
                    site: site_file.to_string(),
                })
            }
        },
        SecretSource::File(path) => match std::fs::read(path) {
            Ok(mut bytes) => {
                // A file written by `echo` or an editor ends with a newline that is not part
                // of the secret.
                if bytes.ends_with(b"\n") {
                    bytes.pop();
                    if bytes.ends_with(b"\r") {
                        bytes.pop();
                    }
                }
                (bytes, format!("file {}", path.display()))
            }
            Err(e) => {
                return Err(SecretError::File {
                    name: secret.name.clone(),
                    path: path.clone(),
                    reason: e.to_string(),
                    site: site_file.to_string(),
                })
            }
        },
    };
    let bad = |reason: &str| SecretError::Value {
        name: secret.name.clone(),
        source_text: source_text.clone(),
        reason: reason.into(),
    };
    if raw.is_empty() {
        return Err(bad("it is empty"));
    }
    if raw.contains(&0) {
        return Err(bad("it contains a NUL byte"));
    }
    String::from_utf8(raw).map_err(|_| bad("it is not UTF-8 text"))
}

/// `text` with every occurrence of `from` replaced by `to`.
fn replace(text: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || text.len() < from.len() {
        return text.to_vec();
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        let mut services = BTreeMap::new();
        services.insert(
            "api".to_string(),
            vec![
                ("TOKEN".to_string(), "api-token".to_string()),
                ("SHARED".to_string(), "api's own".to_string()),
            ],
        );
        Secrets::from_values(
            vec![
                ("SHARED".to_string(), "s3cr3t".to_string()),
                (
                    "KEY".to_string(),
                    "-----BEGIN KEY-----\nabcdefghijkl\n-----END KEY-----".to_string(),
                ),
            ],
            services,
        )
    }

    #[test]
    fn every_occurrence_is_redacted_and_lines_of_long_values_too() {
        let s = secrets();
        assert_eq!(
            s.redact_str("pw=s3cr3t; again s3cr3ts3cr3t; token api-token"),
            "pw=[redacted]; again [redacted][redacted]; token [redacted]"
        );
        assert_eq!(
            s.redact_str("line: abcdefghijkl\n"),
            "line: [redacted]\n",
            "a line of a multi-line secret is redacted on its own"
        );
        assert_eq!(s.redact_str("no secret here"), "no secret here");
        assert!(
            !format!("{s:?}").contains("s3cr3t"),
            "Debug shows names only"
        );
    }

    #[test]
    fn a_service_gets_the_sites_secrets_and_its_own_which_win() {
        let s = secrets();
        let api: Vec<(String, String)> = s.for_service("api");
        assert_eq!(
            api.iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [
                (
                    "KEY",
                    "-----BEGIN KEY-----\nabcdefghijkl\n-----END KEY-----"
                ),
                ("TOKEN", "api-token"),
                ("SHARED", "api's own"),
            ]
        );
        assert_eq!(s.for_service("db").len(), 2);
        assert_eq!(Secrets::none().input("db"), None);
    }

    #[test]
    fn the_input_sets_the_exact_values_in_a_shell() {
        let s = secrets();
        let input = String::from_utf8(s.input("api").unwrap()).unwrap();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("{input}printf '%s|%s' \"$SHARED\" \"$KEY\""))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "api's own|-----BEGIN KEY-----\nabcdefghijkl\n-----END KEY-----"
        );
    }
}
