//! Backpressure, all of it: what one worker may have queued, which frames
//! may be dropped, when a worker is evicted, and the counters and log lines
//! that say so. [`Backpressure::offer`] is the one place a frame enters a
//! worker's outbox.
//!
//! The policy is pgbus's: a durable wake (no payload) past
//! `durable_queue_limit` is dropped, since the durable stream re-reads its
//! queue; an ephemeral wake or a control frame is never dropped; past
//! `hard_queue_limit` queued frames the worker is evicted (its client fails
//! over to a connection of its own), so one stuck worker never grows the
//! master's memory or slows the others.
//!
//! Catch-up wakes (one per subscribed queue after the listener reconnects)
//! are neither: they wait in a queue of their own, sent only when no live
//! frame is waiting, never dropped and never counted towards eviction. They
//! are bounded by the worker's subscriptions, and a hub with 50k queues can
//! owe them all without starving live wakes or losing the catch-up to the
//! durable limit.

use super::limits::Limits;
use crate::log::LogSink;
use crate::protocol::Frame;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Log the first dropped durable wake and then every this many: a stuck
/// worker drops thousands a second, and one line per hundred still shows the rate.
const DROP_LOG_EVERY: u64 = 100;

#[derive(Debug, PartialEq, Eq)]
pub enum Enqueued {
    Queued,
    /// A durable wake over `durable_queue_limit`: dropped (it self-heals on the next read).
    Dropped,
    /// Over `hard_queue_limit`: the worker must be evicted ([`Outbox::close`],
    /// then sever the connection; its client fails over).
    Evicted,
    /// The worker is already gone.
    Closed,
}

/// One worker's queued frames, in order, each marked droppable or not, the
/// catch-up wakes it is owed, and whether its connection is closed and its
/// fd released. Its worker holds it under a lock and acts on what the
/// methods return (wake the writer, sever the connection).
#[derive(Default)]
pub struct Outbox {
    frames: VecDeque<(Frame, bool)>,
    durable: usize,
    catch_up: VecDeque<Frame>,
    closed: bool,
    /// Set before the reader drops its half: from then on the fd may be reused.
    fd_released: bool,
    /// Live frames ever queued and ever taken: a frame's position in `frames`' order.
    queued: u64,
    taken: u64,
    /// Acks queued: their position and when their sub was read (sub->ack times).
    acks: VecDeque<(u64, Instant)>,
}

impl Outbox {
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Closes it for good and drops what is queued. True if the caller must
    /// sever the connection (its fd is still ours to shut down).
    #[must_use]
    pub fn close(&mut self) -> bool {
        self.closed = true;
        self.clear();
        !self.fd_released
    }

    /// The reader is about to drop its half: closes it, and returns true if
    /// the caller must sever the connection first (under the same lock, so
    /// nobody severs a reused fd afterwards).
    #[must_use]
    pub fn release_fd(&mut self) -> bool {
        self.closed = true;
        !std::mem::replace(&mut self.fd_released, true)
    }

    /// Owes these catch-up wakes, replacing any still owed (a newer
    /// reconnect's set supersedes an older one). False if closed.
    pub fn owe_catch_up(&mut self, frames: Vec<Frame>) -> bool {
        if self.closed {
            return false;
        }
        self.catch_up = frames.into();
        true
    }

    /// Moves up to `max` frames, oldest first, into `batch` (the writer's);
    /// catch-up wakes only once no live frame is left, and only up to
    /// `catch_up_max` of them (the writer paces them, see `worker_connection::write_loop`).
    pub fn take(&mut self, batch: &mut Vec<Frame>, max: usize, catch_up_max: usize) {
        while batch.len() < max {
            let Some((frame, droppable)) = self.frames.pop_front() else {
                break;
            };
            self.durable -= usize::from(droppable);
            self.taken += 1;
            batch.push(frame);
        }
        let catch_up_end = batch.len().saturating_add(catch_up_max).min(max);
        while batch.len() < catch_up_end {
            let Some(frame) = self.catch_up.pop_front() else {
                break;
            };
            batch.push(frame);
        }
    }

    /// The frame queued last is an ack of a sub read at `read_at`.
    pub fn ack_queued(&mut self, read_at: Instant) {
        if !self.closed {
            self.acks.push_back((self.queued - 1, read_at));
        }
    }

    /// Moves into `read_at` when the subs were read whose acks `take` has taken.
    pub fn take_acks(&mut self, read_at: &mut Vec<Instant>) {
        while self
            .acks
            .front()
            .is_some_and(|&(position, _)| position < self.taken)
        {
            read_at.extend(self.acks.pop_front().map(|(_, at)| at));
        }
    }

    /// Queues the catch-up wakes still owed as live frames, so that a frame
    /// queued next (a planned stop's `marker`, after which the worker reads
    /// the hub no more) follows them.
    pub fn settle_catch_up(&mut self) {
        let owed = std::mem::take(&mut self.catch_up);
        self.queued += owed.len() as u64;
        self.frames
            .extend(owed.into_iter().map(|frame| (frame, false)));
    }

    /// Catch-up wakes still owed.
    pub fn owes_catch_up(&self) -> bool {
        !self.catch_up.is_empty()
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.durable = 0;
        self.taken = self.queued;
        self.acks.clear();
        self.catch_up.clear();
    }

    #[cfg(test)]
    pub fn front(&self) -> Option<&Frame> {
        self.frames.front().map(|(frame, _)| frame)
    }
}

/// The queue limits (of [`Limits`]) and what applying them has cost so far
/// (shown in the hub's stats).
pub struct Backpressure {
    durable_limit: usize,
    hard_limit: usize,
    dropped: AtomicU64,
    evicted: AtomicU64,
    log: LogSink,
}

impl Backpressure {
    pub fn new(limits: &Limits, log: LogSink) -> Self {
        Self {
            durable_limit: limits.durable_queue_limit,
            hard_limit: limits.hard_queue_limit,
            dropped: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            log,
        }
    }

    /// Queues `frame` in `outbox`, or drops it, or says to evict its worker;
    /// counts and logs the outcome, naming the worker by
    /// `label` (called only to log). Never blocks. `droppable`: a durable wake.
    pub fn offer(
        &self,
        outbox: &mut Outbox,
        frame: Frame,
        droppable: bool,
        label: &dyn Fn() -> String,
    ) -> Enqueued {
        if outbox.closed {
            return Enqueued::Closed;
        }
        if droppable && outbox.durable >= self.durable_limit {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped == 1 || dropped % DROP_LOG_EVERY == 0 {
                self.log.warn(format!(
                    "dropped {dropped} durable wake(s) so far: {} has {} queued \
                     (durable_queue_limit); durable streams catch up on their next read",
                    label(),
                    self.durable_limit
                ));
            }
            return Enqueued::Dropped;
        }
        outbox.frames.push_back((frame, droppable));
        outbox.durable += usize::from(droppable);
        outbox.queued += 1;
        if outbox.frames.len() > self.hard_limit {
            self.evicted.fetch_add(1, Ordering::Relaxed);
            self.log.warn(format!(
                "evicting {}: outbound queue exceeded {} frames (worker not draining) — \
                 it falls back to its own listener",
                label(),
                self.hard_limit
            ));
            return Enqueued::Evicted;
        }
        Enqueued::Queued
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &'static str) -> Frame {
        Frame::from_static(name.as_bytes())
    }

    #[test]
    fn catch_up_waits_behind_live_frames_even_ones_queued_after_it() {
        let mut outbox = Outbox::default();
        outbox.frames.push_back((frame("live-1"), false));
        outbox.catch_up = ["up-1", "up-2", "up-3"].map(frame).into();
        let mut batch = Vec::new();
        outbox.take(&mut batch, 2, 8);
        assert_eq!(batch, [frame("live-1"), frame("up-1")]);
        outbox.frames.push_back((frame("live-2"), true));
        outbox.durable += 1;
        batch.clear();
        outbox.take(&mut batch, 8, 0);
        assert_eq!(
            batch,
            [frame("live-2")],
            "no catch-up while the writer paces it"
        );
        assert_eq!(outbox.durable, 0);
        batch.clear();
        outbox.take(&mut batch, 8, 1);
        assert_eq!(batch, [frame("up-2")]);
        assert!(outbox.owes_catch_up());
        batch.clear();
        outbox.take(&mut batch, 8, 8);
        assert_eq!(batch, [frame("up-3")]);
        assert!(!outbox.owes_catch_up());
    }
}
