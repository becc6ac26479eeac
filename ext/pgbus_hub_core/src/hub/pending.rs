//! Subs waiting for the engine's LISTEN, and the outage rule: during a
//! database outage (workers told `healthy: false`) a sub whose name is valid
//! is acked at once instead: it stays registered and is LISTENed on
//! reconnect, and while the hub has no connection no NOTIFY reaches anyone,
//! subscribed earlier or not. pgbus's own Ruby hub acks such a sub after its
//! listener's budget too; its Ruby client, left without an ack, would fail
//! over to a connection it cannot open during the outage and stay without
//! wakes until the worker recycles. Our client reads an ack that follows
//! `healthy: false` as "LISTENed after the reconnect".
//!
//! Pure state: each call returns the acks to send, the router sends them.

use super::worker_connection::WorkerId;
use std::collections::HashMap;
use std::time::Instant;

/// One sub, as the router answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sub {
    pub worker: WorkerId,
    pub queue: String,
    /// When its frame was read (the sub->ack histogram's start).
    pub read_at: Instant,
}

struct Pending {
    sub: Sub,
    /// The name is valid: during an outage it is acked at once.
    deferrable: bool,
    /// Acked already (during an outage): the engine's answer needs no reply.
    acked: bool,
}

#[derive(Default)]
pub struct PendingSubs {
    subs: HashMap<u64, Pending>,
    next_id: u64,
    /// True while the workers were last told `healthy: false`.
    outage: bool,
}

impl PendingSubs {
    /// A sub now waiting for its LISTEN: its id, and the ack to send at once
    /// if it came during an outage with a valid name.
    pub fn add(&mut self, sub: Sub, deferrable: bool) -> (u64, Option<Sub>) {
        self.next_id += 1;
        let acked = self.outage && deferrable;
        let ack = acked.then(|| sub.clone());
        let pending = Pending {
            sub,
            deferrable,
            acked,
        };
        self.subs.insert(self.next_id, pending);
        (self.next_id, ack)
    }

    /// The health just told to the workers. When an outage begins: the acks
    /// for every valid sub still waiting (its LISTEN needs a reconnect first).
    pub fn health_announced(&mut self, healthy: bool) -> Vec<Sub> {
        let began = !healthy && !self.outage;
        self.outage = !healthy;
        if !began {
            return Vec::new();
        }
        self.subs
            .values_mut()
            .filter(|pending| pending.deferrable && !pending.acked)
            .map(|pending| {
                pending.acked = true;
                pending.sub.clone()
            })
            .collect()
    }

    /// The queue sub `id` waits for, while it does.
    pub fn queue_of(&self, id: u64) -> Option<&str> {
        self.subs.get(&id).map(|pending| pending.sub.queue.as_str())
    }

    /// The engine answered sub `id`: the sub, if it was waiting, and whether
    /// the answer still needs a reply (false once acked during an outage).
    pub fn answered(&mut self, id: u64) -> Option<(Sub, bool)> {
        self.subs
            .remove(&id)
            .map(|pending| (pending.sub, !pending.acked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(worker: WorkerId, queue: &str) -> Sub {
        static READ_AT: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        Sub {
            worker,
            queue: queue.into(),
            read_at: *READ_AT.get_or_init(Instant::now),
        }
    }

    #[test]
    fn a_healthy_hub_replies_when_the_engine_answers() {
        let mut pending = PendingSubs::default();
        assert!(pending.health_announced(true).is_empty());
        let (id, ack) = pending.add(sub(1, "a"), true);
        assert_eq!(ack, None);
        assert_eq!(pending.queue_of(id), Some("a"));
        assert_eq!(pending.answered(id), Some((sub(1, "a"), true)));
        assert_eq!(pending.answered(id), None);
    }

    #[test]
    fn an_outage_acks_every_valid_waiting_sub_once_and_their_answers_need_no_reply() {
        let mut pending = PendingSubs::default();
        let (valid, _) = pending.add(sub(1, "a"), true);
        let (invalid, _) = pending.add(sub(2, "bad name"), false);
        assert_eq!(pending.health_announced(false), vec![sub(1, "a")]);
        // Told again while it lasts: nothing acked twice.
        assert!(pending.health_announced(false).is_empty());
        assert_eq!(pending.answered(valid), Some((sub(1, "a"), false)));
        assert_eq!(pending.answered(invalid), Some((sub(2, "bad name"), true)));
    }

    #[test]
    fn during_an_outage_a_valid_sub_is_acked_at_once_and_after_it_none_is() {
        let mut pending = PendingSubs::default();
        pending.health_announced(false);
        let (during, ack) = pending.add(sub(1, "a"), true);
        assert_eq!(ack, Some(sub(1, "a")));
        assert_eq!(pending.add(sub(1, "bad name"), false).1, None);
        assert!(pending.health_announced(true).is_empty());
        assert_eq!(pending.add(sub(1, "b"), true).1, None);
        assert_eq!(pending.answered(during), Some((sub(1, "a"), false)));
    }
}
