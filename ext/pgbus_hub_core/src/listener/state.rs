//! A LISTEN connection's states (the hub's, and a worker's own). These words
//! are the one vocabulary for them: the hub's `stats[:listener_state]` and
//! `pgbus-hub status`, a FailoverListener's `stats[:listener_state]`, the
//! engine's transition log lines, the docs, and any metric or event label.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ListenerState {
    /// No connection yet: the first one is being made (retried with backoff).
    #[default]
    Connecting,
    /// Connected to a primary, every channel LISTENed (`healthy`).
    Listening,
    /// Listening on a new connection while the given-up one is read on up to
    /// the handover marker (its backlog delivered first; docs/architecture.md).
    HandingOver,
    /// The connection was lost or given up: connecting again (with backoff;
    /// a given-up connection is read on meanwhile).
    Reconnecting,
    /// The engine ended (`stop`).
    Stopped,
}

impl ListenerState {
    pub const ALL: [Self; 5] = [
        Self::Connecting,
        Self::Listening,
        Self::HandingOver,
        Self::Reconnecting,
        Self::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Listening => "listening",
            Self::HandingOver => "handing_over",
            Self::Reconnecting => "reconnecting",
            Self::Stopped => "stopped",
        }
    }

    /// The state of a running engine, from what it knows: healthy (every
    /// channel LISTENed), connected before (so down means reconnecting), a
    /// given-up connection kept for a handover.
    pub(crate) fn of(healthy: bool, ever_connected: bool, handing_over: bool) -> Self {
        match (healthy, handing_over, ever_connected) {
            (true, true, _) => Self::HandingOver,
            (true, false, _) => Self::Listening,
            (false, _, true) => Self::Reconnecting,
            (false, _, false) => Self::Connecting,
        }
    }
}

impl fmt::Display for ListenerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A [`ListenerState`] published by the engine, read from any thread.
#[derive(Debug, Default)]
pub(crate) struct PublishedState(AtomicU8);

impl PublishedState {
    pub(crate) fn get(&self) -> ListenerState {
        ListenerState::ALL[usize::from(self.0.load(Ordering::Acquire))]
    }

    /// Returns the previous state when it changed.
    pub(crate) fn set(&self, state: ListenerState) -> Option<ListenerState> {
        let index = ListenerState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(0);
        let previous = self.0.swap(index as u8, Ordering::AcqRel);
        (usize::from(previous) != index).then(|| ListenerState::ALL[usize::from(previous)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_state_reads_back_and_reports_changes_only() {
        let published = PublishedState::default();
        assert_eq!(published.get(), ListenerState::Connecting);
        for state in ListenerState::ALL {
            published.set(state);
            assert_eq!(published.get(), state);
            assert_eq!(published.set(state), None);
        }
        assert_eq!(
            published.set(ListenerState::Listening),
            Some(ListenerState::Stopped)
        );
    }

    #[test]
    fn a_running_engine_is_connecting_until_first_up_then_reconnecting_when_down() {
        assert_eq!(
            ListenerState::of(false, false, false),
            ListenerState::Connecting
        );
        assert_eq!(
            ListenerState::of(true, true, false),
            ListenerState::Listening
        );
        assert_eq!(
            ListenerState::of(false, true, true),
            ListenerState::Reconnecting
        );
        assert_eq!(
            ListenerState::of(true, true, true),
            ListenerState::HandingOver
        );
    }
}
