//! How the outside (the CLI's signal handling) tells a running rollout to stop: a small
//! handle shared by the CLI, the scheduler and every step. The engine never installs signal
//! handlers itself.

use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How far a run has been asked to stop. Levels only ever go up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Level {
    /// Carry on.
    #[default]
    Running,
    /// Start no new step; let running steps finish (or time out), record everything.
    Stop,
    /// Stop running steps too: kill their hooks' process groups on the hosts and record them
    /// as interrupted.
    Abort,
}

/// A cloneable cancellation handle: one sender, any number of watchers.
#[derive(Clone, Debug)]
pub struct Cancel {
    tx: Arc<watch::Sender<Level>>,
    /// Why the level was last raised ("SIGINT", "the run journal cannot be written: …").
    why: Arc<Mutex<String>>,
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel::new()
    }
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel {
            tx: Arc::new(watch::channel(Level::Running).0),
            why: Arc::default(),
        }
    }

    /// Where the run stands now.
    pub fn level(&self) -> Level {
        *self.tx.borrow()
    }

    /// Raises the level to at least `level` (never lowers it), saying why; returns the level
    /// now.
    pub fn raise(&self, level: Level, why: &str) -> Level {
        let mut reason = self.why.lock().unwrap_or_else(|p| p.into_inner());
        self.tx.send_if_modified(|now| {
            if level > *now {
                *now = level;
                *reason = why.to_string();
                true
            } else {
                false
            }
        });
        self.level()
    }

    /// One more signal: `Running` → `Stop` → `Abort`; returns the level now.
    pub fn escalate(&self, why: &str) -> Level {
        let next = match self.level() {
            Level::Running => Level::Stop,
            _ => Level::Abort,
        };
        self.raise(next, why)
    }

    /// Why the level was last raised; empty while running.
    pub fn reason(&self) -> String {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// No new step may start.
    pub fn stopping(&self) -> bool {
        self.level() >= Level::Stop
    }

    /// Running steps must be stopped too.
    pub fn aborting(&self) -> bool {
        self.level() >= Level::Abort
    }

    /// A receiver that sees every later change of level.
    pub fn subscribe(&self) -> watch::Receiver<Level> {
        self.tx.subscribe()
    }

    /// Resolves once the level is at least `level` (at once if it already is).
    pub async fn reached(&self, level: Level) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|now| *now >= level).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_only_go_up() {
        let c = Cancel::new();
        assert_eq!(c.level(), Level::Running);
        assert_eq!(c.escalate("SIGINT"), Level::Stop);
        assert!(c.stopping() && !c.aborting());
        assert_eq!(c.raise(Level::Running, "no"), Level::Stop);
        assert_eq!(c.reason(), "SIGINT");
        assert_eq!(c.escalate("SIGTERM"), Level::Abort);
        assert_eq!(c.escalate("again"), Level::Abort);
        assert!(c.clone().aborting());
        assert_eq!(c.reason(), "SIGTERM");
    }

    #[tokio::test]
    async fn reached_wakes_watchers() {
        let c = Cancel::new();
        let w = c.clone();
        let waiter = tokio::spawn(async move { w.reached(Level::Abort).await });
        c.escalate("SIGINT");
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        c.escalate("SIGINT");
        waiter.await.expect("the watcher wakes");
    }
}
