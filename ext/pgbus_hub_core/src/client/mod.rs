//! The worker's hub client: one Unix-socket connection to the master hub.
//!
//! `subscribe` writes `sub` and blocks until the hub acks (the LISTEN
//! is active), so the no-lost-wake contract crosses the process boundary.
//! Whoever reads the socket decodes the hub's frames: wakes go to the
//! [`DeliverySender`] (per-queue order preserved), acks release waiters,
//! `status` records the hub's health. Nobody reads for the client but the
//! embedder: [`HubClient::connect_driven`] returns a [`DrivenReader`] whose
//! `next_batch`, called on the embedder's pump thread, polls the socket
//! itself. A wake costs one thread wake-up instead of two (a reader thread,
//! then the pump thread), and a Ruby process that stops draining its wakes
//! pushes back on the hub (drops, then eviction): the socket is not read.
//! Acks are resolved inside the same wait; while the pump is away in the app
//! (blocked on a full dispatch queue), a sub waiting for its ack reads the
//! socket itself ([`Inner::read_for_waiter`]), so acks never wait behind the
//! app and a busy worker does not fail over. The wakes that read takes off
//! the socket do go into the client's in-process delivery channel (not
//! bounded), as do a failed-over worker's own connection's wakes
//! (`failover.rs`): those two paths grow in the process instead of pushing
//! back on the hub.
//!
//! Files: this one holds the API and the failure model; [`waiters`] the subs
//! awaiting the hub's answer; [`driven`] the reading side; [`stats`] an
//! operator's one stats request; the socket itself
//! is [`crate::transport::socket`].
//!
//! Database outages are not transport failures. While the hub's last
//! `status` says its PostgreSQL connection is down, `subscribe` returns
//! [`Listening::AfterReconnect`] on the hub's ack (our hub acks such a sub at
//! once) or after [`UNHEALTHY_ACK_GRACE`] without one (a hub that holds the
//! ack until it reconnects): the hub keeps the sub and LISTENs it when it
//! reconnects, so the worker stays on the hub (one connection per host)
//! instead of failing over to a connection of its own that it would keep
//! after the database is back.
//!
//! Failure model (pgbus 0.13.1's): never retry, never reconnect. The first of
//! EOF, reset, a protocol error from the hub, an ack timeout or a stalled write
//! marks the client dead: every pending waiter is released, the socket is shut
//! down and [`Delivery::Failed`] is sent exactly once (the embedding runtime's
//! cue to fail over to a per-worker listener). A clean [`HubClient::stop`]
//! releases waiters too but never sends `Failed`.
//!
//! A cancel (an embedder's unblock function) never kills the client, not even
//! part-way through a frame: the rest of the frame stays in the client
//! ([`Unsent`]) and goes out before any other frame. Ruby calls a blocked
//! thread's unblock function even with nothing pending, and the binding then
//! calls again (`nogvl_resuming`): failing over there would fail over for
//! nothing.
//!
//! Fork: a client inherited by a forked child is inert there. It reports dead
//! and never writes to or shuts down the parent's socket.

mod driven;
mod inner;
mod stats;
mod waiters;

pub use driven::DrivenReader;
pub(crate) use stats::{await_answer, Unanswered};
pub use stats::{request_stats, StatsError};

use crate::delivery::{self, Delivery, DeliverySender, Drops};
use crate::log::LogSink;
use crate::os::Wakeup;
use crate::process::Owner;
use crate::protocol::{Decoder, Marker, Message, Move};
use crate::sync::{lock, read};
use crate::transport::socket::{ClientSocket, ConnectError, WriteError};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use waiters::{Outcome, Waiters};

/// pgbus's default ack budget.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// A worker waits one health-check cycle plus this for the hub's ack (pgbus's
/// `build_hub_listener`): a second more than pgbus's hub gives its own LISTEN
/// ([`crate::listener::LISTEN_ACK_MARGIN`]), so a slow LISTEN there times out
/// in the hub first, not as a worker fail-over.
pub const HUB_ACK_MARGIN: Duration = Duration::from_secs(2);

/// The ack budget a worker's client gets for `health_check` (pgbus's formula).
pub fn hub_ack_timeout(health_check: Duration) -> Duration {
    health_check + HUB_ACK_MARGIN
}

/// How long `stop` waits for the socket's last users (a writer, the pump's
/// poll) to let go before leaving the close to the client's drop. Both
/// return as soon as stop's shutdown(2) lands; this only bounds a wedge.
pub const STOP_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `subscribe` waits for an ack while the hub reports its
/// database connection down. Long enough for a hub still making its first
/// connection to a local server (a few ms) to ack; short enough that a request
/// subscribing during an outage stays far below 100 ms and far below
/// `ack_timeout` (seconds), which is for a hub that is gone or wedged.
pub const UNHEALTHY_ACK_GRACE: Duration = Duration::from_millis(50);

/// How long a sub waiting for its ack polls the socket (or waits for the
/// pump's answer) at a time: the pump gets the socket back within this once
/// it returns from the app, and a waiter notices a cancel within it.
const ACK_READ_SLICE: Duration = Duration::from_millis(10);

const LOG_PREFIX: &str = "[pgbus-hub] HubClient:";

const INHERITED: &str = "master hub client was inherited across fork; connect a new one";

const STOPPED: &str = "master hub client stopped";

#[derive(Clone)]
pub struct ClientConfig {
    pub socket_path: PathBuf,
    /// Bounds both the write of a frame and the wait for a `sub`'s ack.
    pub ack_timeout: Duration,
    pub log: LogSink,
    /// Counts the payload wakes its channel drops (a listener shares one
    /// across its clients: `crate::delivery::Drops`).
    pub drops: Drops,
}

impl ClientConfig {
    /// Default ack timeout (2 s), log records to the `log` facade only.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            log: LogSink::silent(),
            drops: Drops::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The hub cannot serve this request (unreachable, dead, timed out,
    /// stopped, inherited across fork). The message says which.
    Unavailable(String),
    /// The hub refused this queue (a `nack` frame); the client stays alive.
    Rejected { queue: String, reason: String },
    /// The caller cancelled a connect (an embedder's unblock function);
    /// nothing was left open.
    Interrupted,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(message) => f.write_str(message),
            Self::Rejected { queue, reason } => {
                write!(f, "master hub refused {queue}: {reason}")
            }
            Self::Interrupted => f.write_str("connecting to the master hub was interrupted"),
        }
    }
}

impl std::error::Error for ClientError {}

/// How `subscribe` succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listening {
    /// The hub acked: its LISTEN is active.
    Active,
    /// The hub's database connection is down: the sub is registered there and
    /// is LISTENed when the hub reconnects (not waited for).
    AfterReconnect,
    /// The caller cancelled (an embedder's unblock function: Ruby's
    /// Thread#kill, or a call with nothing pending, after which the binding
    /// calls again). The client stays alive. Cancelled in the wait for the
    /// ack: the sub was sent and stays registered at the hub, unconfirmed.
    /// Cancelled part-way through writing its frame: the rest waits in the
    /// client with the sub's waiter ([`Unsent`]); the next `subscribe` of this
    /// queue finishes that frame and waits for its ack (no second sub), and
    /// any other write sends the rest first. Cancelled before any of it went
    /// out: nothing was sent.
    Interrupted,
}

/// Why a frame did not go out whole.
enum Unwritten {
    /// Cancelled before any byte of it was sent (perhaps while finishing an
    /// earlier frame's [`Unsent`] tail, whose rest stays parked).
    Cancelled,
    /// Cancelled part-way: the rest of it is parked in [`Inner::unsent`]
    /// (without a sub: the caller attaches its own).
    Parked,
    /// The transport is unusable (the caller marks the client dead): why.
    Dead(String),
}

/// What a write cancelled part-way left of its frame. Every later write sends
/// it first, so the frames on the wire stay whole and the client need not die
/// (see the module doc). After a real Thread#kill it waits for the client's
/// next write; if none comes within the hub's frame-completion timeout, our
/// hub drops the connection and the worker fails over (as it did at once
/// before the tail was kept). A death or `stop` answers its waiter with all
/// the others; the tail is never sent then and goes with the client.
struct Unsent {
    tail: Vec<u8>,
    /// The frame's sub, if it was one. Its waiter stays registered in
    /// [`Waiters`], so answers keep their FIFO order per queue: the next
    /// `subscribe` of the queue adopts it. A write for anything else that
    /// finishes the tail discards the waiter, as a cancelled ack wait does.
    sub: Option<PendingSub>,
}

/// A sub's waiter, registered in [`Waiters`], not yet answered.
struct PendingSub {
    queue: String,
    id: u64,
    outcome: Receiver<Outcome>,
}

#[derive(Default)]
struct State {
    /// Set once, by the first of death or stop; never cleared.
    dead_reason: Option<String>,
    waiters: Waiters,
}

struct Inner {
    socket_path: PathBuf,
    ack_timeout: Duration,
    log: LogSink,
    deliveries: DeliverySender,
    /// Shared (read) by the reader's poll and reads, the writer and
    /// shutdown(2); taken (write) only by `stop`, to close it.
    socket: RwLock<Option<ClientSocket>>,
    /// The descriptor number, for a forked child to close its copy without
    /// touching locks a parent thread may have held at fork time.
    raw_fd: RawFd,
    /// False from just before `stop` closes the descriptor.
    fd_open: AtomicBool,
    /// The write lock: frames never interleave. It guards what a write
    /// cancelled part-way left of its frame, which every write sends first.
    /// Taken before `state` when both are.
    unsent: Mutex<Option<Unsent>>,
    state: Mutex<State>,
    /// Mirrors `state.dead_reason.is_some()` for lock-free reads.
    dead: AtomicBool,
    /// Whoever reads the socket holds this: the pump's `next_batch`, or a sub
    /// waiting for its ack while the pump is away ([`Inner::read_for_waiter`]).
    /// Partial frames carry over between reads.
    reading: Mutex<Decoder>,
    healthy: AtomicBool,
    /// Set when a sub returned `AfterReconnect` (and logged), cleared when the
    /// hub is healthy again: one WARN per outage.
    outage_logged: AtomicBool,
}

/// The worker side of the master hub. `Send + Sync`: every method may be
/// called from any thread, concurrently.
pub struct HubClient {
    inner: Arc<Inner>,
    owner: Owner,
}

/// Seconds the way Ruby prints a Float: 2.0, 0.25.
fn seconds(duration: Duration) -> String {
    format!("{:?}", duration.as_secs_f64())
}

fn unavailable(message: impl Into<String>) -> ClientError {
    ClientError::Unavailable(message.into())
}

fn unreachable_at(socket_path: &std::path::Path, why: String) -> ClientError {
    unavailable(format!(
        "cannot reach master hub at {}: {why}",
        socket_path.display()
    ))
}

impl HubClient {
    /// Connects; the returned [`DrivenReader`] reads the socket whenever its
    /// caller waits for wakes (see the module doc).
    pub fn connect_driven(config: ClientConfig) -> Result<(Self, DrivenReader), ClientError> {
        Self::connect_driven_or_cancel(config, &crossbeam_channel::never())
    }

    /// [`HubClient::connect_driven`], giving up as soon as `cancel` receives
    /// while the hub's listen backlog is full (an embedder's unblock
    /// function): then `Interrupted`, and nothing stays open.
    pub fn connect_driven_or_cancel(
        config: ClientConfig,
        cancel: &Receiver<()>,
    ) -> Result<(Self, DrivenReader), ClientError> {
        let (deliveries, receiver) = delivery::channel_counting(config.drops.clone());
        let inner = Inner::connect(config, deliveries, cancel)?;
        let wakeup = Wakeup::new().map_err(|e| {
            inner.unreachable(format!("cannot create the wake-up {}: {e}", Wakeup::KIND))
        })?;
        let owner = Owner::current();
        let reader = DrivenReader {
            inner: ManuallyDrop::new(Arc::clone(&inner)),
            receiver: ManuallyDrop::new(receiver),
            wakeup,
            owner,
        };
        Ok((Self { inner, owner }, reader))
    }

    /// Subscribes to `queue` and blocks until the hub acks it (LISTEN active),
    /// or, while the hub reports its database down, at most
    /// [`UNHEALTHY_ACK_GRACE`] (then `AfterReconnect`).
    pub fn subscribe(&self, queue: &str) -> Result<Listening, ClientError> {
        self.subscribe_or_cancel(queue, &crossbeam_channel::never())
    }

    /// [`HubClient::subscribe`], returning [`Listening::Interrupted`]
    /// as soon as `cancel` receives.
    pub fn subscribe_or_cancel(
        &self,
        queue: &str,
        cancel: &Receiver<()>,
    ) -> Result<Listening, ClientError> {
        if !self.owner.is_current() {
            return Err(unavailable(INHERITED));
        }
        let inner = &*self.inner;
        let frame = Message::Sub(queue.to_owned())
            .encode()
            .map_err(|e| ClientError::Rejected {
                queue: queue.to_owned(),
                reason: format!("the sub frame cannot be encoded: {e}"),
            })?;
        let PendingSub { id, outcome, .. } = {
            let write_deadline = inner.write_deadline();
            let mut unsent = lock(&inner.unsent);
            // This queue's sub cut part-way by a cancel (this call resumed
            // after an unblock with nothing pending, or a later sub after a
            // kill): finish that frame and wait for its ack, not send another.
            let adopted = unsent
                .as_mut()
                .and_then(|parked| parked.sub.take_if(|sub| sub.queue == queue));
            let adopting = adopted.is_some();
            let sub = {
                let mut state = lock(&inner.state);
                if let Some(reason) = &state.dead_reason {
                    return Err(unavailable(format!("master hub is unavailable: {reason}")));
                }
                // Registered BEFORE the write: the ack may beat our return from it.
                adopted.unwrap_or_else(|| {
                    let (id, outcome) = state.waiters.add(queue);
                    PendingSub {
                        queue: queue.to_owned(),
                        id,
                        outcome,
                    }
                })
            };
            // Adopted: the parked tail, which every write sends first, is our frame.
            let frame: &[u8] = if adopting { &[] } else { &frame };
            match inner.write_frame(&mut unsent, frame, write_deadline, cancel) {
                Ok(()) => sub,
                // Cancelled while an earlier frame's tail went out: none of ours did.
                Err(Unwritten::Cancelled) if !adopting => {
                    inner.discard_waiter(queue, sub.id);
                    return Ok(Listening::Interrupted);
                }
                // Part of our frame is on the wire and the rest parked: the
                // waiter waits there with it, for the next sub of this queue.
                Err(Unwritten::Cancelled | Unwritten::Parked) => {
                    if let Some(parked) = unsent.as_mut() {
                        parked.sub = Some(sub);
                    }
                    return Ok(Listening::Interrupted);
                }
                Err(Unwritten::Dead(reason)) => {
                    drop(unsent);
                    inner.discard_waiter(queue, sub.id);
                    inner.mark_dead(reason);
                    return Err(inner.unavailable_now());
                }
            }
        };
        // Unhealthy when the sub went out: wait the grace period only; if no ack
        // came by then, the LISTEN waits for the hub's reconnect, not the hub.
        let in_outage = !inner.healthy.load(Ordering::Acquire);
        let budget = if in_outage {
            inner.ack_timeout.min(UNHEALTHY_ACK_GRACE)
        } else {
            inner.ack_timeout
        };
        // The pump resolves acks while it reads; when it is away in the app
        // (a full dispatch queue), this thread reads for it, in slices.
        let deadline = Instant::now() + budget;
        let received = loop {
            let slice = ACK_READ_SLICE.min(deadline.saturating_duration_since(Instant::now()));
            // Having read (an ack, or another frame first), look again at once;
            // while the pump reads, wait for its answer.
            let wait = if inner.read_for_waiter(slice) {
                Duration::ZERO
            } else {
                slice
            };
            let got = crossbeam_channel::select! {
                recv(outcome) -> result => Some(result.map_err(|_| RecvTimeoutError::Disconnected)),
                recv(cancel) -> _ => {
                    if inner.discard_waiter(queue, id) {
                        return Ok(Listening::Interrupted);
                    }
                    // Already answered under the state lock: the outcome is in the channel.
                    Some(outcome.try_recv().map_err(|_| RecvTimeoutError::Disconnected))
                }
                default(wait) => None,
            };
            match got {
                Some(got) => break got,
                None if Instant::now() >= deadline => break Err(RecvTimeoutError::Timeout),
                None => {}
            }
        };
        let result = match received {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                if inner.discard_waiter(queue, id) {
                    if !in_outage {
                        inner.mark_dead(format!(
                            "sub ack for {queue} not received within {}s",
                            seconds(inner.ack_timeout)
                        ));
                        return Err(unavailable(format!("master hub ack timeout for {queue}")));
                    }
                    Outcome::HubUnhealthy
                } else {
                    // Someone took the waiter out under the state lock, and sends
                    // its outcome under that lock: it is already in the channel.
                    outcome.try_recv().unwrap_or(Outcome::Died)
                }
            }
        };
        match result {
            Outcome::Acked => Ok(Listening::Active),
            Outcome::HubUnhealthy => {
                if !inner.outage_logged.swap(true, Ordering::AcqRel) {
                    inner.log.warn(format!(
                        "{LOG_PREFIX} the master hub reports its database connection down: {queue} \
                         (and later subs) stay registered there and are LISTENed when it reconnects; \
                         until then subscribe returns without confirmation"
                    ));
                }
                Ok(Listening::AfterReconnect)
            }
            Outcome::Died => Err(unavailable(format!(
                "master hub died while awaiting ack for {queue}"
            ))),
            Outcome::Stopped => Err(unavailable(format!(
                "{STOPPED} while awaiting ack for {queue}"
            ))),
            Outcome::Rejected(reason) => Err(ClientError::Rejected {
                queue: queue.to_owned(),
                reason,
            }),
        }
    }

    /// Fire-and-forget `unsub` (see `send_quietly`).
    pub fn unsubscribe(&self, queue: &str) {
        self.send_quietly(Message::Unsub(queue.to_owned()));
    }

    /// Writes `message` whole, never cancelled; a no-op on a dead, stopped or
    /// inherited client; a failed write marks the client dead but is not reported here.
    fn send_quietly(&self, message: Message) {
        if !self.owner.is_current() || self.inner.dead.load(Ordering::Acquire) {
            return;
        }
        let frame = match message.encode() {
            Ok(frame) => frame,
            Err(e) => {
                self.inner.log.warn(format!(
                    "{LOG_PREFIX} cannot encode a {} frame: {e}",
                    message.kind()
                ));
                return;
            }
        };
        // Never cancelled: only a death stops it (a parked tail goes out first).
        let deadline = self.inner.write_deadline();
        let written = self.inner.write_frame(
            &mut lock(&self.inner.unsent),
            &frame,
            deadline,
            &crossbeam_channel::never(),
        );
        if let Err(Unwritten::Dead(reason)) = written {
            self.inner.mark_dead(reason);
        }
    }

    /// Answers the hub's `move` (`{"t":"move","k":token}`): this worker is on
    /// its way. Fire-and-forget, as `unsubscribe`.
    pub fn answer_move(&self, token: &str) {
        self.send_quietly(Message::Move(Move::Answer {
            token: token.to_owned(),
        }));
    }

    /// Asks the hub to commit a cut (`{"t":"marker","c":channel,"k":token}`)
    /// and to send `marker` once it read it. Fire-and-forget, as `unsubscribe`.
    pub fn request_marker(&self, channel: &str, token: &str) {
        self.send_quietly(Message::Marker(Marker::Commit {
            channel: channel.to_owned(),
            token: token.to_owned(),
        }));
    }

    /// The hub's last `status{healthy}`; true before the first, false once dead.
    pub fn hub_healthy(&self) -> bool {
        self.owner.is_current()
            && !self.inner.dead.load(Ordering::Acquire)
            && self.inner.healthy.load(Ordering::Acquire)
    }

    /// The longest `subscribe` waits for an ack.
    pub fn ack_timeout(&self) -> Duration {
        self.inner.ack_timeout
    }

    /// True once the transport died or the client was stopped, and always in
    /// a forked child.
    pub fn is_dead(&self) -> bool {
        !self.owner.is_current() || self.inner.dead.load(Ordering::Acquire)
    }

    /// Why the client is dead (None while alive).
    pub fn dead_reason(&self) -> Option<String> {
        if !self.owner.is_current() {
            return Some(INHERITED.to_owned());
        }
        lock(&self.inner.state).dead_reason.clone()
    }

    /// Idempotent. Releases pending waiters, shuts the socket down (the
    /// hub sees EOF, a pump's poll ends) and closes it once its last users
    /// let go (at most [`STOP_CLOSE_TIMEOUT`]). Never sends
    /// `Delivery::Failed`. Does nothing in a forked child.
    pub fn stop(&self) {
        self.stop_or_cancel(&crossbeam_channel::never());
    }

    /// [`HubClient::stop`], no longer waiting to close the socket once
    /// `cancel` receives (an embedder's unblock function): the client is
    /// stopped and its socket shut down all the same; the descriptor closes
    /// at the next `stop` or when the client drops.
    pub fn stop_or_cancel(&self, cancel: &Receiver<()>) {
        if !self.owner.is_current() {
            return;
        }
        self.inner.kill(STOPPED.to_owned(), Outcome::Stopped, false);
        self.inner
            .close(Instant::now() + STOP_CLOSE_TIMEOUT, cancel);
    }
}

/// Stops without waiting: waiters are released and the socket shut down at
/// once; if a user (the pump's poll, a writer) still holds it, it closes
/// when that user lets go. `stop` is the call that waits.
impl Drop for HubClient {
    fn drop(&mut self) {
        if self.owner.is_current() {
            self.inner.kill(STOPPED.to_owned(), Outcome::Stopped, false);
            self.inner
                .close(Instant::now(), &crossbeam_channel::never());
            return;
        }
        // Forked child: the locks may be held by parent threads that do not
        // exist here. Shut nothing down, drop nothing that would close or free.
        std::mem::forget(Arc::clone(&self.inner));
        // Close only this process's copy of the descriptor (close(2), never
        // shutdown(2)): the parent's connection is untouched, and the hub
        // still sees EOF when the parent goes away.
        if self.inner.fd_open.load(Ordering::Acquire) {
            // SAFETY: the fd was open at fork time (fd_open is cleared before
            // the parent closes it) and nothing in this process will close it
            // again: the socket owning it is leaked above.
            unsafe {
                libc::close(self.inner.raw_fd);
            }
        }
    }
}
