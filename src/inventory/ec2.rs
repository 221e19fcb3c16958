//! The `ec2` backend: running EC2 instances, per class by tags.
//!
//! Credentials, region and endpoint come from AWS's own configuration chain (`aws-config`:
//! environment, shared config and credentials files with `profile=`, SSO, web identity,
//! container and instance metadata), and every request is signed by AWS's own `aws-sigv4`.
//! The one call made, `DescribeInstances` of the EC2 Query API (version 2016-11-15), is a
//! form-encoded POST sent here over hyper, its XML answer read with roxmltree. Why not
//! `aws-sdk-ec2`, and every rule below, in the book: `book/src/inventory-ec2.md`.
//!
//! Per class, one paginated query: `instance-state-name=running` and each of the class's
//! tags as a `tag:KEY` filter (exact values: `*`, `?` and `\` are escaped). What comes back
//! is checked again here (state and tags), so an endpoint that ignored a filter cannot put a
//! host into a class it does not belong to.

use super::{Host, Inventory, InventoryError};
use crate::site::{AddressField, Class, ClassId, Ec2Spec, IdVec, InventorySpec, Site};
use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The EC2 Query API version the request and answer follow.
const API_VERSION: &str = "2016-11-15";
/// Error codes that mean "slow down": retried with backoff, like any 5xx answer.
const THROTTLED: [&str; 6] = [
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
];
/// Error codes that mean the credentials are not accepted, or not allowed to list instances.
const DENIED: [&str; 12] = [
    "AuthFailure",
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "Blocked",
    "OptInRequired",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "ExpiredToken",
    "RequestExpired",
    "MissingAuthenticationToken",
];
/// More instances than this in one error message are summed up as "and N more".
const LISTED: usize = 10;

/// The backend and its limits; [`Ec2::default`] is what `deploy` uses.
#[derive(Debug, Clone)]
pub struct Ec2 {
    /// `MaxResults` of each DescribeInstances page (AWS takes 5 to 1000).
    pub page_size: u32,
    /// Give up on connecting to the endpoint after this long.
    pub connect_timeout: Duration,
    /// Give up on one request (connect, send, the whole answer) after this long; retried.
    pub request_timeout: Duration,
    /// Give up on the whole listing (credentials, every class, page and retry) after this long.
    pub deadline: Duration,
    /// Tries per request when AWS throttles, answers 5xx, or the answer does not come.
    pub attempts: u32,
    /// Wait before the first retry; doubles with each retry up to `backoff_cap`. Each wait is
    /// jittered between half of that and all of it.
    pub backoff: Duration,
    pub backoff_cap: Duration,
}

impl Default for Ec2 {
    fn default() -> Self {
        Ec2 {
            page_size: 100,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
            attempts: 8,
            backoff: Duration::from_millis(200),
            backoff_cap: Duration::from_secs(10),
        }
    }
}

impl Inventory for Ec2 {
    fn hosts(&self, site: &Site) -> Result<Vec<Host>, InventoryError> {
        let InventorySpec::Ec2(spec) = &site.platform.inventory else {
            return Ok(Vec::new());
        };
        let run = || -> Result<Vec<Found>, InventoryError> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| InventoryError::Backend {
                    reason: format!("cannot start the async runtime: {e}"),
                })?;
            runtime.block_on(self.list(spec))
        };
        // Inside a runtime already (a library caller), `block_on` would panic: use a thread.
        let found = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| s.spawn(run).join()).unwrap_or_else(|_| {
                Err(InventoryError::Backend {
                    reason: "the ec2 inventory's thread panicked".into(),
                })
            })?
        } else {
            run()?
        };
        hosts_of(found, spec.address, &site.classes)
    }
}

/// A running instance as DescribeInstances gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    pub state: String,
    pub zone: Option<String>,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    pub ipv6: Option<String>,
    pub private_dns: Option<String>,
    pub public_dns: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    /// The chosen address field, if the instance has it.
    pub fn address(&self, field: AddressField) -> Option<&str> {
        match field {
            AddressField::PrivateIp => self.private_ip.as_deref(),
            AddressField::PublicIp => self.public_ip.as_deref(),
            AddressField::Ipv6 => self.ipv6.as_deref(),
            AddressField::PrivateDns => self.private_dns.as_deref(),
            AddressField::PublicDns => self.public_dns.as_deref(),
        }
    }
}

/// An instance and the classes whose tags it carries, in class order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub instance: Instance,
    pub classes: Vec<ClassId>,
}

/// One page of a DescribeInstances answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub instances: Vec<Instance>,
    pub next_token: Option<String>,
}

impl Ec2 {
    /// Every running instance of every class; an instance in several classes is listed once.
    async fn list(&self, spec: &Ec2Spec) -> Result<Vec<Found>, InventoryError> {
        let deadline = Instant::now() + self.deadline;
        let api = match tokio::time::timeout(self.deadline, self.connect(spec)).await {
            Ok(api) => api?,
            Err(_) => {
                return Err(InventoryError::NoCredentials {
                    reason: format!(
                        "the AWS configuration and credentials did not load within {}",
                        humantime::format_duration(self.deadline)
                    ),
                })
            }
        };
        self.list_on(&api, spec, deadline).await
    }

    /// [`Ec2::list`] once the endpoint and credentials are known.
    async fn list_on(
        &self,
        api: &Api,
        spec: &Ec2Spec,
        deadline: Instant,
    ) -> Result<Vec<Found>, InventoryError> {
        let mut found: BTreeMap<String, Found> = BTreeMap::new();
        for (class, tags) in &spec.classes {
            if tags.is_empty() {
                continue;
            }
            let mut token: Option<String> = None;
            loop {
                let form = describe_form(tags, self.page_size, token.as_deref());
                let xml = self.call(api, &form, deadline).await?;
                let page = parse_page(&xml).map_err(|reason| InventoryError::Api {
                    reason: format!(
                        "unreadable DescribeInstances answer from {}: {reason}",
                        api.endpoint
                    ),
                })?;
                for instance in page.instances {
                    if instance.state != "running" || !carries(&instance.tags, tags) {
                        continue;
                    }
                    let entry = found.entry(instance.id.clone()).or_insert_with(|| Found {
                        instance,
                        classes: Vec::new(),
                    });
                    if !entry.classes.contains(class) {
                        entry.classes.push(*class);
                    }
                }
                match page.next_token {
                    Some(next) if token.as_deref() == Some(next.as_str()) => {
                        return Err(InventoryError::Api {
                            reason: format!(
                                "{} answered the same NextToken twice; stopping rather than looping",
                                api.endpoint
                            ),
                        })
                    }
                    Some(next) => token = Some(next),
                    None => break,
                }
            }
        }
        let mut found: Vec<Found> = found.into_values().collect();
        for f in &mut found {
            f.classes.sort_unstable();
        }
        Ok(found)
    }

    /// Region, endpoint and credentials from the spec and AWS's configuration chain.
    async fn connect(&self, spec: &Ec2Spec) -> Result<Api, InventoryError> {
        let version = aws_config::BehaviorVersion::latest();
        // For the credential providers that call AWS themselves (SSO, STS, instance metadata).
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(version).http_client(http.clone());
        if let Some(profile) = &spec.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &spec.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        let config = loader.load().await;
        // `profile=` names the credentials to use: the profile's own, not whatever the
        // environment holds (the default chain would take AWS_ACCESS_KEY_ID first).
        let provider = match &spec.profile {
            Some(profile) => aws_credential_types::provider::SharedCredentialsProvider::new(
                aws_config::profile::ProfileFileCredentialsProvider::builder()
                    .profile_name(profile)
                    .configure(
                        &aws_config::provider_config::ProviderConfig::default()
                            .with_http_client(http)
                            .with_region(config.region().cloned())
                            .with_behavior_version(Some(version)),
                    )
                    .build(),
            ),
            None => config
                .credentials_provider()
                .ok_or_else(|| InventoryError::NoCredentials {
                    reason: "the AWS configuration has no credentials provider".into(),
                })?,
        };
        let credentials =
            provider
                .provide_credentials()
                .await
                .map_err(|e| InventoryError::NoCredentials {
                    reason: match &spec.profile {
                        Some(p) => format!(
                            "profile `{p}` (profile= of the ec2 inventory, read from \
                             ~/.aws/config and ~/.aws/credentials): {}",
                            error_chain(&e)
                        ),
                        None => error_chain(&e),
                    },
                })?;
        let Some(region) = config.region().map(|r| r.to_string()) else {
            return Err(InventoryError::Backend {
                reason: "no AWS region: set region=\"…\" on the ec2 inventory, or AWS_REGION, \
                         or `region` in the AWS profile"
                    .into(),
            });
        };
        let configured = config
            .service_config()
            .and_then(|c| {
                c.load_config(
                    aws_types::service_config::ServiceConfigKey::builder()
                        .service_id("EC2")
                        .env("AWS_ENDPOINT_URL")
                        .profile("endpoint_url")
                        .build()
                        .ok()?,
                )
            })
            .or_else(|| config.endpoint_url().map(str::to_string));
        let endpoint = spec
            .endpoint
            .clone()
            .or(configured)
            .unwrap_or_else(|| default_endpoint(&region));
        Api::new(endpoint, region, credentials, self.connect_timeout)
    }

    /// Sends one request, retrying throttling, 5xx answers and lost answers with backoff and
    /// jitter, within `attempts` tries and before `deadline`.
    async fn call(
        &self,
        api: &Api,
        form: &str,
        deadline: Instant,
    ) -> Result<String, InventoryError> {
        let first = Instant::now();
        let mut tries = 0;
        // The last answer AWS gave, for when the deadline cuts the last try short: that answer
        // says more than "no answer within 2ms".
        let mut answered: Option<String> = None;
        loop {
            tries += 1;
            let limit = self
                .request_timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            let failure = match tokio::time::timeout(limit, api.send(form)).await {
                Ok(Ok(xml)) => return Ok(xml),
                Ok(Err(Failure::Fatal(e))) => return Err(e),
                Ok(Err(Failure::Throttled(what))) => {
                    answered = Some(what.clone());
                    Failure::Throttled(what)
                }
                Ok(Err(f)) => f,
                Err(_) if limit < self.request_timeout && answered.is_some() => {
                    Failure::Throttled(answered.clone().unwrap_or_default())
                }
                Err(_) => Failure::Lost(format!(
                    "no answer within {}",
                    humantime::format_duration(limit)
                )),
            };
            let delay = backoff(self.backoff, self.backoff_cap, tries, jitter());
            if tries < self.attempts && Instant::now() + delay < deadline {
                tokio::time::sleep(delay).await;
                continue;
            }
            let after = format!(
                "gave up after {tries} {} over {}",
                if tries == 1 { "try" } else { "tries" },
                humantime::format_duration(Duration::from_millis(
                    first.elapsed().as_millis() as u64
                ))
            );
            return Err(match failure {
                Failure::Throttled(what) => InventoryError::Api {
                    reason: format!("{what} ({after})"),
                },
                Failure::Lost(what) => InventoryError::Unreachable {
                    endpoint: api.endpoint.clone(),
                    reason: format!("{what} ({after})"),
                },
                Failure::Fatal(e) => e,
            });
        }
    }
}

/// Why one try failed.
enum Failure {
    /// AWS asked to slow down, or failed on its side (5xx): retried.
    Throttled(String),
    /// The connection broke or the answer did not come: retried.
    Lost(String),
    /// Retrying cannot help.
    Fatal(InventoryError),
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Where requests go, and what signs them.
struct Api {
    /// As configured, for messages.
    endpoint: String,
    uri: http::Uri,
    host: String,
    region: String,
    credentials: Credentials,
    client: Client,
}

impl Api {
    fn new(
        endpoint: String,
        region: String,
        credentials: Credentials,
        connect_timeout: Duration,
    ) -> Result<Api, InventoryError> {
        let bad = |why: &str| InventoryError::Backend {
            reason: format!("the EC2 endpoint `{endpoint}` {why}"),
        };
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| bad(&format!("is not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("must start with https:// or http://")),
        };
        let host = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .ok_or_else(|| bad("has no host"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let tls = match builder.with_provider_and_native_roots(provider.clone()) {
            Ok(b) => b,
            Err(e) if https => {
                return Err(InventoryError::Backend {
                    reason: format!(
                        "cannot load this system's CA certificates to check {endpoint}: {e} \
                         (install the ca-certificates package)"
                    ),
                })
            }
            // Plain http needs no roots.
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| bad(&format!("cannot set up TLS: {e}")))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
        };
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let connector = tls.https_or_http().enable_http1().wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        Ok(Api {
            endpoint,
            uri,
            host,
            region,
            credentials,
            client,
        })
    }

    /// One signed POST; the answer's body when AWS says 200.
    async fn send(&self, form: &str) -> Result<String, Failure> {
        const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
        let uri = self.uri.to_string();
        let identity = self.credentials.clone().into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("ec2")
            .time(SystemTime::now())
            .settings(aws_sigv4::http_request::SigningSettings::default())
            .build()
            .map_err(|e| fatal_backend(format!("cannot sign the request: {e}")))?
            .into();
        let signable = aws_sigv4::http_request::SignableRequest::new(
            "POST",
            uri.as_str(),
            [("host", self.host.as_str()), ("content-type", CONTENT_TYPE)].into_iter(),
            aws_sigv4::http_request::SignableBody::Bytes(form.as_bytes()),
        )
        .map_err(|e| fatal_backend(format!("cannot sign the request: {e}")))?;
        let (instructions, _) = aws_sigv4::http_request::sign(signable, &params)
            .map_err(|e| fatal_backend(format!("cannot sign the request: {e}")))?
            .into_parts();
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.uri.clone())
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
            .header(
                http::header::USER_AGENT,
                concat!("drover/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(form.to_string())))
            .map_err(|e| fatal_backend(format!("cannot build the request: {e}")))?;
        instructions.apply_to_request_http1x(&mut request);
        let response = self.client.request(request).await.map_err(|e| {
            if e.is_connect() {
                Failure::Fatal(InventoryError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    reason: error_chain(&e),
                })
            } else {
                Failure::Lost(error_chain(&e))
            }
        })?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Failure::Lost(format!("the answer broke off: {}", error_chain(&e))))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        if status == 200 {
            return Ok(text);
        }
        Err(classify(status, &text, &self.endpoint))
    }
}

fn fatal_backend(reason: String) -> Failure {
    Failure::Fatal(InventoryError::Api { reason })
}

/// What a non-200 answer means: retry, denied, or an API error with AWS's own words.
fn classify(status: u16, body: &str, endpoint: &str) -> Failure {
    let error = parse_error(body);
    let what = match &error {
        Some((code, message)) if message.is_empty() => format!("{code} (HTTP {status})"),
        Some((code, message)) => format!("{code}: {message}"),
        None => {
            let snippet: String = body.trim().chars().take(200).collect();
            if snippet.is_empty() {
                format!("HTTP {status} from {endpoint}")
            } else {
                format!("HTTP {status} from {endpoint}: {snippet}")
            }
        }
    };
    let code = error.as_ref().map(|(c, _)| c.as_str()).unwrap_or("");
    if THROTTLED.contains(&code) || status == 429 || status >= 500 {
        Failure::Throttled(what)
    } else if DENIED.contains(&code) || (code.is_empty() && status == 403) {
        Failure::Fatal(InventoryError::AccessDenied { reason: what })
    } else {
        Failure::Fatal(InventoryError::Api { reason: what })
    }
}

/// Whether `tags` holds every (key, value) of `wanted`.
fn carries(tags: &BTreeMap<String, String>, wanted: &[(String, String)]) -> bool {
    wanted.iter().all(|(k, v)| tags.get(k) == Some(v))
}

/// Instances → hosts: names, addresses, tags. An instance without the chosen address field
/// is an error that names it, never silently left out.
pub fn hosts_of(
    found: Vec<Found>,
    field: AddressField,
    classes: &IdVec<ClassId, Class>,
) -> Result<Vec<Host>, InventoryError> {
    let ids: HashSet<&str> = found.iter().map(|f| f.instance.id.as_str()).collect();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for f in &found {
        if let Some(name) = f.instance.tags.get("Name").filter(|n| plain_name(n)) {
            *names.entry(name.as_str()).or_default() += 1;
        }
    }
    let host_names: Vec<String> = found
        .iter()
        .map(|f| match f.instance.tags.get("Name") {
            Some(n) if names.get(n.as_str()) == Some(&1) && !ids.contains(n.as_str()) => n.clone(),
            _ => f.instance.id.clone(),
        })
        .collect();
    let missing: Vec<String> = found
        .iter()
        .zip(&host_names)
        .filter(|(f, _)| f.instance.address(field).is_none())
        .map(|(f, name)| {
            let class_names: Vec<&str> = f
                .classes
                .iter()
                .filter_map(|&c| classes.get(c).map(|c| c.name.as_str()))
                .collect();
            let named = if *name == f.instance.id {
                String::new()
            } else {
                format!(" ({name})")
            };
            format!(
                "{}{named} of class {}",
                f.instance.id,
                class_names.join(", ")
            )
        })
        .collect();
    if !missing.is_empty() {
        let field_name = AddressField::NAMES
            .iter()
            .find(|(_, f)| *f == field)
            .map_or("?", |(n, _)| n);
        let mut list = missing[..missing.len().min(LISTED)].join("; ");
        if missing.len() > LISTED {
            let _ = write!(list, "; and {} more", missing.len() - LISTED);
        }
        return Err(InventoryError::Backend {
            reason: format!(
                "{} running instance{} {} no {} address (address=\"{field_name}\"): {list}. \
                 Choose another address= field, or tag {} out of {} class",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" },
                if missing.len() == 1 { "has" } else { "have" },
                describe_field(field),
                if missing.len() == 1 { "it" } else { "them" },
                if missing.len() == 1 { "its" } else { "their" },
            ),
        });
    }
    Ok(found
        .into_iter()
        .zip(host_names)
        .map(|(f, name)| {
            let i = f.instance;
            let address = i.address(field).unwrap_or_default().into();
            let mut tags = i.tags;
            tags.insert("instance-id".into(), i.id);
            if let Some(zone) = i.zone {
                tags.insert("zone".into(), zone);
            }
            Host {
                name: name.into(),
                address,
                classes: f.classes,
                tags,
            }
        })
        .collect())
}

fn describe_field(field: AddressField) -> &'static str {
    match field {
        AddressField::PrivateIp => "private IPv4",
        AddressField::PublicIp => "public IPv4",
        AddressField::Ipv6 => "IPv6",
        AddressField::PrivateDns => "private DNS",
        AddressField::PublicDns => "public DNS",
    }
}

/// Whether a `Name` tag can serve as a host name: letters, digits, `.`, `-`, `_`, starting
/// with a letter or digit, at most 255 characters (it names a directory with the local
/// transport, and is an ssh alias and a selector value).
pub fn plain_name(name: &str) -> bool {
    name.len() <= 255
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// `https://ec2.REGION.amazonaws.com` (`.com.cn` in China).
pub fn default_endpoint(region: &str) -> String {
    if region.starts_with("cn-") {
        format!("https://ec2.{region}.amazonaws.com.cn")
    } else {
        format!("https://ec2.{region}.amazonaws.com")
    }
}

/// The form body of one DescribeInstances page: running instances carrying every tag.
pub fn describe_form(tags: &[(String, String)], page_size: u32, token: Option<&str>) -> String {
    let mut params: Vec<(String, String)> = vec![
        ("Action".into(), "DescribeInstances".into()),
        ("Version".into(), API_VERSION.into()),
        ("MaxResults".into(), page_size.to_string()),
        ("Filter.1.Name".into(), "instance-state-name".into()),
        ("Filter.1.Value.1".into(), "running".into()),
    ];
    for (n, (key, value)) in tags.iter().enumerate() {
        params.push((format!("Filter.{}.Name", n + 2), format!("tag:{key}")));
        params.push((format!("Filter.{}.Value.1", n + 2), filter_value(value)));
    }
    if let Some(token) = token {
        params.push(("NextToken".into(), token.into()));
    }
    params
        .iter()
        .map(|(k, v)| format!("{}={}", percent(k), percent(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A filter value that matches only itself: EC2 reads `*` and `?` as wildcards, `\` escapes.
pub fn filter_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '*' | '?' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// RFC 3986 percent-encoding: everything but letters, digits and `-_.~`.
fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The direct child element of `node` named `name`.
fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

/// The trimmed text of the direct child `name`, if not empty.
fn text(node: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    child(node, name)
        .and_then(|c| c.text())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

/// The `item` children of the direct child `name`.
fn items<'a, 'i>(
    node: roxmltree::Node<'a, 'i>,
    name: &str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    child(node, name)
        .into_iter()
        .flat_map(|set| set.children())
        .filter(|c| c.is_element() && c.tag_name().name() == "item")
}

/// Reads one DescribeInstances answer.
pub fn parse_page(xml: &str) -> Result<Page, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    if root.tag_name().name() != "DescribeInstancesResponse" {
        return Err(format!(
            "expected <DescribeInstancesResponse>, got <{}>",
            root.tag_name().name()
        ));
    }
    let mut instances = Vec::new();
    for reservation in items(root, "reservationSet") {
        for item in items(reservation, "instancesSet") {
            instances.push(parse_instance(item)?);
        }
    }
    Ok(Page {
        instances,
        next_token: text(root, "nextToken"),
    })
}

fn parse_instance(item: roxmltree::Node<'_, '_>) -> Result<Instance, String> {
    let id = text(item, "instanceId").ok_or("an instance without <instanceId>")?;
    let state = child(item, "instanceState")
        .and_then(|s| text(s, "name"))
        .unwrap_or_default();
    let tags = items(item, "tagSet")
        .filter_map(|t| {
            let key = child(t, "key")?.text()?.to_string();
            let value = child(t, "value")
                .and_then(|v| v.text())
                .unwrap_or_default()
                .to_string();
            Some((key, value))
        })
        .collect();
    // The primary IPv6 address, else the first of the primary interface (device 0), else
    // the first of any interface.
    let ipv6 = text(item, "ipv6Address").or_else(|| {
        let mut nics: Vec<_> = items(item, "networkInterfaceSet").collect();
        nics.sort_by_key(|n| {
            child(*n, "attachment")
                .and_then(|a| text(a, "deviceIndex"))
                .and_then(|d| d.parse::<u32>().ok())
                .unwrap_or(u32::MAX)
        });
        nics.into_iter()
            .flat_map(|n| items(n, "ipv6AddressesSet").collect::<Vec<_>>())
            .find_map(|a| text(a, "ipv6Address"))
    });
    Ok(Instance {
        id,
        state,
        zone: child(item, "placement").and_then(|p| text(p, "availabilityZone")),
        private_ip: text(item, "privateIpAddress"),
        public_ip: text(item, "ipAddress"),
        ipv6,
        private_dns: text(item, "privateDnsName"),
        public_dns: text(item, "dnsName"),
        tags,
    })
}

/// The `Code` and `Message` of an AWS error answer (`<Response><Errors><Error>…`).
pub fn parse_error(xml: &str) -> Option<(String, String)> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let error = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "Error")?;
    let code = text(error, "Code")?;
    let message = text(error, "Message").unwrap_or_default();
    Some((code, message))
}

/// The wait before retry number `retry` (1 for the first): `base·2^(retry-1)`, at most `cap`,
/// then jittered to between half of that and all of it (`unit` in 0..1).
pub fn backoff(base: Duration, cap: Duration, retry: u32, unit: f64) -> Duration {
    let exp = base
        .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)))
        .min(cap);
    exp / 2 + exp.mul_f64(unit.clamp(0.0, 1.0) / 2.0)
}

/// A number in 0..1, different on each call (for jitter, not for secrets).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// An error and its sources, `: `-separated, each said once.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !out.contains(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r-1</requestId>
  <reservationSet>
    <item>
      <reservationId>r-0a</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-0001</instanceId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-10-0-0-1.ec2.internal</privateDnsName>
          <dnsName>ec2-54-0-0-1.compute-1.amazonaws.com</dnsName>
          <placement><availabilityZone>us-east-1a</availabilityZone></placement>
          <privateIpAddress>10.0.0.1</privateIpAddress>
          <ipAddress>54.0.0.1</ipAddress>
          <networkInterfaceSet>
            <item>
              <attachment><deviceIndex>1</deviceIndex></attachment>
              <privateIpAddress>10.9.9.9</privateIpAddress>
              <ipv6AddressesSet><item><ipv6Address>2001:db8::9</ipv6Address></item></ipv6AddressesSet>
            </item>
            <item>
              <attachment><deviceIndex>0</deviceIndex></attachment>
              <ipv6AddressesSet><item><ipv6Address>2001:db8::1</ipv6Address></item></ipv6AddressesSet>
            </item>
          </networkInterfaceSet>
          <tagSet>
            <item><key>Name</key><value>web-1</value></item>
            <item><key>role</key><value>app</value></item>
            <item><key>empty</key><value/></item>
          </tagSet>
        </item>
        <item>
          <instanceId>i-0002</instanceId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName/>
          <dnsName></dnsName>
          <placement><availabilityZone>us-east-1b</availabilityZone></placement>
          <privateIpAddress>10.0.0.2</privateIpAddress>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
  <nextToken>tok-2</nextToken>
</DescribeInstancesResponse>"#;

    #[test]
    fn reads_a_page() {
        let page = parse_page(PAGE).unwrap();
        assert_eq!(page.next_token.as_deref(), Some("tok-2"));
        assert_eq!(page.instances.len(), 2);
        let a = &page.instances[0];
        assert_eq!(a.id, "i-0001");
        assert_eq!(a.state, "running");
        assert_eq!(a.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(a.private_ip.as_deref(), Some("10.0.0.1"), "not the nic's");
        assert_eq!(a.public_ip.as_deref(), Some("54.0.0.1"));
        assert_eq!(a.ipv6.as_deref(), Some("2001:db8::1"), "device 0 first");
        assert_eq!(a.private_dns.as_deref(), Some("ip-10-0-0-1.ec2.internal"));
        assert_eq!(
            a.public_dns.as_deref(),
            Some("ec2-54-0-0-1.compute-1.amazonaws.com")
        );
        assert_eq!(a.tags["Name"], "web-1");
        assert_eq!(a.tags["empty"], "");
        let b = &page.instances[1];
        assert_eq!((b.public_ip.as_ref(), b.ipv6.as_ref()), (None, None));
        assert_eq!(
            (b.private_dns.as_ref(), b.public_dns.as_ref()),
            (None, None)
        );
        assert!(b.tags.is_empty());
    }

    #[test]
    fn last_page_has_no_token() {
        let xml = r#"<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>"#;
        assert_eq!(parse_page(xml).unwrap(), Page::default());
        assert!(parse_page("<Response/>").is_err());
        assert!(parse_page("not xml").is_err());
    }

    #[test]
    fn reads_errors_and_classifies_them() {
        let xml = |code: &str| {
            format!(
                "<Response><Errors><Error><Code>{code}</Code><Message>words</Message></Error></Errors><RequestID>x</RequestID></Response>"
            )
        };
        assert_eq!(
            parse_error(&xml("AuthFailure")),
            Some(("AuthFailure".into(), "words".into()))
        );
        let kind = |status, body: &str| match classify(status, body, "http://e") {
            Failure::Throttled(w) => format!("retry {w}"),
            Failure::Lost(w) => format!("lost {w}"),
            Failure::Fatal(InventoryError::AccessDenied { reason }) => format!("denied {reason}"),
            Failure::Fatal(InventoryError::Api { reason }) => format!("api {reason}"),
            Failure::Fatal(e) => format!("other {e}"),
        };
        assert_eq!(
            kind(503, &xml("RequestLimitExceeded")),
            "retry RequestLimitExceeded: words"
        );
        assert_eq!(kind(400, &xml("Throttling")), "retry Throttling: words");
        assert_eq!(
            kind(500, "<html/>"),
            "retry HTTP 500 from http://e: <html/>"
        );
        assert_eq!(kind(429, ""), "retry HTTP 429 from http://e");
        assert_eq!(kind(401, &xml("AuthFailure")), "denied AuthFailure: words");
        assert_eq!(
            kind(403, &xml("UnauthorizedOperation")),
            "denied UnauthorizedOperation: words"
        );
        assert_eq!(kind(403, "nope"), "denied HTTP 403 from http://e: nope");
        assert_eq!(
            kind(400, &xml("InvalidParameterValue")),
            "api InvalidParameterValue: words"
        );
        assert_eq!(kind(404, ""), "api HTTP 404 from http://e");
    }

    #[test]
    fn form_filters_running_instances_by_exact_tags() {
        let tags = vec![
            ("role".to_string(), "app".to_string()),
            ("env".to_string(), "a*b?c\\ d&e=f".to_string()),
        ];
        assert_eq!(
            describe_form(&tags, 100, Some("t/+=")),
            "Action=DescribeInstances&Version=2016-11-15&MaxResults=100\
             &Filter.1.Name=instance-state-name&Filter.1.Value.1=running\
             &Filter.2.Name=tag%3Arole&Filter.2.Value.1=app\
             &Filter.3.Name=tag%3Aenv&Filter.3.Value.1=a%5C%2Ab%5C%3Fc%5C%5C%20d%26e%3Df\
             &NextToken=t%2F%2B%3D"
        );
        assert_eq!(filter_value("x"), "x");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let (base, cap) = (Duration::from_millis(200), Duration::from_secs(10));
        assert_eq!(backoff(base, cap, 1, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(base, cap, 1, 1.0), Duration::from_millis(200));
        assert_eq!(backoff(base, cap, 3, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(base, cap, 3, 0.5), Duration::from_millis(600));
        assert_eq!(backoff(base, cap, 10, 1.0), cap);
        assert_eq!(backoff(base, cap, 200, 0.0), cap / 2);
        let j: Vec<f64> = (0..50).map(|_| jitter()).collect();
        assert!(j.iter().all(|x| (0.0..1.0).contains(x)));
        assert!(j.windows(2).any(|w| w[0] != w[1]), "jitter varies");
    }

    fn found(id: &str, name: Option<&str>, ip: Option<&str>, classes: &[usize]) -> Found {
        let mut tags = BTreeMap::from([("role".to_string(), "app".to_string())]);
        if let Some(n) = name {
            tags.insert("Name".into(), n.into());
        }
        Found {
            instance: Instance {
                id: id.into(),
                state: "running".into(),
                zone: Some("z1".into()),
                private_ip: ip.map(str::to_string),
                tags,
                ..Instance::default()
            },
            classes: crate::site::ids_of(classes),
        }
    }

    fn classes() -> IdVec<ClassId, Class> {
        ["app", "db"]
            .map(|n| Class {
                name: n.into(),
                services: Vec::new(),
            })
            .into_iter()
            .collect()
    }

    #[test]
    fn hosts_are_named_by_unique_plain_name_tags_else_ids() {
        let hosts = hosts_of(
            vec![
                found("i-1", Some("web-1"), Some("10.0.0.1"), &[0]),
                found("i-2", Some("twin"), Some("10.0.0.2"), &[0]),
                found("i-3", Some("twin"), Some("10.0.0.3"), &[0, 1]),
                found("i-4", Some("has space"), Some("10.0.0.4"), &[1]),
                found("i-5", None, Some("10.0.0.5"), &[1]),
                found("i-6", Some("i-5"), Some("10.0.0.6"), &[1]),
            ],
            AddressField::PrivateIp,
            &classes(),
        )
        .unwrap();
        let names: Vec<&str> = hosts.iter().map(|h| &*h.name).collect();
        assert_eq!(names, ["web-1", "i-2", "i-3", "i-4", "i-5", "i-6"]);
        assert_eq!(&*hosts[2].address, "10.0.0.3");
        assert_eq!(hosts[2].classes, crate::site::ids_of(&[0, 1]));
        let tags: Vec<(&str, &str)> = hosts[0]
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            tags,
            [
                ("Name", "web-1"),
                ("instance-id", "i-1"),
                ("role", "app"),
                ("zone", "z1")
            ]
        );
    }

    #[test]
    fn an_instance_without_the_address_field_is_an_error_naming_it() {
        let err = hosts_of(
            vec![
                found("i-1", Some("web-1"), None, &[0]),
                found("i-2", None, Some("10.0.0.2"), &[0]),
                found("i-3", None, None, &[0, 1]),
            ],
            AddressField::PrivateIp,
            &classes(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the inventory failed: 2 running instances have no private IPv4 address \
             (address=\"private-ip\"): i-1 (web-1) of class app; i-3 of class app, db. \
             Choose another address= field, or tag them out of their class"
        );
        let many: Vec<Found> = (0..12)
            .map(|n| found(&format!("i-{n:02}"), None, None, &[0]))
            .collect();
        let err = hosts_of(many, AddressField::PublicDns, &classes()).unwrap_err();
        assert!(
            err.to_string().contains("i-09 of class app; and 2 more."),
            "{err}"
        );
    }

    /// A loopback server answering the n-th request with `answers[n]` (the last one once
    /// they run out), or never when its status is 0; returns its URL and the request bodies.
    fn server(answers: Vec<(u16, String)>) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = bodies.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let mut reader = std::io::BufReader::new(stream);
                let mut length = 0;
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(String::from_utf8_lossy(&body).into_owned());
                    seen.len() - 1
                };
                let (status, text) = &answers[n.min(answers.len() - 1)];
                let mut stream = reader.into_inner();
                if *status == 0 {
                    held.push(stream);
                    continue;
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        (url, bodies)
    }

    fn api(url: &str) -> Api {
        Api::new(
            url.into(),
            "us-east-1".into(),
            Credentials::new("testing", "testing", None, None, "test"),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn pages_are_followed_to_the_end_and_classes_merged() {
        let instance = |id: &str, tags: &str| {
            format!(
                "<item><instanceId>{id}</instanceId><instanceState><name>running</name>\
                 </instanceState><privateIpAddress>10.0.0.1</privateIpAddress><tagSet>{tags}\
                 </tagSet></item>"
            )
        };
        let tag = |k: &str, v: &str| format!("<item><key>{k}</key><value>{v}</value></item>");
        let page = |instances: &[String], token: Option<&str>| {
            format!(
                "<DescribeInstancesResponse><reservationSet><item><instancesSet>{}\
                 </instancesSet></item></reservationSet>{}</DescribeInstancesResponse>",
                instances.concat(),
                token.map_or(String::new(), |t| format!("<nextToken>{t}</nextToken>"))
            )
        };
        let app = tag("role", "app");
        let both = format!("{app}{}", tag("edge", "yes"));
        let (url, bodies) = server(vec![
            (
                200,
                page(&[instance("i-1", &app), instance("i-2", &both)], Some("p2")),
            ),
            (200, page(&[instance("i-3", &app)], Some("p3"))),
            (200, page(&[], None)),
            (
                200,
                page(&[instance("i-2", &both), instance("i-4", &app)], None),
            ),
        ]);
        let spec = Ec2Spec {
            region: None,
            endpoint: None,
            profile: None,
            address: AddressField::PrivateIp,
            classes: vec![
                (ClassId::new(0), vec![("role".into(), "app".into())]),
                (ClassId::new(1), vec![("edge".into(), "yes".into())]),
            ],
        };
        let ec2 = Ec2 {
            page_size: 2,
            ..Ec2::default()
        };
        let deadline = Instant::now() + ec2.deadline;
        let found = runtime()
            .block_on(ec2.list_on(&api(&url), &spec, deadline))
            .unwrap();
        let got: Vec<(&str, &[ClassId])> = found
            .iter()
            .map(|f| (f.instance.id.as_str(), f.classes.as_slice()))
            .collect();
        // i-4 came back for class 1 without its tag: not trusted, left out.
        let ids = crate::site::ids_of::<ClassId>;
        assert_eq!(
            got,
            [
                ("i-1", &ids(&[0])[..]),
                ("i-2", &ids(&[0, 1])[..]),
                ("i-3", &ids(&[0])[..])
            ]
        );
        let bodies = bodies.lock().unwrap();
        assert_eq!(bodies.len(), 4);
        assert!(bodies[0].contains("&MaxResults=2&") && !bodies[0].contains("NextToken"));
        assert!(bodies[1].ends_with("&NextToken=p2"), "{}", bodies[1]);
        assert!(bodies[2].ends_with("&NextToken=p3"), "{}", bodies[2]);
        assert!(bodies[3].contains("tag%3Aedge") && !bodies[3].contains("NextToken"));
    }

    fn call(ec2: &Ec2, url: &str) -> (Result<String, InventoryError>, Duration) {
        let start = Instant::now();
        let got = runtime().block_on(ec2.call(
            &api(url),
            "Action=DescribeInstances",
            start + ec2.deadline,
        ));
        (got, start.elapsed())
    }

    const THROTTLE: &str = "<Response><Errors><Error><Code>RequestLimitExceeded</Code>\
        <Message>Request limit exceeded.</Message></Error></Errors></Response>";

    #[test]
    fn throttling_is_retried_a_bounded_number_of_times() {
        let (url, requests) = server(vec![(503, THROTTLE.into())]);
        let ec2 = Ec2 {
            attempts: 4,
            backoff: Duration::from_millis(1),
            backoff_cap: Duration::from_millis(4),
            ..Ec2::default()
        };
        let (got, _) = call(&ec2, &url);
        let err = got.unwrap_err();
        assert!(matches!(err, InventoryError::Api { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with(
                "the EC2 API failed: RequestLimitExceeded: Request limit exceeded. \
                 (gave up after 4 tries over "
            ),
            "{text}"
        );
        assert_eq!(requests.lock().unwrap().len(), 4);
    }

    #[test]
    fn retries_stop_at_the_deadline() {
        let (url, _) = server(vec![(503, THROTTLE.into())]);
        let ec2 = Ec2 {
            attempts: 1000,
            backoff: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(100),
            deadline: Duration::from_millis(400),
            ..Ec2::default()
        };
        let (got, took) = call(&ec2, &url);
        assert!(matches!(got, Err(InventoryError::Api { .. })), "{got:?}");
        // Without the deadline, 1000 tries 50–100 ms apart take over a minute. The margin over
        // 400 ms is for a loaded machine (this once flaked at 400 ms exactly under a build).
        assert!(
            took < Duration::from_secs(5),
            "gave up at the deadline: {took:?}"
        );
    }

    #[test]
    fn an_answer_that_never_comes_is_retried_then_unreachable() {
        let (url, requests) = server(vec![(0, String::new())]);
        let ec2 = Ec2 {
            attempts: 2,
            request_timeout: Duration::from_millis(200),
            backoff: Duration::from_millis(1),
            ..Ec2::default()
        };
        let (got, _) = call(&ec2, &url);
        match got {
            Err(InventoryError::Unreachable { endpoint, reason }) => {
                assert_eq!(endpoint, url);
                assert!(
                    reason.starts_with("no answer within 200ms (gave up after 2 tries over"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(requests.lock().unwrap().len(), 2);
    }

    #[test]
    fn endpoints_must_be_http_urls() {
        let api = |e: &str| {
            Api::new(
                e.into(),
                "us-east-1".into(),
                Credentials::new("a", "b", None, None, "test"),
                Duration::from_secs(1),
            )
            .err()
            .map(|e| e.to_string())
        };
        assert_eq!(
            api("127.0.0.1:5000").as_deref(),
            Some("the inventory failed: the EC2 endpoint `127.0.0.1:5000` must start with https:// or http://")
        );
        assert_eq!(api("https://ec2.eu-west-1.amazonaws.com"), None);
    }

    #[test]
    fn names_and_endpoints() {
        assert!(plain_name("web-1.prod_a"));
        assert!(!plain_name(""));
        assert!(!plain_name("web server"));
        assert!(!plain_name("../etc"));
        assert!(!plain_name("-x"));
        assert!(!plain_name(&"a".repeat(256)));
        assert_eq!(
            default_endpoint("eu-west-1"),
            "https://ec2.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            default_endpoint("cn-north-1"),
            "https://ec2.cn-north-1.amazonaws.com.cn"
        );
    }
}
