//! Shell quoting: every value sent to a host is one single-quoted word, never code.

/// `s` as one POSIX shell word: `'…'`, with each `'` written as `'\''`.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `env 'K=v' … /bin/sh -c '<command>'`: runs `command` with these variables set.
pub fn env_prefix(vars: &[(String, String)], command: &str) -> String {
    let mut out = String::from("env");
    for (k, v) in vars {
        out.push(' ');
        out.push_str(&quote(&format!("{k}={v}")));
    }
    out.push_str(" /bin/sh -c ");
    out.push_str(&quote(command));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sh(script: &str) -> String {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .output()
            .expect("sh runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn quotes_are_inert() {
        assert_eq!(quote("a'b"), "'a'\\''b'");
        assert_eq!(
            sh(&format!("printf %s {}", quote("$(echo pwned)`id`'\"\n"))),
            "$(echo pwned)`id`'\"\n"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_value_reaches_the_hook_unchanged(value in "[^\u{0}]{0,40}") {
            let script = env_prefix(&[("DEPLOY_X".into(), value.clone())], "printf %s \"$DEPLOY_X\"");
            prop_assert_eq!(sh(&script), value);
        }
    }
}
