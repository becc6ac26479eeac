//! The standby (issue 57; the argument is docs/architecture.md's "Standby"):
//! a second connection LISTENs the same set and commits an alignment marker
//! on the engine's private channel with its LISTENs, in one transaction.
//! Both connections read that marker at one queue position, then the same
//! counted entries in the same order: the standby holds what it read ahead
//! of the serving connection, and when the serving connection is lost it
//! delivers from exactly where that one stopped.
//!
//! `alignment.rs` is the bookkeeping (pure: positions, what is held, what
//! is dropped); [`Standby`] is the connection (connect with its own
//! backoff, its first transaction, its messages).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::alignment::{is_alignment_token, Kind, Serving, Standby as Read, HELD_BYTES_LIMIT};
use super::connect::{check_primary, listen_all};
use super::{listen_sql, op_reason, Engine, Exit, CLOSE_GRACE};
use crate::conninfo::{Connected, ConnectionOptions, ServerMessage};
use crate::listener::{Backend, Event};
use crate::shutdown::Shutdown;

type Connecting = Pin<Box<dyn Future<Output = Result<(Connected, Backend), String>> + Send>>;

enum Slot {
    Down,
    Connecting(Connecting),
    /// Boxed: a connection is large, and the slot is mostly down or connecting.
    Up(Box<(Connected, Backend)>),
}

/// See [`Standby::next`].
pub(super) enum Next {
    /// None: its driver ended.
    Message(Option<ServerMessage>),
    Connected(Result<(Connected, Backend), String>),
}

/// The standby connection, when the engine was started with one.
pub(super) struct Standby {
    enabled: bool,
    slot: Slot,
    backoff_step: u32,
    /// The channels the standby LISTENs (or its connect's first transaction will).
    listened: Vec<String>,
    /// When the standby's current alignment marker was committed, until the
    /// serving connection reads it (see [`Engine::probe_standby`]).
    aligning_since: Option<tokio::time::Instant>,
    /// The listen set changed while the standby was connecting: its first
    /// transaction LISTENed another set, so it is replaced (see
    /// [`Engine::tend_standby`]). One that is up is realigned in place instead
    /// ([`Engine::realign_standby`]).
    stale: bool,
}

impl Standby {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            slot: Slot::Down,
            backoff_step: 0,
            listened: Vec::new(),
            aligning_since: None,
            stale: false,
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(super) fn is_up(&self) -> bool {
        matches!(self.slot, Slot::Up(..))
    }

    pub(super) fn set_changed(&mut self) {
        if matches!(self.slot, Slot::Connecting(_)) {
            self.stale = true;
        }
    }

    /// What the standby has next: a message when up, its connect's outcome
    /// when connecting; pending otherwise.
    pub(super) async fn next(&mut self) -> Next {
        match &mut self.slot {
            Slot::Up(up) => Next::Message(up.0.messages.recv().await),
            Slot::Connecting(connecting) => Next::Connected(connecting.as_mut().await),
            Slot::Down => std::future::pending().await,
        }
    }

    fn take(&mut self) -> Option<(Connected, Backend)> {
        match std::mem::replace(&mut self.slot, Slot::Down) {
            Slot::Up(up) => Some(*up),
            _ => None,
        }
    }
}

/// A standby's way up: connect, the primary check and its first
/// transaction (the set, the private channel, its alignment marker),
/// pipelined as the serving connection's re-LISTEN is.
async fn connect(
    options: ConnectionOptions,
    delay: Duration,
    shutdown: Shutdown,
    queries: Vec<String>,
) -> Result<(Connected, Backend), String> {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let session = options.connect().await.map_err(|error| error.0)?;
    let check = async { check_primary(&session).await.map_err(|(_, reason)| reason) };
    let listen = async {
        listen_all(shutdown, &session, &queries)
            .await
            .map_err(|error| format!("its first transaction failed: {}", op_reason(&error)))
    };
    match futures_util::future::try_join(check, listen).await {
        Ok((backend, ())) => Ok((session, backend)),
        Err(reason) => {
            session.close(CLOSE_GRACE).await;
            Err(reason)
        }
    }
}

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    /// What an entry is for the alignment (see [`Kind`]).
    pub(super) fn kind<'a>(&self, channel: &'a str, payload: &'a str) -> Kind<'a> {
        let private = channel == self.handover.channel();
        if private && is_alignment_token(payload) {
            Kind::Marker(payload)
        } else {
            let cut = private && crate::listener::is_cut_token(payload);
            Kind::Entry { channel, cut }
        }
    }

    /// A notification on the serving connection (without the option
    /// `standby`, handled as before it): dropped if the alignment says so,
    /// else handled as without a standby; its position moves on
    /// once it was handled (a large payload not read is the standby's to
    /// deliver after a promotion).
    pub(super) async fn on_serving(
        &mut self,
        session: &Connected,
        channel: &str,
        payload: &str,
    ) -> Option<Exit> {
        if !self.standby.enabled() {
            return self.on_new(session, channel, payload).await;
        }
        let kind = self.kind(channel, payload);
        match self.alignment.serving_read(kind) {
            Serving::Drop(unlisten) => self.unlisten_at_marker(session, unlisten).await,
            Serving::Deliver { counted } => {
                let exit = self.on_new(session, channel, payload).await;
                if exit.is_none() && counted {
                    self.alignment.serving_delivered();
                }
                exit
            }
        }
    }

    /// The serving connection read a marker at which the set lost
    /// `channels`: UNLISTEN now those not subscribed again since (deferred
    /// to here: see [`crate::listener::engine::alignment::Unlisten`]).
    async fn unlisten_at_marker(
        &mut self,
        session: &Connected,
        channels: Vec<String>,
    ) -> Option<Exit> {
        let mut unlisten = Vec::new();
        for channel in channels {
            self.deferred.remove(&channel);
            if !self.channels.contains_key(&channel) {
                unlisten.push(channel);
            }
        }
        self.unlisten_now(session, &unlisten).await
    }

    /// UNLISTEN `channels` on the serving connection.
    pub(super) async fn unlisten_now(
        &mut self,
        session: &Connected,
        channels: &[String],
    ) -> Option<Exit> {
        if channels.is_empty() {
            return None;
        }
        let sql = listen_sql("UNLISTEN", channels);
        let deadline = self.live_op_timeout();
        match super::op(
            self.shutdown.clone(),
            session.client.batch_execute(&sql),
            deadline,
        )
        .await
        {
            Ok(()) => None,
            Err(super::OpError::Stopped) => Some(Exit::Stop),
            // The channels are out of the set either way (a NOTIFY on them is ignored).
            Err(super::OpError::Pg(error)) if super::live::refused_by_server(&error, session) => {
                self.config.log.warn(format!(
                    "pgbus-hub listener: UNLISTEN of {channels:?} refused: {}",
                    crate::conninfo::describe(&error)
                ));
                None
            }
            Err(error) => {
                let reason = format!(
                    "UNLISTEN failed: {} (deadline {deadline:?})",
                    op_reason(&error)
                );
                Some(super::exit_for(&error, reason))
            }
        }
    }

    /// UNLISTENs deferred to markers that will not be read as such any more
    /// (the standby is gone, so the chain is): run now.
    pub(super) async fn flush_deferred(&mut self, session: &Connected) -> Option<Exit> {
        if self.alignment.chained() || self.deferred.is_empty() {
            return None;
        }
        let deferred = std::mem::take(&mut self.deferred);
        let channels: Vec<String> = deferred
            .into_iter()
            .filter(|channel| !self.channels.contains_key(channel))
            .collect();
        self.unlisten_now(session, &channels).await
    }

    /// An UNLISTEN on the serving connection waits for the marker that
    /// removes the channel from both connections' counted sets while a
    /// standby is up with a chain; else it runs at once, as without one.
    pub(super) fn defers_unlisten(&self) -> bool {
        self.standby.is_up() && self.alignment.chained()
    }

    /// What the standby had next. Returns an exit of the SERVING connection
    /// (it lags too far behind: promote).
    pub(super) async fn on_standby(&mut self, next: Next) -> Option<Exit> {
        let message = match next {
            Next::Message(message) => message,
            Next::Connected(outcome) => {
                self.on_standby_connected(outcome);
                return None;
            }
        };
        let notification = match message {
            Some(ServerMessage::Notification(notification)) => notification,
            Some(ServerMessage::Lost(reason)) => {
                self.standby_gone(&format!("it failed: {reason}")).await;
                return None;
            }
            None => {
                self.standby_gone("its connection driver ended").await;
                return None;
            }
        };
        let (channel, payload) = (notification.channel(), notification.payload());
        let kind = self.kind(channel, payload);
        match self.alignment.standby_read(kind, payload) {
            Read::Taken(unlisten) => {
                self.standby_unlisten(unlisten).await;
                None
            }
            Read::Overflow => Some(Exit::GaveUp(format!(
                "the standby holds more than {HELD_BYTES_LIMIT} bytes the serving connection \
                 has not read"
            ))),
        }
    }

    /// The standby read a marker at which the set lost `channels`: UNLISTEN
    /// there those not subscribed again since. One that fails is replaced.
    async fn standby_unlisten(&mut self, channels: Vec<String>) {
        let channels: Vec<String> = channels
            .into_iter()
            .filter(|channel| !self.channels.contains_key(channel))
            .collect();
        let Slot::Up(up) = &self.standby.slot else {
            return;
        };
        if channels.is_empty() {
            return;
        }
        let sql = listen_sql("UNLISTEN", &channels);
        let deadline = self.live_op_timeout();
        let unlisten = up.0.client.batch_execute(&sql);
        if let Err(error) = super::op(self.shutdown.clone(), unlisten, deadline).await {
            let why = format!("its UNLISTEN failed: {}", op_reason(&error));
            self.standby_gone(&why).await;
        }
    }

    /// The standby's connect ended.
    fn on_standby_connected(&mut self, outcome: Result<(Connected, Backend), String>) {
        match outcome {
            Ok((session, backend)) => {
                self.config.log.debug(format!(
                    "pgbus-hub listener: standby connected (backend pid {}); aligning at its marker",
                    backend.pid
                ));
                self.standby.backoff_step = 0;
                self.standby.aligning_since = Some(tokio::time::Instant::now());
                self.standby.slot = Slot::Up(Box::new((session, backend)));
            }
            Err(reason) => {
                self.alignment.reset();
                self.standby.slot = Slot::Down;
                self.config.log.warn(format!(
                    "pgbus-hub listener: the standby could not connect ({reason}) — retrying \
                     (attempt {})",
                    self.standby.backoff_step
                ));
            }
        }
    }

    /// Closes the standby (nothing to hand over: it delivers nothing); a
    /// new one is connected by [`Self::tend_standby`]. During a stop an
    /// operation on it ends "stopped": that is the stop, closed quietly.
    pub(super) async fn standby_gone(&mut self, why: &str) {
        if self.shutdown.is_triggered() {
            return self.close_standby().await;
        }
        self.alignment.reset();
        if let Some((session, backend)) = self.standby.take() {
            self.config.log.warn(format!(
                "pgbus-hub listener: the standby (backend pid {}) is gone ({why}) — connecting a \
                 new one",
                backend.pid
            ));
            session.close(CLOSE_GRACE).await;
        }
        self.standby.slot = Slot::Down;
    }

    /// Closes the standby, whatever it was doing (a stop, the serving
    /// connection lost without it aligned).
    pub(super) async fn close_standby(&mut self) {
        self.alignment.reset();
        self.standby.stale = false;
        if let Some((session, _)) = self.standby.take() {
            session.close(CLOSE_GRACE).await;
        }
        self.standby.slot = Slot::Down;
    }

    /// Replaces a stale standby and starts a connect when none is up or
    /// coming: only while the serving connection serves with no handover
    /// or start cut to settle, and no promotion is still catching up.
    pub(super) async fn tend_standby(&mut self) {
        if !self.standby.enabled {
            return;
        }
        if self.standby.stale {
            self.config.log.debug(
                "pgbus-hub listener: the listen set changed while the standby connected — it is \
                 replaced by one LISTENing the new set",
            );
            self.close_standby().await;
        }
        self.realign_standby().await;
        self.standby_alignment_budget().await;
        if !matches!(self.standby.slot, Slot::Down)
            || !self.handover.settled()
            || !self.alignment.idle()
        {
            return;
        }
        let step = self.standby.backoff_step;
        self.standby.backoff_step = step.saturating_add(1);
        self.standby.listened = self.channels.keys().cloned().collect();
        let token = self.alignment.begin(self.standby.listened.clone());
        let queries = self.standby_queries(&token);
        let connecting = connect(
            self.config.connection.clone(),
            super::connect::backoff_delay(step),
            self.shutdown.clone(),
            queries,
        );
        self.standby.slot = Slot::Connecting(Box::pin(connecting));
    }

    /// A standby whose marker the serving connection has not read within
    /// the handover's budget (40 cycles) is replaced: on a multi-host
    /// conninfo the two may have reached different servers, whose queues are
    /// others, and they never align. Looked at on every turn of the loop.
    async fn standby_alignment_budget(&mut self) {
        if !self.standby.is_up() {
            return;
        }
        if self.alignment.aligned() {
            self.standby.aligning_since = None;
            return;
        }
        let budget = self
            .config
            .health_check
            .saturating_mul(super::handover::BUDGET_CYCLES);
        if self
            .standby
            .aligning_since
            .is_some_and(|since| since.elapsed() > budget)
        {
            let why = format!("the serving connection did not read its marker within {budget:?}");
            self.standby_gone(&why).await;
        }
    }

    /// The standby's first transaction: the whole set, the private channel
    /// and the alignment marker.
    fn standby_queries(&self, token: &str) -> Vec<String> {
        let channel = self.handover.quoted_channel();
        self.first_transaction(&format!("LISTEN {channel};NOTIFY {channel}, '{token}';"))
    }

    /// A standby that is up LISTENs what the set gained, with a new link
    /// of the chain (an alignment marker carrying the change), in one
    /// transaction: called after the serving connection's LISTENs ran (so
    /// both LISTEN a new channel from that marker on) and before their acks.
    /// Each connection switches its counted set, and UNLISTENs what the set
    /// lost, when it reads the marker: the standby stays aligned. One that
    /// fails or does not answer is replaced.
    pub(super) async fn realign_standby(&mut self) {
        if !self.standby.is_up() || self.standby.listened.iter().eq(self.channels.keys()) {
            return;
        }
        let added: Vec<String> = self
            .channels
            .keys()
            .filter(|channel| self.standby.listened.binary_search(channel).is_err())
            .cloned()
            .collect();
        let removed: Vec<String> = self
            .standby
            .listened
            .iter()
            .filter(|channel| !self.channels.contains_key(*channel))
            .cloned()
            .collect();
        let listens = listen_sql("LISTEN", &added);
        let Some(token) = self.alignment.change(added, removed) else {
            self.standby_gone("it has no chain to realign").await;
            return;
        };
        let sql = format!(
            "BEGIN;{listens}NOTIFY {}, '{token}';COMMIT",
            self.handover.quoted_channel()
        );
        let Slot::Up(up) = &self.standby.slot else {
            return;
        };
        let realign = up.0.client.batch_execute(&sql);
        let deadline = self.live_op_timeout();
        match super::op(self.shutdown.clone(), realign, deadline).await {
            Ok(()) => self.standby.listened = self.channels.keys().cloned().collect(),
            Err(error) => {
                let why = format!("realigning it failed: {}", op_reason(&error));
                self.standby_gone(&why).await;
            }
        }
    }

    /// The standby's health check, on its own tick (reset by what it
    /// reads): one that fails or gets no answer is replaced.
    pub(super) async fn probe_standby(&mut self) {
        let Slot::Up(up) = &self.standby.slot else {
            return;
        };
        let probe = up.0.client.batch_execute("SELECT 1");
        let outcome = super::op(self.shutdown.clone(), probe, super::PROBE_TIMEOUT).await;
        if let Err(error) = outcome {
            let why = format!("health check failed: {}", op_reason(&error));
            self.standby_gone(&why).await;
        }
    }

    /// The serving connection `old` is lost (`reason`): with the standby
    /// aligned, it serves from exactly where `old` stopped. Returns it, or
    /// None (not aligned: the caller reconnects as without a standby).
    pub(super) async fn promote(&mut self, old: Connected, reason: &str) -> Option<Connected> {
        if !(self.standby.is_up() && self.alignment.aligned()) {
            old.close(CLOSE_GRACE).await;
            return None;
        }
        let mut old = old;
        // What `old` received before its loss, so its position is final (a
        // large payload and what follows it: left to the standby).
        if self.deliver_received(&mut old).await.is_some() {
            old.close(CLOSE_GRACE).await;
            return None;
        }
        let held = self.alignment.promote()?;
        let (session, backend) = self.standby.take()?;
        self.stats
            .standby_promotions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.stats.set_last_error(reason);
        self.config.log.warn(format!(
            "pgbus-hub listener: the serving connection was lost ({reason}); the standby (backend \
             pid {}) serves from where it stopped ({} notifications it held delivered) — nothing \
             lost",
            backend.pid,
            held.len()
        ));
        self.stats.set_backend(Some(backend));
        // The lost connection's UNLISTENs: the promoted one runs its own at
        // the markers it reads.
        self.deferred.clear();
        // Its first transaction LISTENed the set, unchanged since (a change
        // replaces the standby).
        self.live = self.channels.keys().cloned().collect();
        for (channel, payload) in held {
            // The new serving connection's exit comes back through its own messages.
            if let Some(Exit::Stop) = self.notify(&session, &channel, &payload).await {
                break;
            }
        }
        old.close(CLOSE_GRACE).await;
        self.standby.backoff_step = 0;
        Some(session)
    }
}
