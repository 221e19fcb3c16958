//! A host whose state file exists but cannot be read or parsed: nothing is known of what it
//! runs, so it is left alone (skipped, like a host that does not answer) and the operator is
//! told how to repair it.

use super::record::STATE_FILE;
use super::Observed;

/// `observed` with an unreadable state file's reason naming the file and how to fix it.
pub fn explain(observed: Observed, state_dir: &str) -> Observed {
    match observed {
        Observed::Unreadable { reason } => Observed::Unreadable {
            reason: reason_for(&reason, state_dir),
        },
        other => other,
    }
}

fn reason_for(reason: &str, state_dir: &str) -> String {
    let file = format!("{}/{STATE_FILE}", state_dir.trim_end_matches('/'));
    let reason = if reason.is_empty() {
        "it cannot be read"
    } else {
        reason
    };
    format!(
        "state file {file} is unusable ({reason}); the host is left alone until it is fixed: \
         inspect it and restore a good copy, or delete it to treat the host as fresh \
         (every service is then installed again, without stop or migrate)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_names_the_file_and_the_fix() {
        let o = explain(
            Observed::Unreadable {
                reason: "state file is not valid: expected value at line 1 column 1".into(),
            },
            "/var/lib/drover/",
        );
        let Observed::Unreadable { reason } = o else {
            panic!("still unreadable")
        };
        assert!(reason.contains("/var/lib/drover/state.json"), "{reason}");
        assert!(reason.contains("expected value at line 1"), "{reason}");
        assert!(
            reason.contains("delete it to treat the host as fresh"),
            "{reason}"
        );
        assert_eq!(explain(Observed::Fresh, "/x"), Observed::Fresh);
    }
}
