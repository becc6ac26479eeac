//! The worker's hub client: one Unix-socket connection to the master hub.
//!
//! `ensure_listening` writes `sub` and blocks until the hub acks (the LISTEN
//! is active), so the no-lost-wake contract crosses the process boundary.
//! Whoever reads the socket decodes the hub's frames: wakes go to the
//! [`DeliverySender`] (per-queue order preserved), acks release waiters,
//! `status` records the hub's health. Two ways to read:
//! - [`HubClient::connect`]: a native reader thread (Rust callers, tests);
//! - [`HubClient::connect_driven`]: no thread; the embedder's pump thread
//!   calls [`DrivenReader::next_batch`], which polls the socket itself. The
//!   gem uses this: a wake costs one thread wake-up instead of two (reader
//!   thread, then pump thread), and a Ruby process that stops draining its
//!   wakes pushes back on the hub (drops, then eviction) instead of growing
//!   an in-process queue. Acks are resolved inside the same wait, so they
//!   need the pump thread to be running: a pump stuck in Ruby for longer
//!   than `ack_timeout` makes `ensure_listening` time out (and fail over).
//!
//! Database outages are not transport failures. While the hub's last
//! `status` says its PostgreSQL connection is down, `ensure_listening` returns
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
//! Fork: a client inherited by a forked child is inert there. It reports dead
//! and never writes to, shuts down or joins the parent's socket and thread.

use crate::delivery::{self, Batch, Delivery, DeliveryReceiver, DeliverySender, WakeSource};
use crate::log::LogSink;
use crate::process::Owner;
use crate::protocol::{Decoder, Message};
use crate::sync::{lock, read};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read};
use std::mem::ManuallyDrop;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

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

/// How long `stop` waits for the reader thread before leaving it detached.
pub const STOP_JOIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The reader decodes JSON nested up to 100 deep; 512 KiB is ample.
const READER_STACK_BYTES: usize = 512 * 1024;

/// How long `ensure_listening` waits for an ack while the hub reports its
/// database connection down. Long enough for a hub still making its first
/// connection to a local server (a few ms) to ack; short enough that a request
/// subscribing during an outage stays far below 100 ms and far below
/// `ack_timeout` (seconds), which is for a hub that is gone or wedged.
pub const UNHEALTHY_ACK_GRACE: Duration = Duration::from_millis(50);

const LOG_PREFIX: &str = "[pgbus-hub] HubClient:";

const INHERITED: &str = "master hub client was inherited across fork; connect a new one";

const STOPPED: &str = "master hub client stopped";

pub struct ClientConfig {
    pub socket_path: PathBuf,
    /// Bounds both the write of a frame and the wait for a `sub`'s ack.
    pub ack_timeout: Duration,
    pub log: LogSink,
}

impl ClientConfig {
    /// Default ack timeout (2 s), log records to the `log` facade only.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            log: LogSink::silent(),
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
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(message) => f.write_str(message),
            Self::Rejected { queue, reason } => {
                write!(f, "master hub refused {queue}: {reason}")
            }
        }
    }
}

impl std::error::Error for ClientError {}

/// How `ensure_listening` succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listening {
    /// The hub acked: its LISTEN is active.
    Active,
    /// The hub's database connection is down: the sub is registered there and
    /// is LISTENed when the hub reconnects (not waited for).
    AfterReconnect,
    /// The caller cancelled the wait (an embedder's unblock function: Ruby's
    /// Thread#kill): the sub was sent and stays registered, unconfirmed.
    Interrupted,
}

/// What a waiter in `ensure_listening` is told.
#[derive(Clone, Debug)]
enum Outcome {
    Acked,
    /// The hub reported its database connection down while this sub waited.
    HubUnhealthy,
    Died,
    Stopped,
    Rejected(String),
}

struct Waiter {
    id: u64,
    outcome: Sender<Outcome>,
}

#[derive(Default)]
struct State {
    /// Set once, by the first of death or stop; never cleared.
    dead_reason: Option<String>,
    /// FIFO per queue: an ack releases the oldest waiter.
    pending: HashMap<String, VecDeque<Waiter>>,
    next_waiter: u64,
}

struct Inner {
    socket_path: PathBuf,
    ack_timeout: Duration,
    log: LogSink,
    deliveries: DeliverySender,
    /// Shared (read) by the reader's reads, the writer and shutdown(2);
    /// taken (write) only by `stop` once the reader has exited, to close it.
    stream: RwLock<Option<UnixStream>>,
    /// The descriptor number, for a forked child to close its copy without
    /// touching locks a parent thread may have held at fork time.
    raw_fd: RawFd,
    /// False from just before `stop` closes the descriptor.
    fd_open: AtomicBool,
    /// Frames never interleave.
    write_lock: Mutex<()>,
    state: Mutex<State>,
    /// Mirrors `state.dead_reason.is_some()` for lock-free reads.
    dead: AtomicBool,
    healthy: AtomicBool,
    /// Set when a sub returned `AfterReconnect` (and logged), cleared when the
    /// hub is healthy again: one WARN per outage.
    outage_logged: AtomicBool,
}

struct Reader {
    handle: JoinHandle<()>,
    /// Disconnected when the reader thread has finished.
    exited: Receiver<()>,
}

/// The worker side of the master hub. `Send + Sync`: every method may be
/// called from any thread, concurrently.
pub struct HubClient {
    inner: Arc<Inner>,
    owner: Owner,
    reader: Mutex<Option<Reader>>,
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
    /// Connects and starts the reader thread.
    pub fn connect(config: ClientConfig, deliveries: DeliverySender) -> Result<Self, ClientError> {
        let inner = Inner::connect(config, deliveries)?;
        let (exited_sender, exited) = crossbeam_channel::bounded::<()>(0);
        let reader_inner = Arc::clone(&inner);
        let spawned = thread::Builder::new()
            .name("pgbus-hub-client".into())
            .stack_size(READER_STACK_BYTES)
            .spawn(move || {
                let _exited = exited_sender;
                reader_main(reader_inner);
            });
        match spawned {
            Ok(handle) => Ok(Self {
                inner,
                owner: Owner::current(),
                reader: Mutex::new(Some(Reader { handle, exited })),
            }),
            // The closure (and its Arc) is dropped, so `inner` is the last
            // owner: dropping it closes the socket.
            Err(e) => Err(inner.unreachable(format!("cannot start the reader thread: {e}"))),
        }
    }

    /// Connects without a reader thread: the returned [`DrivenReader`] reads
    /// the socket whenever its caller waits for wakes (see the module doc).
    pub fn connect_driven(config: ClientConfig) -> Result<(Self, DrivenReader), ClientError> {
        let (deliveries, receiver) = delivery::channel();
        let inner = Inner::connect(config, deliveries)?;
        let wakeup = Wakeup::new()
            .map_err(|e| inner.unreachable(format!("cannot create the wake-up eventfd: {e}")))?;
        let owner = Owner::current();
        let reader = DrivenReader {
            inner: ManuallyDrop::new(Arc::clone(&inner)),
            receiver: ManuallyDrop::new(receiver),
            frames: Mutex::new(FrameReader::new()),
            wakeup,
            owner,
        };
        let client = Self {
            inner,
            owner,
            reader: Mutex::new(None),
        };
        Ok((client, reader))
    }

    /// Subscribes to `queue` and blocks until the hub acks it (LISTEN active),
    /// or, while the hub reports its database down, at most
    /// [`UNHEALTHY_ACK_GRACE`] (then `AfterReconnect`).
    pub fn ensure_listening(&self, queue: &str) -> Result<Listening, ClientError> {
        self.ensure_listening_or_cancel(queue, &crossbeam_channel::never())
    }

    /// [`HubClient::ensure_listening`], returning [`Listening::Interrupted`]
    /// as soon as `cancel` receives.
    pub fn ensure_listening_or_cancel(
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
        let (sender, outcome) = crossbeam_channel::bounded(1);
        let id = {
            let mut state = lock(&inner.state);
            if let Some(reason) = &state.dead_reason {
                return Err(unavailable(format!("master hub is unavailable: {reason}")));
            }
            let id = state.next_waiter;
            state.next_waiter += 1;
            // Registered BEFORE the write: the ack may beat our return from it.
            state
                .pending
                .entry(queue.to_owned())
                .or_default()
                .push_back(Waiter {
                    id,
                    outcome: sender,
                });
            id
        };
        if let Err(reason) = inner.write_frame(&frame) {
            inner.discard_waiter(queue, id);
            inner.mark_dead(reason);
            return Err(inner.unavailable_now());
        }
        // Unhealthy when the sub went out: wait the grace period only; if no ack
        // came by then, the LISTEN waits for the hub's reconnect, not the hub.
        let in_outage = !inner.healthy.load(Ordering::Acquire);
        let budget = if in_outage {
            inner.ack_timeout.min(UNHEALTHY_ACK_GRACE)
        } else {
            inner.ack_timeout
        };
        let received = crossbeam_channel::select! {
            recv(outcome) -> result => result.map_err(|_| RecvTimeoutError::Disconnected),
            recv(cancel) -> _ => {
                if inner.discard_waiter(queue, id) {
                    return Ok(Listening::Interrupted);
                }
                // Already answered under the state lock: the outcome is in the channel.
                outcome.try_recv().map_err(|_| RecvTimeoutError::Disconnected)
            }
            default(budget) => Err(RecvTimeoutError::Timeout),
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
                         until then ensure_listening returns without confirmation"
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

    /// Fire-and-forget `unsub`. A no-op on a dead, stopped or inherited
    /// client; a failed write marks the client dead but is not reported here.
    pub fn remove_listening(&self, queue: &str) {
        if !self.owner.is_current() || self.inner.dead.load(Ordering::Acquire) {
            return;
        }
        let frame = match Message::Unsub(queue.to_owned()).encode() {
            Ok(frame) => frame,
            Err(e) => {
                self.inner.log.warn(format!(
                    "{LOG_PREFIX} cannot encode unsub for {queue:?}: {e}"
                ));
                return;
            }
        };
        if let Err(reason) = self.inner.write_frame(&frame) {
            self.inner.mark_dead(reason);
        }
    }

    /// The hub's last `status{healthy}`; true before the first, false once dead.
    pub fn hub_healthy(&self) -> bool {
        self.owner.is_current()
            && !self.inner.dead.load(Ordering::Acquire)
            && self.inner.healthy.load(Ordering::Acquire)
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

    /// Idempotent. Releases pending waiters, shuts the socket down, joins the
    /// reader (at most [`STOP_JOIN_TIMEOUT`]) and closes the socket. Never
    /// sends `Delivery::Failed`. Does nothing in a forked child.
    pub fn stop(&self) {
        if !self.owner.is_current() {
            return;
        }
        let deadline = Instant::now() + STOP_JOIN_TIMEOUT;
        self.inner.kill(STOPPED.to_owned(), Outcome::Stopped, false);
        // None with a driven reader (its poll ends at shutdown(2), like a read).
        if let Some(reader) = lock(&self.reader).take() {
            match reader.exited.recv_deadline(deadline) {
                Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                    let _ = reader.handle.join();
                }
                Err(RecvTimeoutError::Timeout) => {
                    // Cannot happen short of a wedged kernel: shutdown(2) ends the
                    // read. Leave the thread detached; the socket closes with it.
                    self.inner.log.warn(format!(
                        "{LOG_PREFIX} reader did not exit within {}s of stop; detached",
                        seconds(STOP_JOIN_TIMEOUT)
                    ));
                    return;
                }
            }
        }
        self.inner.close(deadline);
    }
}

impl Drop for HubClient {
    fn drop(&mut self) {
        if self.owner.is_current() {
            self.stop();
            return;
        }
        // Forked child: the reader thread does not exist here and the locks
        // may be held by parent threads that do not exist either. Join
        // nothing, shut nothing down, drop nothing that would close or free.
        let reader = self
            .reader
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        std::mem::forget(reader);
        std::mem::forget(Arc::clone(&self.inner));
        // Close only this process's copy of the descriptor (close(2), never
        // shutdown(2)): the parent's connection is untouched, and the hub
        // still sees EOF when the parent goes away.
        if self.inner.fd_open.load(Ordering::Acquire) {
            // SAFETY: the fd was open at fork time (fd_open is cleared before
            // the parent closes it) and nothing in this process will close it
            // again: the UnixStream owning it is leaked above.
            unsafe {
                libc::close(self.inner.raw_fd);
            }
        }
    }
}

impl Inner {
    fn connect(config: ClientConfig, deliveries: DeliverySender) -> Result<Arc<Self>, ClientError> {
        let ClientConfig {
            socket_path,
            ack_timeout,
            log,
        } = config;
        let unreachable = |why: String| unreachable_at(&socket_path, why);
        crate::transport::check_socket_path(&socket_path).map_err(unreachable)?;
        let stream = UnixStream::connect(&socket_path).map_err(|e| unreachable(e.to_string()))?;
        let raw_fd = stream.as_raw_fd();
        Ok(Arc::new(Inner {
            socket_path,
            ack_timeout,
            log,
            deliveries,
            stream: RwLock::new(Some(stream)),
            raw_fd,
            fd_open: AtomicBool::new(true),
            write_lock: Mutex::new(()),
            state: Mutex::new(State::default()),
            dead: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            outage_logged: AtomicBool::new(false),
        }))
    }

    fn unreachable(&self, why: String) -> ClientError {
        unreachable_at(&self.socket_path, why)
    }

    /// The error for a call on a dead client.
    fn unavailable_now(&self) -> ClientError {
        let reason = lock(&self.state)
            .dead_reason
            .clone()
            .unwrap_or_else(|| "unknown reason".into());
        unavailable(format!("master hub is unavailable: {reason}"))
    }

    /// Removes waiter `id`; false if it was already taken (its outcome is sent).
    fn discard_waiter(&self, queue: &str, id: u64) -> bool {
        let mut state = lock(&self.state);
        let Some(waiters) = state.pending.get_mut(queue) else {
            return false;
        };
        let Some(index) = waiters.iter().position(|w| w.id == id) else {
            return false;
        };
        waiters.remove(index);
        if waiters.is_empty() {
            state.pending.remove(queue);
        }
        true
    }

    /// The transport died: idempotent, one `Delivery::Failed`.
    fn mark_dead(&self, reason: String) {
        self.kill(reason, Outcome::Died, true);
    }

    /// First caller wins: records the reason, releases every waiter, shuts
    /// the socket down; with `report`, logs and sends `Delivery::Failed`.
    fn kill(&self, reason: String, outcome: Outcome, report: bool) -> bool {
        {
            let mut state = lock(&self.state);
            if state.dead_reason.is_some() {
                return false;
            }
            state.dead_reason = Some(reason.clone());
            self.dead.store(true, Ordering::Release);
            self.healthy.store(false, Ordering::Release);
            // Under the lock: a waiter that times out concurrently either
            // finds itself still pending or finds its outcome already sent.
            for (_, waiters) in state.pending.drain() {
                for waiter in waiters {
                    let _ = waiter.outcome.try_send(outcome.clone());
                }
            }
            if report {
                // Under the lock too: wakes are sent under it, so Failed is
                // the last delivery this client ever makes.
                self.deliveries.send(Delivery::Failed {
                    reason: reason.clone(),
                });
            }
        }
        self.shutdown();
        if report {
            self.log.warn(format!(
                "{LOG_PREFIX} {reason} — falling back to a per-worker listener"
            ));
        }
        true
    }

    fn shutdown(&self) {
        let stream = read(&self.stream);
        if let Some(stream) = stream.as_ref() {
            // ENOTCONN if the peer is already gone: nothing left to do.
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Closes the socket once the reader is gone. Writers hold the stream
    /// only for a bounded time (and fail at once after shutdown); if one is
    /// still there at `deadline`, the socket closes when the client drops.
    fn close(&self, deadline: Instant) {
        loop {
            match self.stream.try_write() {
                Ok(mut stream) => {
                    self.fd_open.store(false, Ordering::Release);
                    drop(stream.take());
                    return;
                }
                Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                    self.fd_open.store(false, Ordering::Release);
                    drop(poisoned.into_inner().take());
                    return;
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Writes a whole frame within `ack_timeout`; Err(reason) on a failure
    /// or stall (the caller marks the client dead).
    fn write_frame(&self, frame: &[u8]) -> Result<(), String> {
        let deadline = Instant::now().checked_add(self.ack_timeout);
        let _serial = lock(&self.write_lock);
        let stream = read(&self.stream);
        let Some(stream) = stream.as_ref() else {
            return Err(STOPPED.into());
        };
        let fd = stream.as_raw_fd();
        let mut written = 0;
        while written < frame.len() {
            let rest = &frame[written..];
            // SAFETY: fd is open (we hold the stream); rest is a valid buffer.
            // MSG_NOSIGNAL: a closed peer is EPIPE, not SIGPIPE.
            // MSG_DONTWAIT: the socket stays blocking for the reader.
            let sent = unsafe {
                libc::send(
                    fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if sent >= 0 {
                written += sent as usize;
                continue;
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    let stalled = || {
                        format!(
                            "write to master hub stalled for {}s",
                            seconds(self.ack_timeout)
                        )
                    };
                    let timeout_ms = match deadline {
                        None => -1,
                        Some(deadline) => {
                            let left = deadline.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                return Err(stalled());
                            }
                            // Round up: never spin on a sub-millisecond rest.
                            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                        }
                    };
                    let mut poll_fd = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    let ready = unsafe { libc::poll(&mut poll_fd, 1, timeout_ms) };
                    if ready < 0 {
                        let error = io::Error::last_os_error();
                        if error.kind() != io::ErrorKind::Interrupted {
                            return Err(format!("write to master hub failed: {error}"));
                        }
                    }
                    // ready == 0 is a timeout: the next pass sees the deadline.
                    // POLLERR/POLLHUP: the next send reports the error.
                }
                _ => return Err(format!("write to master hub failed: {error}")),
            }
        }
        Ok(())
    }

    /// One read from the socket; None once `stop` closed it.
    fn read_some(&self, decoder: &mut Decoder) -> Option<io::Result<usize>> {
        let stream = read(&self.stream);
        let mut stream: &UnixStream = stream.as_ref()?;
        Some(decoder.read_with(|buffer| stream.read(buffer)))
    }

    /// The driven reader's wait: polls the socket and `wakeup` for at most
    /// `timeout`, then reads what is there. The stream stays read-locked
    /// throughout, so `stop` cannot close (and the kernel reuse) the fd under
    /// the poll; its shutdown(2) ends the poll at once.
    fn read_when_ready(&self, decoder: &mut Decoder, wakeup: &Wakeup, timeout: Duration) -> Ready {
        let stream = read(&self.stream);
        let Some(stream) = stream
            .as_ref()
            .filter(|_| !self.dead.load(Ordering::Acquire))
        else {
            return Ready::Closed;
        };
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            wakeup.poll_fd(),
        ];
        match poll_for(&mut fds, timeout) {
            0 => Ready::TimedOut,
            _ if fds[1].revents != 0 => Ready::Interrupted,
            _ if fds[0].revents != 0 => {
                // SAFETY: fd is open (we hold the stream); buffer is valid.
                // MSG_DONTWAIT: never block with the stream lock held.
                Ready::Read(decoder.read_with(|buffer| {
                    let got = unsafe {
                        libc::recv(
                            stream.as_raw_fd(),
                            buffer.as_mut_ptr().cast(),
                            buffer.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if got < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(got as usize)
                    }
                }))
            }
            // EINTR: the caller's loop polls again.
            _ => Ready::Read(Err(io::ErrorKind::Interrupted.into())),
        }
    }

    /// Handles one decoded frame; Err(reason) kills the client.
    fn handle_frame(&self, message: Message) -> Result<(), String> {
        match message {
            Message::Wake(wake) => {
                let state = lock(&self.state);
                if state.dead_reason.is_none() {
                    self.deliveries.send(Delivery::Wake(wake));
                }
            }
            Message::Ack(queue) => {
                let mut state = lock(&self.state);
                let waiter = state.pending.get_mut(&queue).and_then(VecDeque::pop_front);
                if state.pending.get(&queue).is_some_and(VecDeque::is_empty) {
                    state.pending.remove(&queue);
                }
                match waiter {
                    Some(waiter) => {
                        // After `healthy: false` the hub acks a sub it will
                        // LISTEN on reconnect (frames arrive in the order sent).
                        let outcome = if self.healthy.load(Ordering::Acquire) {
                            Outcome::Acked
                        } else {
                            Outcome::HubUnhealthy
                        };
                        let _ = waiter.outcome.try_send(outcome);
                    }
                    None => {
                        drop(state);
                        self.log.debug(format!(
                            "{LOG_PREFIX} ack for {queue:?} with no waiter; ignored"
                        ));
                    }
                }
            }
            Message::Status { healthy } => {
                let mut state = lock(&self.state);
                if state.dead_reason.is_none() {
                    let was = self.healthy.swap(healthy, Ordering::AcqRel);
                    if was && !healthy {
                        // Nobody waits out ack_timeout for a LISTEN that needs a reconnect first.
                        for (_, waiters) in state.pending.drain() {
                            for waiter in waiters {
                                let _ = waiter.outcome.try_send(Outcome::HubUnhealthy);
                            }
                        }
                    }
                    if healthy && !was && self.outage_logged.swap(false, Ordering::AcqRel) {
                        drop(state);
                        self.log.info(format!(
                            "{LOG_PREFIX} the master hub's database connection is back"
                        ));
                    }
                }
            }
            Message::Nack { queue, reason } => self.handle_nack(&queue, reason),
            Message::Sub(_) | Message::Unsub(_) | Message::Unknown(_) => {
                self.log.warn(format!(
                    "{LOG_PREFIX} hub sent unknown frame {}; ignored",
                    describe_kind(&message)
                ));
            }
        }
        Ok(())
    }

    /// `{"t":"nack","q":Q,"reason":R}` (our extension): fail the oldest
    /// waiter for Q only; the client stays alive.
    fn handle_nack(&self, queue: &str, reason: String) {
        let mut state = lock(&self.state);
        let waiter = state.pending.get_mut(queue).and_then(VecDeque::pop_front);
        if state.pending.get(queue).is_some_and(VecDeque::is_empty) {
            state.pending.remove(queue);
        }
        match waiter {
            Some(waiter) => {
                let _ = waiter.outcome.try_send(Outcome::Rejected(reason));
            }
            None => {
                drop(state);
                self.log.debug(format!(
                    "{LOG_PREFIX} nack for {queue:?} with no waiter; ignored"
                ));
            }
        }
    }
}

/// The "t" of an unexpected frame, for the log line.
fn describe_kind(message: &Message) -> String {
    match message {
        Message::Sub(_) => "\"sub\"".into(),
        Message::Unsub(_) => "\"unsub\"".into(),
        Message::Unknown(object) => match object.get("t") {
            Some(kind) => kind.to_string(),
            None => "without \"t\"".into(),
        },
        _ => "?".into(),
    }
}

/// What the driven reader's wait ended with.
enum Ready {
    Read(io::Result<usize>),
    Interrupted,
    TimedOut,
    /// Stopped or dead: nothing more will be read.
    Closed,
}

/// poll(2) for at most `timeout` (rounded up to whole ms: never a busy spin);
/// the number of ready descriptors, or -1 (EINTR and the like).
fn poll_for(fds: &mut [libc::pollfd], timeout: Duration) -> i32 {
    let timeout_ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid slice of pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// What one read did to the client.
enum Step {
    Continue,
    /// The client was already dead or stopped.
    Closed,
    /// The transport died: this is why.
    Died(String),
}

/// The decoding half of reading, shared by the reader thread and the driven
/// reader: partial frames carry over between reads.
struct FrameReader {
    decoder: Decoder,
}

impl FrameReader {
    fn new() -> Self {
        Self {
            decoder: Decoder::new(),
        }
    }

    /// Handles what one read into `self.decoder` returned.
    fn absorb(&mut self, inner: &Inner, read: io::Result<usize>) -> Step {
        if inner.dead.load(Ordering::Acquire) {
            return Step::Closed;
        }
        match read {
            Ok(0) if self.decoder.has_partial_frame() => {
                return Step::Died("master hub closed the transport mid-frame".into())
            }
            Ok(0) => return Step::Died("master hub closed the transport".into()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                return Step::Continue
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Step::Died("master hub reset the transport".into())
            }
            Err(e) => return Step::Died(format!("master hub transport error: {e}")),
        }
        loop {
            match self.decoder.next_message() {
                Ok(Some(message)) => {
                    if let Err(reason) = inner.handle_frame(message) {
                        return Step::Died(reason);
                    }
                }
                Ok(None) => return Step::Continue,
                Err(e) => return Step::Died(format!("master hub protocol error: {e}")),
            }
        }
    }
}

/// The reason recorded when reading panicked (a bug; the client dies cleanly).
fn crash_reason(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    format!("master hub reader crashed: {what}")
}

fn reader_main(inner: Arc<Inner>) {
    let result = panic::catch_unwind(AssertUnwindSafe(|| read_until_death(&inner)));
    let reason = match result {
        Ok(Some(reason)) => reason,
        Ok(None) => return,
        Err(panic) => crash_reason(panic),
    };
    // A no-op after stop (already dead), so a clean stop never reports.
    inner.mark_dead(reason);
}

/// Reads and handles frames until the transport ends. Some(reason) if it died,
/// None if the client was already dead or stopped.
fn read_until_death(inner: &Inner) -> Option<String> {
    let mut frames = FrameReader::new();
    loop {
        let read = inner.read_some(&mut frames.decoder)?;
        match frames.absorb(inner, read) {
            Step::Continue => {}
            Step::Closed => return None,
            Step::Died(reason) => return Some(reason),
        }
    }
}

/// An eventfd that makes the driven reader's poll return (Ruby's unblock
/// function, `stop` of the pump). Level-triggered until `clear`.
struct Wakeup(OwnedFd);

impl Wakeup {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn poll_fd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }
    }

    /// Async-signal-safe and callable from any thread.
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64; EAGAIN (counter full) is fine.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN (not signalled) is fine.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

/// The hub client's wakes, read by the caller's thread (see
/// [`HubClient::connect_driven`]). One thread at a time waits in
/// `next_batch`; `interrupt` may be called from any thread.
///
/// Decoded wakes still pass through the client's delivery channel (an
/// uncontended push and pop, no wake-up): it keeps one path for both reading
/// modes, and `kill` queues `Failed` there under the state lock, after every
/// wake, whichever thread found the transport dead.
pub struct DrivenReader {
    // ManuallyDrop: in a forked child these are leaked (see Drop).
    inner: ManuallyDrop<Arc<Inner>>,
    receiver: ManuallyDrop<DeliveryReceiver>,
    frames: Mutex<FrameReader>,
    wakeup: Wakeup,
    owner: Owner,
}

impl WakeSource for DrivenReader {
    /// Returns wakes already decoded; otherwise polls the socket (resolving
    /// acks, nacks and status on the way) until wakes arrive, `interrupt`,
    /// or `timeout`. Once the client died or was stopped: what is left (a
    /// death's one `Failed`), then `closed`.
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch {
        if !self.owner.is_current() {
            return Batch {
                closed: true,
                ..Batch::default()
            };
        }
        // None past Instant's range (e.g. Duration::MAX): poll_for clamps each wait.
        let deadline = Instant::now().checked_add(timeout);
        let mut frames = lock(&self.frames);
        loop {
            let mut batch = Batch::default();
            self.receiver.take_ready(&mut batch, max);
            if !batch.items.is_empty() || batch.closed {
                return batch;
            }
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            let inner = &**self.inner;
            match inner.read_when_ready(&mut frames.decoder, &self.wakeup, left) {
                Ready::Read(read) => {
                    let step = panic::catch_unwind(AssertUnwindSafe(|| frames.absorb(inner, read)))
                        .unwrap_or_else(|panic| Step::Died(crash_reason(panic)));
                    if let Step::Died(reason) = step {
                        inner.mark_dead(reason); // queues `Failed` for the next pass
                    }
                }
                Ready::Interrupted => {
                    self.wakeup.clear();
                    batch.interrupted = true;
                    return batch;
                }
                Ready::TimedOut => return batch,
                Ready::Closed => {
                    // kill() marks the client dead and queues `Failed` under
                    // the state lock: once we have held it, everything this
                    // client will ever deliver is in the channel.
                    drop(lock(&inner.state));
                    self.receiver.take_ready(&mut batch, max);
                    batch.closed = batch.items.is_empty();
                    return batch;
                }
            }
        }
    }

    fn interrupt(&self) {
        self.wakeup.signal();
    }
}

impl Drop for DrivenReader {
    fn drop(&mut self) {
        if self.owner.is_current() {
            // SAFETY: each field is dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.receiver);
                ManuallyDrop::drop(&mut self.inner);
            }
        }
        // Forked child: the channel's and the client's locks may have been
        // held by parent threads at fork time; leak rather than touch them.
        // (The eventfd is this process's own copy: closing it is harmless.)
    }
}
