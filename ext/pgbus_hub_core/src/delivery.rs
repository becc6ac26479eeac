//! Wakes (and a transport failure) handed from native code to the embedding
//! runtime. In the gem, one Ruby thread blocks in [`WakeSource::next_batch`]
//! without the GVL and pushes each batch into pgbus's dispatch queue; the
//! binding's unblock function calls [`WakeSource::interrupt`] so `Thread#kill`
//! and `stop` never wait on it. Two sources exist: this channel (filled by a
//! native thread: the per-worker listener) and the hub client's
//! [`crate::client::DrivenReader`] (the pump thread reads the socket itself,
//! and a sub waiting for its ack reads it while the pump is away).
//!
//! **Bounded or coalesced** (docs/configuration.md, "Limits"): while the
//! pump is away (pgbus's dispatch queue full, an app thread holding the GVL)
//! nothing here grows without bound. A durable wake carries no payload, so
//! one undelivered wake per queue is all its stream needs: a second one
//! while the first waits adds nothing (it is delivered after the second
//! NOTIFY arrived, so the stream's read sees that commit too). Payload wakes
//! past [`WORKER_PAYLOAD_LIMIT`] undelivered are dropped, counted
//! ([`Drops`]), logged and evented (`drop`, `wake: payload`). Everything
//! else (`Failed`, `Listening`, markers, moves) is queued as it comes; there
//! are few. Coalescing never reaches across a marker or a move: the
//! listener switches sides there, and each side's wakes stay its own.

use crate::events;
use crate::hub::limits::WORKER_PAYLOAD_LIMIT;
use crate::log::LogSink;
use crate::protocol::Wake;
use crate::sync::lock;
use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A WARN for the first dropped payload of a channel and every this many after.
const DROP_LOG_EVERY: u64 = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// A NOTIFY: the wake as the listener or the hub made it.
    Wake(Wake),
    /// The source died (hub gone, evicted, protocol error, ...). Sent at most once.
    Failed { reason: String },
    /// A LISTEN asked without waiting ([`crate::failover::FailoverListener::listen_async`],
    /// which returned `ticket`) is active.
    Listening { queue: String, ticket: u64 },
    /// A cut's marker K, in stream order (docs/architecture.md, "The cut"):
    /// every wake before it precedes the cut, every one after it follows it.
    /// Never for the embedding runtime: the worker's FailoverListener
    /// switches sides at it.
    Marker { token: String },
    /// The hub asks its worker to move to a LISTEN connection of its own,
    /// cut at `token` on the hub's private `channel` (a planned stop:
    /// docs/architecture.md, "1. A planned hub stop"). Never for the
    /// embedding runtime: the worker's FailoverListener acts on it.
    Move { channel: String, token: String },
}

impl Delivery {
    /// A marker or a move: where a listener may switch sides.
    fn is_cut(&self) -> bool {
        matches!(self, Self::Marker { .. } | Self::Move { .. })
    }
}

/// Payload wakes dropped over [`WORKER_PAYLOAD_LIMIT`], shared by every
/// channel of one listener (its own connection's and each hub client's), so
/// its stats count them across fail-overs and fail-backs. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Drops {
    dropped: Arc<AtomicU64>,
    log: LogSink,
}

impl Drops {
    /// Counts into a new counter and logs to `log`.
    pub fn new(log: LogSink) -> Self {
        Self {
            dropped: Arc::default(),
            log,
        }
    }

    /// Payload wakes dropped so far.
    pub fn count(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn record(&self, queue: &str) {
        let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if dropped == 1 || dropped % DROP_LOG_EVERY == 0 {
            self.log.warn(format!(
                "[pgbus-hub] dropped a payload for {queue}: {WORKER_PAYLOAD_LIMIT} payload wakes \
                 wait undelivered in this worker (its dispatch queue does not drain); \
                 {dropped} dropped so far"
            ));
        }
        events::dropped_payload(queue);
    }
}

/// What waits for the pump, with what bounds it.
#[derive(Default)]
struct Pending {
    items: VecDeque<Delivery>,
    /// Payload wakes in `items`.
    payloads: usize,
    /// Queues with a durable wake in `items`, by the cut it waits behind
    /// (the number of cuts queued before it): a durable wake is coalesced
    /// only into one behind the same cut.
    durable: HashMap<Arc<str>, u64>,
    cuts_queued: u64,
    cuts_taken: u64,
}

impl Pending {
    /// False when `delivery` was coalesced or dropped.
    fn push(&mut self, delivery: Delivery, drops: &Drops) -> bool {
        match &delivery {
            Delivery::Wake(wake) if wake.is_droppable() => {
                let behind = self.cuts_queued;
                if self.durable.insert(Arc::clone(&wake.queue), behind) == Some(behind) {
                    return false;
                }
            }
            Delivery::Wake(wake) if self.payloads >= WORKER_PAYLOAD_LIMIT => {
                drops.record(&wake.queue);
                return false;
            }
            Delivery::Wake(_) => self.payloads += 1,
            cut if cut.is_cut() => self.cuts_queued += 1,
            _ => {}
        }
        self.items.push_back(delivery);
        true
    }

    fn pop(&mut self) -> Option<Delivery> {
        let delivery = self.items.pop_front()?;
        match &delivery {
            Delivery::Wake(wake) if !wake.is_droppable() => self.payloads -= 1,
            // A durable one: forgotten unless a later one (behind a later cut) took its place.
            Delivery::Wake(wake) if self.durable.get(&wake.queue) == Some(&self.cuts_taken) => {
                self.durable.remove(&wake.queue);
            }
            cut if cut.is_cut() => self.cuts_taken += 1,
            _ => {}
        }
        Some(delivery)
    }
}

struct Shared {
    pending: Mutex<Pending>,
    drops: Drops,
    /// Live `DeliverySender`s: none left and nothing pending is `closed`.
    senders: AtomicUsize,
    receiver_gone: AtomicBool,
}

/// The filling end. Cloning it adds a sender; the channel closes once every
/// sender is dropped and what they queued is taken.
#[derive(Debug)]
pub struct DeliverySender {
    shared: Arc<Shared>,
    /// Rung after each push (capacity 1: one pending ring is as good as many).
    doorbell: Sender<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl DeliverySender {
    /// False once the receiver is gone (nobody is listening any more). A
    /// coalesced or dropped wake is still a successful send.
    pub fn send(&self, delivery: Delivery) -> bool {
        if self.shared.receiver_gone.load(Ordering::Acquire) {
            return false;
        }
        if lock(&self.shared.pending).push(delivery, &self.shared.drops) {
            let _ = self.doorbell.try_send(());
        }
        true
    }
}

impl Clone for DeliverySender {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        Self {
            shared: Arc::clone(&self.shared),
            doorbell: self.doorbell.clone(),
        }
    }
}

impl Drop for DeliverySender {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.doorbell.try_send(()); // a waiting receiver sees `closed`
        }
    }
}

/// What one `next_batch` call returns.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub items: Vec<Delivery>,
    /// `interrupt` was called (the waiting thread should check why).
    pub interrupted: bool,
    /// Every sender is gone and the channel is drained: no more deliveries.
    pub closed: bool,
}

/// What a pump thread waits on. `Send + Sync`: `interrupt` is called from
/// another thread (Ruby's unblock function) while `next_batch` blocks.
pub trait WakeSource: Send + Sync {
    /// Blocks until deliveries are ready, `interrupt` is called, or `timeout`
    /// passes; returns at most `max` deliveries, in order.
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch;
    /// Makes a blocked (or the next) `next_batch` return at once, `interrupted`.
    fn interrupt(&self);
}

pub struct DeliveryReceiver {
    shared: Arc<Shared>,
    doorbell: Receiver<()>,
    interrupts: Receiver<()>,
    interrupter: Interrupter,
}

impl Drop for DeliveryReceiver {
    fn drop(&mut self) {
        self.shared.receiver_gone.store(true, Ordering::Release);
    }
}

/// Wakes a thread blocked in `next_batch`. Cheap to clone, callable from any thread.
#[derive(Clone, Debug)]
pub struct Interrupter(Sender<()>);

impl Interrupter {
    pub fn interrupt(&self) {
        // Capacity 1: one pending interrupt is as good as many.
        let _ = self.0.try_send(());
    }
}

/// A channel whose payload drops count into a counter of its own (tests,
/// and callers without a listener's stats).
pub fn channel() -> (DeliverySender, DeliveryReceiver) {
    channel_counting(Drops::default())
}

/// A channel whose payload drops count into `drops`.
pub fn channel_counting(drops: Drops) -> (DeliverySender, DeliveryReceiver) {
    let (doorbell_sender, doorbell) = crossbeam_channel::bounded(1);
    let (interrupt_sender, interrupts) = crossbeam_channel::bounded(1);
    let shared = Arc::new(Shared {
        pending: Mutex::default(),
        drops,
        senders: AtomicUsize::new(1),
        receiver_gone: AtomicBool::new(false),
    });
    let receiver = DeliveryReceiver {
        shared: Arc::clone(&shared),
        doorbell,
        interrupts,
        interrupter: Interrupter(interrupt_sender),
    };
    let sender = DeliverySender {
        shared,
        doorbell: doorbell_sender,
    };
    (sender, receiver)
}

impl DeliveryReceiver {
    pub fn interrupter(&self) -> Interrupter {
        self.interrupter.clone()
    }

    /// Adds deliveries already waiting to `batch`, without blocking, until it
    /// holds `max` (at least one). Never sets `closed` while items remain.
    pub fn take_ready(&self, batch: &mut Batch, max: usize) {
        let mut pending = lock(&self.shared.pending);
        while batch.items.len() < max.max(1) {
            match pending.pop() {
                Some(delivery) => batch.items.push(delivery),
                None => {
                    // Every sender gone with nothing in hand: report `closed` (else on the next call).
                    batch.closed = batch.items.is_empty() && self.senders_gone();
                    break;
                }
            }
        }
    }

    fn senders_gone(&self) -> bool {
        self.shared.senders.load(Ordering::Acquire) == 0
    }

    /// Like [`WakeSource::next_batch`] for one item, without interrupts (Rust callers and tests).
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Delivery> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(delivery) = lock(&self.shared.pending).pop() {
                return Some(delivery);
            }
            if self.senders_gone() {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.doorbell.recv_timeout(left).is_err() {
                return lock(&self.shared.pending).pop();
            }
        }
    }
}

impl WakeSource for DeliveryReceiver {
    /// Blocks until a delivery arrives, `interrupt` is called, or `timeout`
    /// passes; then takes up to `max` deliveries that are already waiting.
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch {
        let deadline = Instant::now() + timeout;
        let mut batch = Batch::default();
        loop {
            self.take_ready(&mut batch, max);
            if !batch.items.is_empty() || batch.closed || batch.interrupted {
                return batch;
            }
            // A ring may be left from deliveries already taken: then look again.
            crossbeam_channel::select! {
                recv(self.doorbell) -> _ => {},
                recv(self.interrupts) -> _ => batch.interrupted = true,
                default(deadline.saturating_duration_since(Instant::now())) => return batch,
            }
        }
    }

    fn interrupt(&self) {
        self.interrupter.interrupt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake(q: &str) -> Delivery {
        Delivery::Wake(Wake::durable(q))
    }

    #[test]
    fn batches_keep_order_and_respect_max() {
        let (sender, receiver) = channel();
        for q in ["a", "b", "c"] {
            sender.send(wake(q));
        }
        let first = receiver.next_batch(2, Duration::from_secs(1));
        assert_eq!(first.items, vec![wake("a"), wake("b")]);
        assert_eq!(
            receiver.next_batch(2, Duration::from_secs(1)).items,
            vec![wake("c")]
        );
    }

    #[test]
    fn interrupt_releases_a_blocked_wait() {
        let (_sender, receiver) = channel();
        let interrupter = receiver.interrupter();
        let thread = std::thread::spawn(move || receiver.next_batch(8, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        interrupter.interrupt();
        assert!(thread.join().unwrap().interrupted);
    }

    #[test]
    fn closed_only_after_the_last_item_is_taken() {
        let (sender, receiver) = channel();
        sender.send(wake("a"));
        drop(sender);
        let batch = receiver.next_batch(8, Duration::from_secs(1));
        assert_eq!((batch.items.len(), batch.closed), (1, false));
        assert!(receiver.next_batch(8, Duration::from_secs(1)).closed);
    }

    fn payload(q: &str, p: &str) -> Delivery {
        Delivery::Wake(Wake::new(q, Some(p)))
    }

    fn drain(receiver: &DeliveryReceiver) -> Vec<Delivery> {
        let mut all = Vec::new();
        loop {
            let batch = receiver.next_batch(usize::MAX, Duration::ZERO);
            if batch.items.is_empty() {
                return all;
            }
            all.extend(batch.items);
        }
    }

    #[test]
    fn undelivered_durable_wakes_coalesce_per_queue_and_again_once_taken() {
        let (sender, receiver) = channel();
        for q in ["a", "b", "a", "a", "b"] {
            sender.send(wake(q));
        }
        assert_eq!(drain(&receiver), vec![wake("a"), wake("b")]);
        sender.send(wake("a"));
        assert_eq!(
            drain(&receiver),
            vec![wake("a")],
            "taken: the next one queues"
        );
    }

    /// Each side of a cut keeps its own wakes: the listener switches at it.
    #[test]
    fn coalescing_never_reaches_across_a_marker_or_a_move() {
        let (sender, receiver) = channel();
        let marker = Delivery::Marker { token: "k".into() };
        let moved = Delivery::Move {
            channel: "c".into(),
            token: "m".into(),
        };
        for item in [
            wake("a"),
            marker.clone(),
            wake("a"),
            wake("a"),
            moved.clone(),
            wake("a"),
        ] {
            sender.send(item);
        }
        assert_eq!(
            drain(&receiver),
            vec![wake("a"), marker, wake("a"), moved, wake("a")]
        );
        // The first `a` is taken while a later one (behind the marker) waits.
        let marker = Delivery::Marker { token: "j".into() };
        sender.send(wake("a"));
        sender.send(marker.clone());
        sender.send(wake("a"));
        assert_eq!(receiver.recv_timeout(Duration::ZERO), Some(wake("a")));
        sender.send(wake("a")); // coalesced into the one behind the marker
        assert_eq!(drain(&receiver), vec![marker, wake("a")]);
    }

    #[test]
    fn payloads_past_the_limit_are_dropped_and_counted_in_order_and_control_items_never() {
        let drops = Drops::default();
        let (sender, receiver) = channel_counting(drops.clone());
        let extra = 5;
        for i in 0..WORKER_PAYLOAD_LIMIT + extra {
            sender.send(payload("p", &i.to_string()));
        }
        sender.send(wake("d"));
        sender.send(Delivery::Failed {
            reason: "gone".into(),
        });
        assert_eq!(drops.count(), extra as u64);
        let all = drain(&receiver);
        assert_eq!(all.len(), WORKER_PAYLOAD_LIMIT + 2);
        let expected: Vec<Delivery> = (0..WORKER_PAYLOAD_LIMIT)
            .map(|i| payload("p", &i.to_string()))
            .collect();
        assert_eq!(
            all[..WORKER_PAYLOAD_LIMIT],
            expected[..],
            "the first ones, in order"
        );
        // Room again once taken.
        assert!(sender.send(payload("p", "again")));
        assert_eq!(drain(&receiver), vec![payload("p", "again")]);
        assert_eq!(drops.count(), extra as u64);
    }

    #[test]
    fn a_closed_channel_wakes_its_waiter_and_a_send_without_receiver_fails() {
        let (sender, receiver) = channel();
        let copy = sender.clone();
        let waiter = std::thread::spawn(move || receiver.next_batch(8, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        drop(sender);
        drop(copy);
        assert!(waiter.join().unwrap().closed);

        let (sender, receiver) = channel();
        assert!(sender.send(wake("a")));
        drop(receiver);
        assert!(!sender.send(wake("a")));
    }
}
