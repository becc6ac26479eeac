//! The router: the one task that owns the routing table, the workers and the
//! LISTEN engine. Workers' readers and the accept loop send it [`Command`]s;
//! the engine sends it wakes and health changes; it answers subs, fans each
//! wake out to the outboxes of the workers that want it (encoded once, see
//! [`Router::fan_out_wake`]), and broadcasts the hub's health. Nothing else
//! mutates this state, so it needs no lock.

mod moves;

pub use moves::{MOVE_ANSWER_GRACE, MOVE_DEADLINE};

use super::command::{Command, Commands};
use super::limits::COMMAND_QUEUE;
use super::pending::{PendingSubs, Sub};
use super::registry::Registry;
use super::supervisor::{EngineSupervisor, FromEngine};
use super::worker_connection::{WorkerConnection, WorkerId};
use super::{HubConfig, HubShared};
use crate::listener::{Cut, Event, ListenError};
use crate::protocol::{Frame, Marker, Message, Replace, Wake};
use crate::shutdown::Shutdown;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Raw channel names a stats answer lists: enough to recognise an app's
/// channels at a glance, small enough for a terminal and for a hub with thousands.
const STATS_RAW_CHANNEL_NAMES: usize = 20;

pub struct Router {
    shared: Arc<HubShared>,
    registry: Registry,
    /// Every accepted connection of our uid, monitors included.
    workers: HashMap<WorkerId, Arc<WorkerConnection>>,
    /// Connections that asked for stats without ever subscribing (`pgbus-hub
    /// status`): served like any peer, but not counted as workers.
    monitors: HashSet<WorkerId>,
    /// Subs waiting for their LISTEN; told each health announced to the
    /// workers after its status frame is queued, so an ack it releases follows it.
    pending: PendingSubs,
    next_worker: WorkerId,
    /// Cut tokens workers failing back asked this hub to commit, and whose:
    /// read on the private channel, each becomes that worker's `marker`
    /// (at most one per worker: a newer request replaces an older one).
    markers: HashMap<String, WorkerId>,
    /// Where this hub serves: a new hub's `replace` must name it.
    socket_path: PathBuf,
    /// The connection of a new hub that asked to replace this one.
    replacer: Option<WorkerId>,
    /// A new hub took the socket path over: hand over and end, as a stop does.
    yielding: bool,
    engine: EngineSupervisor,
    commands: Commands,
}

/// Where the router's inputs arrive.
pub struct Inputs {
    commands: mpsc::Receiver<Command>,
    from_engine: mpsc::UnboundedReceiver<FromEngine>,
}

impl Router {
    pub fn new(shared: Arc<HubShared>, config: &HubConfig) -> (Self, Inputs) {
        let (commands, command_receiver) = mpsc::channel(COMMAND_QUEUE);
        let (engine, engine_receiver) =
            EngineSupervisor::new(config.listener.clone(), shared.clone());
        let router = Self {
            shared,
            registry: Registry::default(),
            workers: HashMap::new(),
            monitors: HashSet::new(),
            pending: PendingSubs::default(),
            next_worker: 1,
            markers: HashMap::new(),
            socket_path: config.socket_path.clone(),
            replacer: None,
            yielding: false,
            engine,
            commands,
        };
        let inputs = Inputs {
            commands: command_receiver,
            from_engine: engine_receiver,
        };
        (router, inputs)
    }

    pub fn commands(&self) -> Commands {
        self.commands.clone()
    }

    /// Serves until `shutdown`: routes, answers, broadcasts health, and
    /// restarts the LISTEN engine if it ever ends on its own (pgbus's Ruby hub
    /// never does, and the host goes deaf). Then hands every worker over
    /// (`moves.rs`; cut short when `hurry` fires), closes the rest and stops
    /// the engine.
    pub async fn run(mut self, mut inputs: Inputs, mut shutdown: Shutdown, hurry: Shutdown) {
        self.engine.start();
        let mut ticker = tokio::time::interval(self.shared.limits.status_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.wait() => break,
                Some(signal) = inputs.from_engine.recv() => match signal {
                    FromEngine::Event(event) => self.on_event(event),
                    FromEngine::Listened { id, outcome } => {
                        self.listened(id, outcome);
                        self.publish_counts();
                    }
                },
                Some(command) = inputs.commands.recv() => self.on_command(command),
                _ = ticker.tick() => self.broadcast_status(),
                () = self.engine.ended() => self.restart_engine(),
            }
            if self.yielding {
                break;
            }
        }
        self.hand_over(&mut inputs, hurry).await;
        for worker in self.workers.values() {
            worker.close();
        }
        self.engine.stop().await;
    }

    fn restart_engine(&mut self) {
        self.on_event(Event::Healthy(false));
        self.engine.restart(self.registry.queues());
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Wake(wake) => self.fan_out_wake(wake),
            Event::CatchUp(queues) => {
                crate::events::reconnected(queues.len(), &self.shared.listener);
                self.catch_up(queues)
            }
            Event::Healthy(healthy) => {
                if self.shared.healthy.swap(healthy, Ordering::Relaxed) != healthy {
                    self.broadcast_status();
                }
            }
            Event::Marker(token) => match self.markers.remove(&token) {
                Some(id) => {
                    if let Some(worker) = self.workers.get(&id) {
                        self.send(worker, &Message::Marker(Marker::Read { token }));
                    }
                }
                // Another session NOTIFYed it on the hub's private channel,
                // or its worker left before it was read.
                None => self.shared.log.debug(format!(
                    "the LISTEN engine read the marker {token:?}, which no worker awaits — ignored"
                )),
            },
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Accepted { stream, peer_pid } => self.accept(stream, peer_pid),
            Command::Sub {
                worker,
                queue,
                read_at,
            } => self.subscribe(Sub {
                worker,
                queue,
                read_at,
            }),
            Command::Unsub { worker, queue } => self.unsubscribe(worker, &queue),
            Command::Stats(worker) => self.send_stats(worker),
            Command::Replace { worker, replace } => self.replace(worker, replace),
            Command::MarkerCommit {
                worker,
                channel,
                token,
            } => self.commit_marker(worker, channel, token),
            // Only a stop asks a worker to move (`moves.rs` reads its answer there).
            Command::MoveAnswer { worker, token } => self.shared.log.debug(format!(
                "connection {worker} answered a move ({token:?}) no stop asked for — ignored"
            )),
            Command::Gone(worker) => self.remove_worker(worker),
        }
        self.publish_counts();
    }

    /// The counts `MasterHub::stats` reads from other threads.
    fn publish_counts(&self) {
        let workers = self.workers.len().saturating_sub(self.monitors.len());
        self.shared.workers.store(workers, Ordering::Relaxed);
        // A connection whose peer pid is unknown counts as a process of its own.
        let mut pids = HashSet::new();
        let mut unknown = 0;
        for (id, worker) in &self.workers {
            if self.monitors.contains(id) {
                continue;
            }
            match worker.peer_pid() {
                Some(pid) => {
                    pids.insert(pid);
                }
                None => unknown += 1,
            }
        }
        self.shared
            .worker_processes
            .store(pids.len() + unknown, Ordering::Relaxed);
        self.shared
            .channels
            .store(self.registry.queue_count(), Ordering::Relaxed);
        self.shared
            .raw_channels
            .store(self.registry.raw_channel_count(), Ordering::Relaxed);
    }

    fn accept(&mut self, stream: tokio::net::UnixStream, peer_pid: Option<i32>) {
        let id = self.next_worker;
        self.next_worker += 1;
        let worker =
            WorkerConnection::spawn(id, peer_pid, stream, self.shared.clone(), self.commands());
        self.workers.insert(id, worker.clone());
        if let Some(healthy) = self.announced_health() {
            self.send(&worker, &Message::Status { healthy });
        }
    }

    /// Routes `queue` to `worker` FIRST, then asks the engine to LISTEN and
    /// acks when it ran. A NOTIFY after the LISTEN is therefore routed to
    /// this worker whether it arrives before or after the ack. (During a
    /// database outage a valid sub is acked at once: see [`super::pending`].)
    fn subscribe(&mut self, sub: Sub) {
        let worker_id = sub.worker;
        let Some(worker) = self.workers.get(&worker_id).cloned() else {
            return; // gone before its sub was read here
        };
        self.monitors.remove(&worker_id);
        if let Some(refusal) = self.over_cap(&worker, &sub.queue) {
            worker.sub_answered();
            self.shared.refused_subs.fetch_add(1, Ordering::Relaxed);
            if worker.first_refusal() {
                self.shared.log.warn(format!(
                    "{} subscribed to {:?}: {refusal} — refused (further refusals for this \
                     connection are counted in refused_subs, not logged)",
                    worker.label(),
                    sub.queue
                ));
            }
            return self.send(
                &worker,
                &Message::Nack {
                    queue: sub.queue,
                    reason: refusal,
                },
            );
        }
        self.registry.add(worker_id, &sub.queue);
        if self.engine.handle().is_none() {
            worker.sub_answered();
            return self.finish_subscribe(&worker, &sub, Err(ListenError::Stopped));
        }
        let deferrable = self.engine.is_valid_name(&sub.queue);
        let queue = sub.queue.clone();
        let (id, ack) = self.pending.add(sub, deferrable);
        self.engine.listen_for(id, &queue);
        if let Some(ack) = ack {
            self.ack_during_outage(&ack);
        }
    }

    /// Why a sub would pass a channel cap, if it would. A sub that adds no
    /// channel (already routed to this worker, or LISTENed for another) passes
    /// the host-wide cap; the per-connection cap counts this worker's queues.
    fn over_cap(&self, worker: &WorkerConnection, queue: &str) -> Option<String> {
        if self.registry.routes(worker.id, queue) {
            return None;
        }
        let limits = &self.shared.limits;
        let own = self.registry.queue_count_of(worker.id);
        if own >= limits.max_channels_per_connection {
            return Some(format!(
                "this connection already has the hub LISTEN on {own} channels \
                 (max_channels_per_connection {})",
                limits.max_channels_per_connection
            ));
        }
        let all = self.registry.queue_count();
        if !self.registry.has_queue(queue) && all >= limits.max_channels {
            return Some(format!(
                "the hub already LISTENs on {all} channels (max_channels {})",
                limits.max_channels
            ));
        }
        None
    }

    fn ack_during_outage(&self, sub: &Sub) {
        let Some(worker) = self.workers.get(&sub.worker) else {
            return;
        };
        self.send_ack(worker, sub);
        self.shared.log.debug(format!(
            "acked {}'s sub for {:?} during the database outage: LISTENed on reconnect",
            worker.label(),
            sub.queue
        ));
    }

    fn listened(&mut self, id: u64, outcome: Result<(), ListenError>) {
        if let (Err(ListenError::Stopped), Some(handle)) = (&outcome, self.engine.handle()) {
            if let Some(queue) = self.pending.queue_of(id).filter(|_| !handle.is_stopped()) {
                // The engine that had it ended and a new one runs: ask that one.
                return self.engine.listen_for(id, queue);
            }
        }
        let Some((sub, needs_reply)) = self.pending.answered(id) else {
            return;
        };
        let Some(worker) = self.workers.get(&sub.worker).cloned() else {
            return;
        };
        worker.sub_answered();
        if needs_reply {
            self.finish_subscribe(&worker, &sub, outcome);
        }
    }

    /// Acks only a LISTEN that ran. A refused name gets our `nack` extension
    /// (pgbus's client ignores it and times out, as it would with no answer).
    fn finish_subscribe(
        &mut self,
        worker: &WorkerConnection,
        sub: &Sub,
        outcome: Result<(), ListenError>,
    ) {
        let log = &self.shared.log;
        let queue = sub.queue.as_str();
        match outcome {
            Ok(()) => self.send_ack(worker, sub),
            Err(ListenError::Stopped) => log.warn(format!(
                "not acking {}'s sub for {queue:?}: the listener stopped before LISTEN ran",
                worker.label()
            )),
            Err(withdrawn @ ListenError::Withdrawn { .. }) => {
                // The subscriber itself gave up (unsub or disconnect): not a refusal.
                log.info(format!(
                    "{}: {withdrawn}; answering its sub with a nack",
                    worker.label()
                ));
                self.send(worker, &nack(queue, &withdrawn));
            }
            Err(refused) => {
                log.warn(format!(
                    "{} subscribed to {queue:?}: {refused} — refused",
                    worker.label()
                ));
                self.unsubscribe(worker.id, queue);
                self.send(worker, &nack(queue, &refused));
            }
        }
    }

    fn unsubscribe(&mut self, worker: WorkerId, queue: &str) {
        if self.registry.remove(worker, queue) {
            self.engine.unlisten(queue);
        }
    }

    /// A worker failing back asks for the cut (docs/architecture.md, "2.
    /// Fail-back, aligned"): `NOTIFY channel, K; NOTIFY <ours>, K` in one
    /// transaction; once this hub reads K the worker gets `marker` K, in
    /// stream order: its wakes after that follow the cut. A refused or failed
    /// commit sends nothing: the worker, past its budget, switches unaligned.
    fn commit_marker(&mut self, worker: WorkerId, channel: String, token: String) {
        let log = self.shared.log.clone();
        let Some(label) = self.workers.get(&worker).map(|w| w.label()) else {
            return;
        };
        let cut = match Cut::new(channel, token.clone()) {
            Ok(cut) => cut,
            Err(error) => {
                return log.warn(format!("{label} asked for a marker: {error} — refused"));
            }
        };
        let Some(engine) = self.engine.handle() else {
            return;
        };
        self.markers.retain(|_, id| *id != worker);
        self.markers.insert(token, worker);
        engine.commit_cut_then(cut, move |outcome| {
            if let Err(error) = outcome {
                log.info(format!(
                    "{label}'s marker not committed ({error}): it fails back unaligned"
                ));
            }
        });
    }

    /// A new hub at this socket path (`replace.rs` is its side): asked, this
    /// one answers who it is and on which database; told the path is the
    /// new hub's, it hands every worker over as a stop does and ends.
    fn replace(&mut self, worker: WorkerId, replace: Replace) {
        let Some(connection) = self.workers.get(&worker).cloned() else {
            return;
        };
        match replace {
            Replace::Request => {
                // Not a worker: no move for it, not counted.
                self.monitors.insert(worker);
                let database = self
                    .engine
                    .stats()
                    .and_then(|s| s.backend())
                    .map(|b| b.database);
                let answer = match database {
                    _ if self.yielding => Replace::Refused {
                        reason: "it is being replaced already".into(),
                    },
                    Some(database) => {
                        self.replacer = Some(worker);
                        Replace::Serving {
                            pid: std::process::id(),
                            database,
                        }
                    }
                    None => Replace::Refused {
                        reason: super::replace::DATABASE_DOWN.into(),
                    },
                };
                self.send(&connection, &Message::Replace(answer));
            }
            Replace::To(path)
                if self.replacer == Some(worker) && Path::new(&path) == self.socket_path =>
            {
                self.yielding = true;
                self.shared.log.info(format!(
                    "{} took {path} over: handing every worker over, then yielding",
                    connection.label()
                ));
            }
            other => self.shared.log.warn(format!(
                "{} sent replace {other:?} without asking first, or for another path — ignored",
                connection.label()
            )),
        }
    }

    fn remove_worker(&mut self, worker: WorkerId) {
        self.markers.retain(|_, id| *id != worker);
        self.workers.remove(&worker);
        self.monitors.remove(&worker);
        for queue in self.registry.remove_worker(worker) {
            self.engine.unlisten(&queue);
        }
    }

    /// `sub`'s ack, timed: its sub->ack time is observed once it is written.
    fn send_ack(&self, worker: &WorkerConnection, sub: &Sub) {
        match Message::Ack(sub.queue.clone()).encode() {
            Ok(frame) => {
                worker.offer_ack(&self.shared.backpressure, Frame::from(frame), sub.read_at)
            }
            Err(e) => self
                .shared
                .log
                .error(format!("cannot encode an ack frame: {e}")),
        }
    }

    /// A non-droppable control frame (ack, nack, status) to one worker.
    fn send(&self, worker: &WorkerConnection, message: &Message) {
        match message.encode() {
            Ok(frame) => {
                worker.offer(&self.shared.backpressure, Frame::from(frame), false);
            }
            Err(e) => self
                .shared
                .log
                .error(format!("cannot encode a {} frame: {e}", message.kind())),
        }
    }

    /// Fan-out: the wake is encoded once, and every routed worker's outbox
    /// holds the same bytes (a refcount each; the writers send them as they are).
    pub(super) fn fan_out_wake(&self, wake: Wake) {
        self.shared.wakes_received.fetch_add(1, Ordering::Relaxed);
        let mut workers = self
            .registry
            .workers_for(&wake.queue)
            .filter_map(|id| self.workers.get(&id))
            .peekable();
        if workers.peek().is_none() {
            return;
        }
        let Some(frame) = self.encode(&wake) else {
            return;
        };
        for worker in workers {
            let offered = worker.offer(
                &self.shared.backpressure,
                frame.clone(),
                wake.is_droppable(),
            );
            if offered == super::outbox::Enqueued::Dropped {
                crate::events::dropped(worker.id, worker.peer_pid(), &wake.queue);
            }
        }
    }

    /// The wake's one frame, shared by every worker it goes to; None (logged) if it cannot be encoded.
    fn encode(&self, wake: &Wake) -> Option<Frame> {
        wake.encode()
            .map_err(|e| {
                self.shared
                    .log
                    .error(format!("cannot encode a wake frame: {e}"));
            })
            .ok()
    }

    /// One durable wake per queue to each of its subscribers, owed in their
    /// outboxes behind live wakes (see [`super::outbox`]); each frame encoded once.
    fn catch_up(&self, queues: Vec<Arc<str>>) {
        let mut owed: HashMap<WorkerId, Vec<Frame>> = HashMap::new();
        for queue in queues {
            let mut workers = self.registry.workers_for(&queue).peekable();
            if workers.peek().is_none() {
                continue;
            }
            let Some(frame) = self.encode(&Wake::durable(queue)) else {
                return;
            };
            for id in workers {
                owed.entry(id).or_default().push(frame.clone());
            }
        }
        for (id, frames) in owed {
            if let Some(worker) = self.workers.get(&id) {
                worker.owe_catch_up(frames);
            }
        }
    }

    /// The `status` to tell workers, or None while the listener's first
    /// connection attempt is still under way. Our client treats `healthy:false`
    /// as a database outage and stops waiting for acks (it stays on the hub);
    /// before the first attempt has concluded that would be wrong: the ack is
    /// only milliseconds away, so new workers keep pgbus's optimistic default.
    fn announced_health(&self) -> Option<bool> {
        let healthy = self.shared.healthy.load(Ordering::Relaxed);
        let attempted = healthy
            || self.engine.stats().is_some_and(|stats| {
                stats.connect_failures() > 0
                    || stats.reconnects() > 0
                    || stats.last_error().is_some()
            });
        attempted.then_some(healthy)
    }

    fn broadcast_status(&mut self) {
        let Some(healthy) = self.announced_health() else {
            return;
        };
        let Ok(frame) = (Message::Status { healthy }).encode() else {
            return;
        };
        let frame = Frame::from(frame);
        for worker in self.workers.values() {
            worker.offer(&self.shared.backpressure, frame.clone(), false);
        }
        for sub in self.pending.health_announced(healthy) {
            self.ack_during_outage(&sub);
        }
    }

    /// Answers our `{"t":"stats"}` extension (pgbus's client never sends it):
    /// `{"t":"stats","stats":{...}}`, for `pgbus-hub status`. A connection
    /// that asks for stats and has no subscription is a monitor, not a worker:
    /// it is left out of `workers` (in this answer too) until it subscribes.
    fn send_stats(&mut self, worker_id: WorkerId) {
        let Some(worker) = self.workers.get(&worker_id).cloned() else {
            return;
        };
        if !self.registry.is_subscribed(worker_id) {
            self.monitors.insert(worker_id);
        }
        self.publish_counts();
        let mut stats = self.shared.stats(1).fields();
        // Names only here, for `pgbus-hub status`: a bounded list, computed on request.
        let names = self.registry.raw_channel_names(STATS_RAW_CHANNEL_NAMES);
        stats.insert("raw_channel_names".into(), names.into());
        self.send(&worker, &Message::Stats(Some(stats)));
    }
}

fn nack(queue: &str, error: &ListenError) -> Message {
    Message::Nack {
        queue: queue.to_owned(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conninfo::ConnectionOptions;
    use crate::listener::ListenerConfig;
    use crate::log::LogSink;

    /// The fan-out promise in the code path: one encoding per wake, and every
    /// routed worker's outbox holds that same allocation (no per-worker copy).
    #[tokio::test(flavor = "current_thread")]
    async fn a_wake_is_encoded_once_and_every_worker_queues_the_same_bytes() {
        let connection =
            ConnectionOptions::parse("host=/nonexistent dbname=none user=none").unwrap();
        let config = HubConfig {
            listener: ListenerConfig::new(connection, LogSink::silent()),
            socket_path: "/nonexistent/hub.sock".into(),
            status_interval: super::super::DEFAULT_STATUS_INTERVAL,
            durable_queue_limit: 8,
            hard_queue_limit: 8,
            max_channels_per_connection: 8,
            max_channels: 8,
            metrics: None,
        };
        let (mut router, _inputs) = Router::new(Arc::new(HubShared::new(&config)), &config);
        let mut peers = Vec::new();
        for _ in 0..3 {
            let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
            router.accept(ours, None);
            peers.push(theirs);
        }
        let ids: Vec<WorkerId> = router.workers.keys().copied().collect();
        for id in &ids {
            router.registry.add(*id, "q");
        }
        router.fan_out_wake(Wake::new("q", Some("payload")));
        let queued: Vec<usize> = ids
            .iter()
            .map(|id| {
                router.workers[id]
                    .outbox()
                    .front()
                    .expect("a wake")
                    .as_ptr() as usize
            })
            .collect();
        assert_eq!(queued.len(), 3);
        assert!(queued.iter().all(|ptr| *ptr == queued[0]), "{queued:?}");
    }
}
