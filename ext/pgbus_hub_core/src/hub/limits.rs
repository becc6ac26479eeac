//! Every budget a worker's frames pass through, in one place: the defaults of
//! the configurable ones ([`super::HubConfig`]), the fixed ones as constants
//! the code uses from here, and [`Limits`], the set one hub applies, which
//! its stats report as `limits` (`pgbus-hub status`). docs/configuration.md's
//! "Limits" table lists the same fields with the same defaults (a test below
//! checks it), and what happens at each.
//!
//! A wake to a worker: the router's fan-out -> the worker's outbox
//! (`durable_queue_limit`, `hard_queue_limit`; catch-up wakes paced by
//! `catch_up_unread_limit`) -> its writer's batch (`frames_per_batch`) -> the
//! kernel's socket buffer (the kernel's size, not ours) -> the worker's
//! decoder (`max_frame_bytes`) -> the worker's channel to its pump
//! (`worker_payload_limit`, applied by each worker, on its own connection's
//! wakes too: `crate::delivery`). A frame from a worker: the hub's decoder
//! (`max_frame_bytes`, `frame_completion_timeout`) -> the router's command
//! queue (`command_queue`) -> a sub (`max_pending_subs`, the channel caps).
//!
//! Not budgets of a worker's frames, so not here: the metrics endpoint's
//! connections and header timeout (`metrics`), the events queue (`crate::events`),
//! the log channel (`crate::log`), and the LISTEN connection's own hold during
//! a handover (`crate::listener`, upstream of every worker).

use super::HubConfig;
use crate::protocol::MAX_FRAME_BYTES;
use serde_json::{Map, Value};
use std::time::Duration;

/// pgbus's defaults (MasterHub::DEFAULT_DURABLE_QUEUE_LIMIT / DEFAULT_HARD_QUEUE_LIMIT).
pub const DEFAULT_DURABLE_QUEUE_LIMIT: usize = 256;
pub const DEFAULT_HARD_QUEUE_LIMIT: usize = 1024;

/// Payload wakes a worker holds undelivered while its pump is away
/// (`crate::delivery`); past it the next are dropped. A pump starved of the
/// GVL by busy request threads takes a burst in late, not never: 2,000
/// arrive within a second in `spec/hub_client_spec.rb`'s storm, so this is
/// five such bursts. At PostgreSQL's 8 kB payload cap it holds at most
/// ~80 MB (a large payload fetched from its table counts as one).
pub const WORKER_PAYLOAD_LIMIT: usize = 10_000;

/// Between `status` broadcasts (pgbus's hub's `status_interval` default: it
/// checks health this often): a change reaches workers within a second.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// A shorter status interval is raised to this: zero would spin, and 10 ms
/// is far below any useful health cadence.
pub const MIN_STATUS_INTERVAL: Duration = Duration::from_millis(10);

/// Channels one connection may have the hub LISTEN on. PostgreSQL matches
/// every NOTIFY against the listening backend's channel list by a linear scan
/// (async.c), so the set's size is paid on every notification, for the whole
/// host: a peer of our uid must not grow it without bound. pgbus subscribes one
/// queue per stream a worker serves; 10,000 is far above what a worker serves.
pub const DEFAULT_MAX_CHANNELS_PER_CONNECTION: usize = 10_000;

/// Channels the hub LISTENs on in all (the host-wide LISTEN set): several
/// workers' full share, still a list PostgreSQL scans in well under a millisecond.
pub const DEFAULT_MAX_CHANNELS: usize = 50_000;

/// Frames one write takes from the outbox: a socket buffer's worth of typical
/// wakes per writev(2), so a backlog drains in few syscalls. They are out of
/// the outbox, so not counted towards `hard_queue_limit`.
pub const FRAMES_PER_BATCH: usize = 256;

/// Catch-up wakes are written only while the worker has less than this unread
/// (SIOCOUTQ, kernel overhead included): enough that it never waits for them,
/// little enough that a live wake queued behind them waits at most a few
/// hundred frames (a hub owing 50k catch-up wakes once let a live wake wait
/// 40 ms behind a full socket buffer of them).
pub const CATCH_UP_UNREAD_LIMIT: usize = 16 * 1024;

/// How soon a writer with catch-up owed, but a worker still reading the last
/// of them, looks again (a live frame wakes it at once): 1 ms, doubling to
/// 64 ms while the worker reads nothing, so a stalled one costs little.
pub const CATCH_UP_POLL_FIRST: Duration = Duration::from_millis(1);
pub const CATCH_UP_POLL_MAX: Duration = Duration::from_millis(64);

/// A peer that starts a frame must finish it within this time; half a frame
/// then silence is an attack or a dead peer, not a slow worker.
pub const FRAME_COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

/// Unacked subs one worker may have in flight. pgbus waits for each ack per
/// request thread (a few dozen at most); far more is a flood and is cut off.
pub const MAX_PENDING_SUBS: usize = 1024;

/// Commands queued from workers' readers and the accept loop. Bounded, so a
/// peer flooding frames waits on its own reader instead of growing the hub's
/// memory; a socket buffer's worth of small frames fits.
pub const COMMAND_QUEUE: usize = 4096;

/// The budgets one hub applies: the configured ones as the hub uses them
/// (`status_interval` raised to [`MIN_STATUS_INTERVAL`]), the fixed ones as
/// above. The hub's code reads the configured ones from here, so what its
/// stats report is what it applies.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Durable wakes queued for one worker; past it the next are dropped.
    pub durable_queue_limit: usize,
    /// Frames queued for one worker; past it the worker is evicted.
    pub hard_queue_limit: usize,
    pub frames_per_batch: usize,
    /// None where the OS does not say how much a worker has unread: catch-up
    /// wakes are then written as fast as the socket takes them.
    pub catch_up_unread_limit: Option<usize>,
    pub catch_up_poll_first: Duration,
    pub catch_up_poll_max: Duration,
    /// Applied by each worker, not by the hub: reported so one place says it.
    pub worker_payload_limit: usize,
    pub status_interval: Duration,
    /// The wire format's, both ways (defined with it: `protocol::MAX_FRAME_BYTES`).
    pub max_frame_bytes: usize,
    pub frame_completion_timeout: Duration,
    pub max_pending_subs: usize,
    pub command_queue: usize,
    pub max_channels_per_connection: usize,
    pub max_channels: usize,
}

impl Limits {
    pub fn new(config: &HubConfig) -> Self {
        Self {
            durable_queue_limit: config.durable_queue_limit,
            hard_queue_limit: config.hard_queue_limit,
            status_interval: config.status_interval.max(MIN_STATUS_INTERVAL),
            max_channels_per_connection: config.max_channels_per_connection,
            max_channels: config.max_channels,
            ..Self::default()
        }
    }

    /// The stats' `limits` object: durations in seconds, sizes in bytes, the rest counts.
    pub fn to_json(&self) -> Value {
        let seconds = |d: Duration| Value::from(d.as_secs_f64());
        let fields = [
            ("durable_queue_limit", self.durable_queue_limit.into()),
            ("hard_queue_limit", self.hard_queue_limit.into()),
            ("frames_per_batch", self.frames_per_batch.into()),
            ("catch_up_unread_limit", self.catch_up_unread_limit.into()),
            ("catch_up_poll_first", seconds(self.catch_up_poll_first)),
            ("catch_up_poll_max", seconds(self.catch_up_poll_max)),
            ("worker_payload_limit", self.worker_payload_limit.into()),
            ("status_interval", seconds(self.status_interval)),
            ("max_frame_bytes", self.max_frame_bytes.into()),
            (
                "frame_completion_timeout",
                seconds(self.frame_completion_timeout),
            ),
            ("max_pending_subs", self.max_pending_subs.into()),
            ("command_queue", self.command_queue.into()),
            (
                "max_channels_per_connection",
                self.max_channels_per_connection.into(),
            ),
            ("max_channels", self.max_channels.into()),
        ];
        let object: Map<String, Value> = fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        object.into()
    }
}

/// A hub with every option at its default.
impl Default for Limits {
    fn default() -> Self {
        Self {
            durable_queue_limit: DEFAULT_DURABLE_QUEUE_LIMIT,
            hard_queue_limit: DEFAULT_HARD_QUEUE_LIMIT,
            frames_per_batch: FRAMES_PER_BATCH,
            catch_up_unread_limit: crate::os::UNREAD_BYTES_TRUSTED.then_some(CATCH_UP_UNREAD_LIMIT),
            catch_up_poll_first: CATCH_UP_POLL_FIRST,
            catch_up_poll_max: CATCH_UP_POLL_MAX,
            worker_payload_limit: WORKER_PAYLOAD_LIMIT,
            status_interval: DEFAULT_STATUS_INTERVAL,
            max_frame_bytes: MAX_FRAME_BYTES,
            frame_completion_timeout: FRAME_COMPLETION_TIMEOUT,
            max_pending_subs: MAX_PENDING_SUBS,
            command_queue: COMMAND_QUEUE,
            max_channels_per_connection: DEFAULT_MAX_CHANNELS_PER_CONNECTION,
            max_channels: DEFAULT_MAX_CHANNELS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conninfo::ConnectionOptions;
    use crate::listener::ListenerConfig;
    use crate::log::LogSink;

    /// A hub configured with every option away from its default.
    fn configured() -> HubConfig {
        let connection =
            ConnectionOptions::parse("host=/nonexistent dbname=none user=none").unwrap();
        HubConfig {
            listener: ListenerConfig::new(connection, LogSink::silent()),
            socket_path: "/nonexistent/hub.sock".into(),
            status_interval: Duration::from_secs(7),
            durable_queue_limit: 3,
            hard_queue_limit: 8,
            max_channels_per_connection: 5,
            max_channels: 6,
            metrics: None,
        }
    }

    #[test]
    fn a_hub_applies_its_configured_limits_and_raises_a_tiny_status_interval() {
        let limits = Limits::new(&configured());
        assert_eq!(
            limits,
            Limits {
                durable_queue_limit: 3,
                hard_queue_limit: 8,
                status_interval: Duration::from_secs(7),
                max_channels_per_connection: 5,
                max_channels: 6,
                ..Limits::default()
            }
        );
        let tiny = HubConfig {
            status_interval: Duration::ZERO,
            ..configured()
        };
        assert_eq!(Limits::new(&tiny).status_interval, MIN_STATUS_INTERVAL);
    }

    /// One row of docs/configuration.md's "Limits" table: field, default, option or not.
    fn documented() -> Vec<(String, String, bool)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
        let text = std::fs::read_to_string(path).unwrap();
        let section = text
            .split("\n## Limits\n")
            .nth(1)
            .expect("a ## Limits section");
        section
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .skip(2) // the header and its rule
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.split('`').next()?;
                let option = cells.get(3)?.starts_with("yes");
                Some((name.to_owned(), cells.get(2)?.to_string(), option))
            })
            .collect()
    }

    /// The first number of a cell ("1,024", "0.064 s", "4,194,304 (4 MiB)").
    fn number(cell: &str) -> Option<f64> {
        let start = cell.find(|c: char| c.is_ascii_digit())?;
        let digits: String = cell[start..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
            .filter(|c| *c != ',')
            .collect();
        digits.trim_end_matches('.').parse().ok()
    }

    /// The docs' table names exactly the stats' `limits` fields, in their
    /// order, with their defaults, and says "yes" in its option column for
    /// exactly those a configuration changes.
    #[test]
    fn the_configuration_docs_table_names_every_limit_with_its_default() {
        let fields = |limits: Limits| match limits.to_json() {
            Value::Object(fields) => fields,
            other => unreachable!("{other}"),
        };
        let unconfigured = fields(Limits::default());
        let configured = fields(Limits::new(&configured()));
        let defaults = fields(Limits {
            // Where the OS says nothing the stats report null; the table gives the Linux value.
            catch_up_unread_limit: Some(CATCH_UP_UNREAD_LIMIT),
            ..Limits::default()
        });
        let rows = documented();
        let names: Vec<&str> = rows.iter().map(|(name, _, _)| name.as_str()).collect();
        let fields: Vec<&str> = defaults.keys().map(String::as_str).collect();
        assert_eq!(names, fields);
        for (name, cell, option) in &rows {
            let default = defaults[name].as_f64().unwrap();
            let shown = number(cell).unwrap_or(f64::NAN);
            assert!(
                (shown - default).abs() < 1e-9,
                "{name}: the docs say {cell:?}, the default is {default}"
            );
            assert_eq!(
                *option,
                configured[name] != unconfigured[name],
                "{name}: option column"
            );
        }
    }
}
