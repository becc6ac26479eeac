//! Counters that only go up while the process lives: a hub started at a socket
//! path where an earlier hub of this process stopped carries on from that hub's
//! totals. Its `GET /metrics` is then the same series, and Prometheus' `rate()`
//! never reads a hub replaced in a living process (a Puma master re-arming its
//! hub, an embedder's stop and start) as a counter reset. A new process starts
//! from 0, as Prometheus expects of one.
//!
//! Keyed by socket path: it is what names a hub on a host (`pgbus-hub status`,
//! the workers' environment), and specs that run several hubs side by side in one
//! process each have their own.

use super::metrics::AckTimes;
use super::HubStats;
use crate::sync::lock;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What a stopped hub leaves for its successor: every counter of [`HubStats`]
/// (the `_total` metrics) and the sub->ack histogram.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Totals {
    reconnects: u64,
    handovers: u64,
    abandoned_connections: u64,
    standby_promotions: u64,
    wakes_received: u64,
    frames_sent: u64,
    dropped_durable_wakes: u64,
    evicted_workers: u64,
    rejected_peers: u64,
    refused_subs: u64,
    moved_workers: u64,
    unmoved_workers: u64,
    listener_restarts: u64,
    subscribe_ack: AckTimes,
}

/// Socket path -> the totals of the last hub stopped there (a few entries at most).
static CARRIED: Mutex<BTreeMap<PathBuf, Totals>> = Mutex::new(BTreeMap::new());

impl Totals {
    /// What hubs stopped at `socket_path` in this process counted (0 if none did).
    pub(crate) fn carried(socket_path: &Path) -> Self {
        lock(&CARRIED).get(socket_path).cloned().unwrap_or_default()
    }

    /// Keeps `stats`' counters (the carried ones included) for the next hub at `socket_path`.
    pub(crate) fn keep(socket_path: &Path, stats: &HubStats) {
        let totals = Self {
            reconnects: stats.reconnects,
            handovers: stats.handovers,
            abandoned_connections: stats.abandoned_connections,
            standby_promotions: stats.standby_promotions,
            wakes_received: stats.wakes_received,
            frames_sent: stats.frames_sent,
            dropped_durable_wakes: stats.dropped_durable_wakes,
            evicted_workers: stats.evicted_workers,
            rejected_peers: stats.rejected_peers,
            refused_subs: stats.refused_subs,
            moved_workers: stats.moved_workers,
            unmoved_workers: stats.unmoved_workers,
            listener_restarts: stats.listener_restarts,
            subscribe_ack: stats.subscribe_ack.clone(),
        };
        lock(&CARRIED).insert(socket_path.to_path_buf(), totals);
    }

    /// `stats` (this hub's own counts) plus what earlier hubs counted.
    pub(crate) fn add_to(&self, stats: &mut HubStats) {
        stats.reconnects += self.reconnects;
        stats.handovers += self.handovers;
        stats.abandoned_connections += self.abandoned_connections;
        stats.standby_promotions += self.standby_promotions;
        stats.wakes_received += self.wakes_received;
        stats.frames_sent += self.frames_sent;
        stats.dropped_durable_wakes += self.dropped_durable_wakes;
        stats.evicted_workers += self.evicted_workers;
        stats.rejected_peers += self.rejected_peers;
        stats.refused_subs += self.refused_subs;
        stats.moved_workers += self.moved_workers;
        stats.unmoved_workers += self.unmoved_workers;
        stats.listener_restarts += self.listener_restarts;
        let ack = &mut stats.subscribe_ack;
        ack.count += self.subscribe_ack.count;
        ack.sum += self.subscribe_ack.sum;
        // The bounds are the same constants in every hub; a bucket missing on
        // either side (none carried yet) adds nothing.
        for (bucket, carried) in ack.buckets.iter_mut().zip(&self.subscribe_ack.buckets) {
            bucket.1 += carried.1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_at_the_same_path_carries_on_and_another_path_starts_from_zero() {
        let path = Path::new("/nonexistent/totals-unit-a.sock");
        assert_eq!(Totals::carried(path), Totals::default());
        let first = HubStats {
            reconnects: 2,
            frames_sent: 10,
            subscribe_ack: AckTimes {
                buckets: vec![(0.001, 1), (f64::INFINITY, 2)],
                sum: 0.5,
                count: 2,
            },
            ..HubStats::default()
        };
        Totals::keep(path, &first);
        let mut second = HubStats {
            frames_sent: 3,
            subscribe_ack: AckTimes {
                buckets: vec![(0.001, 0), (f64::INFINITY, 1)],
                sum: 0.25,
                count: 1,
            },
            ..HubStats::default()
        };
        Totals::carried(path).add_to(&mut second);
        assert_eq!(second.reconnects, 2);
        assert_eq!(second.frames_sent, 13);
        assert_eq!(second.subscribe_ack.count, 3);
        assert_eq!(
            second.subscribe_ack.buckets,
            [(0.001, 1), (f64::INFINITY, 3)]
        );
        assert!((second.subscribe_ack.sum - 0.75).abs() < 1e-9);
        assert_eq!(
            Totals::carried(Path::new("/nonexistent/totals-unit-b.sock")),
            Totals::default()
        );
    }
}
