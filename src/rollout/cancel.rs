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

/// A cloneable cancellation handle: one sender, any number of watchers. A child
/// ([`Cancel::child`], one service's) is at least at its parent's level.
#[derive(Clone, Debug)]
pub struct Cancel {
    tx: Arc<watch::Sender<Level>>,
    /// Why the level was last raised ("SIGINT", "the run journal cannot be written: …").
    why: Arc<Mutex<String>>,
    parent: Option<Box<Cancel>>,
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
            parent: None,
        }
    }

    /// A handle of its own (one service's) that is also raised whenever this one is: raising
    /// it leaves this one as it is.
    pub fn child(&self) -> Cancel {
        Cancel {
            parent: Some(Box::new(self.clone())),
            ..Cancel::new()
        }
    }

    /// Its own level.
    fn own(&self) -> Level {
        *self.tx.borrow()
    }

    /// Where the run (or the service) stands now.
    pub fn level(&self) -> Level {
        let parent = self.parent.as_ref().map_or(Level::Running, |p| p.level());
        self.own().max(parent)
    }

    /// Raises the level to at least `level` (never lowers it), saying why; returns the level
    /// now.
    pub fn raise(&self, level: Level, why: &str) -> Level {
        let mut reason = self.why.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.level();
        self.tx.send_if_modified(|now| {
            if level > *now && level > before {
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

    /// Why, when this handle alone (one service's) was raised above its parent's level.
    pub fn alone(&self) -> Option<String> {
        let parent = self.parent.as_ref()?.level();
        (self.own() > parent).then(|| self.why.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Resolves once this handle alone (not its parent) is at least at `level`.
    pub async fn reached_alone(&self, level: Level) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|now| *now >= level).await;
    }

    /// Why the level was last raised; empty while running.
    pub fn reason(&self) -> String {
        match &self.parent {
            Some(p) if p.level() >= self.own() => p.reason(),
            _ => self.why.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        }
    }

    /// No new step may start.
    pub fn stopping(&self) -> bool {
        self.level() >= Level::Stop
    }

    /// Running steps must be stopped too.
    pub fn aborting(&self) -> bool {
        self.level() >= Level::Abort
    }

    /// A receiver that sees every later change of its own level (not its parent's).
    pub fn subscribe(&self) -> watch::Receiver<Level> {
        self.tx.subscribe()
    }

    /// Resolves once the level is at least `level` (at once if it already is), its own or
    /// its parent's.
    pub async fn reached(&self, level: Level) {
        let mut rx = self.tx.subscribe();
        let own = rx.wait_for(|now| *now >= level);
        match &self.parent {
            Some(p) => {
                tokio::select! {
                    _ = own => {}
                    _ = Box::pin(p.reached(level)) => {}
                }
            }
            None => {
                let _ = own.await;
            }
        }
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
    async fn a_child_follows_its_parent_and_not_the_other_way() {
        let run = Cancel::new();
        let (a, b) = (run.child(), run.child());
        a.raise(Level::Abort, "deadline");
        assert!(a.aborting() && !b.stopping() && !run.stopping());
        assert_eq!(a.reason(), "deadline");
        a.reached(Level::Abort).await;
        let w = b.clone();
        let waiter = tokio::spawn(async move { w.reached(Level::Stop).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        run.escalate("SIGINT");
        waiter
            .await
            .expect("the child's watcher wakes on its parent");
        assert!(b.stopping() && !b.aborting());
        assert_eq!(b.reason(), "SIGINT");
        assert_eq!(b.escalate("again"), Level::Abort);
        assert!(!run.aborting());
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
