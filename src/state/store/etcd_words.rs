//! etcd-client's errors in words a person reads: what happened at one endpoint (connection
//! refused, no answer, user name or password refused, a certificate not trusted, …), never
//! tonic's or the OS's debug text (`tonic::transport::Error(Transport, ConnectError(… Os {`).

use std::error::Error as StdError;
use std::io::ErrorKind;

/// What `e` says happened, in a few words.
pub fn said(e: &etcd_client::Error) -> String {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(s) => status(s),
        E::TransportError(t) => underneath(t).unwrap_or_else(|| "the connection failed".into()),
        E::IoError(io) => io_words(io),
        E::LeaseKeepAliveError(m) => format!("the lease's keep-alive failed: {m}"),
        E::WatchError(m) => format!("the stream closed: {m}"),
        E::InvalidUri(u) => format!("not a valid URL: {u}"),
        E::InvalidArgs(m) | E::EndpointError(m) | E::Internal(m) | E::ElectError(m) => m.clone(),
        other => other.to_string(),
    }
}

/// A gRPC status: the cause under it when the request never reached etcd (a refused
/// connection, a timeout), else etcd's own reason.
fn status(s: &tonic::Status) -> String {
    use tonic::Code;
    let message = s.message().trim_start_matches("etcdserver: ");
    match s.code() {
        // etcd 3.4 refuses a password with InvalidArgument.
        _ if message.contains("authentication failed") => {
            format!("the user name or password was refused ({message})")
        }
        Code::Unauthenticated if message.contains("token") => {
            format!("etcd refused the auth token ({message})")
        }
        Code::Unauthenticated => format!("the user name or password was refused ({message})"),
        Code::PermissionDenied => format!("permission denied ({message})"),
        Code::DeadlineExceeded => "no answer before the request's deadline".into(),
        Code::Unavailable | Code::Unknown | Code::Cancelled => match underneath(s) {
            Some(cause) => cause,
            None if message.eq_ignore_ascii_case("timeout expired") => "no answer in time".into(),
            None if message.is_empty() => "unavailable".into(),
            None => format!("unavailable: {message}"),
        },
        code => format!("{}: {message}", code.description()),
    }
}

/// What the errors under `e` say, most precise first: an I/O error in words, a timeout, a TLS
/// refusal; `None` if nothing under it says more.
fn underneath(e: &(dyn StdError + 'static)) -> Option<String> {
    let mut chain = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        chain.push(cause);
        next = cause.source();
    }
    if let Some(io) = chain
        .iter()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
    {
        // rustls reports a refused certificate as an I/O error around its own.
        if io.kind() != ErrorKind::InvalidData && io.kind() != ErrorKind::Other {
            return Some(io_words(io));
        }
    }
    let leaf = chain.last()?.to_string();
    let lower = leaf.to_ascii_lowercase();
    if lower.contains("timeout expired") || lower.contains("timed out") {
        return Some("no answer in time".into());
    }
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        return Some(format!("TLS failed: {leaf}"));
    }
    Some(leaf)
}

/// An I/O error as a few words, without its OS error number.
fn io_words(io: &std::io::Error) -> String {
    match io.kind() {
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::TimedOut => "the connection timed out".into(),
        ErrorKind::ConnectionReset => "the connection was reset".into(),
        ErrorKind::ConnectionAborted => "the connection was aborted".into(),
        ErrorKind::NotConnected | ErrorKind::BrokenPipe => "the connection was closed".into(),
        ErrorKind::HostUnreachable => "host unreachable".into(),
        ErrorKind::NetworkUnreachable => "network unreachable".into(),
        ErrorKind::AddrNotAvailable => "address not available".into(),
        _ => {
            let text = io.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_said_in_words() {
        let io = std::io::Error::from(ErrorKind::ConnectionRefused);
        let status = tonic::Status::from_error(Box::new(io));
        let e = etcd_client::Error::GRpcStatus(status);
        assert_eq!(said(&e), "connection refused");
    }

    #[test]
    fn etcd_refusing_the_password_says_so_without_its_prefix() {
        let s = tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert_eq!(
            said(&etcd_client::Error::GRpcStatus(s)),
            "the user name or password was refused (authentication failed, invalid user ID or \
             password)"
        );
    }
}
