//! `deploy agent --print-unit`: a systemd unit that runs the agent with the arguments given.

use super::Request;

/// The unit's text. Each argument is quoted as systemd's `ExecStart=` reads it (double quotes,
/// `\` and `"` escaped, `%` doubled, `$` doubled): no value is taken as a specifier or a
/// variable.
pub fn unit(binary: &str, request: &Request) -> String {
    let ttl = format!("{}s", request.ttl.as_secs().max(1));
    let args = [
        binary.to_string(),
        "agent".into(),
        "--store".into(),
        request.endpoints.join(","),
        "--prefix".into(),
        request.prefix.clone(),
        "--site".into(),
        request.site.clone(),
        "--host".into(),
        request.host.clone(),
        "--state-dir".into(),
        request.state_dir.display().to_string(),
        "--root".into(),
        request.root.display().to_string(),
        "--ttl".into(),
        ttl,
    ];
    let mut args = args.to_vec();
    if let Some(dir) = &request.secrets {
        args.extend(["--secrets".to_string(), dir.display().to_string()]);
    }
    if let Some(tls) = &request.tls {
        args.extend(["--tls-ca".to_string(), tls.ca.display().to_string()]);
        if let Some((cert, key)) = &tls.client {
            args.extend(["--tls-cert".to_string(), cert.display().to_string()]);
            args.extend(["--tls-key".to_string(), key.display().to_string()]);
        }
    }
    if let Some(auth) = &request.auth {
        args.extend(["--user".to_string(), auth.user.clone()]);
        args.extend(["--password-env".to_string(), auth.password_env.clone()]);
    }
    let exec: Vec<String> = args.iter().map(|a| quoted(a)).collect();
    format!(
        "[Unit]\n\
         Description=Drover pull agent for site {site} on {host}\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         ExecStart={exec}\n\
         Restart=always\n\
         RestartSec=5\n\
         # SIGTERM: no new step starts; a running one is stopped and recorded.\n\
         KillMode=mixed\n\
         TimeoutStopSec=120\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        site = plain(&request.site),
        host = plain(&request.host),
        exec = exec.join(" ")
    )
}

/// `text` as one argument of `ExecStart=`.
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` for a `Description=` line: one line, `%` doubled.
fn plain(text: &str) -> String {
    text.replace('%', "%%").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_unit_quotes_every_argument() {
        let r = Request {
            endpoints: vec!["http://10.0.0.1:2379".into()],
            prefix: "/drover".into(),
            site: "web%shop".into(),
            host: "app$1 \"x\"".into(),
            state_dir: "/var/lib/drover/agent".into(),
            root: "/".into(),
            ttl: Duration::from_secs(10),
            secrets: None,
            tls: None,
            auth: None,
        };
        let text = unit("/usr/bin/deploy", &r);
        assert!(
            text.contains("ExecStart=\"/usr/bin/deploy\" \"agent\""),
            "{text}"
        );
        assert!(text.contains("\"web%%shop\""), "{text}");
        assert!(text.contains("\"app$$1 \\\"x\\\"\""), "{text}");
        assert!(text.contains("\"--ttl\" \"10s\""), "{text}");
    }
}
