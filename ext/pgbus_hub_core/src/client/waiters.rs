//! Callers of `HubClient::subscribe` waiting for the hub's answer to their `sub`.
//! The hub answers a queue's subs in the order they were sent, so an answer
//! (ack or nack) goes to the oldest waiter for its queue. Each waiter hears
//! exactly one outcome, or takes itself out first (timeout, cancel).

use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, VecDeque};

/// What a waiter is told.
#[derive(Clone, Debug)]
pub(super) enum Outcome {
    Acked,
    /// The hub reported its database connection down while this sub waited.
    HubUnhealthy,
    Died,
    Stopped,
    Rejected(String),
}

struct Waiter {
    id: u64,
    outcome: Sender<Outcome>,
}

#[derive(Default)]
pub(super) struct Waiters {
    /// FIFO per queue.
    pending: HashMap<String, VecDeque<Waiter>>,
    next_id: u64,
}

impl Waiters {
    /// Adds the newest waiter for `queue`: its id, and where its one outcome
    /// arrives (the channel holds it, so answering never blocks).
    pub(super) fn add(&mut self, queue: &str) -> (u64, Receiver<Outcome>) {
        let (sender, outcome) = crossbeam_channel::bounded(1);
        let id = self.next_id;
        self.next_id += 1;
        self.pending
            .entry(queue.to_owned())
            .or_default()
            .push_back(Waiter {
                id,
                outcome: sender,
            });
        (id, outcome)
    }

    /// Takes waiter `id` out; false if it was already answered (its outcome
    /// is in its channel).
    pub(super) fn discard(&mut self, queue: &str, id: u64) -> bool {
        self.take(queue, |waiters| {
            let index = waiters.iter().position(|w| w.id == id)?;
            waiters.remove(index)
        })
        .is_some()
    }

    /// Answers the oldest waiter for `queue` (the hub's ack or nack); false
    /// if nobody waits.
    pub(super) fn answer_oldest(&mut self, queue: &str, outcome: Outcome) -> bool {
        match self.take(queue, VecDeque::pop_front) {
            Some(waiter) => {
                let _ = waiter.outcome.try_send(outcome);
                true
            }
            None => false,
        }
    }

    /// Answers every waiter (the hub went unhealthy, the client died or stopped).
    pub(super) fn answer_all(&mut self, outcome: &Outcome) {
        for (_, waiters) in self.pending.drain() {
            for waiter in waiters {
                let _ = waiter.outcome.try_send(outcome.clone());
            }
        }
    }

    /// One waiter of `queue`, chosen by `choose`; the queue's entry goes once empty.
    fn take(
        &mut self,
        queue: &str,
        choose: impl FnOnce(&mut VecDeque<Waiter>) -> Option<Waiter>,
    ) -> Option<Waiter> {
        let waiters = self.pending.get_mut(queue)?;
        let waiter = choose(waiters);
        if waiters.is_empty() {
            self.pending.remove(queue);
        }
        waiter
    }
}
