//! Templates rendered per host with minijinja, and the `needs` data they are given.

use crate::inventory::{Host, Hosts};
use crate::secrets::Secrets;
use crate::site::{File, ServiceId, Site, SiteError, Template};
use minijinja::{Environment, UndefinedBehavior, Value};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One host of a needed service, as templates see it (`{{ h.host }} {{ h.address }}:{{ h.port }}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub host: Arc<str>,
    pub address: Arc<str>,
    pub port: Option<u16>,
}

/// A service's hosts as its dependents see them: the list, and its text in the inputs.
#[derive(Debug, Clone)]
pub struct Pool {
    pub members: Arc<Vec<Member>>,
    pub entry: Arc<str>,
}

/// The hosts of service `sid`, in name order.
pub fn pool(site: &Site, hosts: &Hosts, sid: ServiceId) -> Pool {
    let service = &site.services[sid];
    Pool::of(
        hosts
            .of_classes(&service.classes)
            .into_iter()
            .map(|h| Member {
                host: hosts.hosts[h].name.clone(),
                address: hosts.hosts[h].address.clone(),
                port: service.port,
            })
            .collect(),
    )
}

impl Member {
    /// How the inputs record it: `host=address[:port]`.
    pub fn entry(&self) -> String {
        match self.port {
            Some(p) => format!("{}={}:{p}", self.host, self.address),
            None => format!("{}={}", self.host, self.address),
        }
    }
}

impl Pool {
    /// The pool of these members, in the order given.
    pub fn of(members: Vec<Member>) -> Pool {
        let mut entry = String::with_capacity(members.len() * 32);
        for (i, m) in members.iter().enumerate() {
            if i > 0 {
                entry.push(' ');
            }
            entry.push_str(&m.entry());
        }
        Pool {
            members: Arc::new(members),
            entry: Arc::from(entry),
        }
    }
}

/// Per service `sid` needs (runtime or data), its hosts in name order; `pools` caches each
/// needed service's pool across the services that need it.
pub fn members(
    site: &Site,
    hosts: &Hosts,
    sid: ServiceId,
    pools: &mut std::collections::HashMap<ServiceId, Pool>,
) -> BTreeMap<String, Pool> {
    let mut out = BTreeMap::new();
    for need in &site.services[sid].needs {
        let needed = &site.services[need.service];
        if out.contains_key(&needed.name) {
            continue;
        }
        let p = pools
            .entry(need.service)
            .or_insert_with(|| pool(site, hosts, need.service))
            .clone();
        out.insert(needed.name.clone(), p);
    }
    out
}

/// Renders one service's templates, sharing what every host sees.
pub struct Renderer<'a> {
    site: &'a Site,
    sid: ServiceId,
    env: Environment<'static>,
    needs: Value,
    service_env: Value,
    secrets: Value,
}

impl<'a> Renderer<'a> {
    pub fn new(
        site: &'a Site,
        sid: ServiceId,
        needs: Arc<BTreeMap<String, Pool>>,
        secrets: &Secrets,
    ) -> Self {
        let mut env = Environment::new();
        env.set_keep_trailing_newline(true);
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        let service = &site.services[sid];
        // Compiled once per service, not once per host: each by its file's destination.
        for f in &service.files {
            if let Some(t) = &f.template {
                let _ = env.add_template_owned(f.to.clone(), t.text.clone());
            }
        }
        let own: BTreeMap<String, String> =
            secrets.for_service(&service.name).into_iter().collect();
        let service_env: BTreeMap<&str, &str> = service
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        Renderer {
            site,
            sid,
            env,
            needs: Value::from_serialize(
                needs
                    .iter()
                    .map(|(k, p)| (k.as_str(), &*p.members))
                    .collect::<BTreeMap<&str, &Vec<Member>>>(),
            ),
            service_env: Value::from_serialize(&service_env),
            secrets: Value::from_serialize(&own),
        }
    }

    /// `file`'s template rendered for `host`.
    pub fn render(
        &self,
        file: &File,
        template: &Template,
        host: &Host,
    ) -> Result<String, minijinja::Error> {
        let service = &self.site.services[self.sid];
        let classes: Vec<&str> = host
            .classes
            .iter()
            .map(|c| self.site.classes[*c].name.as_str())
            .collect();
        let ctx = minijinja::context! {
            site => self.site.name.as_str(),
            host => &*host.name,
            address => &*host.address,
            classes => classes,
            tags => &host.tags,
            service => service.name.as_str(),
            version => service.version.as_str(),
            port => service.port,
            env => self.service_env.clone(),
            needs => self.needs.clone(),
            secrets => if template.secret { self.secrets.clone() } else { Value::from(()) },
        };
        match self.env.get_template(&file.to) {
            Ok(compiled) => compiled.render(ctx),
            // Not compiled (it did not parse): rendering it again reports why.
            Err(_) => self.env.render_str(&template.text, ctx),
        }
    }

    /// Every template of the service for `host`: `(to, mode, text, secret)`; or the first
    /// error, as a diagnostic pointing into its template. With `skip_secret`, templates that
    /// render secrets are left out (some secret is not readable here).
    #[allow(clippy::type_complexity)]
    pub fn render_all(
        &self,
        host: &Host,
        skip_secret: bool,
    ) -> Result<Vec<(String, u32, String, bool)>, Vec<SiteError>> {
        let mut out = Vec::new();
        for f in &self.site.services[self.sid].files {
            let Some(t) = &f.template else { continue };
            if skip_secret && t.secret {
                continue;
            }
            match self.render(f, t, host) {
                Ok(text) => out.push((f.to.clone(), f.mode(), text, t.secret)),
                Err(e) => {
                    let src = miette::NamedSource::new(
                        f.source.display().to_string(),
                        Arc::new(t.text.clone()),
                    );
                    return Err(vec![crate::site::template_error(&src, &e)]);
                }
            }
        }
        Ok(out)
    }
}
