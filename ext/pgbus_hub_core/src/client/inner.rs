//! The client's shared state at work: connecting, the failure model (kill,
//! close), writing frames and acting on the frames the hub sends.

use super::*;

impl Inner {
    pub(super) fn connect(
        config: ClientConfig,
        deliveries: DeliverySender,
        cancel: &Receiver<()>,
    ) -> Result<Arc<Self>, ClientError> {
        let ClientConfig {
            socket_path,
            ack_timeout,
            log,
            drops: _, // counted by `deliveries`
        } = config;
        let unreachable = |why: String| unreachable_at(&socket_path, why);
        crate::transport::check_socket_path(&socket_path).map_err(unreachable)?;
        let socket = ClientSocket::connect(&socket_path, cancel).map_err(|e| match e {
            ConnectError::Cancelled => ClientError::Interrupted,
            ConnectError::Failed(e) => unreachable(e.to_string()),
        })?;
        let raw_fd = socket.raw_fd();
        Ok(Arc::new(Inner {
            socket_path,
            ack_timeout,
            log,
            deliveries,
            socket: RwLock::new(Some(socket)),
            raw_fd,
            fd_open: AtomicBool::new(true),
            unsent: Mutex::new(None),
            state: Mutex::new(State::default()),
            dead: AtomicBool::new(false),
            reading: Mutex::default(),
            healthy: AtomicBool::new(true),
            outage_logged: AtomicBool::new(false),
        }))
    }

    pub(super) fn unreachable(&self, why: String) -> ClientError {
        unreachable_at(&self.socket_path, why)
    }

    /// The error for a call on a dead client.
    pub(super) fn unavailable_now(&self) -> ClientError {
        let reason = lock(&self.state)
            .dead_reason
            .clone()
            .unwrap_or_else(|| "unknown reason".into());
        unavailable(format!("master hub is unavailable: {reason}"))
    }

    /// Removes waiter `id`; false if it was already answered.
    pub(super) fn discard_waiter(&self, queue: &str, id: u64) -> bool {
        lock(&self.state).waiters.discard(queue, id)
    }

    /// The transport died: idempotent, one `Delivery::Failed`.
    pub(super) fn mark_dead(&self, reason: String) {
        self.kill(reason, Outcome::Died, true);
    }

    /// First caller wins: records the reason, releases every waiter, shuts
    /// the socket down; with `report`, logs and sends `Delivery::Failed`.
    pub(super) fn kill(&self, reason: String, outcome: Outcome, report: bool) {
        {
            let mut state = lock(&self.state);
            if state.dead_reason.is_some() {
                return;
            }
            state.dead_reason = Some(reason.clone());
            self.dead.store(true, Ordering::Release);
            self.healthy.store(false, Ordering::Release);
            // Under the lock: a waiter that times out concurrently either
            // finds itself still pending or finds its outcome already sent.
            state.waiters.answer_all(&outcome);
            if report {
                // Under the lock too: wakes are sent under it, so Failed is
                // the last delivery this client ever makes.
                self.deliveries.send(Delivery::Failed {
                    reason: reason.clone(),
                });
            }
        }
        if let Some(socket) = read(&self.socket).as_ref() {
            socket.shutdown();
        }
        if report {
            self.log.warn(format!(
                "{LOG_PREFIX} {reason} — falling back to a per-worker listener"
            ));
        }
    }

    /// Closes the socket once nobody uses it. Users hold it only for a
    /// bounded time after shutdown(2); if one still does at `deadline`, or
    /// `cancel` receives first, the socket closes when the client drops.
    pub(super) fn close(&self, deadline: Instant, cancel: &Receiver<()>) {
        loop {
            let mut socket = match self.socket.try_write() {
                Ok(socket) => socket,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let pause = left.min(Duration::from_millis(1));
                    if left.is_zero() || cancel.recv_timeout(pause).is_ok() {
                        return;
                    }
                    continue;
                }
            };
            self.fd_open.store(false, Ordering::Release);
            drop(socket.take());
            return;
        }
    }

    /// When a write asked for now must be done: `ack_timeout` from before
    /// the caller waits for the write lock, so that wait counts too.
    pub(super) fn write_deadline(&self) -> Option<Instant> {
        Instant::now().checked_add(self.ack_timeout)
    }

    /// Sends what a write cancelled part-way left of its frame (see
    /// [`Unsent`]), then `frame`, whole, by `deadline` or until `cancel`
    /// receives. `unsent` is the write lock's slot: the caller holds the lock.
    /// A cancel never loses the framing: part-way through `frame`, its rest is
    /// parked in `unsent` (`Parked`); while the tail goes out, the tail's rest
    /// stays and nothing of `frame` was sent (`Cancelled`).
    pub(super) fn write_frame(
        &self,
        unsent: &mut Option<Unsent>,
        frame: &[u8],
        deadline: Option<Instant>,
        cancel: &Receiver<()>,
    ) -> Result<(), Unwritten> {
        let socket = read(&self.socket);
        let Some(socket) = socket.as_ref() else {
            return Err(Unwritten::Dead(STOPPED.into()));
        };
        // How much went out before a cancel, or the death a failed write is.
        let cut = |error| match error {
            WriteError::Cancelled { sent } => Ok(sent),
            WriteError::Stalled => Err(Unwritten::Dead(format!(
                "write to master hub stalled for {}s",
                seconds(self.ack_timeout)
            ))),
            WriteError::Failed(error) => Err(Unwritten::Dead(format!(
                "write to master hub failed: {error}"
            ))),
        };
        if let Some(parked) = unsent {
            if let Err(error) = socket.write_frame(&parked.tail, deadline, cancel) {
                parked.tail.drain(..cut(error)?);
                return Err(Unwritten::Cancelled);
            }
            if let Some(sub) = unsent.take().and_then(|parked| parked.sub) {
                // Its caller returned `Interrupted` and waits for nothing: its
                // waiter goes, as after a cancelled ack wait.
                self.discard_waiter(&sub.queue, sub.id);
            }
        }
        if let Err(error) = socket.write_frame(frame, deadline, cancel) {
            let sent = cut(error)?;
            if sent == 0 {
                return Err(Unwritten::Cancelled);
            }
            *unsent = Some(Unsent {
                tail: frame[sent..].to_vec(),
                sub: None,
            });
            return Err(Unwritten::Parked);
        }
        Ok(())
    }

    /// What one frame from the hub does to the client.
    pub(super) fn handle_frame(&self, message: Message) {
        match message {
            Message::Wake(wake) => self.deliver(Delivery::Wake(wake)),
            Message::Ack(queue) => {
                // After `healthy: false` the hub acks a sub it will LISTEN on
                // reconnect (frames arrive in the order sent).
                let outcome = if self.healthy.load(Ordering::Acquire) {
                    Outcome::Acked
                } else {
                    Outcome::HubUnhealthy
                };
                self.answer_oldest(&queue, "ack", outcome);
            }
            Message::Status { healthy } => {
                let mut state = lock(&self.state);
                if state.dead_reason.is_none() {
                    let was = self.healthy.swap(healthy, Ordering::AcqRel);
                    if was != healthy {
                        crate::events::emit(crate::events::Event::HubHealth { healthy });
                    }
                    if was && !healthy {
                        // Nobody waits out ack_timeout for a LISTEN that needs a reconnect first.
                        state.waiters.answer_all(&Outcome::HubUnhealthy);
                    }
                    if healthy && !was && self.outage_logged.swap(false, Ordering::AcqRel) {
                        drop(state);
                        self.log.info(format!(
                            "{LOG_PREFIX} the master hub's database connection is back"
                        ));
                    }
                }
            }
            Message::Nack { queue, reason } => {
                self.answer_oldest(&queue, "nack", Outcome::Rejected(reason))
            }
            // In stream order among the wakes: the FailoverListener answers
            // a `move` and switches sides at the `marker` that follows.
            Message::Move(Move::Leave {
                channel,
                token,
                to: None,
            }) => self.deliver(Delivery::Move { channel, token }),
            Message::Marker(Marker::Read { token }) => self.deliver(Delivery::Marker { token }),
            // A move to another hub (`to`) is not acted on yet (docs/architecture.md,
            // "3. A new hub replaces an old one"): the hub closes us, and we fail over.
            Message::Sub(_)
            | Message::Unsub(_)
            | Message::Stats(_)
            | Message::Move(_)
            | Message::Marker(_)
            | Message::Replace(_)
            | Message::Unknown(_) => {
                self.log.warn(format!(
                    "{LOG_PREFIX} hub sent unknown frame {}; ignored",
                    describe_kind(&message)
                ));
            }
        }
    }

    /// Queues `delivery` unless the client is dead: under the state lock, so
    /// `Failed` stays the last delivery a client ever makes.
    fn deliver(&self, delivery: Delivery) {
        let state = lock(&self.state);
        if state.dead_reason.is_none() {
            self.deliveries.send(delivery);
        }
    }

    /// The hub's answer to the oldest sub for `queue`: an ack, or (our
    /// extension) `{"t":"nack","q":Q,"reason":R}`, which fails that waiter
    /// only; the client stays alive.
    pub(super) fn answer_oldest(&self, queue: &str, kind: &str, outcome: Outcome) {
        if !lock(&self.state).waiters.answer_oldest(queue, outcome) {
            self.log.debug(format!(
                "{LOG_PREFIX} {kind} for {queue:?} with no waiter; ignored"
            ));
        }
    }
}

/// The "t" of an unexpected frame, for the log line.
fn describe_kind(message: &Message) -> String {
    match message {
        Message::Sub(_) => "\"sub\"".into(),
        Message::Unsub(_) => "\"unsub\"".into(),
        Message::Stats(_) | Message::Move(_) | Message::Marker(_) | Message::Replace(_) => {
            format!("{:?}", message.kind())
        }
        Message::Unknown(object) => match object.get("t") {
            Some(kind) => kind.to_string(),
            None => "without \"t\"".into(),
        },
        _ => "?".into(),
    }
}
