//! The standby (issue 57; the argument is docs/architecture.md's "Standby"):
//! a second connection LISTENs the same set and commits an alignment marker
//! on the engine's private channel with its LISTENs, in one transaction.
//! Both connections read that marker at one queue position, then the same
//! counted entries in the same order: the standby holds what it read ahead
//! of the serving connection, and when the serving connection is lost it
//! delivers from exactly where that one stopped.
//!
//! [`Alignment`] is the bookkeeping (pure: positions, what is held, what
//! is dropped); [`Standby`] is the connection (connect with its own
//! backoff, its first transaction, its messages).

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::time::Duration;

use super::connect::{check_primary, listen_all};
use super::{listen_sql, op_reason, Engine, Exit, CLOSE_GRACE, LISTEN_BATCH};
use crate::conninfo::{Connected, ConnectionOptions, ServerMessage};
use crate::listener::{Backend, Event};
use crate::shutdown::Shutdown;

/// An alignment marker's token starts so: neither a handover's tokens
/// (`<pid>.<random>.<n>`) nor a cut's (`move.`) do.
const TOKEN_PREFIX: &str = "standby.";

/// The most payload bytes the standby holds ahead of the serving
/// connection (the handover's bound). Past it the serving connection lags
/// for a reason of its own (a stalled path, a full socket): it is given up
/// and the standby promoted, which is exact.
pub(super) const HELD_BYTES_LIMIT: usize = 32 << 20;

pub(super) fn is_alignment_token(payload: &str) -> bool {
    payload.starts_with(TOKEN_PREFIX)
}

/// What an entry read on either connection is, for the alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind<'a> {
    /// An alignment marker (ours or a stale one): never delivered.
    Marker(&'a str),
    /// On a channel of the set, or a cut's marker: both connections count it.
    Counted,
    /// Anything else (a channel out of the set, a handover marker): not counted.
    Other,
}

/// What the standby does with an entry it read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Held {
    /// Dropped, or held: nothing to do now.
    Taken,
    /// Held past [`HELD_BYTES_LIMIT`]: give the serving connection up.
    Overflow,
}

#[derive(Debug)]
enum Phase {
    /// No standby aligning or aligned (a stale alignment marker is dropped).
    Idle,
    /// A standby committed `token`. `serving`/`standby`: Some(n) once that
    /// connection read the marker, n the counted entries it read since.
    Aligning {
        token: String,
        serving: Option<u64>,
        standby: Option<u64>,
        /// Counted entries the standby read that the serving connection has
        /// not, in order, with their index after the marker.
        held: VecDeque<(u64, String, String)>,
        held_bytes: usize,
    },
    /// The standby serves now and drops what it reads up to where the lost
    /// connection stopped: `token`, then `through` counted entries.
    Promoted {
        token: String,
        read: Option<u64>,
        through: u64,
    },
}

/// Where the two connections stand relative to the standby's alignment marker.
#[derive(Debug)]
pub(super) struct Alignment {
    random: u64,
    counter: u64,
    phase: Phase,
}

impl Alignment {
    pub(super) fn new() -> Self {
        Self {
            random: RandomState::new().build_hasher().finish(),
            counter: 0,
            phase: Phase::Idle,
        }
    }

    /// A new standby's marker token (unique per standby connection): the
    /// alignment starts over from it.
    pub(super) fn begin(&mut self) -> String {
        self.counter += 1;
        let token = format!(
            "{TOKEN_PREFIX}{}.{:016x}.{}",
            std::process::id(),
            self.random,
            self.counter
        );
        self.phase = Phase::Aligning {
            token: token.clone(),
            serving: None,
            standby: None,
            held: VecDeque::new(),
            held_bytes: 0,
        };
        token
    }

    /// The standby is gone (or was never aligned): nothing to align.
    pub(super) fn reset(&mut self) {
        self.phase = Phase::Idle;
    }

    /// The serving connection read the standby's marker: a loss from now
    /// on is covered.
    pub(super) fn aligned(&self) -> bool {
        matches!(
            self.phase,
            Phase::Aligning {
                serving: Some(_),
                ..
            }
        )
    }

    /// Neither aligning nor catching up: a new standby may align (while a
    /// promoted connection catches up, its marker would be another reference).
    pub(super) fn idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// A promoted connection is still dropping what the lost one delivered.
    pub(super) fn catching_up(&self) -> bool {
        matches!(self.phase, Phase::Promoted { .. })
    }

    /// An entry the serving connection read, before it is delivered: true
    /// if it is dropped (an alignment marker; after a promotion, what the
    /// lost connection delivered).
    pub(super) fn serving_drops(&mut self, kind: Kind<'_>) -> bool {
        match (&mut self.phase, kind) {
            (_, Kind::Other) => false,
            (Phase::Idle, Kind::Marker(_)) => true,
            (Phase::Idle, Kind::Counted) => false,
            (Phase::Aligning { token, serving, .. }, Kind::Marker(read)) => {
                if token == read {
                    *serving = Some(0);
                }
                true
            }
            (Phase::Aligning { .. }, Kind::Counted) => false,
            (Phase::Promoted { token, read, .. }, Kind::Marker(marker)) => {
                if token == marker {
                    *read = Some(0);
                }
                true
            }
            (Phase::Promoted { read, through, .. }, Kind::Counted) => match read {
                None => true,
                Some(index) => {
                    *index += 1;
                    if *index <= *through {
                        return true;
                    }
                    // Past where the lost connection stopped: delivering again.
                    self.phase = Phase::Idle;
                    false
                }
            },
        }
    }

    /// The serving connection delivered a counted entry (its position moves
    /// on; what the standby held up to it is dropped).
    pub(super) fn serving_delivered(&mut self) {
        if let Phase::Aligning {
            serving: Some(position),
            held,
            held_bytes,
            ..
        } = &mut self.phase
        {
            *position += 1;
            while held.front().is_some_and(|(index, ..)| index <= position) {
                if let Some((_, channel, payload)) = held.pop_front() {
                    *held_bytes -= channel.len() + payload.len();
                }
            }
        }
    }

    /// An entry the standby read (it delivers nothing): dropped before its
    /// marker and up to the serving connection's position, held after it.
    pub(super) fn standby_read(&mut self, kind: Kind<'_>, channel: &str, payload: &str) -> Held {
        let Phase::Aligning {
            token,
            serving,
            standby,
            held,
            held_bytes,
        } = &mut self.phase
        else {
            return Held::Taken;
        };
        match (kind, standby.as_mut()) {
            (Kind::Marker(read), _) => {
                if token == read {
                    *standby = Some(0);
                }
            }
            (Kind::Counted, Some(index)) => {
                *index += 1;
                if serving.is_some_and(|position| *index <= position) {
                    return Held::Taken;
                }
                *held_bytes += channel.len() + payload.len();
                held.push_back((*index, channel.to_owned(), payload.to_owned()));
                if *held_bytes > HELD_BYTES_LIMIT {
                    return Held::Overflow;
                }
            }
            // Before its marker: the serving connection's to deliver.
            (Kind::Counted | Kind::Other, _) => {}
        }
        Held::Taken
    }

    /// The serving connection is lost: the standby serves. Returns what it
    /// held (all after the lost connection's position, in order), or None
    /// when not aligned (the lost backend alone had what lay between).
    pub(super) fn promote(&mut self) -> Option<Vec<(String, String)>> {
        if !self.aligned() {
            return None;
        }
        let Phase::Aligning {
            token,
            serving: Some(through),
            standby,
            held,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return None;
        };
        let past = standby.is_some_and(|index| index >= through);
        if !past {
            self.phase = Phase::Promoted {
                token,
                read: standby,
                through,
            };
        }
        Some(
            held.into_iter()
                .map(|(_, channel, payload)| (channel, payload))
                .collect(),
        )
    }
}

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
    pub(super) fn kind<'a>(&self, channel: &str, payload: &'a str) -> Kind<'a> {
        let private = channel == self.handover.channel();
        if private && is_alignment_token(payload) {
            Kind::Marker(payload)
        } else if self.channels.contains_key(channel)
            || (private && crate::listener::is_cut_token(payload))
        {
            Kind::Counted
        } else {
            Kind::Other
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
        if self.alignment.serving_drops(kind) {
            return None;
        }
        let exit = self.on_new(session, channel, payload).await;
        if exit.is_none() && kind == Kind::Counted {
            self.alignment.serving_delivered();
        }
        exit
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
        match self.alignment.standby_read(kind, channel, payload) {
            Held::Taken => None,
            Held::Overflow => Some(Exit::GaveUp(format!(
                "the standby holds more than {HELD_BYTES_LIMIT} bytes the serving connection \
                 has not read"
            ))),
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
    /// new one is connected by [`Self::tend_standby`].
    pub(super) async fn standby_gone(&mut self, why: &str) {
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
        let token = self.alignment.begin();
        self.standby.listened = self.channels.keys().cloned().collect();
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
        let channels: Vec<String> = self.channels.keys().cloned().collect();
        let mut queries: Vec<String> = channels
            .chunks(LISTEN_BATCH)
            .map(|chunk| listen_sql("LISTEN", chunk))
            .collect();
        if queries.is_empty() {
            queries.push(String::new());
        }
        queries[0].insert_str(0, "BEGIN;");
        if let Some(last) = queries.last_mut() {
            let channel = self.handover.quoted_channel();
            last.push_str(&format!(
                "LISTEN {channel};NOTIFY {channel}, '{token}';COMMIT"
            ));
        }
        queries
    }

    /// A standby that is up LISTENs what the set gained and UNLISTENs what
    /// it lost since, with a new alignment marker, in one transaction:
    /// called after the serving connection's LISTENs ran (so both LISTEN a
    /// new channel from that marker on) and before their acks. Not aligned
    /// until the serving connection reads the marker (the set changed: the
    /// two counted different entries before it). One that fails or does not
    /// answer is replaced.
    pub(super) async fn realign_standby(&mut self) {
        let Slot::Up(up) = &self.standby.slot else {
            return;
        };
        // Unchanged and aligning: nothing to do. Unchanged and not aligning
        // (a listen refused: admitted, then forgotten): a marker alone.
        if self.standby.listened.iter().eq(self.channels.keys()) && !self.alignment.idle() {
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
        let token = self.alignment.begin();
        let sql = format!(
            "BEGIN;{}{}NOTIFY {}, '{token}';COMMIT",
            listen_sql("LISTEN", &added),
            listen_sql("UNLISTEN", &removed),
            self.handover.quoted_channel()
        );
        let realign = up.0.client.batch_execute(&sql);
        let deadline = self.live_op_timeout();
        match super::op(self.shutdown.clone(), realign, deadline).await {
            Ok(()) => {
                self.standby.listened = self.channels.keys().cloned().collect();
                self.standby.aligning_since = Some(tokio::time::Instant::now());
            }
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
        // What `old` received before its loss, so its position is final.
        // A large payload's row cannot be read on it: left to the standby.
        while let Ok(ServerMessage::Notification(notification)) = old.messages.try_recv() {
            let (channel, payload) = (notification.channel(), notification.payload());
            if payload.starts_with(crate::protocol::LARGE_PAYLOAD_MARK) {
                break;
            }
            if let Some(Exit::Stop) = self.on_serving(&old, channel, payload).await {
                old.close(CLOSE_GRACE).await;
                return None;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(alignment: &mut Alignment, entries: &[&str]) {
        for entry in entries {
            assert_eq!(
                alignment.standby_read(Kind::Counted, "q", entry),
                Held::Taken
            );
        }
    }

    #[test]
    fn the_standby_holds_only_what_the_serving_connection_has_not_read_and_serves_from_there() {
        let mut alignment = Alignment::new();
        let token = alignment.begin();
        assert!(is_alignment_token(&token));
        // Before its marker the standby drops (the serving connection's).
        read_all(&mut alignment, &["0"]);
        alignment.standby_read(Kind::Marker(&token), "", "");
        read_all(&mut alignment, &["1", "2", "3"]);
        // The serving connection has not read the marker: not aligned.
        assert!(!alignment.aligned());
        assert!(!alignment.serving_drops(Kind::Counted)); // "0"
        assert!(alignment.serving_drops(Kind::Marker(&token)));
        assert!(alignment.aligned());
        assert!(!alignment.serving_drops(Kind::Counted)); // "1"
        alignment.serving_delivered();
        // Lost here: the standby delivers 2 and 3, then serves.
        let held = alignment.promote().unwrap();
        let payloads: Vec<&str> = held.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(payloads, ["2", "3"]);
        assert!(alignment.idle());
        assert!(!alignment.serving_drops(Kind::Counted));
    }

    #[test]
    fn a_standby_behind_the_lost_connection_drops_up_to_where_it_stopped() {
        let mut alignment = Alignment::new();
        let token = alignment.begin();
        assert!(alignment.serving_drops(Kind::Marker(&token)));
        for _ in 0..3 {
            assert!(!alignment.serving_drops(Kind::Counted));
            alignment.serving_delivered();
        }
        // The standby read its marker and one entry: both already delivered.
        alignment.standby_read(Kind::Marker(&token), "", "");
        read_all(&mut alignment, &["1"]);
        assert_eq!(alignment.promote(), Some(vec![]));
        // As the serving connection now: 2 and 3 were delivered, 4 is new.
        assert!(alignment.serving_drops(Kind::Counted));
        assert!(alignment.serving_drops(Kind::Counted));
        assert!(!alignment.idle());
        assert!(!alignment.serving_drops(Kind::Counted));
        assert!(alignment.idle());
    }

    #[test]
    fn a_standby_that_had_not_read_its_marker_drops_up_to_it_then_up_to_the_position() {
        let mut alignment = Alignment::new();
        let token = alignment.begin();
        assert!(alignment.serving_drops(Kind::Marker(&token)));
        assert!(!alignment.serving_drops(Kind::Counted));
        alignment.serving_delivered();
        assert_eq!(alignment.promote(), Some(vec![]));
        // Entries before its marker, the marker, then the one delivered.
        assert!(alignment.serving_drops(Kind::Counted));
        assert!(alignment.serving_drops(Kind::Marker(&token)));
        assert!(alignment.serving_drops(Kind::Counted));
        assert!(!alignment.serving_drops(Kind::Counted));
        // Not counted entries pass as without a standby; stale markers are dropped.
        assert!(!alignment.serving_drops(Kind::Other));
        assert!(alignment.serving_drops(Kind::Marker("standby.1.2.3")));
    }

    #[test]
    fn not_aligned_is_not_promoted_and_what_is_held_is_bounded() {
        let mut alignment = Alignment::new();
        assert_eq!(alignment.promote(), None);
        let token = alignment.begin();
        alignment.standby_read(Kind::Marker(&token), "", "");
        assert_eq!(alignment.promote(), None);
        let big = "x".repeat(HELD_BYTES_LIMIT / 2);
        assert_eq!(
            alignment.standby_read(Kind::Counted, "q", &big),
            Held::Taken
        );
        assert_eq!(
            alignment.standby_read(Kind::Counted, "q", &big),
            Held::Overflow
        );
        // A stale marker aligns nothing.
        assert!(alignment.serving_drops(Kind::Marker("standby.0.0.0")));
        assert!(!alignment.aligned());
    }
}
