//! What a host keeps of how a service was last configured, beyond the digests of its inputs:
//! the texts of every hook and the variables they got, recorded at each switch-over and
//! reconfigure. A revert (`on-failure "revert"`) switches a host back with them, since the site
//! now has this run's (book: "Taking changes back", "Automatic revert"). Never a secret: those
//! reach the hooks on their standard input and are not recorded.

use super::removal::RecordedHook;
use crate::site::{Check, Hook, Hooks};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The hooks a service was last configured with on a host, and their variables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedHooks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrate: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<RecordedCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<RecordedHook>,
    /// The variables the hooks got (`DEPLOY_*` but the two versions, and the site's `env`;
    /// never a secret), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

/// A `check`'s text and timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedCheck {
    pub command: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::site::duration_text"
    )]
    pub timeout: Option<Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::site::duration_text"
    )]
    pub interval: Option<Duration>,
    /// `stable=`; none: healthy at the first pass.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::site::duration_text"
    )]
    pub stable: Option<Duration>,
}

/// The variables a step sets itself, left out of what is recorded.
const VERSIONS: [&str; 2] = ["DEPLOY_OLD_VERSION", "DEPLOY_NEW_VERSION"];

/// A check's time limit and interval when a record has none (the site's defaults).
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl RecordedHooks {
    /// What a service with `hooks`, whose hooks got `env`, was configured with.
    pub fn of(hooks: &Hooks, env: &[(String, String)]) -> RecordedHooks {
        let recorded = |h: &Option<Hook>| h.as_ref().map(RecordedHook::of);
        RecordedHooks {
            stop: recorded(&hooks.stop),
            install: recorded(&hooks.install),
            migrate: recorded(&hooks.migrate),
            start: recorded(&hooks.start),
            check: hooks.check.as_ref().map(|c| RecordedCheck {
                command: c.command.clone(),
                timeout: Some(c.timeout),
                interval: Some(c.interval),
                stable: Some(c.stable).filter(|s| !s.is_zero()),
            }),
            reload: recorded(&hooks.reload),
            rollback: recorded(&hooks.rollback),
            remove: recorded(&hooks.remove),
            env: env
                .iter()
                .filter(|(k, _)| !VERSIONS.contains(&k.as_str()))
                .cloned()
                .collect(),
        }
    }

    /// What a removal of the service runs here: its `stop` and `remove`, with the same
    /// variables (kept in the record beside these, for a `deploy` that reads no more).
    pub fn removal(&self) -> super::Removal {
        super::Removal {
            stop: self.stop.clone(),
            remove: self.remove.clone(),
            env: self.env.clone(),
        }
    }

    /// The hooks as a step runs them.
    pub fn hooks(&self) -> Hooks {
        let hook = |h: &Option<RecordedHook>| {
            h.as_ref().map(|h| Hook {
                command: h.command.clone(),
                timeout: h.timeout,
            })
        };
        Hooks {
            stop: hook(&self.stop),
            install: hook(&self.install),
            migrate: hook(&self.migrate),
            start: hook(&self.start),
            check: self.check.as_ref().map(|c| Check {
                command: c.command.clone(),
                timeout: c.timeout.unwrap_or(CHECK_TIMEOUT),
                interval: c.interval.unwrap_or(CHECK_INTERVAL),
                stable: c.stable.unwrap_or(Duration::ZERO),
            }),
            rollback: hook(&self.rollback),
            reload: hook(&self.reload),
            remove: hook(&self.remove),
        }
    }

    /// The recorded variables with the two versions of a step from `old` to `new`, as
    /// [`crate::rollout`]'s `step_env` orders them (the versions last).
    pub fn env(&self, old: &str, new: &str) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        env.push((VERSIONS[0].into(), old.into()));
        env.push((VERSIONS[1].into(), new.into()));
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{HostRecord, ServiceRecord};

    fn hooks() -> Hooks {
        let hook = |c: &str, t: Option<u64>| {
            Some(Hook {
                command: c.into(),
                timeout: t.map(Duration::from_millis),
            })
        };
        Hooks {
            stop: hook("stop it", None),
            install: hook("install \"$DEPLOY_NEW_VERSION\"", Some(90_000)),
            migrate: None,
            start: hook("echo \"$MODE\" >/srv/x; it's", Some(1500)),
            check: Some(Check {
                command: "curl -fsS x".into(),
                timeout: Duration::from_secs(2),
                interval: Duration::from_millis(200),
                stable: Duration::ZERO,
            }),
            rollback: hook("rollback", None),
            reload: None,
            remove: hook("rm -rf /srv/x", None),
        }
    }

    fn env() -> Vec<(String, String)> {
        [
            ("DEPLOY_SITE", "s"),
            ("MODE", "old"),
            ("DEPLOY_HOST", "app1"),
            ("DEPLOY_OLD_VERSION", "0.9"),
            ("DEPLOY_NEW_VERSION", "1.0"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    }

    #[test]
    fn the_recorded_hooks_are_the_hooks_and_the_env_without_the_versions() {
        let recorded = RecordedHooks::of(&hooks(), &env());
        let back = recorded.hooks();
        let site = hooks();
        assert_eq!(back.stop, site.stop);
        assert_eq!(back.install, site.install);
        assert_eq!(back.migrate, None);
        assert_eq!(back.start, site.start);
        assert_eq!(back.check, site.check);
        assert_eq!(back.rollback, site.rollback);
        assert_eq!(back.reload, None);
        assert_eq!(back.remove, site.remove);
        let names: Vec<&str> = recorded.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["DEPLOY_SITE", "MODE", "DEPLOY_HOST"]);
        // A revert from 2.0 back to 1.0: the versions the other way round, last.
        let env = recorded.env("2.0", "1.0");
        assert_eq!(
            env[3..],
            [
                ("DEPLOY_OLD_VERSION".to_string(), "2.0".to_string()),
                ("DEPLOY_NEW_VERSION".to_string(), "1.0".to_string())
            ]
        );
    }

    #[test]
    fn a_record_keeps_the_texts_and_older_records_read_without_them() {
        let mut api = ServiceRecord::at("1.0");
        let mut hooks = hooks();
        hooks.check = hooks.check.map(|c| Check {
            stable: Duration::from_secs(3),
            ..c
        });
        api.hooks = Some(RecordedHooks::of(&hooks, &env()));
        let record = HostRecord {
            schema: HostRecord::SCHEMA,
            services: [("api".to_string(), api)].into(),
        };
        let text = serde_json::to_string(&record).expect("JSON");
        assert!(text.contains(r#""timeout":"1500ms""#), "{text}");
        assert!(text.contains(r#""interval":"200ms""#), "{text}");
        assert!(text.contains(r#""stable":"3s""#), "{text}");
        assert!(text.contains(r#"["MODE","old"]"#), "{text}");
        let read = HostRecord::parse(text.as_bytes()).expect("reads back");
        assert_eq!(read, record);
        let back = read.services["api"]
            .hooks
            .as_ref()
            .map(RecordedHooks::hooks);
        assert_eq!(back.and_then(|h| h.check), hooks.check);

        // A record of a deploy that kept no texts (and one with only a removal's) reads, with
        // none; one whose check kept no timing gets the site's defaults.
        let old = r#"{"schema":2,"services":{"api":{"version":"1.0","inputs":{"version":"1.0"},
            "removal":{"stop":{"command":"stop it"}}},
            "db":{"version":"16","hooks":{"check":{"command":"pg_isready"}}}}}"#;
        let read = HostRecord::parse(old.as_bytes()).expect("an older record reads");
        assert_eq!(read.services["api"].hooks, None);
        assert!(read.services["api"].removal.is_some());
        let check = read.services["db"].hooks.as_ref().map(RecordedHooks::hooks);
        let check = check.and_then(|h| h.check).expect("check");
        assert_eq!(
            (check.timeout, check.interval, check.stable),
            (CHECK_TIMEOUT, CHECK_INTERVAL, Duration::ZERO)
        );
    }
}
