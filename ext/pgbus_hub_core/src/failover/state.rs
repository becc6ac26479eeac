//! The worker listener's states: who serves its subscriptions. These words
//! are the one vocabulary for them: `FailoverListener#state` (a Symbol),
//! `stats[:state]`, the log lines' `state=`, docs/architecture.md's diagram,
//! docs/pgbus-surface.md, and any metric or event label. Also the fields
//! they are read off ([`State`], under the listener's one lock), and the
//! one place that reads them ([`State::state`]).

use crate::client::HubClient;
use crate::listener::StandaloneListener;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailoverState {
    /// The master hub serves every subscription.
    OnHub,
    /// The hub failed (or was not there at start): the worker's own LISTEN
    /// connection is being started and every subscription replayed on it;
    /// the hub's client still answers until the swap.
    FailingOver,
    /// The worker's own LISTEN connection serves, after the hub failed; a
    /// thread probes the hub's socket to come back.
    FailedOver,
    /// A hub answers again: a new hub client subscribes every subscription
    /// while the own connection still serves (any refusal: back to
    /// `failed_over`; all acked: `on_hub`).
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

/// Who serves subscriptions now: the object `ensure_listening` and
/// `remove_listening` call.
#[derive(Clone)]
pub(super) enum Serving {
    Hub(Arc<HubClient>),
    Local(Arc<StandaloneListener>),
    /// The local listener could not be built, or `stop` ran.
    Nobody,
}

/// Behind the listener's `state` lock.
pub(super) struct State {
    pub(super) serving: Serving,
    pub(super) subscriptions: HashSet<String>,
    /// Set by a fail-over (whatever it came to), cleared by a fail-back.
    pub(super) failed_over: bool,
    /// A fail-back attempt is subscribing through a hub that answered.
    pub(super) failing_back: bool,
    pub(super) stopped: bool,
}

impl State {
    /// The one place the [`FailoverState`] is read off the fields, first
    /// matching row wins (`had_hub`: a socket path was configured):
    ///
    /// | `stopped` | `serving` | `failed_over` | `failing_back` | `had_hub` | state          |
    /// |-----------|-----------|---------------|----------------|-----------|----------------|
    /// | true      | any       | any           | any            | any       | `stopped`      |
    /// | false     | `Hub`     | true          | -              | -         | `failing_over` |
    /// | false     | `Hub`     | false         | -              | -         | `on_hub`       |
    /// | false     | `Local`   | -             | true           | -         | `failing_back` |
    /// | false     | `Local`   | -             | false          | true      | `failed_over`  |
    /// | false     | `Local`   | -             | false          | false     | `standalone`   |
    /// | false     | `Nobody`  | any           | -              | -         | `unserved`     |
    ///
    /// Derived, not stored: `serving` is the object that answers, and the two
    /// phases are a switch under way while the OLD side still answers (a
    /// fail-over sets `failed_over` before its own connection exists, the hub
    /// client serving until the swap; a fail-back sets `failing_back` while
    /// the own connection serves). Each swap changes `serving` and clears or
    /// keeps the flags in one critical section of this lock; a stored state
    /// beside them would be a copy every writer must keep in step, and one
    /// enum carrying the served object would drop `failed_over`, which must
    /// outlive an own connection that could not start (`unserved`) so that a
    /// second fail-over does not run. The switches themselves are serialised
    /// by `FailoverShared::failing_over`, held outside this lock while a
    /// replay or a fail-back's subs wait.
    pub(super) fn state(&self, had_hub: bool) -> FailoverState {
        match &self.serving {
            _ if self.stopped => FailoverState::Stopped,
            Serving::Hub(_) if self.failed_over => FailoverState::FailingOver,
            Serving::Hub(_) => FailoverState::OnHub,
            Serving::Local(_) if self.failing_back => FailoverState::FailingBack,
            Serving::Local(_) if had_hub => FailoverState::FailedOver,
            Serving::Local(_) => FailoverState::Standalone,
            Serving::Nobody => FailoverState::Unserved,
        }
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
