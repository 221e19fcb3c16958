//! The platform's `store` node, read into raw values with spans: where the fleet's shared state
//! lives besides the hosts (`store "etcd" endpoints="…" prefix="…" lock-ttl="10s" { tls …; auth … }`).

use super::read::{Reader, Spanned};
use kdl::KdlNode;
use miette::SourceSpan;
use std::time::Duration;

/// `store "KIND" …`.
#[derive(Debug)]
pub struct RawStore {
    pub kind: Spanned<String>,
    pub endpoints: Option<Spanned<String>>,
    pub prefix: Option<Spanned<String>>,
    pub lock_ttl: Option<Spanned<Duration>>,
    pub tls: Option<RawTls>,
    pub auth: Option<RawAuth>,
}

/// `tls ca="…" cert="…" key="…"`.
#[derive(Debug)]
pub struct RawTls {
    pub ca: Option<Spanned<String>>,
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    pub span: SourceSpan,
}

/// `auth user="…" password-env="…"`.
#[derive(Debug)]
pub struct RawAuth {
    pub user: Option<Spanned<String>>,
    pub password_env: Option<Spanned<String>>,
    pub span: SourceSpan,
}

const STORE_PROPS: &[&str] = &["endpoints", "prefix", "lock-ttl"];

/// Reads a `store` node.
pub fn store(r: &mut Reader<'_>, n: &KdlNode) -> Option<RawStore> {
    r.shape(n, 1, STORE_PROPS, true);
    let endpoints = r.string_prop(n, "endpoints");
    let prefix = r.string_prop(n, "prefix");
    let lock_ttl = r.duration_prop(n, "lock-ttl");
    let kind = r.string_arg(n, "the store's kind")?;
    let (mut tls, mut auth) = (None, None);
    let (mut seen_tls, mut seen_auth) = (None, None);
    for c in r.children(n, &["tls", "auth"]) {
        match c.name().value() {
            "tls" => {
                r.shape(c, 0, &["ca", "cert", "key"], false);
                if r.once(&mut seen_tls, c) {
                    tls = Some(RawTls {
                        ca: r.string_prop(c, "ca"),
                        cert: r.string_prop(c, "cert"),
                        key: r.string_prop(c, "key"),
                        span: Reader::name_span(c),
                    });
                }
            }
            _ => {
                r.shape(c, 0, &["user", "password-env"], false);
                if r.once(&mut seen_auth, c) {
                    auth = Some(RawAuth {
                        user: r.string_prop(c, "user"),
                        password_env: r.string_prop(c, "password-env"),
                        span: Reader::name_span(c),
                    });
                }
            }
        }
    }
    Some(RawStore {
        kind,
        endpoints,
        prefix,
        lock_ttl,
        tls,
        auth,
    })
}
