//! The master hub: ONE PostgreSQL LISTEN connection for a whole host, fanned
//! out to the workers of a preforking server over a Unix socket.
//!
//! Everything runs on one native thread: a current-thread tokio runtime with
//! the LISTEN engine, the accept loop, the status ticker and two small tasks per
//! worker. The thread count does not grow with workers.
//!
//! - [`registry`]: queue -> workers, refcounted (last ref out UNLISTENs).
//! - [`worker`]: one connection: bounded outbox + writer, reader + frame handling.
//! - [`server`]: socket creation (0600, stale-socket rules), peer uid, shutdown(2).

mod registry;
pub mod server;
mod worker;

use crate::listener::{self, Event, ListenError, ListenerConfig, ListenerHandle, ListenerStats};
use crate::log::LogSink;
use crate::process::Owner;
use crate::protocol::{Message, Wake};
use crate::sync::lock;
use registry::Registry;
use server::SocketFile;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use worker::{Enqueued, Frame, Worker, WorkerId};

/// pgbus's defaults (MasterHub::DEFAULT_DURABLE_QUEUE_LIMIT / DEFAULT_HARD_QUEUE_LIMIT).
pub const DEFAULT_DURABLE_QUEUE_LIMIT: usize = 256;
pub const DEFAULT_HARD_QUEUE_LIMIT: usize = 1024;

/// Between `status` broadcasts (pgbus's hub's `status_interval` default: it
/// checks health this often): a change reaches workers within a second.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The environment variable that names the hub's socket to the workers (pgbus's).
pub const SOCKET_ENV: &str = "PGBUS_STREAMS_HUB_SOCKET";

/// pgbus's hub socket file name: one per Puma master pid (`pid` may be a glob's `*`).
pub fn socket_file_name(pid: &str) -> String {
    format!("pgbus-streams-hub-{pid}.sock")
}

/// How long `stop` lets the engine UNLISTEN and close before giving up on it.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Pause after accept(2) fails (EMFILE under an fd flood): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Log the first dropped durable wake and then every this many.
const DROP_LOG_EVERY: u64 = 100;

#[derive(Clone)]
pub struct HubConfig {
    pub listener: ListenerConfig,
    pub socket_path: PathBuf,
    /// Between `status{healthy}` broadcasts (also sent on connect and on every change).
    pub status_interval: Duration,
    pub durable_queue_limit: usize,
    pub hard_queue_limit: usize,
}

/// A point-in-time copy of the hub's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HubStats {
    pub workers: usize,
    pub channels: usize,
    pub listener_healthy: bool,
    pub reconnects: u64,
    pub wakes_received: u64,
    pub frames_sent: u64,
    pub dropped_durable_wakes: u64,
    pub evicted_workers: u64,
    pub rejected_peers: u64,
    pub listener_restarts: u64,
    /// Native threads the hub runs: 1 while running, 0 after stop, whatever the worker count.
    pub threads: usize,
    pub last_error: Option<String>,
    /// When `last_error` happened; an error older than `healthy_since` was resolved.
    pub last_error_at: Option<SystemTime>,
    /// When the listener last became healthy; None while it is not.
    pub healthy_since: Option<SystemTime>,
    /// The LISTEN connection's server session (pid, database, client address).
    pub backend: Option<listener::Backend>,
    pub uptime: Duration,
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
        put("channels", self.channels.into());
        put("listener_healthy", self.listener_healthy.into());
        put("reconnects", self.reconnects.into());
        put("wakes_received", self.wakes_received.into());
        put("frames_sent", self.frames_sent.into());
        put("dropped_durable_wakes", self.dropped_durable_wakes.into());
        put("evicted_workers", self.evicted_workers.into());
        put("rejected_peers", self.rejected_peers.into());
        put("listener_restarts", self.listener_restarts.into());
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
        put("uptime", self.uptime.as_secs_f64().into());
        put("pid", std::process::id().into());
        fields
    }
}

#[derive(Default)]
struct Counters {
    wakes_received: AtomicU64,
    frames_sent: AtomicU64,
    dropped_durable_wakes: AtomicU64,
    evicted_workers: AtomicU64,
    rejected_peers: AtomicU64,
    listener_restarts: AtomicU64,
}

struct State {
    registry: Registry,
    /// Every accepted connection of our uid, monitors included.
    workers: HashMap<WorkerId, Arc<Worker>>,
    /// Connections that asked for stats without ever subscribing (`pgbus-hub
    /// status`): served like any peer, but not counted as workers.
    monitors: HashSet<WorkerId>,
    listener: Option<(ListenerHandle, Arc<ListenerStats>)>,
    next_worker_id: WorkerId,
    refused_uids: HashSet<u32>,
}

/// Shared by every task of one hub.
pub(crate) struct Core {
    log: LogSink,
    durable_queue_limit: usize,
    hard_queue_limit: usize,
    counters: Counters,
    healthy: AtomicBool,
    /// True while the workers were last told `healthy: false` (set after that
    /// status frame is queued to every worker, so an ack it releases follows it).
    outage: watch::Sender<bool>,
    /// The listener's channel rules, to tell a sub it can defer from one it refuses.
    channels: ListenerConfig,
    started: Instant,
    state: Mutex<State>,
}

impl Core {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Routes `queue` to `worker` FIRST, then asks the engine to LISTEN and
    /// acks when it ran. A NOTIFY between LISTEN and the ack is therefore
    /// already routed to this worker and queued before its ack.
    ///
    /// During a database outage (workers told `healthy: false`) a valid sub
    /// is acked at once instead: it stays registered and is LISTENed on
    /// reconnect, and while the hub has no connection no NOTIFY reaches
    /// anyone, subscribed earlier or not. pgbus's own Ruby hub acks such a sub
    /// after its listener's budget too; its Ruby client, left without an ack,
    /// would fail over to a connection it cannot open during the outage and
    /// stay without wakes until the worker recycles. Our client reads an ack
    /// that follows `healthy: false` as "LISTENed after the reconnect".
    fn subscribe(self: &Arc<Self>, worker: Arc<Worker>, queue: String) {
        let answer = {
            let mut state = self.state();
            state.monitors.remove(&worker.id);
            state.registry.add(worker.id, &queue);
            state
                .listener
                .as_ref()
                .map(|(handle, _)| handle.listen(&queue))
        };
        let deferrable = self.channels.channel_for(&queue).is_ok();
        let mut outage = self.outage.subscribe();
        let core = self.clone();
        tokio::spawn(async move {
            let Some(answer) = answer else {
                worker.sub_answered();
                return core.finish_subscribe(&worker, &queue, Err(ListenError::Stopped));
            };
            tokio::pin!(answer);
            let in_outage = async { outage.wait_for(|down| *down).await.is_ok() };
            let outcome = tokio::select! {
                biased;
                outcome = &mut answer => outcome.unwrap_or(Err(ListenError::Stopped)),
                true = in_outage, if deferrable => {
                    core.send(&worker, Message::Ack(queue.clone()));
                    core.log.debug(format!(
                        "acked {}'s sub for {queue:?} during the database outage: LISTENed on reconnect",
                        worker.label()
                    ));
                    // Acked already: a later LISTEN, unsub or stop needs no answer.
                    let _ = answer.await;
                    return worker.sub_answered();
                }
            };
            worker.sub_answered();
            core.finish_subscribe(&worker, &queue, outcome);
        });
    }

    /// Acks only a LISTEN that ran. A refused name gets our `nack` extension
    /// (pgbus's client ignores it and times out, as it would with no answer).
    fn finish_subscribe(&self, worker: &Worker, queue: &str, outcome: Result<(), ListenError>) {
        match outcome {
            Ok(()) => self.send(worker, Message::Ack(queue.to_owned())),
            Err(ListenError::Stopped) => self.log.warn(format!(
                "not acking {}'s sub for {queue:?}: the listener stopped before LISTEN ran",
                worker.label()
            )),
            Err(withdrawn @ ListenError::Withdrawn { .. }) => {
                // The subscriber itself gave up (unsub or disconnect): not a refusal.
                self.log.info(format!(
                    "{}: {withdrawn}; answering its sub with a nack",
                    worker.label()
                ));
                self.send(
                    worker,
                    Message::Nack {
                        queue: queue.to_owned(),
                        reason: withdrawn.to_string(),
                    },
                );
            }
            Err(refused) => {
                self.log.warn(format!(
                    "{} subscribed to {queue:?}: {refused} — refused",
                    worker.label()
                ));
                self.unsubscribe(worker.id, queue);
                let reason = refused.to_string();
                self.send(
                    worker,
                    Message::Nack {
                        queue: queue.to_owned(),
                        reason,
                    },
                );
            }
        }
    }

    fn unsubscribe(&self, worker: WorkerId, queue: &str) {
        let mut state = self.state();
        if state.registry.remove(worker, queue) {
            if let Some((handle, _)) = &state.listener {
                handle.unlisten(queue);
            }
        }
    }

    fn remove_worker(&self, worker: WorkerId) {
        let mut state = self.state();
        state.workers.remove(&worker);
        state.monitors.remove(&worker);
        for queue in state.registry.remove_worker(worker) {
            if let Some((handle, _)) = &state.listener {
                handle.unlisten(&queue);
            }
        }
    }

    /// A non-droppable control frame (ack, nack, status) to one worker.
    fn send(&self, worker: &Worker, message: Message) {
        match message.encode() {
            Ok(frame) => self.enqueue(worker, frame.into(), false),
            Err(e) => self
                .log
                .error(format!("cannot encode a {} frame: {e}", message.kind())),
        }
    }

    fn enqueue(&self, worker: &Worker, frame: Frame, droppable: bool) {
        match worker.enqueue(
            frame,
            droppable,
            self.durable_queue_limit,
            self.hard_queue_limit,
        ) {
            Enqueued::Queued | Enqueued::Closed => {}
            Enqueued::Dropped => {
                let dropped = self
                    .counters
                    .dropped_durable_wakes
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                if dropped == 1 || dropped % DROP_LOG_EVERY == 0 {
                    self.log.warn(format!(
                        "dropped {dropped} durable wake(s) so far: {} has {} queued \
                         (durable_queue_limit); durable streams catch up on their next read",
                        worker.label(),
                        self.durable_queue_limit
                    ));
                }
            }
            Enqueued::Evicted => {
                self.counters
                    .evicted_workers
                    .fetch_add(1, Ordering::Relaxed);
                self.log.warn(format!(
                    "evicting {}: outbound queue exceeded {} frames (worker not draining) — \
                     it falls back to its own listener",
                    worker.label(),
                    self.hard_queue_limit
                ));
            }
        }
    }

    /// Fan-out: encode once, share the bytes with every routed worker.
    fn deliver(&self, wake: Wake) {
        self.counters.wakes_received.fetch_add(1, Ordering::Relaxed);
        let workers: Vec<Arc<Worker>> = {
            let state = self.state();
            state
                .registry
                .workers_for(&wake.queue)
                .filter_map(|id| state.workers.get(&id).cloned())
                .collect()
        };
        if workers.is_empty() {
            return;
        }
        let droppable = wake.is_droppable();
        let frame = match wake.encode() {
            Ok(frame) => frame,
            Err(e) => return self.log.error(format!("cannot encode a wake frame: {e}")),
        };
        for worker in workers {
            self.enqueue(&worker, frame.clone(), droppable);
        }
    }

    /// The `status` to tell workers, or None while the listener's first
    /// connection attempt is still under way. Our client treats `healthy:false`
    /// as a database outage and stops waiting for acks (it stays on the hub);
    /// before the first attempt has concluded that would be wrong: the ack is
    /// only milliseconds away, so new workers keep pgbus's optimistic default.
    fn announced_health(&self) -> Option<bool> {
        let healthy = self.healthy.load(Ordering::Relaxed);
        let attempted = healthy
            || self.state().listener.as_ref().is_some_and(|(_, stats)| {
                stats.connect_failures() > 0
                    || stats.reconnects() > 0
                    || stats.last_error().is_some()
            });
        attempted.then_some(healthy)
    }

    fn broadcast_status(&self) {
        let Some(healthy) = self.announced_health() else {
            return;
        };
        let message = Message::Status { healthy };
        let Ok(frame) = message.encode() else { return };
        let frame: Frame = frame.into();
        let workers: Vec<Arc<Worker>> = self.state().workers.values().cloned().collect();
        for worker in workers {
            self.enqueue(&worker, frame.clone(), false);
        }
        self.outage
            .send_if_modified(|down| std::mem::replace(down, !healthy) == healthy);
    }

    /// `threads`: the caller knows whether the hub thread runs (1) or not (0).
    fn stats(&self, threads: usize) -> HubStats {
        let state = self.state();
        let listener_stats = state.listener.as_ref().map(|(_, stats)| stats.clone());
        let counters = &self.counters;
        HubStats {
            workers: state.workers.len().saturating_sub(state.monitors.len()),
            channels: state.registry.queue_count(),
            listener_healthy: self.healthy.load(Ordering::Relaxed),
            reconnects: listener_stats.as_ref().map_or(0, |s| s.reconnects()),
            wakes_received: counters.wakes_received.load(Ordering::Relaxed),
            frames_sent: counters.frames_sent.load(Ordering::Relaxed),
            dropped_durable_wakes: counters.dropped_durable_wakes.load(Ordering::Relaxed),
            evicted_workers: counters.evicted_workers.load(Ordering::Relaxed),
            rejected_peers: counters.rejected_peers.load(Ordering::Relaxed),
            listener_restarts: counters.listener_restarts.load(Ordering::Relaxed),
            threads,
            last_error: listener_stats.as_ref().and_then(|s| s.last_error()),
            last_error_at: listener_stats.as_ref().and_then(|s| s.last_error_at()),
            healthy_since: listener_stats.as_ref().and_then(|s| s.healthy_since()),
            backend: listener_stats.and_then(|s| s.backend()),
            uptime: self.started.elapsed(),
        }
    }

    /// Answers our `{"t":"stats"}` extension (pgbus's client never sends it):
    /// `{"t":"stats","stats":{...}}`, for `pgbus-hub status`. A connection
    /// that asks for stats and has no subscription is a monitor, not a worker:
    /// it is left out of `workers` (in this answer too) until it subscribes.
    fn send_stats(&self, worker: &Worker) {
        {
            let mut state = self.state();
            if !state.registry.is_subscribed(worker.id) {
                state.monitors.insert(worker.id);
            }
        }
        let fields = self.stats(1).fields();
        let mut reply = serde_json::Map::new();
        reply.insert("t".into(), crate::protocol::STATS_KIND.into());
        reply.insert("stats".into(), fields.into());
        match crate::protocol::encode_object(&reply) {
            Ok(frame) => self.enqueue(worker, frame.into(), false),
            Err(e) => self.log.error(format!("cannot encode a stats frame: {e}")),
        }
    }

    fn on_listener_event(&self, event: Event) {
        match event {
            Event::Wake(wake) => self.deliver(wake),
            Event::Healthy(healthy) => {
                if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
                    self.broadcast_status();
                }
            }
        }
    }
}

/// A running hub. Inert in a forked child: `stop`, `is_running` and drop
/// never touch the parent's thread, sockets or PostgreSQL connection there.
pub struct MasterHub {
    owner: Owner,
    socket_path: PathBuf,
    core: Arc<Core>,
    running: Option<Running>,
}

struct Running {
    shutdown: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
    socket: SocketFile,
}

impl MasterHub {
    /// Binds the socket (errors are returned with the reason) and starts the hub's thread.
    pub fn start(config: HubConfig) -> Result<Self, String> {
        let log = config.listener.log.clone();
        let socket_path = config.socket_path.clone();
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
        let core = Arc::new(Core {
            log: log.clone(),
            durable_queue_limit: config.durable_queue_limit,
            hard_queue_limit: config.hard_queue_limit,
            counters: Counters::default(),
            healthy: AtomicBool::new(false),
            outage: watch::Sender::new(false),
            channels: config.listener.clone(),
            started: Instant::now(),
            state: Mutex::new(State {
                registry: Registry::default(),
                workers: HashMap::new(),
                listener: None,
                monitors: HashSet::new(),
                next_worker_id: 1,
                refused_uids: HashSet::new(),
            }),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let thread_core = core.clone();
        let spawned = std::thread::Builder::new()
            .name("pgbus-hub".into())
            .spawn(move || runtime.block_on(run(thread_core, config, std_listener, shutdown_rx)));
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => {
                socket.unlink_if_ours(&socket_path);
                return Err(format!("cannot start the hub thread: {e}"));
            }
        };
        log.info(format!("master hub listening at {}", socket_path.display()));
        Ok(Self {
            owner: Owner::current(),
            socket_path,
            core,
            running: Some(Running {
                shutdown,
                thread,
                socket,
            }),
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// True while the hub's thread runs, in the process that started it.
    pub fn is_running(&self) -> bool {
        self.owner.is_current()
            && self
                .running
                .as_ref()
                .is_some_and(|r| !r.thread.is_finished())
    }

    pub fn stats(&self) -> HubStats {
        self.core.stats(usize::from(self.is_running()))
    }

    /// Idempotent. Closes every worker, UNLISTENs, closes PostgreSQL, joins the
    /// thread, unlinks the socket if it is still ours. Blocks (callers release the GVL).
    pub fn stop(&mut self) {
        if !self.owner.is_current() {
            return;
        }
        let Some(running) = self.running.take() else {
            return;
        };
        let _ = running.shutdown.send(true);
        let _ = running.thread.join();
        running.socket.unlink_if_ours(&self.socket_path);
        self.core.log.info(format!(
            "master hub at {} stopped",
            self.socket_path.display()
        ));
    }
}

impl Drop for MasterHub {
    fn drop(&mut self) {
        if self.owner.is_current() {
            self.stop();
        } else if let Some(running) = self.running.take() {
            // A forked child: dropping these would signal (write to) the parent's runtime.
            std::mem::forget(running);
        }
    }
}

/// The hub thread's whole life: serve until `shutdown`, restarting the
/// LISTEN engine if it ever ends on its own (pgbus's Ruby hub never does, and
/// the host goes deaf).
async fn run(
    core: Arc<Core>,
    config: HubConfig,
    std_listener: std::os::unix::net::UnixListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let unix = match tokio::net::UnixListener::from_std(std_listener) {
        Ok(unix) => unix,
        Err(e) => {
            return core
                .log
                .error(format!("master hub cannot serve its socket: {e}"))
        }
    };
    let mut engine = spawn_engine(&core, &config.listener);
    tokio::spawn(accept_loop(core.clone(), unix, shutdown.clone()));
    tokio::spawn(status_loop(
        core.clone(),
        config.status_interval,
        shutdown.clone(),
    ));
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = &mut engine => {
                core.counters.listener_restarts.fetch_add(1, Ordering::Relaxed);
                core.log.error("the LISTEN engine ended unexpectedly — restarting it and re-LISTENing every channel");
                core.on_listener_event(Event::Healthy(false));
                engine = spawn_engine(&core, &config.listener);
                let state = core.state();
                if let Some((handle, _)) = &state.listener {
                    for queue in state.registry.queues() {
                        drop(handle.listen(queue));
                    }
                }
            }
        }
    }
    let workers: Vec<Arc<Worker>> = core.state().workers.values().cloned().collect();
    for worker in workers {
        worker.close();
    }
    let listener = core.state().listener.take();
    if let Some((handle, _)) = listener {
        handle.stop();
    }
    let _ = tokio::time::timeout(STOP_GRACE, engine).await;
}

fn spawn_engine(core: &Arc<Core>, config: &ListenerConfig) -> tokio::task::JoinHandle<()> {
    let events = core.clone();
    let (handle, stats, join) =
        listener::spawn(config.clone(), move |event| events.on_listener_event(event));
    core.state().listener = Some((handle, stats));
    join
}

async fn accept_loop(
    core: Arc<Core>,
    unix: tokio::net::UnixListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let own_uid = server::own_uid();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = unix.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                core.log
                    .warn(format!("accept on the hub socket failed: {e} — retrying"));
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let cred = stream.peer_cred();
        let peer_uid = cred
            .as_ref()
            .map(|cred| cred.uid())
            .map_err(|e| e.kind().into());
        if peer_uid.as_ref().ok() != Some(&own_uid) {
            refuse_peer(&core, &stream, peer_uid, own_uid);
            continue;
        }
        let peer_pid = cred.ok().and_then(|cred| cred.pid());
        let worker = {
            let mut state = core.state();
            let id = state.next_worker_id;
            state.next_worker_id += 1;
            let worker = Worker::spawn(core.clone(), id, peer_pid, stream);
            state.workers.insert(id, worker.clone());
            worker
        };
        if let Some(healthy) = core.announced_health() {
            core.send(&worker, Message::Status { healthy });
        }
    }
}

/// Counts every refused peer, logs each uid once (a hostile loop must not flood the log).
fn refuse_peer(
    core: &Core,
    stream: &tokio::net::UnixStream,
    peer_uid: std::io::Result<u32>,
    own_uid: u32,
) {
    core.counters.rejected_peers.fetch_add(1, Ordering::Relaxed);
    let first_time = match &peer_uid {
        Ok(uid) => core.state().refused_uids.insert(*uid),
        Err(_) => true,
    };
    if first_time {
        let who = match peer_uid {
            Ok(uid) => format!("uid {uid}"),
            Err(e) => format!("an unidentifiable peer ({e})"),
        };
        core.log.warn(format!(
            "refused a hub connection from {who}: the hub only serves uid {own_uid}"
        ));
    }
    server::sever(std::os::fd::AsRawFd::as_raw_fd(stream));
}

async fn status_loop(core: Arc<Core>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    // A zero interval would spin; 10 ms is already far below any useful health cadence.
    let mut ticker = tokio::time::interval(every.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = ticker.tick() => core.broadcast_status(),
        }
    }
}
