//! The fields a worker listener's [`FailoverState`] is read off ([`State`],
//! under the listener's one lock), and the one place that reads them
//! ([`State::state`]). The state words themselves: `failover_state.rs`.

use crate::client::{DrivenReader, HubClient};
use crate::failover_state::FailoverState;
use crate::listener::StandaloneListener;
use std::collections::HashSet;
use std::sync::Arc;

/// Who serves subscriptions now: the object `ensure_listening` and
/// `remove_listening` call.
#[derive(Clone)]
pub(super) enum Serving {
    Hub(Arc<HubClient>),
    Local(Arc<StandaloneListener>),
    /// The local listener could not be built, or `stop` ran.
    Nobody,
}

/// A planned stop's move under way (`moves.rs`): the own connection serves
/// new subscriptions, the hub still delivers until its `marker` `token`.
pub(super) struct Moving {
    pub(super) token: String,
    pub(super) client: Arc<HubClient>,
    pub(super) subscriptions: usize,
    pub(super) began: std::time::Instant,
}

/// An aligned fail-back under way (`fail_back.rs`): the hub serves new
/// subscriptions, the own connection delivers until its marker `token`;
/// then the pump reads the hub, dropping the wakes of `subscriptions` (the
/// own connection delivered them) until the hub's `marker` `token`.
pub(super) struct Backing {
    pub(super) token: String,
    /// Until the own connection's marker: the old side, and the hub client's
    /// reader the pump takes up there. Both None once it did.
    pub(super) local: Option<Arc<StandaloneListener>>,
    pub(super) reader: Option<Arc<DrivenReader>>,
    pub(super) subscriptions: HashSet<String>,
    pub(super) began: std::time::Instant,
    /// Never sent on: dropped with this when the fail-back ends (at the hub's
    /// marker, or given up), which ends the fail-back thread's bounded wait.
    pub(super) _done: crossbeam_channel::Sender<()>,
}

/// Behind the listener's `state` lock.
pub(super) struct State {
    pub(super) serving: Serving,
    pub(super) moving: Option<Moving>,
    pub(super) backing: Option<Backing>,
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
    /// | false     | `Hub`     | false         | (`backing` is set)        | -         | `failing_back` |
    /// | false     | `Hub`     | false         | -              | -         | `on_hub`       |
    /// | false     | `Local`   | (`moving` is set)              | -         | `failing_over` |
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
            // An aligned fail-back: the hub serves new subscriptions, the own connection delivers until the cut.
            Serving::Hub(_) if self.backing.is_some() => FailoverState::FailingBack,
            Serving::Hub(_) => FailoverState::OnHub,
            // A move: the own connection takes new subscriptions, the hub delivers until its marker.
            Serving::Local(_) if self.moving.is_some() => FailoverState::FailingOver,
            Serving::Local(_) if self.failing_back => FailoverState::FailingBack,
            Serving::Local(_) if had_hub => FailoverState::FailedOver,
            Serving::Local(_) => FailoverState::Standalone,
            Serving::Nobody => FailoverState::Unserved,
        }
    }
}
