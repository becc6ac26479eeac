//! Handover (issue 46; the argument is docs/architecture.md's "Handover"):
//! a connection given up while its backend may still be alive (a deadline
//! passed: health check, LISTEN/UNLISTEN, large-payload read) is kept and
//! read on; its successor commits the whole LISTEN set and a marker NOTIFY
//! on this engine's private channel in one transaction. PostgreSQL has one
//! notification queue, read in the same order by both backends: the old
//! connection delivers up to the marker, the new one only after it. Nothing
//! lost, nothing twice, order kept, as long as the old backend lives.
//!
//! A cut's marker (a `move.` token, issue 56) on the private channel is not
//! the handover's: it is an entry of the stream like a notification, dropped,
//! held or delivered exactly as one (`classify_new`, `classify_old`), so it
//! keeps its place among them.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Engine, Exit, CLOSE_GRACE, LATE_DEADLINE};
use crate::conninfo::{quote_ident, Connected, ServerMessage};
use crate::listener::{is_cut_token, Cut, Event};

/// The old connection's budget, in health-check cycles, to read up to the
/// marker once it is committed. By then the path works again (the new
/// connection got through it): the old backend answers the statement it
/// owed, then streams its backlog (tens of thousands of NOTIFYs a second).
/// 40 cycles (10 s at pgbus's 250 ms) is far more than that takes after a
/// freeze of minutes, and bounds how long the new connection's
/// notifications are held back when the old backend is gone for good but
/// its socket is not (a dead host, no RST): then they come 10 s late
/// instead of never.
pub(super) const BUDGET_CYCLES: u32 = 40;

/// The most payload bytes held from the new connection while the old one
/// has not shown the marker. Past it the old one is given up (its backlog
/// lost, as before handovers) rather than the hub's memory.
const HELD_BYTES_LIMIT: usize = 32 << 20;

/// What the engine does with a notification read on the new connection.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum New {
    Deliver,
    /// Taken: the marker, a pre-marker entry (the old connection's to
    /// deliver), or held until the old connection shows the marker.
    Taken,
    /// Held past [`HELD_BYTES_LIMIT`]: give the old connection up.
    Overflow,
}

/// What the engine does with a notification read on the old connection.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Old {
    /// Before the marker: the old connection's to deliver (a cut's marker too).
    Deliver,
    /// The marker: the handover is complete.
    Marker,
    /// A marker with a token that is not ours: ignored (logged).
    Ignore,
    /// Before its own marker (it was a new connection when given up): the
    /// connection before it's to deliver.
    Skip,
}

/// The old connection and where its handover stands.
struct Kept {
    session: Connected,
    /// The marker committed on the new connection (None until one is).
    token: Option<String>,
    deadline: Option<Instant>,
    /// Given up before it read back its own marker: what it reads up to
    /// that marker was the connection before it's to deliver.
    skip_until: Option<String>,
}

pub(super) struct Handover {
    /// `pgbus_hub.handover.<pid>.<random>`: LISTENed on every connection
    /// this engine opens, never routed. At most 19 + 10 + 1 + 16 = 46 bytes
    /// (PostgreSQL truncates names past 63).
    channel: String,
    /// `channel` as the SQL names it.
    quoted_channel: String,
    random: u64,
    counter: u64,
    kept: Option<Kept>,
    /// The marker the new connection has not read back yet: what it reads
    /// before it is the old connection's to deliver. A handover's, or the
    /// cut of a start ([`Self::cut_committed`]).
    awaiting_own: Option<String>,
    /// The new connection's notifications after its marker, in order.
    held: VecDeque<(String, String)>,
    held_bytes: usize,
    budget: Duration,
}

impl Handover {
    pub(super) fn new(health_check: Duration) -> Self {
        let random = RandomState::new().build_hasher().finish();
        let channel = format!(
            "{}{}.{random:016x}",
            crate::listener::PRIVATE_CHANNEL_PREFIX,
            std::process::id()
        );
        let quoted_channel = quote_ident(&channel).expect("a generated name holds no NUL");
        Self {
            channel,
            quoted_channel,
            random,
            counter: 0,
            kept: None,
            awaiting_own: None,
            held: VecDeque::new(),
            held_bytes: 0,
            budget: health_check.saturating_mul(BUDGET_CYCLES),
        }
    }

    /// The engine's private channel.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// `cut`'s two NOTIFYs, the other side's channel's and ours, for a transaction.
    pub(super) fn cut_sql(&self, cut: &Cut) -> String {
        cut.notify_sql(&self.quoted_channel)
    }

    /// The private channel as the SQL names it.
    pub(super) fn quoted_channel(&self) -> &str {
        &self.quoted_channel
    }

    /// No given-up connection is read, and the serving connection has read
    /// back its own marker: its stream is the one a standby aligns with.
    pub(super) fn settled(&self) -> bool {
        self.kept.is_none() && self.awaiting_own.is_none()
    }

    /// Whether a given-up connection is still read.
    pub(super) fn keeping(&self) -> bool {
        self.kept.is_some()
    }

    /// The statements the new connection runs in one transaction with its
    /// LISTENs: `LISTEN` of the private channel, and the marker when a
    /// connection is kept. Returns them with the marker's token.
    pub(super) fn statements(&mut self) -> (Vec<String>, Option<String>) {
        let channel = &self.quoted_channel;
        let mut statements = vec![format!("LISTEN {channel}")];
        if !self.keeping() {
            return (statements, None);
        }
        self.counter += 1;
        // Unique per handover: this process, this engine (random), this handover.
        let token = format!(
            "{}.{:016x}.{}",
            std::process::id(),
            self.random,
            self.counter
        );
        statements.push(format!("NOTIFY {channel}, '{token}'"));
        (statements, Some(token))
    }

    /// The marker `token` is committed on the new connection: the old one
    /// has the budget from now to read up to it.
    pub(super) fn marker_committed(&mut self, token: String) {
        if let Some(kept) = &mut self.kept {
            kept.token = Some(token.clone());
            kept.deadline = Some(Instant::now() + self.budget);
            self.awaiting_own = Some(token);
        }
    }

    /// A start's cut `token` is committed with the new connection's LISTENs:
    /// what it reads before it is the old side's to deliver, and the marker
    /// is passed on. A handover marker committed in the same transaction
    /// comes first in the queue and is awaited instead: the cut's follows it
    /// at once, and is passed on as any cut's marker is.
    pub(super) fn cut_committed(&mut self, token: &str) {
        if self.awaiting_own.is_none() {
            self.awaiting_own = Some(token.to_owned());
        }
    }

    /// A given-up connection to keep reading (the caller abandoned any
    /// connection kept before: one at a time). `own_marker`: the marker it
    /// committed and has not read back yet (see [`Self::new_connection_gone`]).
    pub(super) fn keep(&mut self, session: Connected, own_marker: Option<String>) {
        self.kept = Some(Kept {
            session,
            token: None,
            deadline: None,
            skip_until: own_marker,
        });
    }

    /// The new connection is gone. Returns the marker it had not read back
    /// yet, if any (should it be kept, it still skips up to it).
    pub(super) fn new_connection_gone(&mut self) -> Option<String> {
        self.awaiting_own.take()
    }

    pub(super) fn classify_new(&mut self, channel: &str, payload: &str) -> Result<New, String> {
        if channel == self.channel {
            if self.awaiting_own.as_deref() == Some(payload) {
                self.awaiting_own = None;
                // A start's cut is where this side's deliveries begin: passed on.
                return Ok(if is_cut_token(payload) {
                    New::Deliver
                } else {
                    New::Taken
                });
            }
            if !is_cut_token(payload) {
                return Err(format!(
                    "a handover marker with a token not ours ({payload:?}) on the new connection — ignored"
                ));
            }
            // A cut's marker: a notification like the others, below.
        }
        if self.awaiting_own.is_some() {
            return Ok(New::Taken);
        }
        if self.kept.as_ref().is_some_and(|kept| kept.token.is_some()) {
            self.held_bytes += channel.len() + payload.len();
            self.held
                .push_back((channel.to_owned(), payload.to_owned()));
            return Ok(if self.held_bytes > HELD_BYTES_LIMIT {
                New::Overflow
            } else {
                New::Taken
            });
        }
        Ok(New::Deliver)
    }

    pub(super) fn classify_old(&mut self, channel: &str, payload: &str) -> Old {
        let Some(kept) = &mut self.kept else {
            return Old::Skip;
        };
        let marker = channel == self.channel;
        if let Some(own) = &kept.skip_until {
            if marker && own == payload {
                kept.skip_until = None;
                if is_cut_token(payload) {
                    // A start's cut, read on its given-up connection: passed on.
                    return Old::Deliver;
                }
            }
            return Old::Skip;
        }
        if !marker || is_cut_token(payload) {
            return Old::Deliver;
        }
        match kept.token.as_deref() {
            Some(token) if token == payload => Old::Marker,
            _ => Old::Ignore,
        }
    }

    /// The next message of the kept connection (pending without one). None:
    /// its driver ended.
    pub(super) async fn recv(&mut self) -> Option<ServerMessage> {
        match &mut self.kept {
            Some(kept) => kept.session.messages.recv().await,
            None => std::future::pending().await,
        }
    }

    /// When the kept connection's budget is spent (see [`expiry`]).
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.kept.as_ref().and_then(|kept| kept.deadline)
    }

    /// The budget is spent: true if that was noticed only [`LATE_DEADLINE`]
    /// after it passed, and then the budget starts again. This process did
    /// not run meanwhile (SIGSTOP, a paused VM), so the kept connection was
    /// not read: its marker may be in its socket unread, and the select
    /// looks at the budget before the kept connection.
    pub(super) fn renewed_if_late(&mut self, now: Instant) -> bool {
        let budget = self.budget;
        let Some(deadline) = self.kept.as_mut().and_then(|kept| kept.deadline.as_mut()) else {
            return false;
        };
        let late = noticed_late(*deadline, now);
        if late {
            *deadline = now + budget;
        }
        late
    }

    fn take_held(&mut self) -> VecDeque<(String, String)> {
        self.held_bytes = 0;
        std::mem::take(&mut self.held)
    }

    fn take_kept(&mut self) -> Option<Connected> {
        self.kept.take().map(|kept| kept.session)
    }

    /// The kept connection, lent out (a large payload is read on it while no
    /// new connection is up); give it back with [`Self::lend_back`].
    fn lend(&mut self) -> Option<Kept> {
        self.kept.take()
    }

    fn lend_back(&mut self, kept: Kept) {
        self.kept = Some(kept);
    }
}

/// A deadline noticed this long after it passed was not watched.
fn noticed_late(deadline: Instant, now: Instant) -> bool {
    now.saturating_duration_since(deadline) > LATE_DEADLINE
}

/// Resolves at `deadline`; never without one.
pub(super) async fn expiry(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl<F: FnMut(Event) + Send + 'static> Engine<F> {
    /// A message on the kept connection. `session` is the new connection
    /// (None while connecting): large payloads are read on it when it is up,
    /// else on the kept one. Returns an exit of the NEW connection.
    pub(super) async fn on_kept(
        &mut self,
        message: Option<ServerMessage>,
        session: Option<&Connected>,
    ) -> Option<Exit> {
        let notification = match message {
            Some(ServerMessage::Notification(notification)) => notification,
            Some(ServerMessage::Lost(reason)) => {
                self.abandon(session, &format!("it failed: {reason}")).await;
                return None;
            }
            None => {
                self.abandon(session, "its connection driver ended").await;
                return None;
            }
        };
        let (channel, payload) = (notification.channel(), notification.payload());
        match self.handover.classify_old(channel, payload) {
            Old::Deliver => match session {
                Some(session) => self.notify(session, channel, payload).await,
                None => {
                    let kept = self.handover.lend()?;
                    match self.notify(&kept.session, channel, payload).await {
                        Some(Exit::Stop) => {
                            self.handover.lend_back(kept);
                            Some(Exit::Stop)
                        }
                        Some(Exit::Lost(reason) | Exit::GaveUp(reason)) => {
                            self.handover.lend_back(kept);
                            self.abandon(None, &reason).await;
                            None
                        }
                        None => {
                            self.handover.lend_back(kept);
                            None
                        }
                    }
                }
            },
            Old::Marker => {
                let session = session?;
                let old = self.handover.take_kept();
                let held = self.handover.take_held();
                self.stats.handovers.fetch_add(1, Ordering::Relaxed);
                self.config.log.info(format!(
                    "pgbus-hub listener: the given-up connection delivered its backlog up to the \
                     handover marker; the new one takes over ({} notifications held meanwhile)",
                    held.len()
                ));
                if let Some(old) = old {
                    old.close(CLOSE_GRACE).await;
                }
                self.deliver_held(session, held).await
            }
            Old::Skip => None,
            Old::Ignore => {
                self.config.log.warn(format!(
                    "pgbus-hub listener: a handover marker with a token not ours ({payload:?}) on \
                     the given-up connection — ignored"
                ));
                None
            }
        }
    }

    /// A notification on the new connection.
    pub(super) async fn on_new(
        &mut self,
        session: &Connected,
        channel: &str,
        payload: &str,
    ) -> Option<Exit> {
        match self.handover.classify_new(channel, payload) {
            Ok(New::Deliver) => self.notify(session, channel, payload).await,
            Ok(New::Taken) => None,
            Ok(New::Overflow) => {
                let reason = format!(
                    "more than {HELD_BYTES_LIMIT} bytes of the new connection's notifications held"
                );
                self.abandon(Some(session), &reason).await
            }
            Err(warning) => {
                self.config
                    .log
                    .warn(format!("pgbus-hub listener: {warning}"));
                None
            }
        }
    }

    /// Give the kept connection up (shutdown(2) if it does not close in
    /// time, so no forked copy keeps its backend), count it, and deliver what
    /// the new connection held. Returns an exit of the NEW connection.
    pub(super) async fn abandon(&mut self, session: Option<&Connected>, why: &str) -> Option<Exit> {
        let old = self.handover.take_kept()?;
        let held = self.handover.take_held();
        self.stats
            .abandoned_connections
            .fetch_add(1, Ordering::Relaxed);
        self.config.log.warn(format!(
            "pgbus-hub listener: gave up the old connection before it reached the handover \
             marker ({why}); what PostgreSQL still queued for it is lost"
        ));
        old.close(CLOSE_GRACE).await;
        match session {
            Some(session) => self.deliver_held(session, held).await,
            None => None,
        }
    }

    async fn deliver_held(
        &mut self,
        session: &Connected,
        held: VecDeque<(String, String)>,
    ) -> Option<Exit> {
        for (channel, payload) in held {
            if let Some(exit) = self.notify(session, &channel, &payload).await {
                return Some(exit);
            }
        }
        None
    }

    /// On stop: the kept connection is closed, not counted.
    pub(super) async fn close_kept(&mut self) {
        if let Some(old) = self.handover.take_kept() {
            old.close(CLOSE_GRACE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_channel_fits_postgresqls_names_and_is_listened_without_a_marker_when_nothing_is_kept(
    ) {
        let mut handover = Handover::new(Duration::from_millis(250));
        assert!(handover.channel.starts_with("pgbus_hub.handover."));
        // NAMEDATALEN - 1: a longer name would be truncated, and could collide.
        assert!(handover.channel.len() <= crate::listener::MAX_CHANNEL_BYTES);
        let (statements, marker) = handover.statements();
        assert_eq!(statements, vec![format!("LISTEN \"{}\"", handover.channel)]);
        assert_eq!(marker, None);
        assert_eq!(handover.budget, Duration::from_secs(10));
        // Two engines of one process: two channels.
        assert_ne!(handover.channel, Handover::new(Duration::ZERO).channel);
    }

    #[test]
    fn a_budget_noticed_well_after_it_passed_was_not_watched() {
        let deadline = Instant::now();
        assert!(!noticed_late(deadline, deadline));
        assert!(!noticed_late(deadline, deadline + LATE_DEADLINE));
        assert!(noticed_late(
            deadline,
            deadline + LATE_DEADLINE + Duration::from_millis(1)
        ));
        // Nothing kept: nothing to renew.
        let mut handover = Handover::new(Duration::from_millis(250));
        assert!(!handover.renewed_if_late(deadline + Duration::from_secs(15)));
    }

    #[test]
    fn with_nothing_kept_the_new_connection_delivers_and_a_foreign_marker_is_refused() {
        let channel = Handover::new(Duration::from_millis(250)).channel;
        let mut handover = Handover::new(Duration::from_millis(250));
        assert_eq!(
            handover.classify_new("pgmq.q_a.INSERT", "1"),
            Ok(New::Deliver)
        );
        // Another engine's channel is just a channel (not in the listen set:
        // the engine ignores it); a marker on ours with a token not awaited is refused.
        assert_eq!(handover.classify_new(&channel, "x"), Ok(New::Deliver));
        let ours = handover.channel.clone();
        assert!(handover.classify_new(&ours, "1.2.3").is_err());
        assert_eq!(handover.classify_old(&ours, "1.2.3"), Old::Skip);
    }

    #[test]
    fn a_cuts_marker_is_a_notification_and_a_starts_cut_is_where_delivery_begins() {
        let mut handover = Handover::new(Duration::from_millis(250));
        let ours = handover.channel.clone();
        // Nothing awaited: a cut's marker is delivered in its place.
        assert_eq!(handover.classify_new(&ours, "move.1.2.3"), Ok(New::Deliver));
        // A start's cut: what comes before it is the old side's; it and
        // what follows are this side's.
        handover.cut_committed("move.1.2.4");
        assert_eq!(handover.classify_new("q", "1"), Ok(New::Taken));
        assert_eq!(handover.classify_new(&ours, "move.1.2.3"), Ok(New::Taken));
        assert_eq!(handover.classify_new(&ours, "move.1.2.4"), Ok(New::Deliver));
        assert_eq!(handover.classify_new("q", "2"), Ok(New::Deliver));
        // A handover marker awaited first keeps its place: the cut's follows it.
        handover.awaiting_own = Some("1.2.5".into());
        handover.cut_committed("move.1.2.6");
        assert_eq!(handover.awaiting_own.as_deref(), Some("1.2.5"));
        assert_eq!(
            handover.cut_sql(&Cut::new(&ours, "move.1.2.6").unwrap()),
            format!(
                "NOTIFY {q}, 'move.1.2.6';NOTIFY {q}, 'move.1.2.6';",
                q = handover.quoted_channel
            )
        );
    }
}
