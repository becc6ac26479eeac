//! The per-worker fallback listener: the engine on a thread of its own
//! (a current_thread runtime), driven by blocking calls.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{spawn, Event, ListenError, ListenerConfig, ListenerHandle, ListenerStats};
use crate::delivery::{Delivery, DeliverySender};
use crate::log::LogSink;
use crate::process::Owner;

/// How long `stop` waits for the thread (the engine's own shutdown is
/// bounded by ~0.5 s: UNLISTEN * 200 ms + close 200 ms).
const STOP_JOIN_TIMEOUT: Duration = Duration::from_secs(2);

pub struct StandaloneListener {
    owner: Owner,
    handle: Option<ListenerHandle>,
    stats: Arc<ListenerStats>,
    thread: Option<JoinHandle<()>>,
    finished: crossbeam_channel::Receiver<()>,
    log: LogSink,
}

impl std::fmt::Debug for StandaloneListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandaloneListener")
            .field("owner", &self.owner)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl StandaloneListener {
    /// Starts the thread and the engine (connecting in the background).
    /// Wakes go to `deliveries`; health changes are logged and in [`Self::stats`].
    pub fn start(config: ListenerConfig, deliveries: DeliverySender) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let log = config.log.clone();
        let events_log = log.clone();
        let (handle, stats, join) = {
            let _entered = runtime.enter();
            spawn(config, move |event| match event {
                Event::Wake(wake) => {
                    deliveries.send(Delivery::Wake(wake));
                }
                Event::Healthy(healthy) => events_log.info(format!(
                    "pgbus-hub fallback listener is {}",
                    if healthy { "healthy" } else { "unhealthy" }
                )),
            })
        };
        let (finished_sender, finished) = crossbeam_channel::bounded::<()>(0);
        let thread_log = log.clone();
        let thread = std::thread::Builder::new()
            .name("pgbus-listen".into())
            .spawn(move || {
                if let Err(error) = runtime.block_on(join) {
                    thread_log.error(format!("pgbus-hub fallback listener engine ended: {error}"));
                }
                drop(runtime);
                drop(finished_sender);
            });
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
            thread: Some(thread),
            finished,
            log,
        })
    }

    /// Blocks until `queue` is LISTENed on the live connection, or `timeout`
    /// (the request then stays queued). Call it without the Ruby GVL.
    pub fn ensure_listening(&self, queue: &str, timeout: Duration) -> Result<(), ListenError> {
        self.ensure_listening_or_cancel(queue, timeout, &crossbeam_channel::never())
    }

    /// [`StandaloneListener::ensure_listening`], giving up as soon as `cancel`
    /// receives (an embedder's unblock function): [`ListenError::Timeout`],
    /// the request stays queued, as after a timeout.
    pub fn ensure_listening_or_cancel(
        &self,
        queue: &str,
        timeout: Duration,
        cancel: &crossbeam_channel::Receiver<()>,
    ) -> Result<(), ListenError> {
        let handle = match (&self.handle, self.owner.is_current()) {
            (Some(handle), true) => handle,
            _ => return Err(ListenError::Stopped),
        };
        let (sender, receiver) = crossbeam_channel::bounded(1);
        handle.listen_then(queue, move |outcome| {
            let _ = sender.try_send(outcome);
        });
        crossbeam_channel::select! {
            recv(receiver) -> outcome => outcome.unwrap_or(Err(ListenError::Stopped)),
            recv(cancel) -> _ => Err(ListenError::Timeout),
            default(timeout) => Err(ListenError::Timeout),
        }
    }

    /// Asynchronous UNLISTEN.
    pub fn remove_listening(&self, queue: &str) {
        if let (Some(handle), true) = (&self.handle, self.owner.is_current()) {
            handle.unlisten(queue);
        }
    }

    pub fn stats(&self) -> &ListenerStats {
        &self.stats
    }

    /// The engine's handle (for async callers on other runtimes).
    pub fn handle(&self) -> Option<&ListenerHandle> {
        self.handle.as_ref()
    }

    /// Idempotent. Joins the thread within ~2 s. In a forked child it does nothing.
    pub fn stop(&mut self) {
        if !self.owner.is_current() {
            return;
        }
        if let Some(handle) = self.handle.take() {
            handle.stop();
        }
        if let Some(thread) = self.thread.take() {
            match self.finished.recv_timeout(STOP_JOIN_TIMEOUT) {
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    let _ = thread.join();
                }
                _ => self.log.warn(
                    "pgbus-hub fallback listener did not stop within 2 s; leaving its thread detached",
                ),
            }
        }
    }
}

impl Drop for StandaloneListener {
    fn drop(&mut self) {
        if self.owner.is_current() {
            self.stop();
        } else {
            // A forked child: the thread does not exist here and the
            // connection is the parent's. Touch neither (no wake of the
            // parent's runtime through inherited fds, no detach of a foreign thread).
            std::mem::forget(self.handle.take());
            std::mem::forget(self.thread.take());
        }
    }
}
