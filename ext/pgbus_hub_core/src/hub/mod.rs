//! The master hub: ONE PostgreSQL LISTEN connection for a whole host, fanned
//! out to the workers of a preforking server over a Unix socket.
//!
//! Everything runs on one native thread: a current-thread tokio runtime with
//! the LISTEN engine, the router, the accept loop and two small tasks per
//! worker. The thread count does not grow with workers. (A configured
//! metrics endpoint runs on a second thread, so a scrape never waits on this one.)
//!
//! - [`router`]: owns the routing table, the workers and the engine; answers
//!   subs, routes wakes, broadcasts health. Workers talk to it by command.
//! - [`pending`]: subs waiting for their LISTEN, and the outage rule (pure state).
//! - [`supervisor`]: the LISTEN engine, restarted if it ends on its own.
//! - [`limits`]: every budget a worker's frames pass through, and the set one hub applies.
//! - [`outbox`]: the backpressure policy (limits, drops, evictions), one function.
//! - [`registry`]: queue -> workers, refcounted (last ref out UNLISTENs).
//! - [`worker_connection`]: one connection: a reader (frames to commands) and a writer (outbox to socket).
//! - [`server`]: socket creation (0600, stale-socket rules), peer uid, shutdown(2).
//! - [`stale`]: sockets other hubs left beside ours when killed (removed at start).
//! - [`metrics`]: the stats as Prometheus metrics, and `GET /metrics` (a thread of its own).
//! - [`totals`]: the counters a hub at the same socket path carries on from, within one process.

mod command;
pub mod limits;
pub mod metrics;
mod outbox;
mod pending;
mod registry;
mod replace;
mod router;
pub mod server;
mod stale;
mod supervisor;
mod totals;
mod worker_connection;

use crate::listener::{self, ListenerConfig, ListenerStats};
use crate::log::LogSink;
use crate::owned_thread::{OwnedThread, Stopped};
use crate::process::Owner;
use crate::shutdown::{shutdown, Shutdown, ShutdownTrigger};
use crate::sync::lock;
use limits::Limits;
use metrics::{AckHistogram, AckTimes, MetricsConfig};
use outbox::Backpressure;
use router::Router;
use server::SocketFile;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use totals::Totals;

pub use router::{MOVE_ANSWER_GRACE, MOVE_DEADLINE};

pub use limits::{
    DEFAULT_DURABLE_QUEUE_LIMIT, DEFAULT_HARD_QUEUE_LIMIT, DEFAULT_MAX_CHANNELS,
    DEFAULT_MAX_CHANNELS_PER_CONNECTION, DEFAULT_STATUS_INTERVAL, MAX_PENDING_SUBS,
};
pub use stale::stale_sockets;

/// How long `stop` waits for the metrics endpoint's thread (told at once, it ends at its next poll).
const METRICS_STOP: Duration = Duration::from_secs(2);

/// The environment variable that names the hub's socket to the workers (pgbus's).
pub const SOCKET_ENV: &str = "PGBUS_STREAMS_HUB_SOCKET";

/// pgbus's hub socket file name: one per Puma master pid (`pid` may be a glob's `*`).
pub fn socket_file_name(pid: &str) -> String {
    format!("pgbus-streams-hub-{pid}.sock")
}

#[derive(Clone)]
pub struct HubConfig {
    pub listener: ListenerConfig,
    pub socket_path: PathBuf,
    /// Between `status{healthy}` broadcasts (also sent on connect and on every change).
    pub status_interval: Duration,
    /// These four and `status_interval`: what the hub applies is its [`Limits`].
    pub durable_queue_limit: usize,
    pub hard_queue_limit: usize,
    /// Past these a sub that would add a channel is refused with a `nack`.
    pub max_channels_per_connection: usize,
    pub max_channels: usize,
    /// Where to serve `GET /metrics` (None: no endpoint).
    pub metrics: Option<MetricsConfig>,
}

/// A point-in-time copy of the hub's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HubStats {
    /// Worker connections (a stats-only monitor is not one).
    pub workers: usize,
    /// The processes behind them (distinct peer pids): one process may hold
    /// several connections (pgbus's streams and ActionCable's adapter each one).
    pub worker_processes: usize,
    pub channels: usize,
    /// Of `channels`, the raw ones (ActionCable's, LISTENed verbatim).
    pub raw_channels: usize,
    pub listener_healthy: bool,
    /// Where the hub's LISTEN connection stands.
    pub listener_state: listener::ListenerState,
    pub reconnects: u64,
    /// Reconnects where the given-up connection handed its backlog over (nothing lost).
    pub handovers: u64,
    /// Given-up connections closed before they could hand their backlog over.
    pub abandoned_connections: u64,
    /// The LISTEN engine's connections that LISTEN (the census from inside):
    /// 1, 2 with `standby` while the standby is up (docs/architecture.md, "Standby").
    pub listen_connections: usize,
    /// A standby is up and aligned: the serving connection's loss is covered.
    pub standby_aligned: bool,
    /// Serving connections lost while a standby was aligned: the standby
    /// served on from where they stopped, nothing lost (no reconnect counted).
    pub standby_promotions: u64,
    pub wakes_received: u64,
    pub frames_sent: u64,
    pub dropped_durable_wakes: u64,
    pub evicted_workers: u64,
    pub rejected_peers: u64,
    /// Subs refused because they would pass a channel cap.
    pub refused_subs: u64,
    /// Workers a planned stop handed over at their markers (nothing lost, nothing twice).
    pub moved_workers: u64,
    /// Workers a planned stop closed without a marker (no answer to `move`,
    /// the deadline): they failed over as after an unplanned stop.
    pub unmoved_workers: u64,
    pub listener_restarts: u64,
    /// Sub->ack times (from a sub frame read to its ack written).
    pub subscribe_ack: AckTimes,
    /// Native threads the hub runs: 1 while running (2 with a metrics
    /// endpoint), 0 after stop, whatever the worker count.
    pub threads: usize,
    pub last_error: Option<String>,
    /// When `last_error` happened; an error older than `healthy_since` was resolved.
    pub last_error_at: Option<SystemTime>,
    /// When the listener last became healthy; None while it is not.
    pub healthy_since: Option<SystemTime>,
    /// The LISTEN connection's server session (pid, database, client address).
    pub backend: Option<listener::Backend>,
    /// Where `GET /metrics` is served (None: not configured, or it could not bind).
    pub metrics_address: Option<std::net::SocketAddr>,
    pub uptime: Duration,
    /// The budgets this hub applies (fixed for its life).
    pub limits: Limits,
}

fn unix_seconds(time: Option<SystemTime>) -> serde_json::Value {
    time.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(serde_json::Value::Null, |d| d.as_secs_f64().into())
}

impl HubStats {
    /// The one field list: the `stats` frame (`pgbus-hub status`) and
    /// `MasterHub#stats` in Ruby both show exactly this. Times are Unix seconds.
    pub fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let backend = self.backend.as_ref();
        let mut fields = serde_json::Map::new();
        let mut put = |key: &str, value: serde_json::Value| {
            fields.insert(key.into(), value);
        };
        put("workers", self.workers.into());
        put("worker_processes", self.worker_processes.into());
        put("channels", self.channels.into());
        put("raw_channels", self.raw_channels.into());
        put("listener_healthy", self.listener_healthy.into());
        put("listener_state", self.listener_state.as_str().into());
        put("reconnects", self.reconnects.into());
        put("handovers", self.handovers.into());
        put("abandoned_connections", self.abandoned_connections.into());
        put("listen_connections", self.listen_connections.into());
        put("standby_aligned", self.standby_aligned.into());
        put("standby_promotions", self.standby_promotions.into());
        put("wakes_received", self.wakes_received.into());
        put("frames_sent", self.frames_sent.into());
        put("dropped_durable_wakes", self.dropped_durable_wakes.into());
        put("evicted_workers", self.evicted_workers.into());
        put("rejected_peers", self.rejected_peers.into());
        put("refused_subs", self.refused_subs.into());
        put("moved_workers", self.moved_workers.into());
        put("unmoved_workers", self.unmoved_workers.into());
        put("listener_restarts", self.listener_restarts.into());
        put("subscribe_ack_seconds", self.subscribe_ack.to_json());
        put("threads", self.threads.into());
        put("last_error", self.last_error.clone().into());
        put("last_error_at", unix_seconds(self.last_error_at));
        put("healthy_since", unix_seconds(self.healthy_since));
        put("backend_pid", backend.map(|b| b.pid).into());
        put("database", backend.map(|b| b.database.clone()).into());
        put(
            "client_addr",
            backend.and_then(|b| b.client_addr.clone()).into(),
        );
        put(
            "metrics_address",
            self.metrics_address.map(|a| a.to_string()).into(),
        );
        put("uptime", self.uptime.as_secs_f64().into());
        put("pid", std::process::id().into());
        put("limits", self.limits.to_json());
        fields
    }
}

/// What the hub's tasks share with each other and with `MasterHub::stats`
/// (read from any thread): counters, the health flag, the backpressure policy.
pub(crate) struct HubShared {
    log: LogSink,
    limits: Limits,
    backpressure: Backpressure,
    healthy: AtomicBool,
    /// Published by the router after every change (monitors not counted).
    workers: AtomicUsize,
    worker_processes: AtomicUsize,
    channels: AtomicUsize,
    raw_channels: AtomicUsize,
    wakes_received: AtomicU64,
    frames_sent: AtomicU64,
    rejected_peers: AtomicU64,
    /// Subs refused by the channel caps.
    refused_subs: AtomicU64,
    /// Counted by a stop's hand-over (`router/moves.rs`).
    moved_workers: AtomicU64,
    unmoved_workers: AtomicU64,
    listener_restarts: AtomicU64,
    subscribe_ack: AckHistogram,
    /// What earlier hubs at this socket path counted in this process: added to every counter.
    carried: Totals,
    /// Set once the metrics endpoint listens.
    metrics_address: OnceLock<std::net::SocketAddr>,
    /// The current engine's stats (replaced when the engine is restarted).
    listener: Mutex<Option<Arc<ListenerStats>>>,
    /// Test builds: ends the LISTEN engine task as a crash would.
    #[cfg(feature = "fault-injection")]
    end_engine: tokio::sync::Notify,
    started: Instant,
}

impl HubShared {
    fn new(config: &HubConfig) -> Self {
        let log = config.listener.log.clone();
        let limits = Limits::new(config);
        Self {
            backpressure: Backpressure::new(&limits, log.clone()),
            limits,
            log,
            healthy: AtomicBool::new(false),
            workers: AtomicUsize::new(0),
            worker_processes: AtomicUsize::new(0),
            channels: AtomicUsize::new(0),
            raw_channels: AtomicUsize::new(0),
            wakes_received: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            rejected_peers: AtomicU64::new(0),
            refused_subs: AtomicU64::new(0),
            moved_workers: AtomicU64::new(0),
            unmoved_workers: AtomicU64::new(0),
            listener_restarts: AtomicU64::new(0),
            subscribe_ack: AckHistogram::new(),
            carried: Totals::carried(&config.socket_path),
            metrics_address: OnceLock::new(),
            listener: Mutex::new(None),
            #[cfg(feature = "fault-injection")]
            end_engine: tokio::sync::Notify::new(),
            started: Instant::now(),
        }
    }

    /// `threads`: the caller knows whether the hub thread runs (1) or not (0).
    fn stats(&self, threads: usize) -> HubStats {
        let listener = lock(&self.listener).clone();
        let listener = listener.as_deref();
        let mut stats = HubStats {
            workers: self.workers.load(Ordering::Relaxed),
            worker_processes: self.worker_processes.load(Ordering::Relaxed),
            channels: self.channels.load(Ordering::Relaxed),
            raw_channels: self.raw_channels.load(Ordering::Relaxed),
            listener_healthy: self.healthy.load(Ordering::Relaxed),
            listener_state: listener.map_or(Default::default(), ListenerStats::state),
            reconnects: listener.map_or(0, ListenerStats::reconnects),
            handovers: listener.map_or(0, ListenerStats::handovers),
            abandoned_connections: listener.map_or(0, ListenerStats::abandoned_connections),
            listen_connections: listener.map_or(0, ListenerStats::listen_connections),
            standby_aligned: listener.is_some_and(ListenerStats::standby_aligned),
            standby_promotions: listener.map_or(0, ListenerStats::standby_promotions),
            wakes_received: self.wakes_received.load(Ordering::Relaxed),
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            dropped_durable_wakes: self.backpressure.dropped(),
            evicted_workers: self.backpressure.evicted(),
            rejected_peers: self.rejected_peers.load(Ordering::Relaxed),
            refused_subs: self.refused_subs.load(Ordering::Relaxed),
            moved_workers: self.moved_workers.load(Ordering::Relaxed),
            unmoved_workers: self.unmoved_workers.load(Ordering::Relaxed),
            listener_restarts: self.listener_restarts.load(Ordering::Relaxed),
            subscribe_ack: self.subscribe_ack.snapshot(),
            threads,
            last_error: listener.and_then(ListenerStats::last_error),
            last_error_at: listener.and_then(ListenerStats::last_error_at),
            healthy_since: listener.and_then(ListenerStats::healthy_since),
            backend: listener.and_then(ListenerStats::backend),
            metrics_address: self.metrics_address.get().copied(),
            uptime: self.started.elapsed(),
            limits: self.limits.clone(),
        };
        self.carried.add_to(&mut stats);
        stats
    }
}

/// A running hub. Inert in a forked child: `stop`, `is_running` and drop
/// never touch the parent's thread, sockets or PostgreSQL connection there.
pub struct MasterHub {
    owner: Owner,
    socket_path: PathBuf,
    shared: Arc<HubShared>,
    running: Option<Running>,
}

struct Running {
    thread: OwnedThread,
    /// Cuts a stop's hand-over short (fired, or dropped: a cancelled stop, a drop).
    hurry: ShutdownTrigger,
    socket: SocketFile,
    /// The `GET /metrics` endpoint's thread, when configured and bound.
    metrics: Option<OwnedThread>,
}

impl MasterHub {
    /// Removes the stale hub sockets beside its own, binds the socket (errors
    /// are returned with the reason) and starts the hub's thread.
    pub fn start(config: HubConfig) -> Result<Self, String> {
        let log = config.listener.log.clone();
        let socket_path = config.socket_path.clone();
        let socket_dir = socket_path
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty());
        stale::remove_stale_sockets(socket_dir.unwrap_or(Path::new(".")), &log);
        let (std_listener, socket) = server::bind(&socket_path)?;
        let prepared = std_listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot make the socket non-blocking: {e}"))
            .and_then(|()| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the hub runtime: {e}"))
            });
        let runtime = match prepared {
            Ok(runtime) => runtime,
            Err(e) => {
                socket.unlink_if_ours(&socket_path);
                return Err(e);
            }
        };
        let shared = Arc::new(HubShared::new(&config));
        let metrics_config = config.metrics.clone();
        let (trigger, shutdown) = shutdown();
        let (hurry, hurried) = self::shutdown();
        let thread_shared = shared.clone();
        let spawned = OwnedThread::spawn(
            "pgbus-hub",
            move || trigger.trigger(),
            move || {
                let run = run(thread_shared, config, std_listener, shutdown, hurried);
                runtime.block_on(run)
            },
        );
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                socket.unlink_if_ours(&socket_path);
                return Err(format!("cannot start the hub thread: {e}"));
            }
        };
        log.info(format!("master hub listening at {}", socket_path.display()));
        let metrics = metrics_config.and_then(|config| start_metrics(&config, &shared));
        Ok(Self {
            owner: Owner::current(),
            socket_path,
            shared,
            running: Some(Running {
                thread,
                hurry,
                socket,
                metrics,
            }),
        })
    }

    /// `pgbus-hub serve`: [`MasterHub::start`], except that a hub of ours
    /// already serving the socket path is replaced (`replace.rs`): this one
    /// starts at a temporary name beside it, renames its socket onto the
    /// path and tells the old one, which hands its workers over and yields.
    /// Refused as `start` would be for anything else serving the path.
    pub fn take_over(config: HubConfig) -> Result<Self, String> {
        let path = config.socket_path.clone();
        if !server::is_served(&path) {
            return Self::start(config);
        }
        let temporary = path.with_file_name(socket_file_name(&std::process::id().to_string()));
        if temporary == path {
            return Err(format!(
                "another process is already serving {}",
                path.display()
            ));
        }
        let database = config.listener.connection.dbname().to_owned();
        let log = config.listener.log.clone();
        let mut hub = Self::start(HubConfig {
            socket_path: temporary.clone(),
            ..config
        })?;
        let agreed = match replace::ask(&path, &database) {
            Ok(agreed) => agreed,
            Err(refused) => {
                hub.stop();
                return Err(refused);
            }
        };
        if let Err(e) = std::fs::rename(&temporary, &path) {
            hub.stop();
            return Err(format!(
                "cannot rename {} onto {}: {e}",
                temporary.display(),
                path.display()
            ));
        }
        hub.socket_path = path.clone();
        let pid = agreed.pid;
        match agreed.hand_over(&path) {
            Ok(()) => log.info(format!(
                "took {} over from the hub of pid {pid}: its workers move to their own \
                 connections at its markers, then fail back here at this hub's",
                path.display()
            )),
            Err(e) => log.warn(format!(
                "serving {} in place of the hub of pid {pid}, which keeps its workers: {e}",
                path.display()
            )),
        }
        Ok(hub)
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// True while the hub's thread runs, in the process that started it.
    pub fn is_running(&self) -> bool {
        self.owner.is_current() && self.running.as_ref().is_some_and(|r| r.thread.is_running())
    }

    /// The hub's thread and the metrics endpoint's, those running.
    fn threads(&self) -> usize {
        if !self.owner.is_current() {
            return 0;
        }
        self.running.as_ref().map_or(0, |r| {
            usize::from(r.thread.is_running())
                + usize::from(r.metrics.as_ref().is_some_and(OwnedThread::is_running))
        })
    }

    /// Fault injection (feature `fault-injection`, test builds only): aborts
    /// the LISTEN engine's task, as a panic in it would end it.
    #[cfg(feature = "fault-injection")]
    pub fn end_engine(&self) {
        self.shared.end_engine.notify_one();
    }

    pub fn stats(&self) -> HubStats {
        self.shared.stats(self.threads())
    }

    /// Idempotent. Unlinks the socket if it is still ours (no new worker
    /// reaches a stopping hub), hands every worker over to its own LISTEN
    /// connection at a marker (`router/moves.rs`: at most `MOVE_DEADLINE`),
    /// closes the rest, UNLISTENs, closes PostgreSQL, joins the thread.
    /// Blocks (callers release the GVL).
    pub fn stop(&mut self) {
        self.stop_or_cancel(&crossbeam_channel::never());
    }

    /// [`MasterHub::stop`], giving up the wait for the hub thread as soon as
    /// `cancel` receives (an embedder's unblock function): the hand-over is
    /// cut short (every worker closed now), the thread finishes on its own
    /// (within the engine's stop grace) and nothing waits for it.
    pub fn stop_or_cancel(&mut self, cancel: &crossbeam_channel::Receiver<()>) {
        if !self.owner.is_current() {
            return;
        }
        let Some(Running {
            thread,
            hurry,
            socket,
            metrics,
        }) = self.running.take()
        else {
            return;
        };
        // First: no worker connects to a stopping hub, no fail-back probe finds it.
        socket.unlink_if_ours(&self.socket_path);
        let mut metrics = metrics;
        if let Some(metrics) = &mut metrics {
            metrics.signal(); // it ends while the hub's thread does
        }
        if thread.stop_or_cancel(cancel, None) == Stopped::Cancelled {
            hurry.trigger();
            self.shared
                .log
                .info("master hub stop interrupted: its thread finishes stopping on its own");
        }
        if let Some(metrics) = metrics {
            // Told already: it ends at its next poll; a scrape is not worth holding the stop for.
            metrics.stop_or_cancel(cancel, Some(METRICS_STOP));
        }
        Totals::keep(&self.socket_path, &self.stats());
        self.shared.log.info(format!(
            "master hub at {} stopped",
            self.socket_path.display()
        ));
    }
}

/// Only signals: the hub's thread stops on its own, detached (a GC free or
/// an unwinding caller never waits for it). `stop` is the call that waits.
impl Drop for MasterHub {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A forked child: the socket file is the parent's; OwnedThread is inert here.
            return;
        }
        if let Some(Running {
            thread,
            hurry,
            socket,
            metrics,
        }) = self.running.take()
        {
            drop(metrics);
            drop(hurry); // first: no hand-over, a drop never waits
            drop(thread);
            socket.unlink_if_ours(&self.socket_path);
            Totals::keep(&self.socket_path, &self.stats());
            self.shared.log.info(format!(
                "master hub at {} dropped without stop: its thread stops on its own",
                self.socket_path.display()
            ));
        }
    }
}

/// The metrics endpoint, or a logged error: metrics are not worth an outage,
/// so the hub serves its workers either way.
fn start_metrics(config: &MetricsConfig, shared: &Arc<HubShared>) -> Option<OwnedThread> {
    match metrics::start(config, shared.clone()) {
        Ok(endpoint) => {
            let _ = shared.metrics_address.set(endpoint.address);
            shared.log.info(format!(
                "metrics at http://{}{}",
                endpoint.address,
                metrics::METRICS_PATH
            ));
            Some(endpoint.thread)
        }
        Err(e) => {
            shared.log.error(format!(
                "metrics endpoint: {e} — the hub serves its workers without it"
            ));
            None
        }
    }
}

/// The hub thread's whole life: the accept loop beside the router, until `shutdown`.
async fn run(
    shared: Arc<HubShared>,
    config: HubConfig,
    std_listener: std::os::unix::net::UnixListener,
    shutdown: Shutdown,
    hurry: Shutdown,
) {
    let unix = match tokio::net::UnixListener::from_std(std_listener) {
        Ok(unix) => unix,
        Err(e) => {
            return shared
                .log
                .error(format!("master hub cannot serve its socket: {e}"))
        }
    };
    let (router, inputs) = Router::new(shared.clone(), &config);
    tokio::spawn(server::accept_loop(
        shared,
        unix,
        router.commands(),
        shutdown.clone(),
    ));
    router.run(inputs, shutdown, hurry).await;
}
