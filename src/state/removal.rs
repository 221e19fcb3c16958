//! What a host keeps of a service for the day it leaves: the texts of its `stop` and `remove`
//! hooks and the variables they got, recorded at each switch-over and reconfigure, since the
//! site may no longer have them when the service is removed (book: "Taking changes back").

use crate::site::Hooks;
use serde::{Deserialize, Serialize};

/// The hooks a removal runs on a host, as it recorded them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<RecordedHook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<RecordedHook>,
    /// The variables the hooks got (`DEPLOY_*` and the site's `env`; never a secret), in
    /// order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

/// One hook's text and time limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedHook {
    pub command: String,
    /// Kill it after this long (`"30s"`); none: no limit.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::site::duration_text"
    )]
    pub timeout: Option<std::time::Duration>,
}

impl Removal {
    /// What a removal of a service with `hooks`, whose hooks got `env`, runs. The variables a
    /// removal sets itself (`DEPLOY_NEW_VERSION`, empty) are left out.
    pub fn of(hooks: &Hooks, env: &[(String, String)]) -> Removal {
        let recorded = |h: &Option<crate::site::Hook>| {
            h.as_ref().map(|h| RecordedHook {
                command: h.command.clone(),
                timeout: h.timeout,
            })
        };
        Removal {
            stop: recorded(&hooks.stop),
            remove: recorded(&hooks.remove),
            env: env
                .iter()
                .filter(|(k, _)| k != "DEPLOY_NEW_VERSION" && k != "DEPLOY_OLD_VERSION")
                .cloned()
                .collect(),
        }
    }

    /// The hooks it runs, in order: `stop`, then `remove`.
    pub fn hooks(&self) -> impl Iterator<Item = (&'static str, &RecordedHook)> {
        [("stop", &self.stop), ("remove", &self.remove)]
            .into_iter()
            .filter_map(|(n, h)| h.as_ref().map(|h| (n, h)))
    }
}
