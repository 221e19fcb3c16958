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

/// What a session of its own is given, for `script`: `exec /bin/sh -c '<script>'`. sshd hands a
/// session's command to the user's login shell, which may not read `script` as `/bin/sh` does:
/// `zsh` stops a command at a glob that matches nothing (`rm -f dir/1-*.stop` never ran the
/// `rm`, and a lock was left behind) and does not split `$x`. Every login shell the book names
/// reads this one line alike, and `exec` keeps the session's process (its group id is still the
/// script's `$$`).
pub fn in_sh(script: &str) -> String {
    format!("exec /bin/sh -c {}", quote(script))
}

/// `K='v' … /bin/sh -c '<command>'`: runs `command` with these variables set (and exported
/// to it alone), without a process of its own for setting them. A name that is not a shell
/// name (letters, digits, `_`, not starting with a digit) cannot be an assignment: then the
/// variables go through `env 'K=v' …` instead.
pub fn env_prefix(vars: &[(String, String)], command: &str) -> String {
    let assignable = vars.iter().all(|(k, _)| is_name(k));
    let mut out = String::new();
    if !assignable {
        out.push_str("env ");
    }
    for (k, v) in vars {
        if assignable {
            out.push_str(k);
            out.push('=');
            out.push_str(&quote(v));
        } else {
            out.push_str(&quote(&format!("{k}={v}")));
        }
        out.push(' ');
    }
    out.push_str("/bin/sh -c ");
    out.push_str(&quote(command));
    out
}

/// A POSIX shell variable name.
fn is_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
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

    #[test]
    fn names_that_are_not_shell_names_go_through_env() {
        let plain = env_prefix(&[("DEPLOY_X".into(), "a b".into())], "true");
        assert_eq!(plain, "DEPLOY_X='a b' /bin/sh -c 'true'");
        let odd = env_prefix(
            &[("X-Y".into(), "1".into())],
            r#"printf %s "$(tr '\0' '\n' < /proc/$$/environ | grep ^X-Y=)""#,
        );
        assert!(odd.starts_with("env 'X-Y=1' "), "{odd}");
        assert_eq!(sh(&odd), "X-Y=1");
        assert!(!is_name("1A") && !is_name("") && is_name("_a1"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_value_reaches_the_hook_unchanged(value in "[^\u{0}]{0,40}") {
            let script = env_prefix(&[("DEPLOY_X".into(), value.clone())], "printf %s \"$DEPLOY_X\"");
            prop_assert_eq!(sh(&script), value);
        }

        #[test]
        fn a_variable_set_for_the_hook_is_not_set_after_it(value in "[^\u{0}]{1,20}") {
            let script = format!(
                "{}; printf %s \"${{DEPLOY_X-unset}}\"",
                env_prefix(&[("DEPLOY_X".into(), value.clone())], "printf %s \"$DEPLOY_X\"")
            );
            prop_assert_eq!(sh(&script), format!("{value}unset"));
        }
    }
}
