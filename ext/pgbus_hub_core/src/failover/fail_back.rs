//! Fail-back: while a worker's own connection serves, probe the hub's socket
//! and come back to it once it acks every subscription (see the parent's module doc).
//!
//! Aligned (docs/architecture.md, "2. Fail-back, aligned"): once every
//! subscription is acked, the hub takes new ones, the own connection is told
//! to stop at a cut token K and the hub is asked to commit K on both private
//! channels. The pump reads the own connection up to its K, then the hub,
//! dropping the wakes of the queues both sides LISTENed until the hub's
//! `marker` K: nothing missed, nothing twice, no queue woken. A hub that
//! does not commit K (an older one, pgbus's Ruby hub, its database down), or
//! a marker not read within the ack budget: the switch finishes unaligned,
//! as before (every queue woken once, a payload may arrive twice).

use super::state::Backing;
use super::*;
use crate::listener::cut_token;

/// What one fail-back attempt came to.
enum FailBackAttempt {
    Done,
    NotYet,
    Stopped,
    /// Swapped in, the cut asked for: ends when `finished` disconnects.
    Aligning {
        token: String,
        finished: Receiver<()>,
    },
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
        drop(_one); // the pump may need it (a fail-over) while the cut is awaited
        let FailBackAttempt::Aligning { token, finished } = attempt else {
            return attempt;
        };
        let budget = hub_ack_timeout(self.listener.health_check);
        crossbeam_channel::select! {
            recv(finished) -> _ => {}
            recv(stop) -> _ => {}
            default(budget) => self.finish_back_unaligned(&token, budget),
        }
        FailBackAttempt::Done
    }

    /// The hub's `marker` for an aligned fail-back, read by the pump: the
    /// fail-back is complete.
    pub(super) fn hub_marker(&self, token: &str) {
        let backing = {
            let mut state = lock(&self.state);
            match &state.backing {
                Some(backing) if backing.token == token && backing.reader.is_none() => {
                    self.dropping.store(false, Ordering::Release);
                    state.backing.take()
                }
                _ => None,
            }
        };
        let Some(backing) = backing else {
            return self.log.debug(format!(
                "[pgbus-hub] the master hub sent the marker {token:?}, which nothing awaits — ignored"
            ));
        };
        events::emit(Event::FailBack {
            state: FailoverState::OnHub,
            subscriptions: backing.subscriptions.len(),
            woken: 0,
            duration: backing.began.elapsed(),
            aligned: true,
        });
        self.log.info(format!(
            "[pgbus-hub] back on the master hub at its marker ({} subscription(s); nothing missed, \
             nothing twice); the per-worker connection is closed state={}",
            backing.subscriptions.len(),
            FailoverState::OnHub,
        ));
    }

    /// A marker on the own connection, read by the pump: an aligned
    /// fail-back's K switches the pump to the hub (its reader), which from
    /// here drops the set's wakes until its own `marker`. Others (a move's
    /// own connection starting at its K) mark nothing to do.
    pub(super) fn own_marker(&self, token: &str) {
        let local = {
            let mut state = lock(&self.state);
            let Some(backing) = state.backing.as_mut().filter(|b| b.token == token) else {
                return;
            };
            let Some(reader) = backing.reader.take() else {
                return;
            };
            self.dropping.store(true, Ordering::Release);
            *lock(&self.hub_reader) = Some(reader);
            backing.local.take()
        };
        // It delivers nothing after its K (`stop_at`).
        if let Some(local) = local {
            local.stop();
        }
    }

    /// True for a queue the own connection delivered up to the cut (its
    /// wakes from the hub before the hub's marker are the own connection's).
    pub(super) fn delivered_before_the_cut(&self, queue: &str) -> bool {
        lock(&self.state)
            .backing
            .as_ref()
            .is_some_and(|backing| backing.subscriptions.contains(queue))
    }

    /// No marker within the budget: the switch finishes as before the cut
    /// existed (the own connection closed, every queue woken once).
    fn finish_back_unaligned(&self, token: &str, budget: Duration) {
        let (backing, local) = {
            let mut state = lock(&self.state);
            if state.backing.as_ref().is_none_or(|b| b.token != token) {
                return;
            }
            let Some(mut backing) = state.backing.take() else {
                return;
            };
            self.dropping.store(false, Ordering::Release);
            if let Some(reader) = backing.reader.take() {
                *lock(&self.hub_reader) = Some(reader);
            }
            let local = backing.local.take();
            (backing, local)
        };
        if let Some(local) = local {
            local.stop();
        }
        let woken = self.wake_all(&backing.subscriptions);
        events::emit(Event::FailBack {
            state: FailoverState::OnHub,
            subscriptions: backing.subscriptions.len(),
            woken,
            duration: backing.began.elapsed(),
            aligned: false,
        });
        self.log.warn(format!(
            "[pgbus-hub] back on the master hub unaligned: no marker within {:?}s (an older hub, or \
             its database slow); {woken} queue(s) woken to re-read what was committed meanwhile \
             state={}",
            budget.as_secs_f64(),
            FailoverState::OnHub,
        ));
    }

    /// A fail-back's cut abandoned (the hub failed, `stop`): the own
    /// connection, if it still serves up to the cut, is stopped.
    pub(super) fn abandon_backing(&self) {
        let backing = lock(&self.state).backing.take();
        self.dropping.store(false, Ordering::Release);
        if let Some(local) = backing.and_then(|backing| backing.local) {
            local.stop();
        }
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
                    // The own connection's private channel, while it LISTENs: the cut's other side.
                    let aligned = match &state.serving {
                        Serving::Local(local) if local.stats().healthy() => local
                            .stats()
                            .private_channel()
                            .map(|channel| (Arc::clone(local), channel)),
                        _ => None,
                    };
                    let previous =
                        std::mem::replace(&mut state.serving, Serving::Hub(Arc::clone(client)));
                    state.failed_over = false;
                    state.failing_back = false;
                    // Removed while we subscribed: not the hub's to serve.
                    let removed: Vec<String> = subscribed
                        .difference(&state.subscriptions)
                        .cloned()
                        .collect();
                    for queue in &removed {
                        subscribed.remove(queue);
                    }
                    if let Some((local, channel)) = aligned {
                        let token = cut_token();
                        let (done, finished) = crossbeam_channel::bounded(0);
                        state.backing = Some(Backing {
                            token: token.clone(),
                            local: Some(Arc::clone(&local)),
                            reader: reader.take(),
                            subscriptions: subscribed.clone(),
                            began,
                            _done: done,
                        });
                        drop(state);
                        for queue in &removed {
                            client.unsubscribe(queue);
                        }
                        // Before the hub can commit K: the engine reads its
                        // commands before the notifications that follow them.
                        if let Some(engine) = local.handle() {
                            engine.stop_at(Some(&token));
                        }
                        client.request_marker(&channel, &token);
                        self.log.info(format!(
                            "[pgbus-hub] the master hub at {} acked {} subscription(s): switching \
                             back at its marker state={}",
                            socket_path.display(),
                            subscribed.len(),
                            self.state(),
                        ));
                        return FailBackAttempt::Aligning { token, finished };
                    }
                    *lock(&self.hub_reader) = reader.take();
                    drop(state);
                    for queue in &removed {
                        client.unsubscribe(queue);
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
            FailBackAttempt::Done | FailBackAttempt::Stopped | FailBackAttempt::Aligning { .. } => {
                return
            }
        }
    }
}
