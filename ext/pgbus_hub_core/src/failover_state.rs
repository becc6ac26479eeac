//! The worker listener's states: who serves its subscriptions. These words
//! are the one vocabulary for them: `FailoverListener#state` (a Symbol),
//! `stats[:state]`, the log lines' `state=`, docs/architecture.md's diagram,
//! docs/pgbus-surface.md, and any metric or event label. A module of its
//! own so that the failover listener (which emits events) and the events
//! (which carry a state) both use it without importing each other; the
//! fields a state is read off are in `failover/state.rs`.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverState {
    /// The master hub serves every subscription.
    OnHub,
    /// The hub failed (or was not there at start), or the hub asked it to
    /// move (a planned stop): the worker's own LISTEN connection is being
    /// started and every subscription replayed on it; the hub still delivers
    /// until the swap (a move's: until the hub's marker).
    FailingOver,
    /// The worker's own LISTEN connection serves, after the hub failed or
    /// stopped; a thread probes the hub's socket to come back.
    FailedOver,
    /// A hub answers again: a new hub client subscribes every subscription
    /// while the own connection still serves (any refusal: back to
    /// `failed_over`), and once all are acked the own connection delivers
    /// until the cut's marker (then `on_hub`).
    FailingBack,
    /// No hub to try (`Pgbus::Hub::Listener`): the own connection serves.
    Standalone,
    /// Nobody serves: the own connection could not be started (logged);
    /// `ensure_listening` answers nil until `stop`.
    Unserved,
    /// `stop` ran.
    Stopped,
}

impl FailoverState {
    pub const ALL: [Self; 7] = [
        Self::OnHub,
        Self::FailingOver,
        Self::FailedOver,
        Self::FailingBack,
        Self::Standalone,
        Self::Unserved,
        Self::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnHub => "on_hub",
            Self::FailingOver => "failing_over",
            Self::FailedOver => "failed_over",
            Self::FailingBack => "failing_back",
            Self::Standalone => "standalone",
            Self::Unserved => "unserved",
            Self::Stopped => "stopped",
        }
    }
}

impl fmt::Display for FailoverState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_its_own_snake_case_word() {
        let words: std::collections::HashSet<&str> =
            FailoverState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(words.len(), FailoverState::ALL.len());
        assert!(words
            .iter()
            .all(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
    }
}
