//! The routing table: which workers want which queues, refcounted so the
//! last worker to leave a queue is the one that UNLISTENs it.

use crate::protocol::key_channel;
use std::collections::{HashMap, HashSet};

pub type WorkerId = u64;

#[derive(Debug, Default)]
pub struct Registry {
    queues: HashMap<String, HashSet<WorkerId>>,
    workers: HashMap<WorkerId, HashSet<String>>,
    /// Routed raw channels (ActionCable's), kept as queues come and go.
    raw_channels: usize,
}

impl Registry {
    /// Routes `queue` to `worker` (idempotent: duplicate subs count once).
    /// True when this is the queue's first worker.
    pub fn add(&mut self, worker: WorkerId, queue: &str) -> bool {
        self.workers
            .entry(worker)
            .or_default()
            .insert(queue.to_owned());
        let routed = self.queues.entry(queue.to_owned()).or_default();
        let first = routed.insert(worker) && routed.len() == 1;
        if first && key_channel(queue).is_some() {
            self.raw_channels += 1;
        }
        first
    }

    /// Drops one worker's ref; true when the queue has no worker left (UNLISTEN it).
    pub fn remove(&mut self, worker: WorkerId, queue: &str) -> bool {
        if let Some(queues) = self.workers.get_mut(&worker) {
            queues.remove(queue);
        }
        let Some(routed) = self.queues.get_mut(queue) else {
            return false;
        };
        if !routed.remove(&worker) || !routed.is_empty() {
            return false;
        }
        self.queues.remove(queue);
        if key_channel(queue).is_some() {
            self.raw_channels -= 1;
        }
        true
    }

    pub fn raw_channel_count(&self) -> usize {
        self.raw_channels
    }

    /// The routed raw channels' names, sorted, at most `limit` (an operator's view).
    pub fn raw_channel_names(&self, limit: usize) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .queues
            .keys()
            .filter_map(|key| key_channel(key))
            .collect();
        names.sort_unstable();
        names.truncate(limit);
        names
    }

    /// Forgets a worker; returns the queues it was the last ref of.
    pub fn remove_worker(&mut self, worker: WorkerId) -> Vec<String> {
        let queues = self.workers.remove(&worker).unwrap_or_default();
        queues
            .into_iter()
            .filter(|queue| self.remove(worker, queue))
            .collect()
    }

    pub fn workers_for(&self, queue: &str) -> impl Iterator<Item = WorkerId> + '_ {
        self.queues.get(queue).into_iter().flatten().copied()
    }

    pub fn queues(&self) -> impl Iterator<Item = &str> {
        self.queues.keys().map(String::as_str)
    }

    /// True while `worker` has at least one subscription (acked or awaiting LISTEN).
    pub fn is_subscribed(&self, worker: WorkerId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|queues| !queues.is_empty())
    }

    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// How many queues `worker` is routed (its share of the LISTEN set).
    pub fn queue_count_of(&self, worker: WorkerId) -> usize {
        self.workers.get(&worker).map_or(0, HashSet::len)
    }

    /// True when `queue` is LISTENed for someone (a sub for it adds no channel).
    pub fn has_queue(&self, queue: &str) -> bool {
        self.queues.contains_key(queue)
    }

    pub fn routes(&self, worker: WorkerId, queue: &str) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|queues| queues.contains(queue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::channel_key;

    /// Found by the `hub_frames` fuzz target (kept input
    /// tests/fixtures/fuzz/hub_frames/registry-add-duplicate-sub-reports-first.bin):
    /// a duplicate sub from a queue's only worker is not a first worker.
    #[test]
    fn a_duplicate_sub_from_the_only_worker_is_not_a_first_worker() {
        let mut registry = Registry::default();
        assert!(registry.add(1, "chat"));
        assert!(!registry.add(1, "chat"));
        assert!(
            registry.remove(1, "chat"),
            "one ref: the first remove releases it"
        );
        assert_eq!(registry.queue_count(), 0);
    }

    #[test]
    fn raw_channels_are_counted_and_listed_as_they_come_and_go() {
        let mut registry = Registry::default();
        let (a, b) = (channel_key("room_b"), channel_key("room_a"));
        registry.add(1, &a);
        registry.add(2, &a);
        registry.add(1, &b);
        registry.add(1, "queue");
        assert_eq!(registry.raw_channel_count(), 2);
        assert_eq!(registry.raw_channel_names(1), vec!["room_a"]);
        registry.remove_worker(1);
        assert_eq!(registry.raw_channel_count(), 1);
        assert_eq!(registry.raw_channel_names(10), vec!["room_b"]);
    }

    #[test]
    fn last_ref_out_unlistens() {
        let mut registry = Registry::default();
        assert!(registry.add(1, "q"));
        assert!(!registry.add(2, "q"));
        assert!(!registry.add(2, "q"), "duplicate sub counts once");
        assert!(!registry.remove(1, "q"));
        assert!(registry.remove(2, "q"));
        assert_eq!(registry.queue_count(), 0);
    }

    #[test]
    fn removing_a_worker_releases_only_its_last_refs() {
        let mut registry = Registry::default();
        registry.add(1, "a");
        registry.add(1, "b");
        registry.add(2, "b");
        let mut released = registry.remove_worker(1);
        released.sort();
        assert_eq!(released, vec!["a".to_owned()]);
        assert_eq!(registry.workers_for("b").collect::<Vec<_>>(), vec![2]);
        assert!(registry.remove_worker(1).is_empty(), "idempotent");
    }
}
