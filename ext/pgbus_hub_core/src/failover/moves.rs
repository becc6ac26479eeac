//! A planned stop's move (docs/architecture.md, "1. A planned hub stop"):
//! the hub sends `move` with a cut token K; the worker starts its own LISTEN
//! connection whose first transaction LISTENs every recorded subscription
//! and NOTIFYs K on both private channels, answers, and makes that
//! connection the side new subscriptions go to. The pump reads the hub up to
//! its `marker` K, then the own connection from its K: nothing missed,
//! nothing twice, so no queue is woken. Should the hub fail before its
//! `marker`, it is an unplanned fail-over after all (every queue woken once).

use super::state::Moving;
use super::*;

impl FailoverShared {
    /// The hub's `move`, seen by the pump. Does not block: the own connection
    /// connects in the background, and the pump goes on reading the hub.
    /// A move that cannot start is not answered: the hub closes this
    /// connection after its grace and the worker fails over as before.
    pub(super) fn start_move(self: &Arc<Self>, channel: String, token: String) {
        let cut = match Cut::new(channel, token.clone()) {
            Ok(cut) => cut,
            Err(error) => {
                return self.log.warn(format!(
                    "[pgbus-hub] the master hub asked to move with a cut this worker refuses \
                     ({error}): not moving; it fails over when the hub closes"
                ))
            }
        };
        // Never waits on the pump thread: a fail-back replaying its subs holds this for seconds.
        let _one =
            match self.failing_over.try_lock() {
                Ok(one) => one,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return self.log.info(
                    "[pgbus-hub] the master hub asked to move during another switch: not moving; \
                     it fails over when the hub closes",
                ),
            };
        let began = Instant::now();
        let mut state = lock(&self.state);
        let client = match &state.serving {
            // Not during an aligned fail-back: its own connection still delivers up to its cut.
            Serving::Hub(client)
                if !state.stopped && state.moving.is_none() && state.backing.is_none() =>
            {
                Arc::clone(client)
            }
            _ => return,
        };
        // In one critical section with the swap: a subscription recorded
        // after this goes to the own connection, LISTENed there live.
        let queues: Vec<String> = state.subscriptions.iter().cloned().collect();
        let subscriptions = queues.len();
        let Some(local) = self.start_local(Start {
            queues,
            cut: Some(cut),
        }) else {
            return;
        };
        state.serving = Serving::Local(local);
        state.failed_over = true;
        state.moving = Some(Moving {
            token: token.clone(),
            client: Arc::clone(&client),
            subscriptions,
            began,
        });
        let now = state.state(self.hub.is_some());
        drop(state);
        client.answer_move(&token);
        self.log.info(format!(
            "[pgbus-hub] the master hub is stopping: moving {subscriptions} subscription(s) to a \
             per-worker listener, cut at the hub's marker state={now}"
        ));
    }

    /// True when `token` is the marker the pump switches sides at.
    pub(super) fn is_moving_at(&self, token: &str) -> bool {
        lock(&self.state)
            .moving
            .as_ref()
            .is_some_and(|moving| moving.token == token)
    }

    /// The hub's `marker`: everything before it was the hub's to deliver,
    /// everything after it is the own connection's. The hub client is closed
    /// (the hub counts the worker as moved), fail-back starts probing.
    pub(super) fn finish_move(self: &Arc<Self>) {
        let Some(moving) = lock(&self.state).moving.take() else {
            return;
        };
        moving.client.stop();
        let state = self.state();
        events::emit(Event::FailOver {
            state,
            subscriptions: moving.subscriptions,
            woken: 0,
            duration: moving.began.elapsed(),
            aligned: true,
        });
        self.log.info(format!(
            "[pgbus-hub] moved to a per-worker listener at the hub's marker ({} subscription(s); \
             nothing missed, nothing twice) state={state}",
            moving.subscriptions
        ));
        self.start_fail_back();
    }

    /// The hub client failed (or was closed) while it served: a move cut
    /// short by the hub's end wakes every queue once (what the hub did not
    /// deliver before the own connection's marker reached nobody); without a
    /// move, today's fail-over.
    pub(super) fn hub_failed(self: &Arc<Self>) {
        let moving = lock(&self.state).moving.take();
        let Some(moving) = moving else {
            return self.fail_over();
        };
        moving.client.stop();
        let subscriptions: HashSet<String> = lock(&self.state).subscriptions.clone();
        let woken = self.wake_all(&subscriptions);
        let state = self.state();
        events::emit(Event::FailOver {
            state,
            subscriptions: moving.subscriptions,
            woken,
            duration: moving.began.elapsed(),
            aligned: false,
        });
        self.log.warn(format!(
            "[pgbus-hub] the master hub closed before its marker: on the per-worker listener \
             unaligned ({woken} queue(s) woken to re-read what was committed meanwhile) state={state}"
        ));
        self.start_fail_back();
    }
}
