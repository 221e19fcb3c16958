//! What a host keeps of a service for the day it leaves: the texts of its `stop` and `remove`
//! hooks and the variables they got, recorded at each switch-over and reconfigure, since the
//! site may no longer have them when the service is removed (book: "Taking changes back").

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

impl RecordedHook {
    /// `hook` as a host records it.
    pub fn of(hook: &crate::site::Hook) -> RecordedHook {
        RecordedHook {
            command: hook.command.clone(),
            timeout: hook.timeout,
        }
    }
}

impl Removal {
    /// The hooks it runs, in order: `stop`, then `remove`.
    pub fn hooks(&self) -> impl Iterator<Item = (&'static str, &RecordedHook)> {
        [("stop", &self.stop), ("remove", &self.remove)]
            .into_iter()
            .filter_map(|(n, h)| h.as_ref().map(|h| (n, h)))
    }
}
