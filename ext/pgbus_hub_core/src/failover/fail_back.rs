//! Fail-back: while a worker's own connection serves, probe the hub's socket
//! and come back to it once it acks every subscription (see the parent's module doc).

use super::*;

/// What one fail-back attempt came to.
enum FailBackAttempt {
    Done,
    NotYet,
    Stopped,
}

impl FailoverShared {
    /// Starts the thread that probes for the hub while the local listener
    /// serves (none without a hub, in a forked child, or after `stop`).
    pub(super) fn start_fail_back(self: &Arc<Self>) {
        if self.hub.is_none() || !self.owner.is_current() {
            return;
        }
        let mut fail_back = lock(&self.fail_back);
        if lock(&self.state).stopped || fail_back.as_ref().is_some_and(OwnedThread::is_running) {
            return;
        }
        // Weak: a listener dropped without `stop` ends the thread too.
        let shared = Arc::downgrade(self);
        let spawned = OwnedThread::spawn_with_stop_channel("pgbus-hub back", move |stopped| {
            run_fail_back(&shared, stopped)
        });
        match spawned {
            Ok(thread) => *fail_back = Some(thread),
            Err(error) => self.log.warn(format!(
                "[pgbus-hub] cannot start the fail-back thread ({error}): this worker keeps its own connection"
            )),
        }
    }

    /// One fail-back attempt (see the module doc): Done once the hub serves
    /// every subscription and the local listener is closed.
    fn try_fail_back(&self, stop: &Receiver<()>) -> FailBackAttempt {
        let Some(config) = self.hub.clone() else {
            return FailBackAttempt::Done;
        };
        if !config.socket_path.exists() {
            return FailBackAttempt::NotYet; // the common case while it is down: no connect
        }
        let socket_path = config.socket_path.clone();
        let (client, reader) = match HubClient::connect_driven_or_cancel(config, stop) {
            Ok(connected) => connected,
            Err(ClientError::Interrupted) => return FailBackAttempt::Stopped,
            Err(_) => return FailBackAttempt::NotYet,
        };
        let client = Arc::new(client);
        let _one = lock(&self.failing_over);
        lock(&self.state).failing_back = true;
        self.log.info(format!(
            "[pgbus-hub] the master hub at {} answers again: subscribing through it while the \
             per-worker listener serves state={}",
            socket_path.display(),
            self.state()
        ));
        let attempt = self.fail_back_through(&client, reader, &socket_path, stop);
        lock(&self.state).failing_back = false;
        attempt
    }

    /// Subscribes every recorded subscription through `client`, then swaps
    /// it in (Done), or stops it (NotYet, Stopped).
    fn fail_back_through(
        &self,
        client: &Arc<HubClient>,
        reader: DrivenReader,
        socket_path: &std::path::Path,
        stop: &Receiver<()>,
    ) -> FailBackAttempt {
        let began = Instant::now();
        let mut reader = Some(Arc::new(reader));
        let mut subscribed: HashSet<String> = HashSet::new();
        loop {
            let pending: Vec<String> = {
                let mut state = lock(&self.state);
                if state.stopped {
                    drop(state);
                    client.stop();
                    return FailBackAttempt::Stopped;
                }
                let pending: Vec<String> = state
                    .subscriptions
                    .difference(&subscribed)
                    .cloned()
                    .collect();
                if pending.is_empty() {
                    let previous =
                        std::mem::replace(&mut state.serving, Serving::Hub(Arc::clone(client)));
                    state.failed_over = false;
                    state.failing_back = false;
                    // Removed while we subscribed: not the hub's to serve.
                    let removed: Vec<String> = subscribed
                        .difference(&state.subscriptions)
                        .cloned()
                        .collect();
                    *lock(&self.hub_reader) = reader.take();
                    drop(state);
                    for queue in &removed {
                        client.unsubscribe(queue);
                        subscribed.remove(queue);
                    }
                    if let Serving::Local(local) = previous {
                        local.stop();
                    }
                    let woken = self.wake_all(&subscribed);
                    events::emit(Event::FailBack {
                        state: FailoverState::OnHub,
                        subscriptions: subscribed.len(),
                        woken,
                        duration: began.elapsed(),
                        aligned: false,
                    });
                    self.log.info(format!(
                        "[pgbus-hub] back on the master hub at {} ({} subscription(s) acked by it, \
                         {woken} queue(s) woken to re-read what was committed meanwhile); \
                         the per-worker connection is closed state={}",
                        socket_path.display(),
                        subscribed.len(),
                        FailoverState::OnHub,
                    ));
                    return FailBackAttempt::Done;
                }
                pending
            };
            for queue in pending {
                match client.subscribe_or_cancel(&queue, stop) {
                    Ok(Listening::Active) => {
                        subscribed.insert(queue);
                    }
                    Ok(Listening::Interrupted) | Err(ClientError::Interrupted) => {
                        client.stop();
                        return FailBackAttempt::Stopped;
                    }
                    outcome => {
                        self.log.info(format!(
                            "[pgbus-hub] the master hub at {} answers again but not for {queue:?} \
                             ({outcome:?}): staying on the per-worker listener, trying again later state={}",
                            socket_path.display(),
                            FailoverState::FailedOver,
                        ));
                        client.stop();
                        return FailBackAttempt::NotYet;
                    }
                }
            }
        }
    }
}

/// The fail-back thread: an attempt every [`FAIL_BACK_FIRST`], doubling to
/// [`FAIL_BACK_MAX`], until one succeeds; ends at `stop` or once the listener is gone.
fn run_fail_back(shared: &Weak<FailoverShared>, stop: &Receiver<()>) {
    let mut delay = FAIL_BACK_FIRST;
    loop {
        if stop.recv_timeout(delay) != Err(crossbeam_channel::RecvTimeoutError::Timeout) {
            return; // `stop` dropped its sender
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match shared.try_fail_back(stop) {
            FailBackAttempt::NotYet => delay = (delay * 2).min(FAIL_BACK_MAX),
            FailBackAttempt::Done | FailBackAttempt::Stopped => return,
        }
    }
}
