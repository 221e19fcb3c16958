//! The raw `store` node → a checked [`StoreSpec`]: a kind this `deploy` knows, endpoints that are
//! URLs, a lease long enough to renew, TLS files that can be read, and complete credentials.

use super::model::{StoreAuth, StoreSpec, StoreTls};
use super::raw_store::RawStore;
use super::read::Reader;
use super::source::beside;
use std::path::Path;
use std::time::Duration;

const DEFAULT_PREFIX: &str = "/drover";
const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// A lease shorter than this could not be renewed in time across a slow network.
const MIN_TTL: Duration = Duration::from_secs(2);

/// Checks a `store` node of the platform file `platform`; `None` (with diagnostics) if wrong.
pub fn store(r: &mut Reader<'_>, raw: RawStore, platform: &Path) -> Option<StoreSpec> {
    if raw.kind.value != "etcd" {
        r.bad(
            raw.kind.span,
            "the store's kind".into(),
            format!("`{}` is not a store this deploy knows", raw.kind.value),
            "write `store \"etcd\" endpoints=\"http://10.0.0.11:2379\"`, or leave the store out \
             (each host keeps its own state either way)"
                .into(),
        );
        return None;
    }
    let mut ok = true;
    let endpoints: Vec<String> = match &raw.endpoints {
        None => {
            r.missing(
                raw.kind.span,
                "`endpoints=`, where etcd answers".into(),
                "write `store \"etcd\" endpoints=\"http://10.0.0.11:2379,http://10.0.0.12:2379\"`"
                    .into(),
            );
            return None;
        }
        Some(e) => {
            let list: Vec<String> = e
                .value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let bad = list
                .iter()
                .find(|u| !(u.starts_with("http://") || u.starts_with("https://")));
            if list.is_empty() || bad.is_some() {
                r.bad(
                    e.span,
                    "`endpoints`".into(),
                    match bad {
                        Some(u) => format!("`{u}` is not an http:// or https:// URL"),
                        None => "no endpoint".into(),
                    },
                    "give etcd's client URLs, comma-separated, as in \
                     \"https://10.0.0.11:2379,https://10.0.0.12:2379\""
                        .into(),
                );
                ok = false;
            }
            list
        }
    };
    let prefix = match &raw.prefix {
        Some(p) if !p.value.starts_with('/') || p.value.len() < 2 || p.value.ends_with('/') => {
            r.bad(
                p.span,
                "`prefix`".into(),
                "a key prefix starts with `/` and does not end with one".into(),
                "write it as prefix=\"/drover\"".into(),
            );
            ok = false;
            String::new()
        }
        Some(p) => p.value.clone(),
        None => DEFAULT_PREFIX.into(),
    };
    let lock_ttl = match &raw.lock_ttl {
        Some(t) if t.value < MIN_TTL => {
            r.bad(
                t.span,
                "`lock-ttl`".into(),
                "shorter than 2s: the lease could not be renewed in time".into(),
                "give the lock's lease at least lock-ttl=\"2s\" (the default is \"10s\")".into(),
            );
            ok = false;
            DEFAULT_TTL
        }
        Some(t) if t.value.subsec_nanos() != 0 => {
            // etcd's leases are whole seconds: asked for less precision, etcd would cut it, and
            // the lease would end before the controller counts on.
            let up = t.value.as_secs() + 1;
            r.bad(
                t.span,
                "`lock-ttl`".into(),
                "not a whole number of seconds: etcd's leases are counted in whole seconds".into(),
                format!("write lock-ttl=\"{up}s\""),
            );
            ok = false;
            DEFAULT_TTL
        }
        Some(t) => t.value,
        None => DEFAULT_TTL,
    };
    let tls = match raw.tls {
        None => None,
        Some(t) => {
            let mut file = |v: &Option<super::read::Spanned<String>>, what: &str| {
                let v = v.as_ref()?;
                let path = beside(platform, &v.value);
                if let Err(e) = std::fs::File::open(&path) {
                    r.errors.push(super::error::SiteError::Unreadable {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                        src: Some(r.src.clone()),
                        span: Some(v.span),
                        help: format!("the {what} is read relative to the platform file"),
                    });
                    ok = false;
                }
                Some(path)
            };
            let ca = file(&t.ca, "CA certificate");
            let cert = file(&t.cert, "client certificate");
            let key = file(&t.key, "client key");
            match (ca, cert, key) {
                (None, _, _) => {
                    r.missing(
                        t.span,
                        "`ca=`, the CA that signed etcd's certificate".into(),
                        "write `tls ca=\"etcd-ca.pem\"` (and `cert=`, `key=` when etcd asks for \
                         a client certificate)"
                            .into(),
                    );
                    ok = false;
                    None
                }
                (Some(ca), Some(cert), Some(key)) => Some(StoreTls {
                    ca,
                    client: Some((cert, key)),
                }),
                (Some(ca), None, None) => Some(StoreTls { ca, client: None }),
                (Some(_), cert, _) => {
                    r.missing(
                        t.span,
                        if cert.is_some() {
                            "`key=`, the client certificate's key".into()
                        } else {
                            "`cert=`, the client certificate of `key=`".into()
                        },
                        "a client certificate comes with its key: give both or neither".into(),
                    );
                    ok = false;
                    None
                }
            }
        }
    };
    if let (Some(_), Some(e)) = (&tls, &raw.endpoints) {
        if endpoints.iter().any(|u| u.starts_with("http://")) {
            r.bad(
                e.span,
                "`endpoints`".into(),
                "`tls` is given, but an endpoint is plain http://".into(),
                "write the endpoints as https:// URLs, or leave `tls` out".into(),
            );
            ok = false;
        }
    }
    let auth = match raw.auth {
        None => None,
        Some(a) => match (a.user, a.password_env) {
            (Some(user), Some(env)) => Some(StoreAuth {
                user: user.value,
                password_env: env.value,
            }),
            (user, _) => {
                r.missing(
                    a.span,
                    if user.is_some() {
                        "`password-env=`, the variable that holds etcd's password".into()
                    } else {
                        "`user=`, etcd's user name".into()
                    },
                    "write `auth user=\"deploy\" password-env=\"ETCD_PASSWORD\"`: the password \
                     is read from that variable when `deploy` runs, never from a file of the site"
                        .into(),
                );
                ok = false;
                None
            }
        },
    };
    ok.then_some(StoreSpec {
        endpoints,
        prefix,
        lock_ttl,
        tls,
        auth,
    })
}
