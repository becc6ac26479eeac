//! Events for an embedder's instrumentation (the Ruby binding publishes
//! them as ActiveSupport::Notifications, docs/events.md): a worker's
//! subscribes, fail-overs, fail-backs and the hub's reported health; the
//! hub's reconnects, evictions and dropped durable wakes.
//!
//! Native threads only [`emit`]: a short push into one bounded queue per
//! process, never a wait on whoever reads it. Off until the process calls
//! [`enable`] (the binding does when ActiveSupport is loaded): [`emit`] then
//! queues nothing. Full, it drops the oldest event and counts it: a queue
//! nobody reads never grows.
//!
//! Fork: the queue belongs to the process that enabled it. A forked child
//! never touches its parent's (whose lock a parent thread may have held at
//! the fork); its events are off until it enables its own.

use crate::failover_state::FailoverState;
use crate::listener::{ListenerState, ListenerStats};
use crate::process::current_pid;
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Events kept unread before the oldest is dropped: far more than a burst
/// (a fail-over of every subscription is one event), small enough that an
/// unread queue costs little.
pub const EVENT_QUEUE_CAPACITY: usize = 1024;

/// Which side served a subscribe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Hub,
    OwnConnection,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hub => "hub",
            Self::OwnConnection => "own_connection",
        }
    }
}

/// Why the hub evicted a worker's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictReason {
    /// Its outbound queue passed `hard_queue_limit`: it does not read.
    NotDraining,
}

impl EvictReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotDraining => "not_draining",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A worker's `ensure_listening` (or `listen_async`'s) came to `outcome`.
    Subscribe {
        queue: String,
        duration: Duration,
        via: Option<Via>,
        /// `done`, `not_confirmed` or `refused`.
        outcome: &'static str,
        state: FailoverState,
    },
    /// A worker's own connection took over (or could not: `unserved`).
    FailOver {
        state: FailoverState,
        subscriptions: usize,
        woken: usize,
        duration: Duration,
        /// Cut at a marker (a planned stop's move): nothing missed, nothing twice, none woken.
        aligned: bool,
    },
    /// The hub serves a worker again.
    FailBack {
        state: FailoverState,
        subscriptions: usize,
        woken: usize,
        duration: Duration,
        /// Cut at a marker: nothing missed, nothing twice, none woken.
        aligned: bool,
    },
    /// The hub told a worker its database connection went down or came back.
    HubHealth { healthy: bool },
    /// The hub's LISTEN connection is back, its queues re-LISTENed.
    Reconnect {
        state: ListenerState,
        queues: usize,
        reconnects: u64,
    },
    /// The hub cut a worker's connection off.
    Evict {
        connection: u64,
        pid: Option<i32>,
        reason: EvictReason,
    },
    /// Wakes dropped for one queue: durable ones by the hub for a worker
    /// (`connection` its number), payload ones by a worker itself
    /// (`connection` None, `pid` its own). Consecutive drops of the same
    /// connection, queue and kind are counted in one event.
    Drop {
        connection: Option<u64>,
        wake: DroppedWake,
        pid: Option<i32>,
        queue: String,
        dropped: u64,
    },
}

/// Which wakes a `drop` event counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DroppedWake {
    /// The hub's, over `durable_queue_limit` (the stream re-reads its queue).
    Durable,
    /// A worker's own, over `worker_payload_limit` (the payload is lost).
    Payload,
}

impl DroppedWake {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Durable => "durable",
            Self::Payload => "payload",
        }
    }
}

/// A payload value, typed for the embedder: a `Word` is one of a fixed
/// vocabulary (a Symbol in Ruby), a `Text` is free text (a String).
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    Word(&'static str),
    Text(String),
    Int(i64),
    Seconds(f64),
    Flag(bool),
    Nil,
}

fn count(n: impl TryInto<i64>) -> Field {
    Field::Int(n.try_into().unwrap_or(i64::MAX))
}

fn pid(pid: Option<i32>) -> Field {
    pid.map_or(Field::Nil, |p| Field::Int(p.into()))
}

impl Event {
    /// The event's name without the embedder's suffix.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Subscribe { .. } => "subscribe",
            Self::FailOver { .. } => "fail_over",
            Self::FailBack { .. } => "fail_back",
            Self::HubHealth { .. } => "hub_health",
            Self::Reconnect { .. } => "reconnect",
            Self::Evict { .. } => "evict",
            Self::Drop { .. } => "drop",
        }
    }

    /// The payload, in docs/events.md's order.
    pub fn fields(&self) -> Vec<(&'static str, Field)> {
        match self {
            Self::Subscribe {
                queue,
                duration,
                via,
                outcome,
                state,
            } => vec![
                ("queue", Field::Text(queue.clone())),
                ("duration", Field::Seconds(duration.as_secs_f64())),
                ("via", via.map_or(Field::Nil, |v| Field::Word(v.as_str()))),
                ("outcome", Field::Word(outcome)),
                ("state", Field::Word(state.as_str())),
            ],
            Self::FailOver {
                state,
                subscriptions,
                woken,
                duration,
                aligned,
            }
            | Self::FailBack {
                state,
                subscriptions,
                woken,
                duration,
                aligned,
            } => vec![
                ("state", Field::Word(state.as_str())),
                ("subscriptions", count(*subscriptions)),
                ("woken", count(*woken)),
                ("duration", Field::Seconds(duration.as_secs_f64())),
                ("aligned", Field::Flag(*aligned)),
            ],
            Self::HubHealth { healthy } => vec![("healthy", Field::Flag(*healthy))],
            Self::Reconnect {
                state,
                queues,
                reconnects,
            } => vec![
                ("state", Field::Word(state.as_str())),
                ("queues", count(*queues)),
                ("reconnects", count(*reconnects)),
            ],
            Self::Evict {
                connection,
                pid: peer,
                reason,
            } => vec![
                ("connection", count(*connection)),
                ("pid", pid(*peer)),
                ("reason", Field::Word(reason.as_str())),
            ],
            Self::Drop {
                connection,
                wake,
                pid: peer,
                queue,
                dropped,
            } => vec![
                ("connection", connection.map_or(Field::Nil, count)),
                ("pid", pid(*peer)),
                ("wake", Field::Word(wake.as_str())),
                ("queue", Field::Text(queue.clone())),
                ("dropped", count(*dropped)),
            ],
        }
    }

    /// Adds `newer` to this event if both are drops for the same connection
    /// and queue (then `newer` needs no slot of its own).
    fn absorb(&mut self, newer: &Event) -> bool {
        match (self, newer) {
            (
                Self::Drop {
                    connection,
                    wake,
                    queue,
                    dropped,
                    ..
                },
                Self::Drop {
                    connection: c,
                    wake: w,
                    queue: q,
                    dropped: d,
                    ..
                },
            ) if connection == c && wake == w && queue == q => {
                *dropped += d;
                true
            }
            _ => false,
        }
    }
}

/// What the queue's reader sees of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventStats {
    pub queued: usize,
    /// Events dropped (the oldest first) because the queue was full.
    pub dropped: u64,
}

#[derive(Default)]
struct Inner {
    events: VecDeque<Event>,
    dropped: u64,
    enabled: bool,
    /// Bumped by [`interrupt`]: a waiting [`next`] returns.
    interrupts: u64,
}

struct EventQueue {
    pid: u32,
    inner: Mutex<Inner>,
    ready: Condvar,
}

impl EventQueue {
    fn new() -> Self {
        Self {
            pid: current_pid(),
            inner: Mutex::default(),
            ready: Condvar::new(),
        }
    }

    fn set_enabled(&self, enabled: bool) {
        let mut inner = lock(&self.inner);
        inner.enabled = enabled;
        if !enabled {
            inner.events.clear(); // nobody reads them
        }
    }

    fn emit(&self, event: Event) {
        let mut inner = lock(&self.inner);
        if !inner.enabled {
            return;
        }
        if inner
            .events
            .back_mut()
            .is_some_and(|last| last.absorb(&event))
        {
            return;
        }
        if inner.events.len() >= EVENT_QUEUE_CAPACITY {
            inner.events.pop_front();
            inner.dropped += 1;
        }
        inner.events.push_back(event);
        drop(inner);
        self.ready.notify_one();
    }

    fn next(&self, timeout: Duration) -> Option<Event> {
        let inner = lock(&self.inner);
        let interrupts = inner.interrupts;
        let (mut inner, _) = self
            .ready
            .wait_timeout_while(inner, timeout, |inner| {
                inner.events.is_empty() && inner.interrupts == interrupts
            })
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.events.pop_front()
    }

    fn interrupt(&self) {
        lock(&self.inner).interrupts += 1;
        self.ready.notify_all();
    }

    fn stats(&self) -> EventStats {
        let inner = lock(&self.inner);
        EventStats {
            queued: inner.events.len(),
            dropped: inner.dropped,
        }
    }
}

/// This process's queue (leaked: one per process that ever enabled events).
static QUEUE: AtomicPtr<EventQueue> = AtomicPtr::new(std::ptr::null_mut());

/// The queue if this process made it (never a forked parent's).
fn own_queue() -> Option<&'static EventQueue> {
    let queue = QUEUE.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is a leaked Box, never freed.
    let queue = unsafe { queue.as_ref() }?;
    (queue.pid == current_pid()).then_some(queue)
}

/// This process's queue, made if it has none.
fn queue() -> &'static EventQueue {
    loop {
        let seen = QUEUE.load(Ordering::Acquire);
        // SAFETY: a non-null pointer is a leaked Box, never freed.
        if let Some(queue) = unsafe { seen.as_ref() }.filter(|q| q.pid == current_pid()) {
            return queue;
        }
        let made = Box::into_raw(Box::new(EventQueue::new()));
        if QUEUE
            .compare_exchange(seen, made, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: `made` was never shared.
            drop(unsafe { Box::from_raw(made) });
        }
    }
}

/// Events are queued from now on in this process.
pub fn enable() {
    queue().set_enabled(true);
}

/// Events are no longer queued; what was queued is dropped (nobody reads it).
pub fn disable() {
    if let Some(queue) = own_queue() {
        queue.set_enabled(false);
    }
}

pub fn enabled() -> bool {
    own_queue().is_some_and(|queue| lock(&queue.inner).enabled)
}

/// Queues `event` if events are enabled in this process; never waits for a reader.
pub fn emit(event: Event) {
    if let Some(queue) = own_queue() {
        queue.emit(event);
    }
}

/// The oldest queued event, waiting at most `timeout` for one; None on
/// timeout, after an [`interrupt`], or at once if this process never
/// enabled events. Off, it still waits (a reader must not spin).
pub fn next(timeout: Duration) -> Option<Event> {
    own_queue()?.next(timeout)
}

/// Ends a waiting [`next`] at once.
pub fn interrupt() {
    if let Some(queue) = own_queue() {
        queue.interrupt();
    }
}

pub fn stats() -> EventStats {
    own_queue().map_or_else(EventStats::default, EventQueue::stats)
}

/// The hub's call sites, one line each.
///
/// The hub's LISTEN connection is back: `queues` re-LISTENed and owed a
/// catch-up wake (`listener`: the engine's stats, for its state and count).
pub fn reconnected(queues: usize, listener: &Mutex<Option<Arc<ListenerStats>>>) {
    if !enabled() {
        return;
    }
    let listener = lock(listener).clone();
    emit(Event::Reconnect {
        state: listener
            .as_deref()
            .map_or(ListenerState::Listening, ListenerStats::state),
        queues,
        reconnects: listener.as_deref().map_or(0, ListenerStats::reconnects),
    });
}

/// The hub dropped a durable wake for a worker over `durable_queue_limit`.
pub fn dropped(connection: u64, pid: Option<i32>, queue: &str) {
    if enabled() {
        emit(Event::Drop {
            connection: Some(connection),
            wake: DroppedWake::Durable,
            pid,
            queue: queue.to_owned(),
            dropped: 1,
        });
    }
}

/// This worker dropped a payload wake over `worker_payload_limit` (`crate::delivery`).
pub fn dropped_payload(queue: &str) {
    if enabled() {
        emit(Event::Drop {
            connection: None,
            wake: DroppedWake::Payload,
            pid: i32::try_from(std::process::id()).ok(),
            queue: queue.to_owned(),
            dropped: 1,
        });
    }
}

/// The hub severed a worker that does not read.
pub fn evicted(connection: u64, pid: Option<i32>) {
    emit(Event::Evict {
        connection,
        pid,
        reason: EvictReason::NotDraining,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drop_of(queue: &str, connection: u64) -> Event {
        Event::Drop {
            connection: Some(connection),
            wake: DroppedWake::Durable,
            pid: None,
            queue: queue.into(),
            dropped: 1,
        }
    }

    /// A queue of its own: other tests of this binary emit into the process's.
    #[test]
    fn off_until_enabled_bounded_then_and_drops_coalesce() {
        let queue = EventQueue::new();
        queue.emit(Event::HubHealth { healthy: false });
        assert_eq!(queue.next(Duration::ZERO), None, "off: nothing queued");

        queue.set_enabled(true);
        for _ in 0..3 {
            queue.emit(drop_of("a", 1));
        }
        queue.emit(drop_of("a", 2));
        let mut three = drop_of("a", 1);
        assert!(three.absorb(&drop_of("a", 1)) && three.absorb(&drop_of("a", 1)));
        assert_eq!(
            queue.next(Duration::ZERO),
            Some(three),
            "one event, dropped: 3"
        );
        assert_eq!(queue.next(Duration::ZERO), Some(drop_of("a", 2)));

        for healthy in (0..EVENT_QUEUE_CAPACITY + 2).map(|i| i % 2 == 0) {
            queue.emit(Event::HubHealth { healthy });
        }
        assert_eq!(queue.stats().queued, EVENT_QUEUE_CAPACITY);
        assert_eq!(queue.stats().dropped, 2);
        assert_eq!(
            queue.next(Duration::ZERO),
            Some(Event::HubHealth { healthy: true }),
            "the oldest two went"
        );
        queue.set_enabled(false);
        assert_eq!(queue.stats().queued, 0);

        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| queue.next(Duration::from_secs(60)));
            while !waiter.is_finished() {
                queue.interrupt();
                std::thread::yield_now();
            }
            assert_eq!(waiter.join().unwrap(), None, "interrupted");
        });
    }

    #[test]
    fn a_forked_parents_queue_is_not_ours() {
        enable();
        let parent = QUEUE.load(Ordering::Acquire);
        // SAFETY: leaked, never freed; a pid that is not ours stands for the parent's.
        let mut other = EventQueue::new();
        other.pid = unsafe { &*parent }.pid.wrapping_add(1);
        let other = Box::into_raw(Box::new(other));
        QUEUE.store(other, Ordering::Release);
        assert!(!enabled(), "the inherited queue is off here");
        enable();
        assert_ne!(QUEUE.load(Ordering::Acquire), other, "a queue of its own");
        assert!(enabled());
        disable();
    }
}
