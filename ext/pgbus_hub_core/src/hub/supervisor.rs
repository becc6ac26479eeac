//! The hub's LISTEN engine, kept running: started with the router, restarted
//! (every routed channel LISTENed again) if it ever ends on its own — pgbus's
//! Ruby hub never does, and the host goes deaf — and stopped with a grace.

use super::HubShared;
use crate::listener::{self, Event, ListenError, ListenerConfig, ListenerHandle, ListenerStats};
use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long `stop` lets the engine UNLISTEN and close before giving up on it.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What the LISTEN engine sends the router (unbounded: the engine never
/// waits on the router, and neither a wake nor an answer may be lost).
pub enum FromEngine {
    Event(Event),
    /// The engine answered sub `id`'s LISTEN.
    Listened {
        id: u64,
        outcome: Result<(), ListenError>,
    },
}

struct Engine {
    handle: ListenerHandle,
    stats: Arc<ListenerStats>,
    task: JoinHandle<()>,
}

pub struct EngineSupervisor {
    engine: Option<Engine>,
    config: ListenerConfig,
    shared: Arc<HubShared>,
    from_engine: mpsc::UnboundedSender<FromEngine>,
}

impl EngineSupervisor {
    /// Not started yet: see [`EngineSupervisor::start`].
    pub fn new(
        config: ListenerConfig,
        shared: Arc<HubShared>,
    ) -> (Self, mpsc::UnboundedReceiver<FromEngine>) {
        let (from_engine, received) = mpsc::unbounded_channel();
        let supervisor = Self {
            engine: None,
            config,
            shared,
            from_engine,
        };
        (supervisor, received)
    }

    pub fn start(&mut self) {
        self.spawn(None);
    }

    /// A new engine; `resumed`: the stats of the one it replaces, which the
    /// new one keeps (reconnects, last error) and counts its first connection
    /// in as a reconnect, with the catch-up wakes that follow one.
    fn spawn(&mut self, resumed: Option<Arc<ListenerStats>>) {
        let from_engine = self.from_engine.clone();
        let on_event = move |event| {
            // Fails only once the router is gone (stopping): nothing to deliver to.
            let _ = from_engine.send(FromEngine::Event(event));
        };
        let config = self.config.clone();
        let (handle, stats, task) = match resumed {
            None => listener::spawn(config, on_event),
            Some(stats) => listener::respawn(config, stats, on_event),
        };
        *lock(&self.shared.listener) = Some(stats.clone());
        self.engine = Some(Engine {
            handle,
            stats,
            task,
        });
    }

    /// After the engine ended on its own: a new one, LISTENing `queues` (their
    /// subs were acked, or are pending, already: the answers need no reply).
    /// For the subscribers it is a reconnect: once it LISTENs, each is owed a
    /// catch-up wake per queue (a NOTIFY between the two engines reached
    /// nobody), and the listener's stats carry on.
    pub fn restart<'a>(&mut self, queues: impl Iterator<Item = &'a str>) {
        self.shared
            .listener_restarts
            .fetch_add(1, Ordering::Relaxed);
        self.shared.log.error(
            "the LISTEN engine ended unexpectedly — restarting it and re-LISTENing every channel",
        );
        let stats = self.engine.take().map(|ended| ended.stats);
        self.spawn(stats);
        if let Some(handle) = self.handle() {
            for queue in queues {
                handle.listen_then(queue, |_| {});
            }
        }
    }

    /// The name maps to a channel: a sub for it can be LISTENed on reconnect.
    pub fn is_valid_name(&self, queue: &str) -> bool {
        self.config.channel_for(queue).is_ok()
    }

    /// None before the start and once stopping.
    pub fn handle(&self) -> Option<&ListenerHandle> {
        self.engine.as_ref().map(|engine| &engine.handle)
    }

    pub fn stats(&self) -> Option<&ListenerStats> {
        self.engine.as_ref().map(|engine| &*engine.stats)
    }

    /// Asks the engine to LISTEN for sub `id`; the answer comes back as [`FromEngine::Listened`].
    pub fn listen_for(&self, id: u64, queue: &str) {
        if let Some(handle) = self.handle() {
            let from_engine = self.from_engine.clone();
            handle.listen_then(queue, move |outcome| {
                let _ = from_engine.send(FromEngine::Listened { id, outcome });
            });
        }
    }

    pub fn unlisten(&self, queue: &str) {
        if let Some(handle) = self.handle() {
            handle.unlisten(queue);
        }
    }

    /// Resolves when the engine's task ends (never while there is none).
    pub async fn ended(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return std::future::pending().await;
        };
        #[cfg(feature = "fault-injection")]
        tokio::select! {
            _ = &mut engine.task => {}
            () = self.shared.end_engine.notified() => {
                engine.task.abort();
                let _ = (&mut engine.task).await;
            }
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = (&mut engine.task).await;
    }

    /// The engine UNLISTENs and closes, given [`STOP_GRACE`].
    pub async fn stop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.handle.stop();
            let _ = tokio::time::timeout(STOP_GRACE, engine.task).await;
        }
    }
}
