//! The worker's FailoverListener against a real master hub and PostgreSQL:
//! served by the hub, then (the hub stopped) by its own connection with
//! every subscription replayed; local from the start without a hub; one
//! outcome for a refused name; nothing built after stop.

mod support_hub;
mod support_os;
mod support_pg;
mod support_wait;

use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::delivery::{self, Delivery, WakeSource};
use pgbus_hub_core::failover::{FailoverConfig, FailoverListener, FailoverWakes, Listened};
use pgbus_hub_core::hub::{self, HubConfig, MasterHub};
use pgbus_hub_core::listener::{ListenerConfig, StandaloneListener};
use pgbus_hub_core::log::{LogSink, Record};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support_pg::database_url;

static FIXTURES: AtomicUsize = AtomicUsize::new(0);

/// This test's names: its own application_name (the census counts only its
/// connections), queue names, socket directory.
struct Fixture {
    url: String,
    tag: String,
    dir: PathBuf,
    sql: postgres::Client,
}

impl Fixture {
    fn new() -> Option<Self> {
        let url = database_url()?;
        let n = FIXTURES.fetch_add(1, Ordering::Relaxed);
        let tag = format!("pgbus-fo-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir).unwrap();
        let sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        Some(Self { url, tag, dir, sql })
    }

    fn queue(&self, name: &str) -> String {
        format!("{}_{name}", self.tag.replace('-', "_"))
    }

    fn listener(&self, log: LogSink) -> ListenerConfig {
        support_pg::listener_config(&self.url, &self.tag, log)
    }

    fn hub_config(&self) -> HubConfig {
        HubConfig {
            listener: self.listener(LogSink::silent()),
            socket_path: self.dir.join("hub.sock"),
            status_interval: Duration::from_millis(200),
            durable_queue_limit: 256,
            hard_queue_limit: 1024,
            max_channels_per_connection: hub::DEFAULT_MAX_CHANNELS_PER_CONNECTION,
            max_channels: hub::DEFAULT_MAX_CHANNELS,
            metrics: None,
        }
    }

    fn hub(&self) -> MasterHub {
        MasterHub::start(self.hub_config()).unwrap()
    }

    fn failover(&self, hub: Option<&MasterHub>, log: LogSink) -> (FailoverListener, Pump) {
        let config = FailoverConfig {
            socket_path: hub.map(|hub| hub.socket_path().to_owned()),
            listener: self.listener(log),
        };
        let (listener, wakes) =
            FailoverListener::start_or_cancel(config, &crossbeam_channel::never()).unwrap();
        (listener, Pump::start(wakes))
    }

    fn notify(&mut self, queue: &str, payload: &str) {
        support_pg::notify(&mut self.sql, queue, payload);
    }

    fn census(&mut self) -> i64 {
        support_pg::census(&mut self.sql, &self.tag)
    }

    fn wait_for_census(&mut self, expected: i64) {
        support_wait::wait_until(&format!("census {expected}"), || self.census() == expected);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The embedder's pump thread, played by a test thread.
struct Pump {
    wakes: crossbeam_channel::Receiver<Delivery>,
    stop: Arc<AtomicBool>,
    source: Arc<FailoverWakes>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    fn start(source: FailoverWakes) -> Self {
        let source = Arc::new(source);
        let stop = Arc::new(AtomicBool::new(false));
        let (sender, wakes) = crossbeam_channel::unbounded();
        let (pumped, stopping) = (Arc::clone(&source), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let batch = pumped.next_batch(64, Duration::from_millis(200));
                batch
                    .items
                    .into_iter()
                    .for_each(|item| sender.send(item).unwrap());
            }
        });
        Self {
            wakes,
            stop,
            source,
            thread: Some(thread),
        }
    }

    /// The next delivery is a durable wake: its queue.
    fn expect_durable_wake(&self) -> String {
        match self.wakes.recv_timeout(Duration::from_secs(5)) {
            Ok(Delivery::Wake(wake)) if wake.payload.is_none() => wake.queue.to_string(),
            other => panic!("expected a durable wake, got {other:?}"),
        }
    }

    fn expect_wake(&self, queue: &str, payload: &str) {
        match self.wakes.recv_timeout(Duration::from_secs(5)) {
            Ok(Delivery::Wake(wake)) => {
                assert_eq!(
                    (&*wake.queue, wake.payload.as_deref()),
                    (queue, Some(payload))
                )
            }
            other => panic!("expected a wake of {queue}, got {other:?}"),
        }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.source.interrupt();
        self.thread.take().unwrap().join().unwrap();
    }
}

fn logged(records: &crossbeam_channel::Receiver<Record>, needle: &str) -> usize {
    records
        .try_iter()
        .filter(|r| r.message.contains(needle))
        .count()
}

#[test]
fn the_hub_serves_until_it_dies_then_every_subscription_is_replayed_locally() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = fx.hub();
    let (a, b, gone) = (fx.queue("a"), fx.queue("b"), fx.queue("gone"));
    let (log, records) = LogSink::channel();
    let (listener, pump) = fx.failover(Some(&hub), log);
    for queue in [&a, &b, &gone] {
        assert_eq!(listener.ensure_listening(queue), Listened::Done);
    }
    listener.remove_listening(&gone);
    fx.notify(&a, "via-hub");
    pump.expect_wake(&a, "via-hub");
    assert!(!listener.failed_over());
    fx.wait_for_census(1); // the hub's connection only

    // Dropped, not stopped: no hand-over (a stop moves the worker at a
    // marker, tests/hub_pg_moves.rs), its connections close as a crash's would.
    drop(hub);
    // The pump sees the hub go and hands over; the replay is not waited for,
    // so a caller's confirmed LISTEN marks the moment both replayed ones ran.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listener.failed_over() {
        assert!(Instant::now() < deadline, "never failed over");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(listener.ensure_listening(&a), Listened::Done);
    fx.wait_for_census(1); // the local connection now
                           // With nothing NOTIFYed: a durable wake for each replayed queue (in no
                           // particular order), so what the hub missed since it failed is re-read.
    let mut caught_up = vec![pump.expect_durable_wake(), pump.expect_durable_wake()];
    caught_up.sort();
    let mut replayed = vec![a.clone(), b.clone()];
    replayed.sort();
    assert_eq!(caught_up, replayed);
    fx.notify(&b, "via-local");
    fx.notify(&gone, "unsubscribed");
    fx.notify(&a, "again");
    pump.expect_wake(&b, "via-local");
    pump.expect_wake(&a, "again");
    assert!(pump.wakes.recv_timeout(Duration::from_millis(300)).is_err());
    assert_eq!(
        logged(&records, "2 subscription(s) re-LISTENed, 2 queue(s) woken"),
        1
    );

    listener.stop();
    fx.wait_for_census(0);
}

#[test]
fn a_restarted_hub_takes_the_worker_back_once_it_acks_every_subscription() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = fx.hub();
    let (a, b) = (fx.queue("a"), fx.queue("b"));
    let (log, records) = LogSink::channel();
    let (listener, pump) = fx.failover(Some(&hub), log);
    for queue in [&a, &b] {
        assert_eq!(listener.ensure_listening(queue), Listened::Done);
    }
    drop(hub); // as a crash: no hand-over
    support_wait::wait_until("the fail-over", || listener.failed_over());
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    let mut caught_up = vec![pump.expect_durable_wake(), pump.expect_durable_wake()];
    caught_up.sort();
    assert_eq!(caught_up, both);
    fx.wait_for_census(1); // the worker's own connection

    // The hub comes back at the same socket (a sidecar its supervisor restarted).
    let back = Instant::now();
    let mut restarted = fx.hub();
    support_wait::wait_until("the fail-back", || !listener.failed_over());
    assert!(
        back.elapsed() < Duration::from_secs(5),
        "{:?}",
        back.elapsed()
    );
    assert!(listener.local().is_none());
    fx.wait_for_census(1); // the hub's connection; the worker's own closed
                           // Switched at a marker: nothing to re-read, so no catch-up wake.
    fx.notify(&a, "through the restarted hub");
    pump.expect_wake(&a, "through the restarted hub");
    assert_eq!(restarted.stats().workers, 1);
    assert_eq!(logged(&records, "back on the master hub at its marker"), 1);

    // And it moves again when that hub stops (at its marker: nothing to re-read).
    restarted.stop();
    support_wait::wait_until("the second fail-over", || listener.failed_over());
    fx.notify(&b, "local again");
    loop {
        match pump.wakes.recv_timeout(Duration::from_secs(5)) {
            Ok(Delivery::Wake(wake)) if wake.payload.is_none() => continue, // its catch-up
            Ok(Delivery::Wake(wake)) => {
                assert_eq!(
                    (&*wake.queue, wake.payload.as_deref()),
                    (b.as_str(), Some("local again"))
                );
                break;
            }
            other => panic!("expected the wake, got {other:?}"),
        }
    }
    listener.stop();
    fx.wait_for_census(0);
}

#[test]
fn without_a_hub_the_local_listener_serves_from_the_start() {
    let Some(mut fx) = Fixture::new() else { return };
    let queue = fx.queue("q");
    let config = FailoverConfig {
        socket_path: Some(fx.dir.join("nobody-here.sock")),
        listener: fx.listener(LogSink::silent()),
    };
    let (listener, wakes) =
        FailoverListener::start_or_cancel(config, &crossbeam_channel::never()).unwrap();
    let pump = Pump::start(wakes);
    assert!(listener.failed_over());
    assert_eq!(listener.ensure_listening(&queue), Listened::Done);
    fx.notify(&queue, "local");
    pump.expect_wake(&queue, "local");
    fx.wait_for_census(1);
    listener.stop();
    fx.wait_for_census(0);
}

#[test]
fn a_refused_name_has_one_outcome_on_either_side_and_is_logged_once() {
    let Some(fx) = Fixture::new() else { return };
    let too_long = "q".repeat(70);
    let mut hub = fx.hub();
    for served_by_hub in [true, false] {
        let (log, records) = LogSink::channel();
        let (listener, _pump) = fx.failover(served_by_hub.then_some(&hub), log);
        assert!(!listener.failed_over());
        for _ in 0..3 {
            assert!(matches!(
                listener.ensure_listening(&too_long),
                Listened::Refused(_)
            ));
        }
        assert_eq!(logged(&records, "cannot listen to"), 1);
        listener.stop();
    }
    hub.stop();
}

#[test]
fn after_stop_nothing_is_confirmed_and_no_fallback_is_built() {
    let Some(mut fx) = Fixture::new() else { return };
    let queue = fx.queue("q");
    let mut hub = fx.hub();
    let (listener, _pump) = fx.failover(Some(&hub), LogSink::silent());
    assert_eq!(listener.ensure_listening(&queue), Listened::Done);
    listener.stop();
    hub.stop();
    assert_eq!(listener.ensure_listening(&queue), Listened::NotConfirmed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!listener.failed_over());
    fx.wait_for_census(0);
}

impl Pump {
    fn expect_listening(&self, queue: &str, ticket: u64) {
        match self.wakes.recv_timeout(Duration::from_secs(5)) {
            Ok(Delivery::Listening {
                queue: q,
                ticket: t,
            }) => assert_eq!((&*q, t), (queue, ticket)),
            other => panic!("expected {queue} listening, got {other:?}"),
        }
    }
}

#[test]
fn listen_async_confirms_each_request_by_its_ticket_in_order_on_either_side() {
    let Some(mut fx) = Fixture::new() else { return };
    let (a, b, c) = (fx.queue("a"), fx.queue("b"), fx.queue("c"));
    let mut hub = fx.hub();
    for served_by_hub in [true, false] {
        let (listener, pump) = fx.failover(served_by_hub.then_some(&hub), LogSink::silent());
        let (ticket_a, ticket_b) = (listener.listen_async(&a), listener.listen_async(&b));
        assert_ne!(ticket_a, ticket_b);
        pump.expect_listening(&a, ticket_a);
        pump.expect_listening(&b, ticket_b);
        fx.notify(&a, "after-confirmation");
        pump.expect_wake(&a, "after-confirmation");
        // Unsubscribed before its LISTEN was confirmed, then subscribed
        // again: the later confirmation carries the later ticket.
        let first_c = listener.listen_async(&c);
        listener.unlisten_async(&c);
        let second_c = listener.listen_async(&c);
        let confirmed: Vec<u64> = (0..2)
            .map(|_| match pump.wakes.recv_timeout(Duration::from_secs(5)) {
                Ok(Delivery::Listening { ticket, .. }) => ticket,
                other => panic!("expected c listening, got {other:?}"),
            })
            .collect();
        assert_eq!(confirmed, vec![first_c, second_c]);
        listener.unlisten_async(&a);
        let again_b = listener.listen_async(&b); // in order: a's UNLISTEN ran before this confirms
        pump.expect_listening(&b, again_b);
        fx.notify(&a, "unsubscribed");
        fx.notify(&c, "subscribed");
        pump.expect_wake(&c, "subscribed");
        assert!(pump.wakes.recv_timeout(Duration::from_millis(300)).is_err());
        listener.stop();
        fx.wait_for_census(1); // the hub's: the listener's own connection closed with it
    }
    hub.stop();
    fx.wait_for_census(0);
}

#[test]
fn listen_async_asks_again_while_not_confirmed_and_stop_ends_it() {
    let Some(fx) = Fixture::new() else { return };
    let queue = fx.queue("q");
    // A port nothing listens on: every LISTEN stays unconfirmed.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = unreachable.local_addr().unwrap().port();
    drop(unreachable);
    let (log, records) = LogSink::channel();
    let mut config = fx.listener(log);
    config.connection = ConnectionOptions::parse(&format!(
        "host=127.0.0.1 port={port} dbname=nowhere connect_timeout=1"
    ))
    .unwrap();
    let (listener, wakes) = FailoverListener::start_or_cancel(
        FailoverConfig {
            socket_path: None,
            listener: config,
        },
        &crossbeam_channel::never(),
    )
    .unwrap();
    let pump = Pump::start(wakes);
    listener.listen_async(&queue);
    let deadline = Instant::now() + Duration::from_secs(15);
    while logged(&records, "not confirmed: asking again every 1s") == 0 {
        assert!(Instant::now() < deadline, "no retry warning");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3)); // later attempts: not warned again
    assert_eq!(logged(&records, "not confirmed: asking again"), 0);
    assert!(pump.wakes.try_recv().is_err());
    let stopping = Instant::now();
    listener.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stop waited {:?}",
        stopping.elapsed()
    );
}

#[test]
fn a_listener_dropped_without_stop_ends_its_listen_thread_and_closes_its_connection() {
    let Some(mut fx) = Fixture::new() else { return };
    let queue = fx.queue("q");
    let (listener, pump) = fx.failover(None, LogSink::silent());
    let ticket = listener.listen_async(&queue);
    pump.expect_listening(&queue, ticket);
    fx.wait_for_census(1);
    drop(pump);
    drop(listener);
    fx.wait_for_census(0);
}

/// A drop (a Ruby object's GC free) only tells the threads to stop; `stop`
/// is the call that waits. With the server hung (a frozen proxy), a stop
/// waits out the engine's UNLISTEN and close timeouts; a drop of the hub, of
/// a worker served by it, or of a worker with its own connection returns in
/// a small part of that (bound: a tenth of the stop measured here).
#[test]
fn a_dropped_hub_or_worker_listener_never_waits_for_its_threads() {
    let Some(mut fx) = Fixture::new() else { return };
    let proxy = support_pg::FreezableProxy::start(&fx.url);
    let hung_later = || support_pg::listener_config(&proxy.url, &fx.tag, LogSink::silent());
    let queue = fx.queue("q");
    let hub = MasterHub::start(HubConfig {
        listener: hung_later(),
        ..fx.hub_config()
    })
    .unwrap();
    let start = |socket_path: Option<PathBuf>, listener| {
        let config = FailoverConfig {
            socket_path,
            listener,
        };
        FailoverListener::start_or_cancel(config, &crossbeam_channel::never()).unwrap()
    };
    let (served, served_wakes) = start(
        Some(hub.socket_path().to_owned()),
        fx.listener(LogSink::silent()),
    );
    let (own, own_wakes) = start(None, hung_later());
    let baseline = StandaloneListener::start(hung_later(), delivery::channel().0).unwrap();
    for listener in [&served, &own] {
        assert_eq!(listener.ensure_listening(&queue), Listened::Done);
    }
    baseline.listen(&queue, Duration::from_secs(5)).unwrap();
    assert!(!served.failed_over());
    fx.wait_for_census(3); // the hub's, `own`'s and the baseline's

    proxy.freeze();
    let stopping = Instant::now();
    baseline.stop();
    let stop_took = stopping.elapsed();
    assert!(
        stop_took >= Duration::from_millis(200),
        "the baseline stop did not wait for the hung server ({stop_took:?})"
    );
    let bound = stop_took / 10;
    for (what, dropped) in [
        (
            "the served worker's listener",
            Box::new(move || drop((served, served_wakes))) as Box<dyn FnOnce()>,
        ),
        (
            "the local worker's listener",
            Box::new(move || drop((own, own_wakes))),
        ),
        ("the hub", Box::new(move || drop(hub))),
    ] {
        let dropping = Instant::now();
        dropped();
        let took = dropping.elapsed();
        assert!(
            took < bound,
            "dropping {what} took {took:?} (a stop took {stop_took:?})"
        );
    }
}

/// Every payload of `pump` until `last` (or a quiet second), as numbers; a
/// durable wake (a catch-up: something may have been missed) fails the test.
fn numbers_until(pump: &Pump, last: u32) -> Vec<u32> {
    let mut numbers = Vec::new();
    while let Ok(delivery) = pump.wakes.recv_timeout(Duration::from_secs(1)) {
        match delivery {
            Delivery::Wake(wake) => {
                let payload = wake
                    .payload
                    .expect("no catch-up wake after a move at a marker");
                numbers.push(payload.parse::<u32>().expect("a number"));
            }
            other => panic!("unexpected {other:?}"),
        }
        if numbers.last() == Some(&last) {
            break;
        }
    }
    numbers
}

/// Workers for the planned-event tests: `n` FailoverListeners on `hub`, each
/// subscribed to `queue`, logging to `log`.
fn workers_on(
    fx: &Fixture,
    hub: &MasterHub,
    queue: &str,
    n: usize,
    log: &LogSink,
) -> Vec<(FailoverListener, Pump)> {
    (0..n)
        .map(|_| {
            let (listener, pump) = fx.failover(Some(hub), log.clone());
            assert_eq!(listener.ensure_listening(queue), Listened::Done);
            (listener, pump)
        })
        .collect()
}

/// A second session NOTIFYing numbered payloads on `queue` every 3 ms until `finish`.
struct Stream {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u32>,
}

impl Stream {
    fn start(fx: &Fixture, queue: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, queue, stopping) = (fx.url.clone(), queue.to_owned(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut sent = 0u32;
            // Bounded: far more than the few seconds a test runs.
            while sent < 20_000 && !stopping.load(Ordering::SeqCst) {
                support_pg::notify(&mut sql, &queue, &sent.to_string());
                sent += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            sent
        });
        Self { stop, thread }
    }

    /// Stops it; every worker got every number once, in order, and no catch-up wake.
    fn finish_and_check(self, workers: &[(FailoverListener, Pump)]) {
        self.stop.store(true, Ordering::SeqCst);
        let sent = self.thread.join().unwrap();
        assert!(sent < 20_000, "the stream ran out before the end");
        for (_, pump) in workers {
            let numbers = numbers_until(pump, sent - 1);
            assert_eq!(
                numbers,
                (0..sent).collect::<Vec<_>>(),
                "once each, in order"
            );
        }
    }
}

/// A peer that does not answer `move` (pgbus's Ruby client, an older
/// pgbus-hub worker: an unknown frame to them) is closed after the grace and
/// fails over as before; ours beside it moves at its marker.
#[test]
fn a_peer_that_ignores_move_is_closed_after_the_grace_and_counted_unmoved() {
    use pgbus_hub_core::protocol::{Decoder, Message, Move};
    use std::io::{Read, Write};
    let Some(mut fx) = Fixture::new() else { return };
    let mut hub = fx.hub();
    let queue = fx.queue("silent");
    let (listener, pump) = fx.failover(Some(&hub), LogSink::silent());
    assert_eq!(listener.ensure_listening(&queue), Listened::Done);
    let mut peer = std::os::unix::net::UnixStream::connect(hub.socket_path()).unwrap();
    peer.write_all(&Message::Sub(queue.clone()).encode().unwrap())
        .unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The hub routes a queue to a worker as it reads the sub, so a wake may
    // precede the ack: the NOTIFY below waits for the ack.
    let (acked, ack_seen) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let (mut decoder, mut kinds, mut buffer) = (Decoder::new(), Vec::new(), [0u8; 4096]);
        loop {
            while let Some(object) = decoder.next_frame().unwrap() {
                match Message::from_object(object).unwrap() {
                    Message::Status { .. } => {}
                    Message::Move(Move::Leave { to, .. }) => {
                        assert_eq!(to, None);
                        kinds.push("move");
                    }
                    Message::Ack(_) => {
                        let _ = acked.send(());
                        kinds.push("ack");
                    }
                    other => kinds.push(other.kind()),
                }
            }
            match peer.read(&mut buffer) {
                Ok(0) | Err(_) => return kinds, // closed by the hub
                Ok(n) => decoder.feed(&buffer[..n]),
            }
        }
    });
    support_wait::wait_until("both subscribed", || hub.stats().workers == 2);
    ack_seen
        .recv_timeout(Duration::from_secs(10))
        .expect("the peer's ack");
    fx.notify(&queue, "before");
    pump.expect_wake(&queue, "before");
    hub.stop();
    assert_eq!(reader.join().unwrap(), vec!["ack", "wake", "move"]);
    let stats = hub.stats();
    assert_eq!((stats.moved_workers, stats.unmoved_workers), (1, 1));
    fx.notify(&queue, "after");
    pump.expect_wake(&queue, "after");
    listener.stop();
    fx.wait_for_census(0);
}

/// Issue 56 items 1 and 2, one after the other under one steady stream, as
/// a sidecar's restart is: the hub stopped (each worker moves to its own
/// connection at the hub's marker), then a new hub at the same path (each
/// fails back at a marker the new hub commits with the own connection's).
/// Every number once, in order, at every worker; no catch-up wake anywhere.
#[test]
fn a_stopped_hub_and_its_successor_lose_nothing_and_double_nothing_under_a_stream() {
    use pgbus_hub_core::failover::FailoverState;
    const WORKERS: usize = 3;
    let Some(mut fx) = Fixture::new() else { return };
    let mut hub = fx.hub();
    let queue = fx.queue("restart");
    let (log, records) = LogSink::channel();
    let workers = workers_on(&fx, &hub, &queue, WORKERS, &log);
    fx.wait_for_census(1);
    let stream = Stream::start(&fx, &queue);
    std::thread::sleep(Duration::from_millis(500));
    hub.stop();
    let stats = hub.stats();
    assert_eq!(
        (stats.moved_workers, stats.unmoved_workers),
        (WORKERS as u64, 0)
    );
    for (listener, _) in &workers {
        assert!(listener.failed_over());
    }
    fx.wait_for_census(WORKERS as i64); // each worker's own connection, the hub's closed
    std::thread::sleep(Duration::from_millis(500));
    let mut successor = fx.hub();
    support_wait::wait_until("every worker back on the hub", || {
        workers
            .iter()
            .all(|(listener, _)| listener.state() == FailoverState::OnHub)
    });
    fx.wait_for_census(1);
    std::thread::sleep(Duration::from_millis(500));
    stream.finish_and_check(&workers);
    let lines: Vec<String> = records.try_iter().map(|r| r.message).collect();
    for said in [
        "moved to a per-worker listener at the hub's marker",
        "back on the master hub at its marker",
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(said)).count(),
            WORKERS,
            "{said}"
        );
    }
    assert_eq!(successor.stats().workers, WORKERS);
    for (listener, _) in &workers {
        listener.stop();
    }
    successor.stop();
    fx.wait_for_census(0);
}

/// A hub that acks but never commits the cut (pgbus's Ruby hub, an older
/// pgbus-hub: `marker` is an unknown frame to them): the fail-back waits the
/// ack budget for the marker, then finishes as before the cut existed, the
/// own connection closed and every queue woken once.
#[test]
fn a_hub_that_ignores_the_marker_request_gets_the_worker_back_unaligned_after_the_budget() {
    use pgbus_hub_core::failover::FailoverState;
    use pgbus_hub_core::protocol::{Marker, Message};
    let Some(mut fx) = Fixture::new() else { return };
    let stub = support_hub::StubHub::start(support_hub::Behaviour::default());
    let queue = fx.queue("unaligned");
    let (log, records) = LogSink::channel();
    let config = FailoverConfig {
        socket_path: Some(stub.path().to_owned()),
        listener: fx.listener(log),
    };
    let (listener, wakes) =
        FailoverListener::start_or_cancel(config, &crossbeam_channel::never()).unwrap();
    let pump = Pump::start(wakes);
    assert_eq!(listener.ensure_listening(&queue), Listened::Done);
    stub.close_all(); // the hub fails: the worker's own connection serves
    support_wait::wait_until("the fail-over", || listener.failed_over());
    assert_eq!(pump.expect_durable_wake(), queue); // its catch-up
    support_wait::wait_until("back on the stub", || {
        listener.state() == FailoverState::OnHub
    });
    let asked = stub
        .received()
        .into_iter()
        .filter(|m| matches!(m, Message::Marker(Marker::Commit { .. })))
        .count();
    assert_eq!(asked, 1, "the cut was asked for once");
    assert_eq!(pump.expect_durable_wake(), queue, "woken once, unaligned");
    // Logged after the wakes (a loaded machine read the log first).
    let mut unaligned = 0;
    support_wait::wait_until("the unaligned fail-back's line", || {
        unaligned += logged(&records, "back on the master hub unaligned");
        unaligned > 0
    });
    assert_eq!(unaligned, 1);
    fx.wait_for_census(0); // the own connection closed
    listener.stop();
}

/// Issue 56 item 3: `pgbus-hub serve` (N) started at the socket path an
/// older hub of ours serves (O) takes it over under a steady stream: N
/// renames its socket onto the path, O hands its workers over at their
/// markers and ends, each fails back to N at N's: every number once, in
/// order, at every worker; O's thread gone; census 1 (N's).
#[test]
fn a_new_hub_takes_the_path_over_and_the_old_one_yields_nothing_lost_or_twice() {
    use pgbus_hub_core::failover::FailoverState;
    const WORKERS: usize = 3;
    let Some(mut fx) = Fixture::new() else { return };
    let old = fx.hub();
    let queue = fx.queue("replace");
    let (log, records) = LogSink::channel();
    let workers = workers_on(&fx, &old, &queue, WORKERS, &log);
    fx.wait_for_census(1);
    let stream = Stream::start(&fx, &queue);
    std::thread::sleep(Duration::from_millis(500));
    let mut new = MasterHub::take_over(fx.hub_config()).expect("the take-over");
    assert_eq!(new.socket_path(), old.socket_path());
    support_wait::wait_until("the old hub yields", || !old.is_running());
    assert_eq!(old.stats().moved_workers, WORKERS as u64);
    support_wait::wait_until("every worker on the new hub", || {
        new.stats().workers == WORKERS
            && workers
                .iter()
                .all(|(listener, _)| listener.state() == FailoverState::OnHub)
    });
    fx.wait_for_census(1);
    std::thread::sleep(Duration::from_millis(500));
    stream.finish_and_check(&workers);
    assert_eq!(
        logged(&records, "back on the master hub at its marker"),
        WORKERS
    );
    for (listener, _) in &workers {
        listener.stop();
    }
    new.stop();
    drop(old);
    fx.wait_for_census(0);
}

/// The take-over is refused, and the old hub keeps serving, for a hub on
/// another database and for a peer that does not answer `replace`.
#[test]
fn a_take_over_is_refused_for_another_database_or_a_peer_that_does_not_answer() {
    let Some(mut fx) = Fixture::new() else { return };
    let old = fx.hub();
    let mut other = fx.hub_config();
    // The same server, database `postgres`: a URL's path, or a later keyword (libpq's last one wins).
    let elsewhere = match fx.url.rsplit_once('/') {
        Some((base, _)) if fx.url.contains("://") => format!("{base}/postgres"),
        _ => format!("{} dbname=postgres", fx.url),
    };
    other.listener = support_pg::listener_config(&elsewhere, &fx.tag, LogSink::silent());
    let refused = MasterHub::take_over(other).map(|_| ()).unwrap_err();
    assert!(refused.contains("served by a hub of database"), "{refused}");
    assert!(old.is_running());
    drop(old);

    let silent = fx.dir.join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let mut config = fx.hub_config();
    config.socket_path = silent;
    let refused = MasterHub::take_over(config).map(|_| ()).unwrap_err();
    assert!(refused.contains("does not answer replace"), "{refused}");
    fx.wait_for_census(0);
}
