//! Fail-over: the hub failed (or was not there at start), so the worker's own
//! LISTEN connection is started, every recorded subscription replayed on it,
//! and it is swapped in (see the parent's module doc); then fail-back
//! (`fail_back.rs`) starts probing for the hub.

use super::*;

impl FailoverShared {
    /// The local listener, started (connecting in the background); None,
    /// logged, when its thread cannot start.
    /// `start`: a set LISTENed and a cut committed in its first transaction (a move).
    pub(super) fn start_local(&self, start: Start) -> Option<Arc<StandaloneListener>> {
        match StandaloneListener::start_with(self.listener.clone(), self.local_wakes.clone(), start)
        {
            Ok(local) => Some(Arc::new(local)),
            Err(error) => {
                self.log.error(format!(
                    "[pgbus-hub] per-worker listener failed to start ({error}) — streams degraded until this worker recycles state={}",
                    FailoverState::Unserved
                ));
                None
            }
        }
    }

    /// Asks the engine for each LISTEN and waits for the answers, at most
    /// one LISTEN budget for the lot: an engine still connecting (the
    /// database down) keeps them and runs them when it connects.
    fn replay(&self, engine: &ListenerHandle, queues: &[String]) {
        let (answered, answers) = crossbeam_channel::unbounded();
        for queue in queues {
            let answered = answered.clone();
            engine.listen_then(queue, move |_| {
                let _ = answered.send(());
            });
        }
        let budget = listen_ack_timeout(self.listener.health_check);
        let deadline = Instant::now() + budget;
        let confirmed = (0..queues.len())
            .take_while(|_| answers.recv_deadline(deadline).is_ok())
            .count();
        if confirmed < queues.len() {
            self.log.warn(format!(
                "[pgbus-hub] {} replayed LISTEN(s) not confirmed within {:?}s; the per-worker listener runs them once connected",
                queues.len() - confirmed,
                budget.as_secs_f64()
            ));
        }
    }

    /// Idempotent: builds the local listener, replays every recorded
    /// subscription on it and swaps it in, then starts probing for the hub
    /// (see the module doc).
    pub(super) fn fail_over(self: &Arc<Self>) {
        let _one = lock(&self.failing_over);
        // A fail-back switching at a cut: its hub failed before the cut.
        self.abandon_backing();
        {
            let mut state = lock(&self.state);
            if state.stopped || state.failed_over {
                return;
            }
            state.failed_over = true;
        }
        let began = Instant::now();
        let Some(local) = self.start_local(Start::default()) else {
            lock(&self.state).serving = Serving::Nobody;
            return self.emit_fail_over(began, 0, 0);
        };
        let Some(engine) = local.handle() else { return };
        let mut replayed = HashSet::new();
        loop {
            let pending: Vec<String> = {
                let mut state = lock(&self.state);
                if state.stopped {
                    drop(state);
                    local.stop();
                    return;
                }
                let pending: Vec<String> =
                    state.subscriptions.difference(&replayed).cloned().collect();
                if pending.is_empty() {
                    state.serving = Serving::Local(Arc::clone(&local));
                }
                pending
            };
            if pending.is_empty() {
                break;
            }
            self.replay(engine, &pending);
            replayed.extend(pending);
        }
        // What the hub would have woken since it failed reached nobody.
        let woken = self.wake_all(&replayed);
        self.emit_fail_over(began, replayed.len(), woken);
        self.log.info(format!(
            "[pgbus-hub] failed over to a per-worker listener ({} subscription(s) re-LISTENed, \
             {woken} queue(s) woken to re-read what was committed meanwhile) state={}",
            replayed.len(),
            self.state(),
        ));
        self.start_fail_back();
    }

    fn emit_fail_over(&self, began: Instant, subscriptions: usize, woken: usize) {
        events::emit(Event::FailOver {
            state: self.state(),
            subscriptions,
            woken,
            duration: began.elapsed(),
            aligned: false,
        });
    }

    /// One durable wake per queue, now that it is LISTENed on the side that
    /// serves, so each is re-read. Raw channels carry only payloads, which
    /// are gone. Returns how many.
    pub(super) fn wake_all(&self, queues: &HashSet<String>) -> usize {
        let queues: Vec<&String> = queues.iter().filter(|q| key_channel(q).is_none()).collect();
        for queue in &queues {
            self.local_wakes
                .send(Delivery::Wake(Wake::durable(queue.as_str())));
        }
        queues.len()
    }
}
