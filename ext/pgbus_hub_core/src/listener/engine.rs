//! The engine task: owns the connection; one `select!` over notifications,
//! commands and the health tick.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::{
    Command, Cut, CutError, Event, ListenError, ListenerConfig, ListenerState, ListenerStats,
    Reply, Start,
};
use crate::conninfo::{describe, quote_ident, Connected, ServerMessage};
use crate::protocol::{key_channel, Wake, LARGE_PAYLOAD_MARK, LARGE_PAYLOAD_TABLE};
use crate::shutdown::Shutdown;

mod alignment;
mod connect;
mod handover;
mod live;
mod standby;

/// Deadline for the health probe (`SELECT 1`). A healthy primary answers in
/// well under a millisecond even under load, so 2 s never flaps on a slow
/// moment, yet a black-holed connection (no RST; TCP keepalives take minutes)
/// is detected within `health_check` + 2 s.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Deadline for the re-LISTEN after a reconnect (batches of up to
/// [`LISTEN_BATCH`] statements), and the most a LISTEN/UNLISTEN on a live
/// connection may take (see [`Engine::live_op_timeout`]). Past it the
/// connection is treated as broken and rebuilt.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// `UNLISTEN *` on stop is a courtesy (closing the session unlistens anyway):
/// never let it hold up shutdown.
const STOP_UNLISTEN_TIMEOUT: Duration = Duration::from_millis(200);

/// Time given to tokio-postgres to send Terminate and close the socket.
const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// Reconnect backoff: the first retry is immediate (a terminated backend or
/// a failover usually succeeds at once), then 100 ms doubling to 5 s. 100 ms
/// keeps a brief blip short; 5 s caps the wakes lost during an outage at a
/// few seconds while costing a down server at most one attempt per 5 s per
/// listener (a host's worth of fallback listeners is 10-100 connections).
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Statements per LISTEN batch (one simple query, one round trip).
const LISTEN_BATCH: usize = 500;

/// A deadline noticed this much after it passed was not watched: this process
/// did not run (SIGSTOP, a paused VM, a starved runtime), so it says nothing
/// of the connection (see [`op`]). A timer on a busy runtime is late by
/// milliseconds, not this.
const LATE_DEADLINE: Duration = Duration::from_millis(250);

enum Exit {
    Stop,
    /// The connection failed or closed: its backend's backlog is gone.
    Lost(String),
    /// A deadline passed: the backend may be alive, its backlog owed to us
    /// (the connection is kept for a handover).
    GaveUp(String),
}

/// [`Exit::GaveUp`] for a missed deadline, else [`Exit::Lost`].
fn exit_for(error: &OpError, reason: String) -> Exit {
    match error {
        OpError::Timeout => Exit::GaveUp(reason),
        _ => Exit::Lost(reason),
    }
}

enum OpError {
    Stopped,
    Timeout,
    Pg(tokio_postgres::Error),
}

pub(super) struct Engine<F> {
    config: ListenerConfig,
    stats: Arc<ListenerStats>,
    on_event: F,
    commands: mpsc::UnboundedReceiver<Command>,
    shutdown: Shutdown,
    /// The listen set: channel -> queue. What is LISTENed, or will be after reconnect.
    /// channel -> queue; the queue is shared by every wake it names (no copy per NOTIFY).
    channels: BTreeMap<String, Arc<str>>,
    /// Channels LISTENed on the current connection.
    live: HashSet<String>,
    /// Listens waiting for a connection, in arrival order.
    pending: Vec<(String, Reply)>,
    healthy: bool,
    /// The next `up` is a reconnect (catch-up, counted): after a lost
    /// connection, or from the start for an engine replacing one that ended.
    ever_connected: bool,
    backoff_step: u32,
    handover: handover::Handover,
    /// The cut to commit in the next connection's first transaction
    /// ([`Start::cut`]); taken once committed.
    start_cut: Option<Cut>,
    /// The marker to deliver last ([`super::ListenerHandle::stop_at`]).
    stop_at: Option<String>,
    /// That marker was delivered: nothing more is.
    stopped_at_cut: bool,
    /// The standby connection (off unless [`ListenerConfig::standby`]).
    standby: standby::Standby,
    /// Where the serving connection and the standby stand relative to the
    /// standby's alignment markers.
    alignment: alignment::Alignment,
    /// Channels out of the set the serving connection still LISTENs: their
    /// UNLISTEN waits for the marker that removes them from both
    /// connections' counted sets (docs/architecture.md, "Standby").
    deferred: std::collections::BTreeSet<String>,
}

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    pub(super) fn new(
        config: ListenerConfig,
        stats: Arc<ListenerStats>,
        commands: mpsc::UnboundedReceiver<Command>,
        shutdown: Shutdown,
        on_event: F,
    ) -> Self {
        stats.set_healthy(false);
        stats.state.set(ListenerState::Connecting);
        stats.set_backend(None);
        stats.channels.store(0, Ordering::Relaxed);
        let handover = handover::Handover::new(config.health_check);
        stats.set_private_channel(handover.channel());
        let standby = standby::Standby::new(config.standby);
        Self {
            config,
            stats,
            on_event,
            commands,
            shutdown,
            channels: BTreeMap::new(),
            live: HashSet::new(),
            pending: Vec::new(),
            healthy: false,
            ever_connected: false,
            backoff_step: 0,
            handover,
            start_cut: None,
            stop_at: None,
            stopped_at_cut: false,
            standby,
            alignment: alignment::Alignment::new(),
            deferred: std::collections::BTreeSet::new(),
        }
    }

    /// The set and the cut of the first transaction (see [`Start`]).
    pub(super) fn starting_with(mut self, start: Start) -> Self {
        for queue in &start.queues {
            match self.config.channel_for(queue) {
                Ok(channel) => {
                    self.channels.insert(channel, Arc::from(queue.as_str()));
                }
                // As for a refused listen: whoever asked learns why from its `listen`.
                Err(error) => self.config.log.debug(format!(
                    "pgbus-hub listener: not LISTENing on {queue:?}: {error}"
                )),
            }
        }
        self.stats
            .channels
            .store(self.channels.len(), Ordering::Relaxed);
        self.start_cut = start.cut;
        self
    }

    /// Deadline for a LISTEN/UNLISTEN batch on the live connection: the
    /// health-check cycle plus [`crate::listener::LISTEN_ACK_MARGIN`] (pgbus's
    /// own Listener's budget), at most [`OP_TIMEOUT`]. Subs wait behind it
    /// (the engine reads no command meanwhile), and a worker waits the cycle
    /// plus 2 s for its ack ([`crate::client::hub_ack_timeout`]): on a path
    /// that black-holes (no answer, no RST), the connection is given up, and
    /// the hub's workers told `healthy: false` (which acks their waiting subs),
    /// a second before any worker would fail over. A batch of 500 LISTENs
    /// takes milliseconds on a live server.
    pub(super) fn live_op_timeout(&self) -> Duration {
        crate::listener::listen_ack_timeout(self.config.health_check).min(OP_TIMEOUT)
    }

    /// This engine replaces one whose task ended: its first connection is a
    /// reconnect (see [`super::respawn`]).
    pub(super) fn resumed(mut self) -> Self {
        self.ever_connected = true;
        self.publish_state();
        self
    }

    /// Publishes where the connection stands (`stats.state()`, the
    /// connections that LISTEN, the standby's alignment), logging a change.
    fn publish_state(&self) {
        let state = ListenerState::of(self.healthy, self.ever_connected, self.handover.keeping());
        self.publish(state);
        let standby = self.standby.is_up();
        let connections = [self.healthy, self.handover.keeping(), standby];
        self.stats.listen_connections.store(
            connections.iter().filter(|up| **up).count(),
            Ordering::Relaxed,
        );
        self.stats
            .standby_aligned
            .store(standby && self.alignment.aligned(), Ordering::Relaxed);
    }

    /// Stopped is final: this engine's stats say so from then on.
    fn publish(&self, state: ListenerState) {
        if self.stats.state.get() == ListenerState::Stopped {
            return;
        }
        if let Some(previous) = self.stats.state.set(state) {
            self.config
                .log
                .debug(format!("pgbus-hub listener: {previous} -> {state}"));
        }
    }

    pub(super) async fn run(mut self) {
        let mut next = self.connect_phase().await;
        while let Some(mut session) = next.take() {
            let exit = match self.serve(&mut session).await {
                // A promoted connection still dropping what the lost one
                // delivered is not kept for a handover: the kept connection's
                // path does not drop, and would deliver those twice. Closed:
                // not exact (a second fault in a row), never twice.
                Exit::GaveUp(reason) if self.alignment.catching_up() => Exit::Lost(reason),
                exit => exit,
            };
            // The serving connection is lost with the standby aligned: the
            // standby serves from where it stopped (nothing lost, no reconnect).
            let reason = match &exit {
                Exit::Stop => None,
                Exit::Lost(reason) | Exit::GaveUp(reason) => Some(reason.clone()),
            };
            if let Some(reason) = reason.filter(|_| self.alignment.aligned()) {
                if let Some(promoted) = self.promote(session, &reason).await {
                    next = Some(promoted);
                    continue;
                }
                self.lost(&reason);
                self.close_standby().await;
                next = self.connect_phase().await;
                continue;
            }
            self.close_standby().await;
            match exit {
                Exit::Stop => {
                    let unlisten = session.client.batch_execute("UNLISTEN *");
                    let _ = tokio::time::timeout(STOP_UNLISTEN_TIMEOUT, unlisten).await;
                    session.close(CLOSE_GRACE).await;
                    break;
                }
                Exit::Lost(reason) => {
                    self.lost(&reason);
                    let _ = self.handover.new_connection_gone();
                    let why = "the new connection was lost too";
                    let _ = self.abandon(Some(&session), why).await;
                    // A failed LISTEN or health check ends the connection
                    // with notifications it had received still unread.
                    let _ = self.deliver_received(&mut session).await;
                    session.close(CLOSE_GRACE).await;
                }
                Exit::GaveUp(reason) => {
                    self.lost(&reason);
                    let own_marker = self.handover.new_connection_gone();
                    let why = "the new connection was given up too";
                    let _ = self.abandon(Some(&session), why).await;
                    // Read on: its backlog is handed over to the next one.
                    self.config.log.info(
                        "pgbus-hub listener: the given-up connection is read on (its backend may \
                         be alive) until the next one's handover marker",
                    );
                    self.handover.keep(session, own_marker);
                }
            }
            next = self.connect_phase().await;
        }
        self.close_kept().await;
        self.shutdown();
    }

    /// Delivers, in order, the notifications a lost connection had received
    /// and not yet handed on, up to a large payload (its row cannot be read
    /// on a lost connection). `Some(Exit::Stop)`: the engine was told to
    /// stop meanwhile.
    async fn deliver_received(&mut self, lost: &mut Connected) -> Option<Exit> {
        while let Ok(ServerMessage::Notification(notification)) = lost.messages.try_recv() {
            let (channel, payload) = (notification.channel(), notification.payload());
            if payload.starts_with(crate::protocol::LARGE_PAYLOAD_MARK) {
                break;
            }
            if let Some(Exit::Stop) = self.on_serving(lost, channel, payload).await {
                return Some(Exit::Stop);
            }
        }
        None
    }

    fn shutdown(&mut self) {
        self.publish(ListenerState::Stopped);
        self.set_healthy(false);
        self.stats.set_backend(None);
        for (_, reply) in self.pending.drain(..) {
            reply.send(Err(ListenError::Stopped));
        }
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Listen { reply, .. } = command {
                reply.send(Err(ListenError::Stopped));
            }
        }
        self.config.log.debug("pgbus-hub listener stopped");
    }

    fn lost(&mut self, reason: &str) {
        self.stats.set_last_error(reason);
        self.stats.set_backend(None);
        self.live.clear();
        self.deferred.clear();
        self.config.log.warn(format!(
            "pgbus-hub listener lost its PostgreSQL connection ({reason}) — reconnecting"
        ));
        self.set_healthy(false);
    }

    fn set_healthy(&mut self, healthy: bool) {
        if self.healthy != healthy {
            self.healthy = healthy;
            self.stats.set_healthy(healthy);
            self.publish_state();
            (self.on_event)(Event::Healthy(healthy));
        }
    }

    fn handle_down(&mut self, command: Command) {
        match command {
            Command::Listen { queue, reply } => {
                if let Some(channel) = self.admit(&queue, reply) {
                    self.pending.push(channel);
                }
            }
            Command::Unlisten { queue } => {
                self.forget(&queue);
            }
            Command::Cut { reply, .. } => reply.send(Err(CutError::NotListening)),
            Command::StopAt(token) => self.stop_at = token,
        }
    }

    /// Hands a delivery (a wake, a catch-up, a marker) on, unless the engine
    /// delivered the marker it was told to stop at: then nothing.
    fn deliver(&mut self, event: Event) {
        if self.stopped_at_cut {
            return;
        }
        if let Event::Marker(token) = &event {
            if self.stop_at.as_deref() == Some(token.as_str()) {
                self.stopped_at_cut = true;
                self.config.log.debug(format!(
                    "pgbus-hub listener: read the marker {token:?} it was told to stop at; \
                     delivering nothing more"
                ));
            }
        }
        (self.on_event)(event);
    }

    /// Validate a listen and add it to the set. Returns the reply still to be
    /// answered, or None if it was answered (refused).
    fn admit(&mut self, queue: &str, reply: Reply) -> Option<(String, Reply)> {
        match self.config.channel_for(queue) {
            Ok(channel) => {
                if self
                    .channels
                    .insert(channel.clone(), Arc::from(queue))
                    .is_none()
                {
                    self.set_changed();
                }
                self.stats
                    .channels
                    .store(self.channels.len(), Ordering::Relaxed);
                Some((channel, reply))
            }
            Err(error) => {
                // Debug only: whoever asked reports the refusal once, where it
                // knows who asked (the hub: WARN naming the connection; a
                // standalone listener: InvalidQueueError to its caller).
                self.config.log.debug(format!(
                    "pgbus-hub listener: not LISTENing on {queue:?}: {error}"
                ));
                reply.send(Err(error));
                None
            }
        }
    }

    /// The listen set changed: a standby still connecting LISTENs another
    /// set, and is replaced; one that is up is realigned
    /// ([`Self::realign_standby`]) and stays aligned.
    fn set_changed(&mut self) {
        self.standby.set_changed();
    }

    /// Drop `queue` from the set; answers its pending listens. Returns the
    /// channel if it was LISTENed on the live connection.
    fn forget(&mut self, queue: &str) -> Option<String> {
        let channel = self.config.channel_for(queue).ok()?;
        self.channels.remove(&channel)?;
        self.set_changed();
        self.stats
            .channels
            .store(self.channels.len(), Ordering::Relaxed);
        let (cancelled, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(c, _)| *c == channel);
        self.pending = kept;
        for (channel, reply) in cancelled {
            reply.send(Err(ListenError::Withdrawn { channel }));
        }
        self.live.remove(&channel).then_some(channel)
    }

    async fn serve(&mut self, session: &mut Connected) -> Exit {
        let period = self.config.health_check.max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The standby's own: the serving connection's stream resets the
        // serving tick, and says nothing of the standby's path.
        let mut standby_tick = tokio::time::interval_at(Instant::now() + period, period);
        standby_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            // Commands first: they come at a bounded rate (workers' subs),
            // while NOTIFYs can arrive without pause and must not starve acks.
            // Notifications keep their order among themselves either way.
            self.tend_standby().await;
            if let Some(exit) = self.flush_deferred(session).await {
                return exit;
            }
            self.publish_state(); // a handover may have ended
            let mut shutdown = self.shutdown.clone();
            let budget = self.handover.deadline();
            // A promoted connection still dropping what the lost one
            // delivered counts entries as that one did: the set must not
            // change until it is past (a few entries: its lag).
            let catching_up = self.alignment.catching_up();
            let standby_up = self.standby.is_up();
            tokio::select! {
                biased;
                () = shutdown.wait() => return Exit::Stop,
                command = self.commands.recv(), if !catching_up => {
                    let exit = match command {
                        None => Some(Exit::Stop),
                        Some(command) => self.live_command(session, command).await,
                    };
                    if let Some(exit) = exit {
                        return exit;
                    }
                    tick.reset();
                }
                // The budget, then the kept connection before the new one: its
                // backlog is older (and what the new one reads meanwhile is
                // held for it), so a busy new connection must not starve it.
                () = handover::expiry(budget) => {
                    if self.handover.renewed_if_late(Instant::now()) {
                        self.config.log.info(
                            "pgbus-hub listener: the handover's budget passed while this process did not \
                             run — the given-up connection gets its budget again",
                        );
                        continue;
                    }
                    let why = "no handover marker within its budget";
                    if let Some(exit) = self.abandon(Some(session), why).await {
                        return exit;
                    }
                }
                message = self.handover.recv() => {
                    if let Some(exit) = self.on_kept(message, Some(session)).await {
                        return exit;
                    }
                }
                message = session.messages.recv() => match message {
                    Some(ServerMessage::Notification(notification)) => {
                        if let Some(exit) = self.on_serving(session, notification.channel(), notification.payload()).await {
                            return exit;
                        }
                        tick.reset();
                    }
                    Some(ServerMessage::Lost(reason)) => return Exit::Lost(reason),
                    None => return Exit::Lost("the connection driver ended".into()),
                },
                // After the serving connection: it moves the position the
                // standby's held entries are dropped up to.
                next = self.standby.next() => {
                    if let Some(exit) = self.on_standby(next).await {
                        return exit;
                    }
                    standby_tick.reset();
                }
                _ = tick.tick() => {
                    match op(self.shutdown.clone(), session.client.batch_execute("SELECT 1"), PROBE_TIMEOUT).await {
                        Ok(()) => {}
                        Err(OpError::Stopped) => return Exit::Stop,
                        Err(error) => {
                            let reason = format!("health check failed: {}", op_reason(&error));
                            return exit_for(&error, reason);
                        }
                    }
                }
                _ = standby_tick.tick(), if standby_up => self.probe_standby().await,
            }
        }
    }

    /// Delivers one NOTIFY on a LISTENed channel. Inline, in order: a large
    /// payload's row is read before anything after it is delivered.
    async fn notify(&mut self, session: &Connected, channel: &str, payload: &str) -> Option<Exit> {
        if channel == self.handover.channel() {
            // A cut's marker: the handover's own never get here (Handover's
            // classify_new and classify_old take them).
            self.deliver(Event::Marker(payload.to_owned()));
            return None;
        }
        let queue = match self.channels.get(channel) {
            Some(queue) if !self.stopped_at_cut => queue.clone(),
            _ => {
                self.stats
                    .ignored_notifications
                    .fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        self.stats.notifications.fetch_add(1, Ordering::Relaxed);
        let payload: Option<Arc<str>> = match key_channel(&queue) {
            // A queue's empty payload is a durable wake.
            None => (!payload.is_empty()).then(|| Arc::from(payload)),
            Some(raw) => match payload.strip_prefix(LARGE_PAYLOAD_MARK) {
                // A raw channel's payload is delivered as it is, empty or not.
                None => Some(Arc::from(payload)),
                Some(id) => match self.large_payload(session, raw, id).await {
                    Ok(Some(large)) => Some(Arc::from(large)),
                    Ok(None) => return None,
                    Err(exit) => return Some(exit),
                },
            },
        };
        self.deliver(Event::Wake(Wake { queue, payload }));
        None
    }

    /// The payload a large broadcast stored; None (logged) when it cannot be
    /// had. (`&mut self`: the engine is Send, not Sync.)
    async fn large_payload(
        &mut self,
        session: &Connected,
        channel: &str,
        id: &str,
    ) -> Result<Option<String>, Exit> {
        let Ok(id) = id.parse::<i64>() else {
            self.config.log.warn(format!(
                "pgbus-hub listener: a NOTIFY on {channel:?} carries a malformed large-payload reference — not delivered"
            ));
            return Ok(None);
        };
        let sql = format!("SELECT payload FROM {LARGE_PAYLOAD_TABLE} WHERE id = $1");
        match op(
            self.shutdown.clone(),
            session.client.query_opt(&sql, &[&id]),
            PROBE_TIMEOUT,
        )
        .await
        {
            Ok(Some(row)) => Ok(Some(row.get(0))),
            Ok(None) => {
                self.config.log.warn(format!(
                    "pgbus-hub listener: large payload {id} for {channel:?} is gone from {LARGE_PAYLOAD_TABLE} \
                     (removed after its retention) — not delivered"
                ));
                Ok(None)
            }
            Err(OpError::Stopped) => Err(Exit::Stop),
            // No answer: the connection is stuck (a black-holed path), and the
            // subs queued behind this read would wait out a LISTEN's deadline
            // after it. Given up now, as a failed health check would.
            Err(OpError::Timeout) => Err(Exit::GaveUp(format!(
                "reading large payload {id} for {channel:?} got no answer within {PROBE_TIMEOUT:?}"
            ))),
            Err(error) => {
                self.config.log.warn(format!(
                    "pgbus-hub listener: reading large payload {id} for {channel:?} failed: {} — not delivered",
                    op_reason(&error)
                ));
                Ok(None)
            }
        }
    }
}

/// Run a client operation bounded by `timeout`, abandoned at once on stop.
/// A deadline that passed while this process was not running gets `timeout`
/// once more: its answer may be in the socket unread, or its request not yet
/// written, because the connection's driver has not run since (a stopped Puma
/// master's LISTEN was otherwise given up on SIGCONT, and with the connection
/// the NOTIFYs queued for it).
async fn op<T>(
    mut shutdown: Shutdown,
    operation: impl Future<Output = Result<T, tokio_postgres::Error>>,
    timeout: Duration,
) -> Result<T, OpError> {
    let mut operation = std::pin::pin!(operation);
    let watched = async {
        let started = Instant::now();
        match tokio::time::timeout(timeout, &mut operation).await {
            Err(_) if started.elapsed() > timeout + LATE_DEADLINE => {
                tokio::time::timeout(timeout, &mut operation).await
            }
            outcome => outcome,
        }
    };
    tokio::select! {
        biased;
        () = shutdown.wait() => Err(OpError::Stopped),
        outcome = watched => match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(OpError::Pg(error)),
            Err(_) => Err(OpError::Timeout),
        },
    }
}

/// `LISTEN "a";LISTEN "b";...`. Channels were validated (no NUL) on admission.
fn listen_sql(verb: &str, channels: &[String]) -> String {
    let mut sql = String::new();
    for channel in channels {
        if let Ok(quoted) = quote_ident(channel) {
            sql.push_str(verb);
            sql.push(' ');
            sql.push_str(&quoted);
            sql.push(';');
        }
    }
    sql
}

fn op_reason(error: &OpError) -> String {
    match error {
        OpError::Stopped => "stopped".into(),
        OpError::Timeout => "no answer in time".into(),
        OpError::Pg(error) => describe(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation answered by another thread at `answer_at` after the start.
    fn answered_at(answer_at: Duration) -> impl Future<Output = Result<u8, tokio_postgres::Error>> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(answer_at);
            let _ = answer.send(7);
        });
        async move { Ok(answered.await.unwrap_or(0)) }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deadline_that_passed_while_the_process_was_frozen_is_given_once_more() {
        let (_trigger, shutdown) = crate::shutdown::shutdown();
        // Frozen 500 ms (past deadline + LATE_DEADLINE by 150 ms); answered
        // halfway through the second 100 ms it is given (50 ms of slack each
        // side: with 0, as before, a loaded machine failed it 2 times in 6).
        let deadline = Duration::from_millis(100);
        let asked = tokio::spawn(op(
            shutdown,
            answered_at(Duration::from_millis(550)),
            deadline,
        ));
        tokio::task::yield_now().await; // the operation runs: its deadline is set
                                        // The whole runtime stops (SIGSTOP) far past the deadline; the answer comes
                                        // a round trip after it resumes.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(asked.await.unwrap().ok(), Some(7));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deadline_watched_as_it_passed_ends_the_operation() {
        let (_trigger, shutdown) = crate::shutdown::shutdown();
        let outcome = op(
            shutdown,
            answered_at(Duration::from_secs(2)),
            Duration::from_millis(50),
        )
        .await;
        assert!(matches!(outcome, Err(OpError::Timeout)));
    }
}
