//! The hub's metrics endpoint against the real local PostgreSQL, real Unix
//! sockets and a real TCP port: the families and values `GET /metrics`
//! serves, its answers to other requests, and a port that cannot be bound.
//! Skips (with a message) when no server answers.

#![allow(dead_code, unused_imports)]

mod support_os;
mod support_pg;
mod support_wait;

include!("support_hub_pg/fixture.rs");

use pgbus_hub_core::hub::metrics::MetricsConfig;
use pgbus_hub_core::log::Level;
use std::net::{SocketAddr, TcpStream};

fn with_metrics(mut config: HubConfig, port: u16) -> HubConfig {
    config.metrics = Some(MetricsConfig {
        bind: "127.0.0.1".into(),
        port,
    });
    config
}

/// One HTTP/1.1 request, the whole answer (status line, headers, body) as text.
fn request(address: SocketAddr, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The sample lines (name{labels} value) of a scrape, comments left out.
fn samples(answer: &str) -> Vec<&str> {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    body.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn get_metrics_serves_the_stats_families_with_their_values() {
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(with_metrics(fx.config("metrics"), 0)).unwrap();
    let address = hub.stats().metrics_address.expect("the endpoint listens");
    assert_eq!(
        hub.stats().threads,
        2,
        "the hub's thread and the endpoint's"
    );
    let mut peers = [Peer::connect(&hub), Peer::connect(&hub)];
    for (i, peer) in peers.iter_mut().enumerate() {
        peer.subscribe(&format!("metrics_{i}"));
    }
    peers[0].subscribe("metrics_shared");
    peers[1].subscribe("metrics_shared");
    // Each ack is observed as its writer hands it to the socket: a peer holding it finds it counted.
    assert_eq!(hub.stats().subscribe_ack.count, 4);

    let answer = request(address, "GET", "/metrics");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("content-type: text/plain; version=0.0.4"),
        "{answer}"
    );
    let samples = samples(&answer);
    for expected in [
        "pgbus_hub_up 1",
        "pgbus_hub_workers 2",
        "pgbus_hub_worker_processes 1",
        "pgbus_hub_channels 3",
        "pgbus_hub_raw_channels 0",
        "pgbus_hub_listener_state{state=\"connecting\"} 0",
        "pgbus_hub_listener_state{state=\"listening\"} 1",
        "pgbus_hub_listener_state{state=\"handing_over\"} 0",
        "pgbus_hub_listener_state{state=\"reconnecting\"} 0",
        "pgbus_hub_listener_state{state=\"stopped\"} 0",
        "pgbus_hub_reconnects_total 0",
        "pgbus_hub_handovers_total 0",
        "pgbus_hub_abandoned_connections_total 0",
        "pgbus_hub_dropped_durable_wakes_total 0",
        "pgbus_hub_evicted_workers_total 0",
        "pgbus_hub_rejected_peers_total 0",
        "pgbus_hub_subscribe_ack_seconds_count 4",
        "pgbus_hub_subscribe_ack_seconds_bucket{le=\"+Inf\"} 4",
    ] {
        assert!(samples.contains(&expected), "{expected} in {samples:#?}");
    }
    for family in [
        "# TYPE pgbus_hub_up gauge",
        "# TYPE pgbus_hub_wakes_received_total counter",
        "# TYPE pgbus_hub_frames_sent_total counter",
        "# TYPE pgbus_hub_subscribe_ack_seconds histogram",
        "# HELP pgbus_hub_workers ",
    ] {
        assert!(answer.contains(family), "{family} in {answer}");
    }
    // The same numbers `stats` reports: one source.
    let stats = hub.stats();
    let frames_sent = samples
        .iter()
        .find_map(|l| l.strip_prefix("pgbus_hub_frames_sent_total "))
        .unwrap();
    assert!(frames_sent.parse::<u64>().unwrap() <= stats.frames_sent);
    assert!(!samples.iter().any(|l| l.starts_with("pgbus_hub_census")));

    assert!(request(address, "GET", "/").starts_with("HTTP/1.1 404"));
    assert!(request(address, "GET", "/metrics/x").starts_with("HTTP/1.1 404"));
    let post = request(address, "POST", "/metrics");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("allow: GET"), "{post}");
}

#[test]
fn a_port_that_cannot_be_bound_is_logged_and_the_hub_serves_its_workers() {
    let Some(mut fx) = Fixture::new() else { return };
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (log, records) = LogSink::channel();
    let mut config = with_metrics(fx.config("taken"), port);
    config.listener.log = log;
    let mut hub = MasterHub::start(config).unwrap();
    let error = std::iter::from_fn(|| records.recv_timeout(Duration::from_secs(5)).ok())
        .find(|r| r.level == Level::Error)
        .expect("an error logged");
    assert!(
        error
            .message
            .contains(&format!("cannot listen on 127.0.0.1:{port}"))
            && error.message.contains("serves its workers without it"),
        "{}",
        error.message
    );
    assert_eq!(hub.stats().metrics_address, None);
    assert_eq!(hub.stats().threads, 1);
    let mut peer = Peer::connect(&hub);
    peer.subscribe("unbound");
    fx.notify("unbound", "still served");
    peer.expect_wake("unbound", Some("still served"));
    hub.stop();
}

#[test]
fn stop_ends_the_endpoint() {
    let Some(fx) = Fixture::new() else { return };
    let mut hub = MasterHub::start(with_metrics(fx.config("stops"), 0)).unwrap();
    let address = hub.stats().metrics_address.unwrap();
    hub.stop();
    assert_eq!(hub.stats().threads, 0);
    assert!(
        TcpStream::connect(address).is_err(),
        "nothing listens at {address}"
    );
}

/// The sub->ack histogram counts an ack before its worker can read it, so
/// stats read right after a subscribe returned include it (CI once scraped
/// 1 of 2 when the ack was observed after its write returned).
#[test]
fn an_ack_a_worker_holds_is_already_counted() {
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("metrics_held")).unwrap();
    let mut peer = Peer::connect(&hub);
    for i in 1..=50u64 {
        peer.subscribe(&format!("metrics_held_{i}"));
        assert_eq!(hub.stats().subscribe_ack.count, i, "after sub {i}");
    }
}

/// Issue 54 item 6: a hub that replaces another at the same socket path in
/// the same process carries on from its counters, so a scrape never sees a
/// `_total` fall (Prometheus' `rate()` would read a reset); a hub at another
/// path starts from 0.
#[test]
fn a_hub_replaced_in_the_same_process_keeps_counting_up() {
    let Some(fx) = Fixture::new() else { return };
    let mut first = MasterHub::start(with_metrics(fx.config("replaced"), 0)).unwrap();
    let mut peer = Peer::connect(&first);
    peer.subscribe("replaced_a");
    peer.subscribe("replaced_b");
    drop(peer);
    first.stop();
    let before = first.stats();
    assert_eq!(before.subscribe_ack.count, 2);
    assert!(before.frames_sent >= 2, "{before:?}");

    let second = MasterHub::start(with_metrics(fx.config("replaced"), 0)).unwrap();
    let carried = second.stats();
    assert_eq!(carried.subscribe_ack.count, 2, "carried, before any sub");
    assert!(carried.frames_sent >= before.frames_sent);
    let mut peer = Peer::connect(&second);
    peer.subscribe("replaced_c");
    let address = second.stats().metrics_address.unwrap();
    let answer = request(address, "GET", "/metrics");
    let samples = samples(&answer);
    assert!(
        samples.contains(&"pgbus_hub_subscribe_ack_seconds_count 3"),
        "{answer}"
    );
    let frames = samples
        .iter()
        .find_map(|l| l.strip_prefix("pgbus_hub_frames_sent_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect(&answer);
    // Not more: `frames_sent` counts a frame once its write returned, which
    // may be after the worker read it (CI under load scraped exactly the carried count).
    assert!(frames >= before.frames_sent, "{frames} after {before:?}");

    let elsewhere = MasterHub::start(fx.config("replaced_elsewhere")).unwrap();
    assert_eq!(elsewhere.stats().subscribe_ack.count, 0);
    assert_eq!(elsewhere.stats().frames_sent, 0);
}

/// Issue 57 items 1–2: a hub with `standby` LISTENs on 2 connections (the
/// census, `stats` and the metrics say so); its serving backend terminated,
/// the standby serves on from where that one stopped: a stream of numbered
/// NOTIFYs reaches the worker every number once, in order, no catch-up
/// wake, 1 promotion, 0 reconnects, and a new standby makes 2 again.
#[test]
fn a_hub_with_standby_counts_two_connections_and_a_promotion_loses_nothing() {
    let Some(mut fx) = Fixture::new() else { return };
    let mut config = with_metrics(fx.config("standby"), 0);
    config.listener.standby = true;
    let hub = MasterHub::start(config).unwrap();
    let address = hub.stats().metrics_address.unwrap();
    let queue = format!("standby_{}", std::process::id());
    let mut peer = Peer::connect(&hub);
    peer.subscribe(&queue);
    wait_until("the standby aligned", || {
        let stats = hub.stats();
        stats.standby_aligned && stats.listen_connections == 2
    });
    assert_eq!(fx.census(), 2, "2 pgbus-listen backends with standby");
    let scrape = request(address, "GET", "/metrics");
    for expected in [
        "pgbus_hub_listen_connections 2",
        "pgbus_hub_standby_promotions_total 0",
    ] {
        assert!(
            samples(&scrape).contains(&expected),
            "{expected} in {scrape}"
        );
    }

    // A second session NOTIFYs numbered payloads every 3 ms until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (url, channel_queue, stopping) = (fx.url.clone(), queue.clone(), stop.clone());
    let stream = std::thread::spawn(move || {
        let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut sent = 0u32;
        while sent < 20_000 && !stopping.load(std::sync::atomic::Ordering::SeqCst) {
            support_pg::notify(&mut sql, &channel_queue, &sent.to_string());
            sent += 1;
            std::thread::sleep(Duration::from_millis(3));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(300));
    let serving = hub.stats().backend.unwrap().pid;
    let terminated: bool = fx
        .sql
        .query_one(
            "select pg_terminate_backend(pid) from pg_stat_activity \
             where pid = $1 and application_name = $2",
            &[&i32::try_from(serving).unwrap(), &fx.tag],
        )
        .unwrap()
        .get(0);
    assert!(terminated, "the serving backend {serving} terminated");
    wait_until("a promotion and a new standby aligned", || {
        let stats = hub.stats();
        stats.standby_promotions == 1 && stats.standby_aligned && stats.listen_connections == 2
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = stream.join().unwrap();
    assert!(sent < 20_000, "the stream ran out before the end");

    let mut numbers = Vec::new();
    while numbers.last() != Some(&(sent - 1)) {
        match peer.next_non_status() {
            Some(Message::Wake(wake)) => {
                assert_eq!(wake.queue.as_ref(), queue.as_str());
                let payload = wake.payload.expect("no catch-up wake: nothing was lost");
                numbers.push(payload.parse::<u32>().unwrap());
            }
            other => panic!(
                "expected a wake, got {other:?} after {} numbers",
                numbers.len()
            ),
        }
    }
    assert_eq!(
        numbers,
        (0..sent).collect::<Vec<_>>(),
        "once each, in order"
    );
    let stats = hub.stats();
    assert_eq!((stats.standby_promotions, stats.reconnects), (1, 0));
    assert_ne!(stats.backend.unwrap().pid, serving, "the standby serves");
    assert_eq!(fx.census(), 2, "a new standby beside the promoted one");
    let scrape = request(address, "GET", "/metrics");
    for expected in [
        "pgbus_hub_listen_connections 2",
        "pgbus_hub_standby_promotions_total 1",
        "pgbus_hub_reconnects_total 0",
    ] {
        assert!(
            samples(&scrape).contains(&expected),
            "{expected} in {scrape}"
        );
    }
}
