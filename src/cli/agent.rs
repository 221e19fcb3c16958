//! `deploy agent`: flags → the agent stage (a long-lived process), or its systemd unit.

use super::{code, AgentArgs, Error};
use crate::agent::{self, Request};
use crate::site::{StoreAuth, StoreTls};

pub fn run(args: &AgentArgs) -> Result<u8, Error> {
    let missing = |flag: &str| Error::Usage {
        reason: format!("deploy agent needs {flag}"),
        help: "deploy agent --store http://10.0.0.11:2379 --site SITE --host HOST".into(),
    };
    let endpoints: Vec<String> = args
        .store
        .as_deref()
        .ok_or_else(|| missing("--store URL"))?
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    if endpoints.is_empty() {
        return Err(missing("--store URL"));
    }
    let ttl = humantime::parse_duration(&args.ttl).map_err(|e| Error::Usage {
        reason: format!("--ttl {}: {e}", args.ttl),
        help: "a whole number of seconds, as \"10s\"".into(),
    })?;
    let request = Request {
        endpoints,
        prefix: args.prefix.clone(),
        site: args.site.clone().ok_or_else(|| missing("--site SITE"))?,
        host: match (&args.host, args.simulate) {
            (Some(h), _) => h.clone(),
            (None, Some(_)) => String::new(),
            (None, None) => return Err(missing("--host HOST")),
        },
        state_dir: args.state_dir.clone(),
        root: args.root.clone(),
        ttl,
        secrets: args.secrets.clone(),
        tls: match (&args.tls_ca, &args.tls_cert, &args.tls_key) {
            (None, None, None) => None,
            (Some(ca), None, None) => Some(StoreTls {
                ca: ca.clone(),
                client: None,
            }),
            (Some(ca), Some(cert), Some(key)) => Some(StoreTls {
                ca: ca.clone(),
                client: Some((cert.clone(), key.clone())),
            }),
            _ => {
                return Err(Error::Usage {
                    reason: "--tls-cert and --tls-key go together, with --tls-ca".into(),
                    help: "as the platform's `tls ca=… cert=… key=…`".into(),
                })
            }
        },
        auth: args.user.clone().map(|user| StoreAuth {
            user,
            password_env: args.password_env.clone(),
        }),
    };
    if args.print_unit {
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| p.to_str().map(str::to_string))
            .unwrap_or_else(|| "/usr/local/bin/deploy".into());
        out!("{}", agent::unit(&binary, &request));
        return Ok(code::OK);
    }
    match args.simulate {
        Some(0) => {
            return Err(Error::Usage {
                reason: "--simulate 0: no agent to run".into(),
                help: "--simulate N runs agents for the first N hosts published".into(),
            })
        }
        Some(n) => agent::simulate(&request, n, super::say())?,
        None => agent::run(&request, super::say())?,
    }
    Ok(code::OK)
}
