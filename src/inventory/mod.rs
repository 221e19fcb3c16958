//! Class → hosts: the [`Inventory`] trait and its backends.

mod command;
#[cfg(feature = "ec2")]
pub mod ec2;
mod order;
pub mod select;
mod static_hosts;

pub use command::Command;
pub use order::natural_cmp;
pub use select::{SelectError, Selector};
pub use static_hosts::Static;

use crate::site::{ClassId, IdVec, InventorySpec, OnEmpty, Site};
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

crate::site::id_type!(
    /// Index of a host in [`Hosts::hosts`].
    HostId
);

/// A real machine, and the classes it plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: Arc<str>,
    pub address: Arc<str>,
    /// The classes it plays (at least one).
    pub classes: Vec<ClassId>,
    /// zone, rack, instance id, …: what `spread` and selectors look at.
    pub tags: BTreeMap<String, String>,
}

/// Every host of the site, resolved once per run and shared by every stage.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// In natural name order.
    pub hosts: IdVec<HostId, Host>,
    /// Per class, its hosts in natural name order.
    pub by_class: IdVec<ClassId, Vec<HostId>>,
    /// Things the operator should know that do not stop the run.
    pub warnings: Vec<String>,
}

impl Hosts {
    /// Indexes `hosts` by class; sorts them by name.
    pub fn new(mut hosts: Vec<Host>, classes: usize) -> Hosts {
        hosts.sort_by(|a, b| natural_cmp(&a.name, &b.name));
        let mut by_class: IdVec<ClassId, Vec<HostId>> = vec![Vec::new(); classes].into();
        let hosts: IdVec<HostId, Host> = hosts.into();
        for (id, h) in hosts.enumerate() {
            for &c in &h.classes {
                if let Some(list) = by_class.get_mut(c) {
                    list.push(id);
                }
            }
        }
        Hosts {
            hosts,
            by_class,
            warnings: Vec::new(),
        }
    }

    /// Every host of any of `classes`, in natural name order (host id order), each once.
    pub fn of_classes(&self, classes: &[ClassId]) -> Vec<HostId> {
        if let [only] = classes {
            return self.by_class.get(*only).cloned().unwrap_or_default();
        }
        let mut all: Vec<HostId> = classes
            .iter()
            .filter_map(|c| self.by_class.get(*c))
            .flat_map(|hs| hs.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The host of this name.
    pub fn find(&self, name: &str) -> Option<HostId> {
        self.hosts
            .as_slice()
            .binary_search_by(|h| natural_cmp(&h.name, name))
            .ok()
            .map(HostId::new)
    }
}

/// What went wrong resolving the inventory; each says what the operator can do about it.
#[derive(Debug, Error, miette::Diagnostic)]
pub enum InventoryError {
    #[error("host `{host}` has class `{class}`, which the site does not declare")]
    #[diagnostic(code(drover::inventory::unknown_class), help("{help}"))]
    UnknownClass {
        host: String,
        class: String,
        /// "did you mean …?", or the site's classes.
        help: String,
        /// What the backend read the class from.
        #[source_code]
        output: std::sync::Arc<miette::NamedSource<String>>,
        #[label("not a class of the site")]
        span: Option<miette::SourceSpan>,
    },
    #[error("two hosts are named `{name}` in the inventory")]
    #[diagnostic(
        code(drover::inventory::duplicate_host),
        help("host names must be unique: {detail}")
    )]
    DuplicateHost { name: String, detail: String },
    #[error("{classes} resolved to no hosts in the inventory of {platform}")]
    #[diagnostic(code(drover::inventory::empty_class), help("check the inventory (tags, command output), or set on-empty=\"warn\" on the inventory to go on without them"))]
    EmptyClass { classes: String, platform: String },
    #[error("no AWS credentials: {reason}")]
    #[diagnostic(code(drover::inventory::no_credentials), help("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, choose a profile with AWS_PROFILE or profile=\"…\", or run where an instance role applies"))]
    NoCredentials { reason: String },
    #[error("AWS denied the request: {reason}")]
    #[diagnostic(
        code(drover::inventory::access_denied),
        help("the credentials need permission for ec2:DescribeInstances in this region")
    )]
    AccessDenied { reason: String },
    #[error("cannot reach {endpoint}: {reason}")]
    #[diagnostic(
        code(drover::inventory::unreachable),
        help("check the region and endpoint (endpoint=\"…\" or AWS_ENDPOINT_URL) and the network")
    )]
    Unreachable { endpoint: String, reason: String },
    #[error("the EC2 API failed: {reason}")]
    #[diagnostic(code(drover::inventory::api))]
    Api { reason: String },
    #[error("the inventory command `{program}` failed ({status}){stderr}")]
    #[diagnostic(
        code(drover::inventory::command_failed),
        help("run the command yourself from the platform file's directory to see why")
    )]
    CommandFailed {
        program: String,
        status: String,
        stderr: String,
    },
    #[error("the inventory command `{program}` did not finish within {after}")]
    #[diagnostic(
        code(drover::inventory::command_timeout),
        help("make it faster, or give the inventory a longer timeout=\"…\"")
    )]
    CommandTimeout { program: String, after: String },
    #[error("the inventory command `{program}` printed invalid output: {reason}")]
    #[diagnostic(code(drover::inventory::bad_output), help("it must print JSON: {{\"hosts\": [{{\"name\": …, \"address\": …, \"class\": … or \"classes\": […], \"tags\": {{…}}}}]}}"))]
    BadOutput {
        program: String,
        reason: String,
        #[source_code]
        output: std::sync::Arc<miette::NamedSource<String>>,
        #[label("{reason}")]
        span: Option<miette::SourceSpan>,
    },
    #[error("the inventory failed: {reason}")]
    #[diagnostic(code(drover::inventory::backend))]
    Backend { reason: String },
    #[error("this `deploy` was built without the {backend} inventory backend (cargo feature `{backend}`), which {platform} uses")]
    #[diagnostic(
        code(drover::inventory::not_built),
        help("use a `deploy` built with the default features, or with `--features {backend}`: `cargo install --path . --features {backend}`, or `cargo build --release` in the repository")
    )]
    NotBuilt { backend: String, platform: String },
}

/// A source of hosts for the classes of a site. Backends only list hosts; [`resolve`]
/// checks names and classes the same way for all of them.
pub trait Inventory {
    fn hosts(&self, site: &Site) -> Result<Vec<Host>, InventoryError>;
}

/// The backend the site's platform names.
pub fn backend(site: &Site) -> Box<dyn Inventory> {
    match &site.platform.inventory {
        InventorySpec::Static { .. } => Box::new(Static),
        InventorySpec::Command(_) => Box::new(Command),
        #[cfg(feature = "ec2")]
        InventorySpec::Ec2(_) => Box::new(ec2::Ec2::default()),
        #[cfg(not(feature = "ec2"))]
        InventorySpec::Ec2(_) => Box::new(NotBuilt("ec2")),
    }
}

/// A backend the site's platform names but this build left out (its cargo feature is off):
/// every run that needs the hosts stops with [`InventoryError::NotBuilt`], and says how to
/// get a `deploy` that has it. `deploy check` still checks the platform in full.
#[cfg(any(test, not(feature = "ec2")))]
struct NotBuilt(&'static str);

#[cfg(any(test, not(feature = "ec2")))]
impl Inventory for NotBuilt {
    fn hosts(&self, site: &Site) -> Result<Vec<Host>, InventoryError> {
        Err(InventoryError::NotBuilt {
            backend: self.0.to_string(),
            platform: site.platform.file.display().to_string(),
        })
    }
}

/// Resolves the site's hosts through the platform's backend, once per run: unique names, and
/// every class with a host (or a warning, with `on-empty="warn"`).
pub fn resolve(site: &Site) -> Result<Hosts, InventoryError> {
    let list = backend(site).hosts(site)?;
    let mut hosts = Hosts::new(list, site.classes.len());
    if let Some(w) = hosts
        .hosts
        .as_slice()
        .windows(2)
        .find(|w| w[0].name == w[1].name)
    {
        return Err(InventoryError::DuplicateHost {
            name: w[0].name.to_string(),
            detail: format!("addresses {} and {}", w[0].address, w[1].address),
        });
    }
    let empty: Vec<&str> = site
        .classes
        .enumerate()
        .filter(|(c, _)| hosts.by_class[*c].is_empty())
        .map(|(_, c)| c.name.as_str())
        .collect();
    if !empty.is_empty() {
        let classes = format!(
            "class{} {}",
            if empty.len() == 1 { "" } else { "es" },
            empty.join(", ")
        );
        let platform = site.platform.file.display().to_string();
        match site.platform.on_empty {
            OnEmpty::Error => return Err(InventoryError::EmptyClass { classes, platform }),
            OnEmpty::Warn => hosts.warnings.push(format!(
                "{classes} resolved to no hosts in the inventory of {platform}"
            )),
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A site on an `inventory "ec2"` platform, loaded (so fully checked) from a scratch dir.
    fn ec2_site(dir: &std::path::Path) -> Site {
        let platform = r#"platform "aws" {
    transport "local" root="hosts"
    state-dir "/var/lib/drover"
    inventory "ec2" region="eu-west-1" address="private-ip" {
        class "app" tag="role=app"
    }
}
"#;
        let site = r#"site "s" { platform "platform.kdl" }
class "app" { service "api" }
service "api" { version "1"; install "true"; check "true" }
"#;
        std::fs::write(dir.join("platform.kdl"), platform).expect("write platform");
        std::fs::write(dir.join("site.kdl"), site).expect("write site");
        match crate::site::load(&dir.join("site.kdl")) {
            Ok(site) => site,
            Err(e) => panic!("the ec2 site is valid: {e:?}"),
        }
    }

    #[test]
    fn an_ec2_platform_is_checked_in_every_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        let site = ec2_site(dir.path());
        let InventorySpec::Ec2(spec) = &site.platform.inventory else {
            panic!("an ec2 inventory: {:?}", site.platform.inventory);
        };
        assert_eq!(spec.region.as_deref(), Some("eu-west-1"));
        assert_eq!(spec.classes.len(), 1);
        // And a mistake in it is still reported, whether or not the backend was built.
        let bad = std::fs::read_to_string(dir.path().join("platform.kdl"))
            .expect("read platform")
            .replace("tag=\"role=app\"", "");
        std::fs::write(dir.path().join("platform.kdl"), bad).expect("write platform");
        assert!(crate::site::load(&dir.path().join("site.kdl")).is_err());
    }

    #[test]
    fn a_backend_left_out_of_the_build_says_how_to_get_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let site = ec2_site(dir.path());
        let Err(e) = NotBuilt("ec2").hosts(&site) else {
            panic!("no hosts from a backend not built");
        };
        assert!(matches!(e, InventoryError::NotBuilt { .. }), "{e:?}");
        let text = crate::report::render_diagnostic(&e, crate::report::Style::PLAIN);
        assert!(
            text.contains("built without the ec2 inventory backend"),
            "{text}"
        );
        assert!(text.contains("platform.kdl"), "{text}");
        assert!(text.contains("--features ec2"), "{text}");
        // An environment error, like every inventory failure.
        assert_eq!(
            crate::cli::Error::from(e).exit_code(),
            crate::cli::code::ENVIRONMENT
        );
    }

    /// Built without the feature, `resolve` stops with [`InventoryError::NotBuilt`] (with it,
    /// tests/it/ec2.rs resolves real hosts from moto).
    #[cfg(not(feature = "ec2"))]
    #[test]
    fn without_the_feature_resolving_ec2_hosts_is_an_environment_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let site = ec2_site(dir.path());
        let e = resolve(&site).expect_err("no ec2 backend in this build");
        assert!(matches!(e, InventoryError::NotBuilt { ref backend, .. } if backend == "ec2"));
    }
}
