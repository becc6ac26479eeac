//! The LISTEN engine: one PostgreSQL connection, the set of LISTENed
//! channels, the health check, reconnect + re-LISTEN. The master hub runs it
//! on its tokio runtime ([`spawn`]); a worker without a hub runs it on a
//! thread of its own ([`StandaloneListener`]).
//!
//! One task owns the connection and `select!`s over commands, notifications
//! and the health tick, so a new `listen` is LISTENed (and acked) at once.
//! An ack (`Ok(())`) means `LISTEN` completed on the live connection: a
//! NOTIFY committed after the ack is delivered.
//!
//! Cuts (issue 56, docs/architecture.md's "The cut"): an engine commits one
//! on command ([`ListenerHandle::commit_cut`]) or in its first transaction
//! ([`Start::cut`]), passes every cut's marker read on its private channel
//! on as [`Event::Marker`] in stream order, and delivers nothing after the
//! one it is told to stop at ([`ListenerHandle::stop_at`]).

mod cut;
mod engine;
mod standalone;
mod state;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};

use crate::conninfo::ConnectionOptions;
use crate::log::LogSink;
use crate::protocol::{key_channel, Wake};
use crate::shutdown::{shutdown, ShutdownTrigger};
use crate::sync::lock;

pub use cut::{
    cut_token, is_cut_token, Cut, CutError, CUT_TOKEN_PREFIX, MAX_CUT_TOKEN_BYTES,
    PRIVATE_CHANNEL_PREFIX,
};
pub use standalone::StandaloneListener;
pub use state::ListenerState;

/// PostgreSQL's NAMEDATALEN - 1: a longer channel name is silently truncated,
/// so two long queue names could share a channel. Refused instead.
pub const MAX_CHANNEL_BYTES: usize = 63;

/// pgbus's default `streams_listen_health_check_ms`.
pub const DEFAULT_HEALTH_CHECK: Duration = Duration::from_millis(250);

/// pgbus's Listener waits one health-check cycle plus this for a LISTEN to run
/// (`Listener#ack_timeout`): the cycle is how long a busy engine may take to
/// see the command, the second covers the LISTEN round trip on a slow server.
pub const LISTEN_ACK_MARGIN: Duration = Duration::from_secs(1);

/// How long a caller waits for a LISTEN (pgbus's formula, see [`LISTEN_ACK_MARGIN`]).
pub fn listen_ack_timeout(health_check: Duration) -> Duration {
    health_check + LISTEN_ACK_MARGIN
}

/// pgmq's trigger channel is `pgmq.q_<queue>.INSERT`.
pub const DEFAULT_CHANNEL_PREFIX: &str = "pgmq.q_";
pub const DEFAULT_CHANNEL_SUFFIX: &str = ".INSERT";

/// No standby unless asked for: one LISTEN connection per engine (issue 57;
/// what a second one costs is not measured yet).
pub const DEFAULT_STANDBY: bool = false;

#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub connection: ConnectionOptions,
    /// Liveness probe interval when idle (default 250 ms).
    pub health_check: Duration,
    /// `"pgmq.q_"` by default; standalone users set both to `""`.
    pub channel_prefix: String,
    /// `".INSERT"` by default.
    pub channel_suffix: String,
    /// A second LISTEN connection, aligned with the serving one by a marker,
    /// that serves from exactly where the serving one stopped when that one is
    /// lost (docs/architecture.md, "Standby"). [`DEFAULT_STANDBY`]: off.
    pub standby: bool,
    pub log: LogSink,
}

impl ListenerConfig {
    /// pgbus's defaults (pgmq channel names, 250 ms health check, no standby).
    pub fn new(connection: ConnectionOptions, log: LogSink) -> Self {
        Self {
            connection,
            health_check: DEFAULT_HEALTH_CHECK,
            channel_prefix: DEFAULT_CHANNEL_PREFIX.to_string(),
            channel_suffix: DEFAULT_CHANNEL_SUFFIX.to_string(),
            standby: DEFAULT_STANDBY,
            log,
        }
    }

    /// The channel for routing key `key` (a queue, or a raw channel: see
    /// [`crate::protocol::channel_key`]), or why it cannot be LISTENed.
    pub fn channel_for(&self, key: &str) -> Result<String, ListenError> {
        let channel = match key_channel(key) {
            Some(raw) => {
                if self.is_queue_channel(raw) {
                    return Err(ListenError::QueueChannel {
                        channel: raw.to_owned(),
                    });
                }
                raw.to_owned()
            }
            None => format!("{}{key}{}", self.channel_prefix, self.channel_suffix),
        };
        if channel.is_empty() || key.is_empty() {
            return Err(ListenError::EmptyName);
        }
        if channel.len() > MAX_CHANNEL_BYTES {
            let bytes = channel.len();
            return Err(ListenError::NameTooLong { channel, bytes });
        }
        if channel.contains('\0') {
            return Err(ListenError::ContainsNul { channel });
        }
        Ok(channel)
    }

    /// A raw channel in the queues' namespace would be LISTENed twice over
    /// one connection under two keys; it is refused (subscribe to the queue).
    fn is_queue_channel(&self, channel: &str) -> bool {
        let (prefix, suffix) = (&self.channel_prefix, &self.channel_suffix);
        !(prefix.is_empty() && suffix.is_empty())
            && channel.len() >= prefix.len() + suffix.len()
            && channel.starts_with(prefix.as_str())
            && channel.ends_with(suffix.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A NOTIFY on a LISTENed channel (an empty payload is a durable wake).
    Wake(Wake),
    /// The connection went down (false) or is up with every channel re-LISTENed (true).
    Healthy(bool),
    /// Right after a reconnect's `Healthy(true)`: every queue of the listen set
    /// (raw channels excepted), each owed one durable wake so its subscribers
    /// re-read what was committed while nothing listened. One event, not a
    /// wake per queue, so a hub can pace tens of thousands of them behind
    /// live wakes instead of dropping them as backpressure. Sent after every
    /// reconnect, empty when the listen set holds no queue.
    CatchUp(Vec<Arc<str>>),
    /// A cut's marker (its token K, `move.*`) read on the engine's private
    /// channel, in stream order: every wake before it precedes the cut, every
    /// one after it follows it. During a handover it is dropped, held or
    /// delivered exactly as a notification is. From a start with a cut, the
    /// first event of the stream (what preceded it was the old side's).
    Marker(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenError {
    EmptyName,
    NameTooLong {
        channel: String,
        bytes: usize,
    },
    /// PostgreSQL identifiers cannot contain NUL.
    ContainsNul {
        channel: String,
    },
    /// A raw channel named like a queue's channel (prefix + name + suffix).
    QueueChannel {
        channel: String,
    },
    /// The engine stopped (or ended) before the LISTEN ran.
    Stopped,
    /// [`StandaloneListener::listen`] gave up waiting; the request
    /// stays queued and is LISTENed when the connection allows.
    Timeout,
    /// The queue was unlistened (its last subscriber withdrew) before its
    /// LISTEN could run: nothing is wrong with the name or the server.
    Withdrawn {
        channel: String,
    },
    /// The server refused the LISTEN or the name cannot be sent.
    Failed {
        channel: String,
        reason: String,
    },
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyName => f.write_str("empty queue name: nothing to LISTEN on"),
            Self::NameTooLong { channel, bytes } => write!(
                f,
                "channel name {channel:?} is {bytes} bytes; PostgreSQL truncates channel names \
                 to {MAX_CHANNEL_BYTES} bytes, so distinct queues would collide"
            ),
            Self::ContainsNul { channel } => {
                write!(f, "channel name {channel:?} contains a NUL byte")
            }
            Self::QueueChannel { channel } => write!(
                f,
                "channel {channel:?} is a queue's channel (prefix + queue + suffix): subscribe to the queue"
            ),
            Self::Stopped => f.write_str("the listener stopped before LISTEN ran"),
            Self::Timeout => f.write_str("timed out waiting for LISTEN to run"),
            Self::Withdrawn { channel } => {
                write!(
                    f,
                    "{channel:?} was unsubscribed before its LISTEN could run"
                )
            }
            Self::Failed { channel, reason } => write!(f, "LISTEN {channel:?} failed: {reason}"),
        }
    }
}

impl std::error::Error for ListenError {}

impl ListenError {
    /// The queue name itself can never be LISTENed (as opposed to a transient failure).
    pub fn is_invalid_name(&self) -> bool {
        matches!(
            self,
            Self::EmptyName
                | Self::NameTooLong { .. }
                | Self::ContainsNul { .. }
                | Self::QueueChannel { .. }
        )
    }
}

/// The error a reply dropped unsent answers.
pub(crate) trait Unanswered {
    fn stopped() -> Self;
}

impl Unanswered for ListenError {
    fn stopped() -> Self {
        Self::Stopped
    }
}

impl Unanswered for CutError {
    fn stopped() -> Self {
        Self::Stopped
    }
}

/// Where a listen (or cut) answer goes: an async caller's oneshot or a blocking caller's channel.
/// Whoever asked, told its outcome exactly once (run on the
/// engine's task: it must not block). A reply dropped unsent (the engine
/// task ended or was aborted) answers `Stopped`.
pub(crate) struct Reply<E: Unanswered = ListenError>(Option<Answer<E>>);

type Answer<E> = Box<dyn FnOnce(Result<(), E>) + Send>;

impl<E: Unanswered> Reply<E> {
    pub(crate) fn send(mut self, outcome: Result<(), E>) {
        if let Some(answer) = self.0.take() {
            answer(outcome);
        }
    }
}

impl<E: Unanswered> Drop for Reply<E> {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer(Err(E::stopped()));
        }
    }
}

pub(crate) enum Command {
    Listen {
        queue: String,
        reply: Reply,
    },
    Unlisten {
        queue: String,
    },
    /// Commit this cut on the live connection (batched with the cuts queued behind it).
    Cut {
        cut: Cut,
        reply: Reply<CutError>,
    },
    /// Deliver up to this cut's marker, then nothing; None forgets a token not read yet.
    StopAt(Option<String>),
}

/// Commands to one engine. Cheap to clone; every method returns at once.
#[derive(Clone)]
pub struct ListenerHandle {
    commands: mpsc::UnboundedSender<Command>,
    stop: Arc<ShutdownTrigger>,
}

impl fmt::Debug for ListenerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerHandle")
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

impl ListenerHandle {
    /// Resolves `Ok(())` only once `LISTEN` has run on the live connection (at
    /// once if the channel is already LISTENed there). While disconnected the
    /// request waits for reconnect + re-LISTEN. Never `Ok` for a LISTEN that failed.
    pub fn listen(&self, queue: &str) -> oneshot::Receiver<Result<(), ListenError>> {
        let (sender, receiver) = oneshot::channel();
        self.listen_then(queue, move |outcome| {
            let _ = sender.send(outcome);
        });
        receiver
    }

    /// As [`ListenerHandle::listen`], calling `answer` with the outcome
    /// instead (on the engine's task, so it must not block): the caller
    /// needs no task of its own to wait.
    pub fn listen_then(
        &self,
        queue: &str,
        answer: impl FnOnce(Result<(), ListenError>) + Send + 'static,
    ) {
        let command = Command::Listen {
            queue: queue.to_string(),
            reply: Reply(Some(Box::new(answer))),
        };
        if let Err(mpsc::error::SendError(Command::Listen { reply, .. })) =
            self.commands.send(command)
        {
            reply.send(Err(ListenError::Stopped));
        }
    }

    /// Asynchronous: UNLISTEN if listening; a queued listen for it is answered `Failed`.
    pub fn unlisten(&self, queue: &str) {
        let _ = self.commands.send(Command::Unlisten {
            queue: queue.to_string(),
        });
    }

    /// Commits `cut` on the live connection: `NOTIFY <cut's channel>, K;
    /// NOTIFY <this engine's private channel>, K` in ONE transaction, with
    /// the cuts asked for meanwhile (docs/architecture.md, "The cut"). `Ok`
    /// once committed: from the marker on this engine reads K at, its set is
    /// LISTENed. [`CutError::NotListening`] at once while no connection
    /// LISTENs the set.
    pub fn commit_cut(&self, cut: Cut) -> oneshot::Receiver<Result<(), CutError>> {
        let (sender, receiver) = oneshot::channel();
        self.commit_cut_then(cut, move |outcome| {
            let _ = sender.send(outcome);
        });
        receiver
    }

    /// As [`ListenerHandle::commit_cut`], calling `answer` with the outcome
    /// (on the engine's task: it must not block).
    pub fn commit_cut_then(
        &self,
        cut: Cut,
        answer: impl FnOnce(Result<(), CutError>) + Send + 'static,
    ) {
        let command = Command::Cut {
            cut,
            reply: Reply(Some(Box::new(answer))),
        };
        if let Err(mpsc::error::SendError(Command::Cut { reply, .. })) = self.commands.send(command)
        {
            reply.send(Err(CutError::Stopped));
        }
    }

    /// `Some(K)`: deliver up to the marker K ([`Event::Marker`], delivered),
    /// then nothing (no wake, catch-up or marker) until the engine is stopped,
    /// which is its owner's to do. Call it before K can be committed (before
    /// asking the other side for the cut): the engine reads its commands
    /// before the notifications that follow them. `None` forgets a K not read
    /// yet; once K is read, nothing is delivered whatever follows (what came
    /// after it was dropped).
    pub fn stop_at(&self, token: Option<&str>) {
        let _ = self
            .commands
            .send(Command::StopAt(token.map(str::to_owned)));
    }

    /// The engine does a best-effort `UNLISTEN *` (short timeout), closes the
    /// connection and exits; an operation in flight is abandoned at once.
    pub fn stop(&self) {
        self.stop.trigger();
    }

    /// True once the engine has exited (or `stop` was called).
    pub fn is_stopped(&self) -> bool {
        self.commands.is_closed() || self.stop.is_triggered()
    }
}

/// The server session the engine LISTENs on, as the server sees it: what
/// `pgbus-hub status` needs to count this host's connections and no others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub pid: u32,
    pub database: String,
    /// `inet_client_addr()`: None over a Unix socket.
    pub client_addr: Option<String>,
}

/// The last connection error and when it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastError {
    pub message: String,
    pub at: SystemTime,
}

/// Counters and state published by the engine (readable from any thread).
#[derive(Default, Debug)]
pub struct ListenerStats {
    healthy: AtomicBool,
    reconnects: AtomicU64,
    connect_failures: AtomicU64,
    notifications: AtomicU64,
    ignored_notifications: AtomicU64,
    handovers: AtomicU64,
    abandoned_connections: AtomicU64,
    listen_connections: AtomicUsize,
    standby_aligned: AtomicBool,
    standby_promotions: AtomicU64,
    channels: AtomicUsize,
    backend: Mutex<Option<Backend>>,
    last_error: Mutex<Option<LastError>>,
    /// When the engine last became healthy; None while it is not.
    healthy_since: Mutex<Option<SystemTime>>,
    state: state::PublishedState,
    /// The engine's private channel (set when it is made).
    private_channel: Mutex<Option<String>>,
}

impl ListenerStats {
    /// Connected, primary, every channel LISTENed.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
    /// Where the connection stands (see [`ListenerState`]).
    pub fn state(&self) -> ListenerState {
        self.state.get()
    }
    /// Successful reconnects after a lost connection (the first connect is not one).
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }
    /// Connect attempts that failed (including refusals of a server in recovery).
    pub fn connect_failures(&self) -> u64 {
        self.connect_failures.load(Ordering::Relaxed)
    }
    /// The engine's first connection attempt has come to something: it
    /// connected (and LISTENs), or it failed.
    pub fn first_attempt_concluded(&self) -> bool {
        self.healthy() || self.backend_pid().is_some() || self.connect_failures() > 0
    }
    /// NOTIFYs delivered as [`Event::Wake`].
    pub fn notifications(&self) -> u64 {
        self.notifications.load(Ordering::Relaxed)
    }
    /// NOTIFYs for channels not in the set (e.g. in flight across an
    /// UNLISTEN), and those read after the marker the engine was told to stop at.
    pub fn ignored_notifications(&self) -> u64 {
        self.ignored_notifications.load(Ordering::Relaxed)
    }
    /// Given-up connections that delivered their backlog up to the handover
    /// marker: nothing was lost in those reconnects (docs/architecture.md).
    pub fn handovers(&self) -> u64 {
        self.handovers.load(Ordering::Relaxed)
    }
    /// Given-up connections closed before they showed the marker (they
    /// failed, or the budget ran out): what was queued for them is lost.
    pub fn abandoned_connections(&self) -> u64 {
        self.abandoned_connections.load(Ordering::Relaxed)
    }
    /// This engine's connections that LISTEN: the serving one, a standby
    /// (with [`ListenerConfig::standby`]), a given-up one read on for a handover.
    pub fn listen_connections(&self) -> usize {
        self.listen_connections.load(Ordering::Relaxed)
    }
    /// A standby is up and the serving connection read its alignment marker:
    /// the serving connection's loss is covered (docs/architecture.md, "Standby").
    pub fn standby_aligned(&self) -> bool {
        self.standby_aligned.load(Ordering::Relaxed)
    }
    /// Serving connections lost while a standby was aligned: the standby
    /// served from where they stopped, nothing lost.
    pub fn standby_promotions(&self) -> u64 {
        self.standby_promotions.load(Ordering::Relaxed)
    }
    /// Channels in the listen set (LISTENed, or to be re-LISTENed on reconnect).
    pub fn channels(&self) -> usize {
        self.channels.load(Ordering::Relaxed)
    }
    /// The PostgreSQL backend pid of the live connection.
    pub fn backend_pid(&self) -> Option<u32> {
        lock(&self.backend).as_ref().map(|backend| backend.pid)
    }
    /// The live connection's backend (pid, database, client address).
    pub fn backend(&self) -> Option<Backend> {
        lock(&self.backend).clone()
    }
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).as_ref().map(|e| e.message.clone())
    }
    /// The last error with its time; compare with [`Self::healthy_since`] to
    /// tell a current problem from one that was resolved.
    pub fn last_error_at(&self) -> Option<SystemTime> {
        lock(&self.last_error).as_ref().map(|e| e.at)
    }
    pub fn healthy_since(&self) -> Option<SystemTime> {
        *lock(&self.healthy_since)
    }
    /// The engine's private channel, `pgbus_hub.handover.<pid>.<random>`:
    /// LISTENed by every connection it opens; where another side commits a
    /// cut's marker for this one ([`Cut::new`]). A new engine in place of an
    /// ended one ([`respawn`]) has a new one.
    pub fn private_channel(&self) -> Option<String> {
        lock(&self.private_channel).clone()
    }

    fn set_private_channel(&self, channel: &str) {
        *lock(&self.private_channel) = Some(channel.to_owned());
    }

    fn set_last_error(&self, error: &str) {
        *lock(&self.last_error) = Some(LastError {
            message: error.to_string(),
            at: SystemTime::now(),
        });
    }

    fn set_backend(&self, backend: Option<Backend>) {
        *lock(&self.backend) = backend;
    }

    fn set_healthy(&self, healthy: bool) {
        let mut since = lock(&self.healthy_since);
        self.healthy.store(healthy, Ordering::Release);
        *since = healthy.then(SystemTime::now);
    }
}

/// What an engine starts with: a listen set LISTENed in its first
/// transaction, and a cut committed in that same transaction.
#[derive(Clone, Debug, Default)]
pub struct Start {
    /// Queues (routing keys, as [`ListenerHandle::listen`] takes them) in the
    /// first transaction. A name that cannot be LISTENed is left out (logged
    /// at debug): a `listen` for it is refused with the reason.
    pub queues: Vec<String>,
    /// Committed with the first LISTENs (docs/architecture.md, item 1 of
    /// "Planned events"): this engine is the new side, and drops what it reads
    /// before the marker (the old side's to deliver); the marker is its first
    /// [`Event::Marker`]. Committed once: a later connection does not.
    pub cut: Option<Cut>,
}

/// A spawned engine: its handle, its stats, its task.
pub type Spawned = (
    ListenerHandle,
    Arc<ListenerStats>,
    tokio::task::JoinHandle<()>,
);

/// Spawn the engine on the CURRENT tokio runtime. `on_event` is called from
/// the engine task for each NOTIFY on a LISTENed channel and each health
/// change. To replace an engine that ended, see [`respawn`].
pub fn spawn(config: ListenerConfig, on_event: impl FnMut(Event) + Send + 'static) -> Spawned {
    spawn_with(config, Start::default(), on_event)
}

/// [`spawn`], starting with `start`'s set and cut.
pub fn spawn_with(
    config: ListenerConfig,
    start: Start,
    on_event: impl FnMut(Event) + Send + 'static,
) -> Spawned {
    spawn_engine(
        config,
        Arc::new(ListenerStats::default()),
        start,
        false,
        on_event,
    )
}

/// A new engine in place of one whose task ended: it publishes into the old
/// engine's `stats` (reconnects and the last error are kept), and its first
/// connection is a reconnect: counted in `reconnects`, followed by
/// [`Event::CatchUp`] for every queue LISTENed on it, since nothing listened
/// between the two engines (a NOTIFY then reached nobody).
pub fn respawn(
    config: ListenerConfig,
    stats: Arc<ListenerStats>,
    on_event: impl FnMut(Event) + Send + 'static,
) -> Spawned {
    spawn_engine(config, stats, Start::default(), true, on_event)
}

fn spawn_engine(
    config: ListenerConfig,
    stats: Arc<ListenerStats>,
    start: Start,
    resumed: bool,
    on_event: impl FnMut(Event) + Send + 'static,
) -> Spawned {
    let (commands, receiver) = mpsc::unbounded_channel();
    let (trigger, shutdown) = shutdown();
    let handle = ListenerHandle {
        commands,
        stop: Arc::new(trigger),
    };
    let engine = engine::Engine::new(config, stats.clone(), receiver, shutdown, on_event)
        .starting_with(start);
    let engine = if resumed { engine.resumed() } else { engine };
    let join = tokio::spawn(engine.run());
    (handle, stats, join)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(prefix: &str, suffix: &str) -> ListenerConfig {
        let connection = ConnectionOptions::parse("host=/tmp user=u").unwrap();
        ListenerConfig {
            channel_prefix: prefix.into(),
            channel_suffix: suffix.into(),
            ..ListenerConfig::new(connection, LogSink::silent())
        }
    }

    #[test]
    fn channel_names_are_checked_before_anything_is_sent() {
        let pgmq = config(DEFAULT_CHANNEL_PREFIX, DEFAULT_CHANNEL_SUFFIX);
        assert_eq!(
            pgmq.channel_for("pgbus_chat").unwrap(),
            "pgmq.q_pgbus_chat.INSERT"
        );
        assert_eq!(pgmq.channel_for(""), Err(ListenError::EmptyName));
        let bare = config("", "");
        assert!(bare.channel_for(&"x".repeat(63)).is_ok());
        assert_eq!(
            bare.channel_for(&"x".repeat(64)),
            Err(ListenError::NameTooLong {
                channel: "x".repeat(64),
                bytes: 64
            })
        );
        // Bytes, not characters: 21 three-byte characters = 63 bytes.
        assert!(bare.channel_for(&"€".repeat(21)).is_ok());
        assert!(bare.channel_for(&"€".repeat(22)).is_err());
        assert!(matches!(
            bare.channel_for("a\0b"),
            Err(ListenError::ContainsNul { .. })
        ));
    }
}
