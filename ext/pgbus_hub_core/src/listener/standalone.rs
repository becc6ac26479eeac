//! The per-worker fallback listener: the engine on a thread of its own
//! (a current_thread runtime), driven by blocking calls.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{spawn_with, Event, ListenError, ListenerConfig, ListenerHandle, ListenerStats, Start};
use crate::conninfo::DEFAULT_CONNECT_TIMEOUT;
use crate::delivery::{Delivery, DeliverySender};
use crate::log::LogSink;
use crate::owned_thread::{OwnedThread, Stopped};
use crate::process::Owner;
use crate::protocol::Wake;
use crate::sync::lock;

/// How often a first LISTEN looks whether the first connection attempt has
/// concluded (only while it has not).
const FIRST_ATTEMPT_POLL: Duration = Duration::from_millis(20);

/// How long `stop` waits for the thread (the engine's own shutdown is
/// bounded by ~0.5 s: UNLISTEN * 200 ms + close 200 ms).
const STOP_JOIN_TIMEOUT: Duration = Duration::from_secs(2);

/// `Send + Sync`: every method takes `&self`, so `stop` never waits for a
/// concurrent `listen` to let go of the listener.
pub struct StandaloneListener {
    owner: Owner,
    /// None only in a forked child's drop (leaked there, see Drop).
    handle: Option<ListenerHandle>,
    stats: Arc<ListenerStats>,
    /// How long the first connection attempt may take (its connect timeout).
    first_attempt_budget: Duration,
    /// Taken by the first `stop`.
    thread: Mutex<Option<OwnedThread>>,
    log: LogSink,
}

impl std::fmt::Debug for StandaloneListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneListener")
            .field("owner", &self.owner)
            .field("running", &lock(&self.thread).is_some())
            .finish()
    }
}

impl StandaloneListener {
    /// Starts the thread and the engine (connecting in the background).
    /// Wakes go to `deliveries`; health changes are logged and in [`Self::stats`].
    pub fn start(config: ListenerConfig, deliveries: DeliverySender) -> std::io::Result<Self> {
        Self::start_with(config, deliveries, Start::default())
    }

    /// [`Self::start`], the first transaction LISTENing `start`'s set and
    /// committing its cut (docs/architecture.md, item 1 of "Planned events").
    /// A cut's markers go to `deliveries` as [`Delivery::Marker`], in order
    /// among the wakes.
    pub fn start_with(
        config: ListenerConfig,
        deliveries: DeliverySender,
        start: Start,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let log = config.log.clone();
        let first_attempt_budget = config
            .connection
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let events_log = log.clone();
        let (handle, stats, join) = {
            let _entered = runtime.enter();
            spawn_with(config, start, move |event| match event {
                Event::Wake(wake) => {
                    deliveries.send(Delivery::Wake(wake));
                }
                Event::Marker(token) => {
                    deliveries.send(Delivery::Marker { token });
                }
                Event::CatchUp(queues) => {
                    for queue in queues {
                        deliveries.send(Delivery::Wake(Wake::durable(queue)));
                    }
                }
                Event::Healthy(healthy) => events_log.info(format!(
                    "pgbus-hub fallback listener is {}",
                    if healthy { "healthy" } else { "unhealthy" }
                )),
            })
        };
        let thread_log = log.clone();
        let stopping = handle.clone();
        let thread = OwnedThread::spawn(
            "pgbus-listen",
            move || stopping.stop(),
            move || {
                if let Err(error) = runtime.block_on(join) {
                    thread_log.error(format!("pgbus-hub fallback listener engine ended: {error}"));
                }
            },
        );
        let thread = match thread {
            Ok(thread) => thread,
            Err(error) => {
                handle.stop();
                return Err(error);
            }
        };
        Ok(Self {
            owner: Owner::current(),
            handle: Some(handle),
            stats,
            first_attempt_budget,
            thread: Mutex::new(Some(thread)),
            log,
        })
    }

    /// Blocks until `queue` is LISTENed on the live connection, or `timeout`
    /// (the request then stays queued). Call it without the Ruby GVL.
    pub fn listen(&self, queue: &str, timeout: Duration) -> Result<(), ListenError> {
        self.listen_or_cancel(queue, timeout, &crossbeam_channel::never())
    }

    /// [`StandaloneListener::listen`], giving up as soon as `cancel`
    /// receives (an embedder's unblock function): [`ListenError::Timeout`],
    /// the request stays queued, as after a timeout.
    pub fn listen_or_cancel(
        &self,
        queue: &str,
        timeout: Duration,
        cancel: &crossbeam_channel::Receiver<()>,
    ) -> Result<(), ListenError> {
        let Some(handle) = self.handle() else {
            return Err(ListenError::Stopped);
        };
        let (sender, receiver) = crossbeam_channel::bounded(1);
        handle.listen_then(queue, move |outcome| {
            let _ = sender.try_send(outcome);
        });
        // `timeout` budgets a LISTEN on a live connection. A fresh listener's
        // first connection (TLS, authentication, a busy server: 32 processes
        // forked at once on 2 loaded cores took longer than 1.25 s) is waited
        // out first, bounded by its connect timeout; a failed attempt (the
        // database down) ends this wait at once, so that case keeps `timeout`.
        let first_attempt_deadline = Instant::now() + self.first_attempt_budget;
        while !self.stats.first_attempt_concluded() && Instant::now() < first_attempt_deadline {
            crossbeam_channel::select! {
                recv(receiver) -> outcome => return outcome.unwrap_or(Err(ListenError::Stopped)),
                recv(cancel) -> _ => return Err(ListenError::Timeout),
                default(FIRST_ATTEMPT_POLL) => {}
            }
        }
        crossbeam_channel::select! {
            recv(receiver) -> outcome => outcome.unwrap_or(Err(ListenError::Stopped)),
            recv(cancel) -> _ => Err(ListenError::Timeout),
            default(timeout) => Err(ListenError::Timeout),
        }
    }

    /// Asynchronous UNLISTEN.
    pub fn unlisten(&self, queue: &str) {
        if let Some(handle) = self.handle() {
            handle.unlisten(queue);
        }
    }

    pub fn stats(&self) -> &ListenerStats {
        &self.stats
    }

    /// The engine's handle (for async callers on other runtimes); None once
    /// stopped, and in a forked child.
    pub fn handle(&self) -> Option<&ListenerHandle> {
        self.handle
            .as_ref()
            .filter(|handle| self.owner.is_current() && !handle.is_stopped())
    }

    /// Idempotent. Joins the thread within ~2 s. In a forked child it does nothing.
    pub fn stop(&self) {
        self.stop_or_cancel(&crossbeam_channel::never());
    }

    /// [`StandaloneListener::stop`], no longer waiting for the thread once
    /// `cancel` receives (an embedder's unblock function): the engine is told
    /// to stop all the same and its thread, detached, ends on its own (its
    /// shutdown is bounded, see [`STOP_JOIN_TIMEOUT`]).
    pub fn stop_or_cancel(&self, cancel: &crossbeam_channel::Receiver<()>) {
        if !self.owner.is_current() {
            return;
        }
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        match thread.stop_or_cancel(cancel, Some(STOP_JOIN_TIMEOUT)) {
            Stopped::Joined | Stopped::NotOurs => {}
            Stopped::Cancelled => self.log.debug(
                "pgbus-hub fallback listener stop interrupted; its thread finishes shutting down detached",
            ),
            Stopped::TimedOut => self.log.warn(
                "pgbus-hub fallback listener did not stop within 2 s; leaving its thread detached",
            ),
        }
    }
}

/// Only signals (through the thread's stop): the engine shuts down on its
/// own, detached; `stop` is the call that waits.
impl Drop for StandaloneListener {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A forked child: the engine's handle would wake the parent's
            // runtime through inherited descriptors. (The thread is inert here.)
            std::mem::forget(self.handle.take());
        }
    }
}
