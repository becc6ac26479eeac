//! Wakes (and a transport failure) handed from native code to the embedding
//! runtime. In the gem, one Ruby thread blocks in [`WakeSource::next_batch`]
//! without the GVL and pushes each batch into pgbus's dispatch queue; the
//! binding's unblock function calls [`WakeSource::interrupt`] so `Thread#kill`
//! and `stop` never wait on it. Two sources exist: this channel (filled by a
//! native thread: the per-worker listener) and the hub client's
//! [`crate::client::DrivenReader`] (the pump thread reads the socket itself).
//!
//! The channel is unbounded on purpose: an ephemeral wake is the only copy of
//! its payload and must never be dropped here. Bounding happens upstream, per
//! worker, in the master hub (durable wakes dropped, a stuck worker evicted).

use crate::protocol::Wake;
use crossbeam_channel::{Receiver, Sender};
use std::time::Duration;

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

#[derive(Clone, Debug)]
pub struct DeliverySender(Sender<Delivery>);

impl DeliverySender {
    /// False once the receiver is gone (nobody is listening any more).
    pub fn send(&self, delivery: Delivery) -> bool {
        self.0.send(delivery).is_ok()
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
    deliveries: Receiver<Delivery>,
    interrupts: Receiver<()>,
    interrupter: Interrupter,
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

pub fn channel() -> (DeliverySender, DeliveryReceiver) {
    let (sender, deliveries) = crossbeam_channel::unbounded();
    let (interrupt_sender, interrupts) = crossbeam_channel::bounded(1);
    let receiver = DeliveryReceiver {
        deliveries,
        interrupts,
        interrupter: Interrupter(interrupt_sender),
    };
    (DeliverySender(sender), receiver)
}

impl DeliveryReceiver {
    pub fn interrupter(&self) -> Interrupter {
        self.interrupter.clone()
    }

    /// Adds deliveries already waiting to `batch`, without blocking, until it
    /// holds `max` (at least one). Never sets `closed` while items remain.
    pub fn take_ready(&self, batch: &mut Batch, max: usize) {
        while batch.items.len() < max.max(1) {
            match self.deliveries.try_recv() {
                Ok(delivery) => batch.items.push(delivery),
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                // Disconnected with items in hand: report `closed` on the next call.
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    batch.closed = batch.items.is_empty();
                    break;
                }
            }
        }
    }

    /// Like [`WakeSource::next_batch`] for one item, without interrupts (Rust callers and tests).
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Delivery> {
        self.deliveries.recv_timeout(timeout).ok()
    }
}

impl WakeSource for DeliveryReceiver {
    /// Blocks until a delivery arrives, `interrupt` is called, or `timeout`
    /// passes; then takes up to `max` deliveries that are already waiting.
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch {
        let mut batch = Batch::default();
        crossbeam_channel::select! {
            recv(self.deliveries) -> first => match first {
                Ok(delivery) => batch.items.push(delivery),
                Err(_) => batch.closed = true,
            },
            recv(self.interrupts) -> _ => batch.interrupted = true,
            default(timeout) => {}
        }
        if !batch.closed {
            self.take_ready(&mut batch, max);
        }
        batch
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
}
