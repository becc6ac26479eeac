//! A worker's listener: served by the master hub while the hub serves, by a
//! LISTEN connection of its own from the hub's first failure on.
//!
//! The hub client's failure model is pgbus 0.13.1's: a client never
//! reconnects. So a failure (an `Unavailable` answer to a sub, or the
//! client's one [`Delivery::Failed`] seen by the pump) builds a
//! [`StandaloneListener`], asks it for every subscription recorded so far and
//! swaps it in. A hub that cannot be reached at start means the local
//! listener at once.
//!
//! A planned stop of the hub is not a failure: the hub sends `move`, and the
//! worker starts its own connection cut at the hub's marker (`moves.rs`):
//! nothing missed, nothing twice, no queue woken.
//!
//! **Fail-back**: from then on a thread probes the hub's socket (every
//! [`FAIL_BACK_FIRST`], doubling to [`FAIL_BACK_MAX`]). Once a hub answers
//! again (a sidecar its supervisor restarted, a Puma master's new hub), a new
//! client subscribes every recorded subscription through it while the local
//! listener keeps serving; when all are acked the hub takes new ones and the
//! two are cut at a marker (`fail_back.rs`): the local connection delivers up
//! to it, the hub from it, then the local connection is closed. A hub that
//! does not commit the cut within the ack budget (an older one) gets the
//! worker back as before: every subscribed queue woken once (durable), and
//! a payload NOTIFYed during the switch may arrive twice.
//!
//! No acknowledged subscription is lost: a queue is recorded before the
//! caller's sub goes out, and the swap happens in the same critical section
//! that finds nothing recorded is left to replay. The replay waits for its
//! LISTENs (one LISTEN budget for the lot), so once the local listener is
//! in charge it is listening; with the database down, the engine keeps them
//! and runs them when it connects.
//!
//! `listen_async` / `unlisten_async` are the same subscriptions without a
//! wait, for callers that must not block (ActionCable's subscriber map): one
//! thread runs them in order, asks again every [`LISTEN_RETRY`] for a LISTEN
//! not confirmed while it is still wanted, and reports each confirmation as
//! [`Delivery::Listening`] among the wakes.
//!
//! One outcome for every input, whichever side serves: [`Listened::Done`],
//! or [`Listened::NotConfirmed`] (timed out, the database down, interrupted;
//! the subscription is kept), or [`Listened::Refused`] for a name no LISTEN
//! can take or a hub's nack (logged at ERROR the first time per name; the
//! subscription is dropped, never replayed).
//!
//! One job per file: this one the API and the pump's [`FailoverWakes`];
//! `fail_over.rs` (the hub failed), `moves.rs` (it stops and asks the worker
//! to move), `fail_back.rs` (it answers again),
//! `async_listens.rs` (`listen_async`'s thread), `state.rs` (the
//! [`FailoverState`] words and the table deriving them).

use crate::client::{
    hub_ack_timeout, ClientConfig, ClientError, DrivenReader, HubClient, Listening,
};
use crate::delivery::{self, Batch, Delivery, DeliveryReceiver, DeliverySender, Drops, WakeSource};
use crate::events::{self, Event, Via};
use crate::listener::{
    listen_ack_timeout, Cut, ListenError, ListenerConfig, ListenerHandle, StandaloneListener, Start,
};
use crate::log::LogSink;
use crate::owned_thread::OwnedThread;
use crate::process::Owner;
use crate::protocol::{key_channel, Wake};
use crate::sync::lock;

mod async_listens;
mod fail_back;
mod fail_over;
mod moves;
mod state;
pub use crate::failover_state::FailoverState;
use async_listens::run_async_listens;
use crossbeam_channel::{Receiver, Sender};
use state::{Serving, State};
use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long `listen_async` waits before asking again for a LISTEN that was
/// not confirmed (the database down, the listener reconnecting): a
/// subscription confirms within a second of the database's return, and an
/// outage costs one attempt per channel per second.
pub const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// How soon after a fail-over the hub's socket is first probed, and the
/// probe interval's cap: a restarted hub serves again within about 2 s, at a
/// cost of one refused connect per worker per 2 s while it is down.
pub const FAIL_BACK_FIRST: Duration = Duration::from_millis(250);
pub const FAIL_BACK_MAX: Duration = Duration::from_secs(2);

/// What `ensure_listening` came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listened {
    /// LISTEN is active (the hub acked, or the local connection ran it).
    Done,
    /// Not confirmed in time (the subscription is kept and LISTENed later).
    NotConfirmed,
    /// No LISTEN can take this name, or the hub refused it: why.
    Refused(String),
}

impl Listened {
    /// The `subscribe` event's `outcome`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::NotConfirmed => "not_confirmed",
            Self::Refused(_) => "refused",
        }
    }
}

/// The names refused so far. Each is logged at ERROR once: app code repeats
/// a bad name on every request.
#[derive(Default)]
pub struct RefusedNames(Mutex<HashSet<String>>);

impl RefusedNames {
    pub fn report(&self, log: &LogSink, queue: &str, reason: &str) {
        if lock(&self.0).insert(queue.to_owned()) {
            log.error(format!("[pgbus-hub] cannot listen to {queue:?}: {reason}"));
        }
    }
}

pub struct FailoverConfig {
    /// The master hub's socket; None: the local listener from the start.
    pub socket_path: Option<PathBuf>,
    /// The fallback's connection, health check and channel names; its
    /// health check also sets both ack budgets (pgbus's formulas).
    pub listener: ListenerConfig,
}

/// What the `listen_async` thread is asked, in order.
enum Command {
    Listen(String, u64),
    Unlisten(String),
}

/// The thread behind `listen_async`.
struct AsyncListens {
    commands: Sender<Command>,
    thread: OwnedThread,
}

struct FailoverShared {
    state: Mutex<State>,
    /// Started by the first `listen_async`; taken by `stop`.
    async_listens: Mutex<Option<AsyncListens>>,
    /// The next `listen_async` ticket.
    tickets: AtomicU64,
    /// The hub client's reader while the hub serves (the pump reads it;
    /// `listen_async` wakes it to pass on a confirmation).
    hub_reader: Mutex<Option<Arc<DrivenReader>>>,
    /// One fail-over or fail-back at a time (each replays outside `state`'s lock).
    failing_over: Mutex<()>,
    /// How to reach the hub again (None: no hub was configured).
    hub: Option<ClientConfig>,
    /// Probes for the hub while the local listener serves; taken by `stop`.
    fail_back: Mutex<Option<OwnedThread>>,
    /// True while the pump drops the hub's wakes of an aligned fail-back's
    /// set until the hub's marker (`backing` says which): no lock per wake otherwise.
    dropping: AtomicBool,
    listener: ListenerConfig,
    /// Where the local listener's wakes go (the pump reads them after the swap).
    local_wakes: DeliverySender,
    /// Payload wakes dropped over `worker_payload_limit` on either side.
    drops: Drops,
    refused: RefusedNames,
    log: LogSink,
    owner: Owner,
}

pub struct FailoverListener {
    shared: Arc<FailoverShared>,
}

/// The wakes of a [`FailoverListener`], for the embedder's pump thread: the
/// hub client's [`DrivenReader`] until it fails (which triggers the
/// fail-over), then the local listener's channel (which also carries
/// `listen_async`'s confirmations from the start).
pub struct FailoverWakes {
    local: DeliveryReceiver,
    shared: Arc<FailoverShared>,
}

impl FailoverListener {
    /// Connects to the hub (giving up when `cancel` receives, as
    /// [`HubClient::connect_driven_or_cancel`]); a hub that cannot be
    /// reached is logged and the local listener starts instead.
    pub fn start_or_cancel(
        config: FailoverConfig,
        cancel: &Receiver<()>,
    ) -> Result<(Self, FailoverWakes), ClientError> {
        let log = config.listener.log.clone();
        // One count for every channel it reads: its own connection's and each hub client's.
        let drops = Drops::new(log.clone());
        let (local_wakes, local) = delivery::channel_counting(drops.clone());
        let mut hub = None;
        let had_hub = config.socket_path.is_some();
        let hub_config = config.socket_path.map(|socket_path| ClientConfig {
            socket_path,
            ack_timeout: hub_ack_timeout(config.listener.health_check),
            log: log.clone(),
            drops: drops.clone(),
        });
        if let Some(client) = hub_config.clone() {
            match HubClient::connect_driven_or_cancel(client, cancel) {
                Ok(connected) => hub = Some(connected),
                Err(ClientError::Interrupted) => return Err(ClientError::Interrupted),
                Err(error) => log.info(format!(
                    "[pgbus-hub] master hub not reachable ({error}) — using a per-worker listener"
                )),
            }
        }
        let (serving, reader) = match hub {
            Some((client, reader)) => (Serving::Hub(Arc::new(client)), Some(Arc::new(reader))),
            None => (Serving::Nobody, None),
        };
        let shared = Arc::new(FailoverShared {
            state: Mutex::new(State {
                serving,
                moving: None,
                backing: None,
                subscriptions: HashSet::new(),
                failed_over: false,
                failing_back: false,
                stopped: false,
            }),
            async_listens: Mutex::new(None),
            tickets: AtomicU64::new(1),
            hub_reader: Mutex::new(reader.clone()),
            failing_over: Mutex::new(()),
            hub: hub_config,
            fail_back: Mutex::new(None),
            dropping: AtomicBool::new(false),
            listener: config.listener,
            local_wakes,
            drops,
            refused: RefusedNames::default(),
            log,
            owner: Owner::current(),
        });
        match (&reader, had_hub) {
            (Some(_), _) => {}
            (None, true) => shared.fail_over(),
            (None, false) => {
                let local = shared.start_local(Start::default());
                lock(&shared.state).serving = local.map_or(Serving::Nobody, Serving::Local);
            }
        }
        let wakes = FailoverWakes {
            local,
            shared: Arc::clone(&shared),
        };
        Ok((Self { shared }, wakes))
    }

    /// Subscribes to `queue` on whichever side serves (see the module doc);
    /// a wait ends early when `cancel` receives (then `NotConfirmed`).
    pub fn ensure_listening_or_cancel(&self, queue: &str, cancel: &Receiver<()>) -> Listened {
        let shared = &self.shared;
        if !shared.owner.is_current() {
            return Listened::NotConfirmed; // a forked child: nothing here is its own
        }
        let asked = Instant::now();
        let serving = {
            let mut state = lock(&shared.state);
            state.subscriptions.insert(queue.to_owned());
            state.serving.clone()
        };
        let (outcome, via) = match serving {
            Serving::Hub(client) => match client.subscribe_or_cancel(queue, cancel) {
                Ok(Listening::Active) => (Listened::Done, Some(Via::Hub)),
                Ok(Listening::AfterReconnect | Listening::Interrupted) => {
                    (Listened::NotConfirmed, Some(Via::Hub))
                }
                Err(ClientError::Rejected { reason, .. }) => {
                    (Listened::Refused(reason), Some(Via::Hub))
                }
                Err(ClientError::Interrupted) => (Listened::NotConfirmed, Some(Via::Hub)),
                Err(ClientError::Unavailable(_)) => {
                    shared.fail_over();
                    let serving = lock(&shared.state).serving.clone();
                    shared.listen_on(&serving, queue, cancel)
                }
            },
            serving => shared.listen_on(&serving, queue, cancel),
        };
        events::emit(Event::Subscribe {
            queue: queue.to_owned(),
            duration: asked.elapsed(),
            via,
            outcome: outcome.as_str(),
            state: shared.state(),
        });
        if let Listened::Refused(reason) = &outcome {
            lock(&shared.state).subscriptions.remove(queue);
            shared.refused.report(&shared.log, queue, reason);
        }
        outcome
    }

    /// The longest `ensure_listening` waits for a confirmation, on either
    /// side (the hub's ack timeout, the local listener's LISTEN budget).
    pub fn listen_budget(&self) -> Duration {
        let health_check = self.shared.listener.health_check;
        hub_ack_timeout(health_check).max(listen_ack_timeout(health_check))
    }

    pub fn ensure_listening(&self, queue: &str) -> Listened {
        self.ensure_listening_or_cancel(queue, &crossbeam_channel::never())
    }

    /// Asynchronous; never fails.
    pub fn remove_listening(&self, queue: &str) {
        let serving = {
            let mut state = lock(&self.shared.state);
            state.subscriptions.remove(queue);
            state.serving.clone()
        };
        match serving {
            Serving::Hub(client) => client.unsubscribe(queue),
            Serving::Local(local) => local.unlisten(queue),
            Serving::Nobody => {}
        }
    }

    /// Subscribes to `queue` without waiting (see the module doc) and
    /// returns this request's ticket: once its LISTEN is active,
    /// [`Delivery::Listening`] with that ticket follows on the wakes (the
    /// ticket tells it from an earlier request's of the same queue); a
    /// refused name gets none (logged once). In order with `unlisten_async`.
    pub fn listen_async(&self, queue: &str) -> u64 {
        let ticket = self.shared.tickets.fetch_add(1, Ordering::Relaxed);
        self.ask(Command::Listen(queue.to_owned(), ticket));
        ticket
    }

    /// Unsubscribes, in order with `listen_async` (a pending retry ends).
    pub fn unlisten_async(&self, queue: &str) {
        self.ask(Command::Unlisten(queue.to_owned()));
    }

    fn ask(&self, command: Command) {
        if !self.shared.owner.is_current() {
            return; // a forked child's: nothing runs it
        }
        let mut async_listens = lock(&self.shared.async_listens);
        // Checked under `async_listens`: `stop` sets it before taking them.
        if lock(&self.shared.state).stopped {
            return;
        }
        if async_listens.is_none() {
            let (commands, received) = crossbeam_channel::unbounded();
            // Weak: a listener dropped without `stop` ends the thread too.
            let shared = Arc::downgrade(&self.shared);
            let spawned =
                OwnedThread::spawn_with_stop_channel("pgbus-hub listens", move |stopped| {
                    run_async_listens(&shared, &received, stopped)
                });
            match spawned {
                Ok(thread) => *async_listens = Some(AsyncListens { commands, thread }),
                Err(error) => {
                    return self.shared.log.error(format!(
                        "[pgbus-hub] cannot start the LISTEN thread ({error}): not subscribed"
                    ))
                }
            }
        }
        if let Some(running) = &*async_listens {
            let _ = running.commands.send(command);
        }
    }

    fn subscribed(&self, queue: &str) -> bool {
        lock(&self.shared.state).subscriptions.contains(queue)
    }

    /// True once the hub's failure (or absence at start) handed over to the
    /// local listener; false without a hub to try.
    pub fn failed_over(&self) -> bool {
        let state = lock(&self.shared.state);
        state.failed_over && !matches!(state.serving, Serving::Hub(_))
    }

    /// Who serves now (see [`FailoverState`]).
    pub fn state(&self) -> FailoverState {
        self.shared.state()
    }

    /// True while the hub serves and its last `status` said healthy (the
    /// hub client's [`HubClient::hub_healthy`]); false on the local
    /// listener, after `stop`, and in a forked child.
    pub fn hub_healthy(&self) -> bool {
        match &lock(&self.shared.state).serving {
            Serving::Hub(client) => client.hub_healthy(),
            _ => false,
        }
    }

    /// Payload wakes dropped while undelivered, over `worker_payload_limit`
    /// (`crate::delivery`), on either side since `start`.
    pub fn dropped_payloads(&self) -> u64 {
        self.shared.drops.count()
    }

    /// The local listener once it serves (for its stats).
    pub fn local(&self) -> Option<Arc<StandaloneListener>> {
        match &lock(&self.shared.state).serving {
            Serving::Local(local) => Some(Arc::clone(local)),
            _ => None,
        }
    }

    /// Idempotent: stops whichever side serves; no fail-over happens after it.
    /// Waits for the side's threads unless `cancel` receives (see the sides' `stop_or_cancel`).
    pub fn stop_or_cancel(&self, cancel: &Receiver<()>) {
        let (serving, moving, backing, was_stopped) = {
            let mut state = lock(&self.shared.state);
            let was_stopped = std::mem::replace(&mut state.stopped, true);
            (
                std::mem::replace(&mut state.serving, Serving::Nobody),
                state.moving.take(),
                state.backing.take(),
                was_stopped,
            )
        };
        if let Some(moving) = moving {
            moving.client.stop_or_cancel(cancel);
        }
        if let Some(local) = backing.and_then(|backing| backing.local) {
            local.stop_or_cancel(cancel);
        }
        if !was_stopped {
            let stopped = FailoverState::Stopped;
            self.shared.log.debug(format!(
                "[pgbus-hub] worker listener stopped state={stopped}"
            ));
        }
        let async_listens = lock(&self.shared.async_listens).take();
        let fail_back = lock(&self.shared.fail_back).take();
        if let Some(thread) = fail_back {
            // Its signal also ends a connect or sub in progress.
            thread.stop_or_cancel(cancel, None);
        }
        match serving {
            Serving::Hub(client) => client.stop_or_cancel(cancel),
            Serving::Local(local) => local.stop_or_cancel(cancel),
            Serving::Nobody => {}
        }
        if let Some(AsyncListens { thread, .. }) = async_listens {
            // Its signal also ends a LISTEN wait in progress.
            thread.stop_or_cancel(cancel, None);
        }
    }

    pub fn stop(&self) {
        self.stop_or_cancel(&crossbeam_channel::never());
    }
}

impl FailoverShared {
    fn state(&self) -> FailoverState {
        lock(&self.state).state(self.hub.is_some())
    }

    fn listen_on(
        &self,
        serving: &Serving,
        queue: &str,
        cancel: &Receiver<()>,
    ) -> (Listened, Option<Via>) {
        let Serving::Local(local) = serving else {
            // Stopped, or no local listener could be built.
            return (Listened::NotConfirmed, None);
        };
        let timeout = listen_ack_timeout(self.listener.health_check);
        let asked = Instant::now();
        let listened = match local.listen_or_cancel(queue, timeout, cancel) {
            Ok(()) => Listened::Done,
            Err(error) if error.is_invalid_name() => Listened::Refused(error.to_string()),
            // A cancelled wait reports Timeout too: only a wait that ran its course is logged.
            Err(ListenError::Timeout) if asked.elapsed() >= timeout => {
                self.log.warn(format!(
                    "[pgbus-hub] LISTEN for {queue} not confirmed within {:?}s",
                    timeout.as_secs_f64()
                ));
                Listened::NotConfirmed
            }
            Err(_) => Listened::NotConfirmed,
        };
        (listened, Some(Via::OwnConnection))
    }
}

impl WakeSource for FailoverWakes {
    /// The hub's deliveries while it serves, acting on the ones that are the
    /// listener's (`move`, `marker`, `Failed`), then the local channel's: the
    /// own connection's wakes and `listen_async`'s confirmations. During a
    /// move the local channel waits: the own connection's wakes follow the
    /// hub's `marker` (`moves.rs`). During an aligned fail-back the own
    /// connection's marker switches the pump to the hub (`fail_back.rs`).
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch {
        let hub = lock(&self.shared.hub_reader).clone();
        let mut batch = match hub {
            Some(hub) => self.read_hub(&hub, max, timeout),
            None => self.local.next_batch(max, timeout),
        };
        if lock(&self.shared.state).moving.is_none() {
            self.local.take_ready(&mut batch, max);
        }
        // The own connection's markers: where its stream starts (a move) or
        // ends (a fail-back), nothing to deliver.
        batch.items.retain(|item| match item {
            Delivery::Marker { token } => {
                self.shared.own_marker(token);
                false
            }
            _ => true,
        });
        batch
    }

    /// Both sides: the pump may be switching from one to the other.
    fn interrupt(&self) {
        if let Some(hub) = lock(&self.shared.hub_reader).clone() {
            hub.interrupt();
        }
        self.local.interrupt();
    }
}

impl FailoverWakes {
    fn read_hub(&self, hub: &DrivenReader, max: usize, timeout: Duration) -> Batch {
        let mut batch = hub.next_batch(max, timeout);
        let mut failed = batch.closed;
        let mut cut = false;
        let mut items = Vec::with_capacity(batch.items.len());
        for item in batch.items.drain(..) {
            match item {
                Delivery::Move { channel, token } => self.shared.start_move(channel, token),
                Delivery::Marker { token } if self.shared.is_moving_at(&token) => {
                    // The hub routes this worker nothing after it.
                    cut = true;
                    break;
                }
                Delivery::Marker { token } => self.shared.hub_marker(&token),
                // Before the hub's marker the own connection delivered it.
                Delivery::Wake(wake)
                    if self.shared.dropping.load(Ordering::Acquire)
                        && self.shared.delivered_before_the_cut(&wake.queue) => {}
                Delivery::Failed { .. } => failed = true,
                item => items.push(item),
            }
        }
        batch.items = items;
        batch.closed = false; // the local listener's wakes follow
        if cut || failed {
            *lock(&self.shared.hub_reader) = None;
        }
        if cut {
            self.shared.finish_move();
        } else if failed {
            self.shared.hub_failed();
        }
        batch
    }
}
