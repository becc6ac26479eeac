//! The master hub against the real local PostgreSQL and real Unix sockets.
//!
//! Tests take one lock so census counts (rows of `pg_stat_activity`) are not
//! disturbed by another test's hub. Skips (with a message) when no server answers.

#![allow(dead_code, unused_imports)]

mod support_os;
mod support_pg;
mod support_wait;

include!("support_hub_pg/fixture.rs");

#[test]
fn sub_ack_then_durable_and_ephemeral_wakes() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("wakes")).unwrap();
    let mut peer = Peer::connect(&hub);
    assert!(
        matches!(peer.next(), Some(Message::Status { .. })),
        "status on connect"
    );
    peer.subscribe("chat");
    fx.notify("chat", "");
    peer.expect_wake("chat", None);
    fx.notify("chat", "<p>héllo</p>");
    peer.expect_wake("chat", Some("<p>héllo</p>"));
    let big = "x".repeat(7999);
    fx.notify("chat", &big);
    peer.expect_wake("chat", Some(&big));
    fx.notify("other", "not subscribed");
    fx.notify("chat", "after");
    peer.expect_wake("chat", Some("after"));
    let stats = hub.stats();
    assert_eq!((stats.workers, stats.channels, stats.threads), (1, 1, 1));
    assert!(stats.listener_healthy);
}

#[test]
fn no_wake_lost_after_ack_under_a_notify_storm() {
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("storm")).unwrap();
    let url = fx.url.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storm_stop = stop.clone();
    let storm = std::thread::spawn(move || {
        let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut sent = 0u64;
        while !storm_stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 200_000 {
            sql.execute("select pg_notify('pgmq.q_storm.INSERT', 'noise')", &[])
                .unwrap();
            sent += 1;
        }
    });
    let mut sql = postgres::Client::connect(&fx.url, postgres::NoTls).unwrap();
    for i in 0..50 {
        let mut peer = Peer::connect(&hub);
        let queue = format!("fresh_{i}");
        peer.subscribe(&queue);
        sql.execute(
            "select pg_notify($1, 'marker')",
            &[&format!("pgmq.q_{queue}.INSERT")],
        )
        .unwrap();
        peer.expect_wake(&queue, Some("marker"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    storm.join().unwrap();
}

#[test]
fn refcounts_unlisten_only_after_the_last_worker_leaves() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("refs")).unwrap();
    let mut a = Peer::connect(&hub);
    let mut b = Peer::connect(&hub);
    a.subscribe("shared");
    b.subscribe("shared");
    a.send(Message::Unsub("shared".into()));
    wait_until("a's unsub", || hub.stats().channels == 1);
    fx.notify("shared", "still");
    b.expect_wake("shared", Some("still"));
    drop(b); // a disconnect releases refs like an unsub
    wait_until("last ref released", || {
        hub.stats().channels == 0 && hub.stats().workers == 1
    });
    fx.notify("shared", "nobody");
    a.subscribe("probe");
    fx.notify("probe", "p");
    a.expect_wake("probe", Some("p")); // "nobody" never reached a: it unsubscribed
}

#[test]
fn sixteen_workers_share_one_listen_connection() {
    let Some(mut fx) = Fixture::new() else { return };
    let before = fx.census();
    let hub = MasterHub::start(fx.config("census")).unwrap();
    let mut peers: Vec<Peer> = (0..16).map(|_| Peer::connect(&hub)).collect();
    for (i, peer) in peers.iter_mut().enumerate() {
        peer.subscribe("fanout");
        peer.subscribe(&format!("own_{i}"));
    }
    assert_eq!(
        fx.census() - before,
        1,
        "one pgbus-listen backend for 16 workers"
    );
    let started = Instant::now();
    fx.notify("fanout", "all");
    for peer in &mut peers {
        peer.expect_wake("fanout", Some("all"));
    }
    eprintln!(
        "1 NOTIFY -> 16 workers: all delivered in {:?}",
        started.elapsed()
    );
    let stats = hub.stats();
    assert_eq!((stats.workers, stats.threads), (16, 1));
    drop(hub);
    wait_until("census back", || fx.census() == before);
}

#[test]
fn a_stats_only_connection_is_not_counted_as_a_worker() {
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("monitor")).unwrap();
    let mut workers: Vec<Peer> = (0..4).map(|_| Peer::connect(&hub)).collect();
    workers[0].subscribe("chat"); // subscribed or idle, a worker counts
    let mut monitor = Peer::connect(&hub);
    wait_until("5 connections accepted", || hub.stats().workers == 5);
    let answer = monitor.ask_stats();
    assert_eq!(answer["workers"], 4, "the asking connection is no worker");
    assert_eq!(hub.stats().workers, 4, "nor while it stays connected");
    let answer = monitor.ask_stats();
    assert_eq!(answer["workers"], 4, "asking twice changes nothing");
    assert_eq!(
        workers[0].ask_stats()["workers"],
        4,
        "a subscribed worker that asks stays a worker"
    );
    workers[1].ask_stats();
    assert_eq!(
        hub.stats().workers,
        3,
        "an idle connection that asks is a monitor"
    );
    monitor.subscribe("chat"); // a monitor that subscribes is a worker again
    assert_eq!(hub.stats().workers, 4);
    drop(workers.remove(1));
    drop(monitor);
    wait_until("disconnects released", || hub.stats().workers == 3);
    assert_eq!(hub.stats().channels, 1);
}

#[test]
fn an_operators_stats_request_answers_or_says_why_not() {
    use pgbus_hub_core::client::{request_stats, StatsError};
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("operator")).unwrap();
    let _worker = Peer::connect(&hub);
    wait_until("1 connection accepted", || hub.stats().workers == 1);
    let never = crossbeam_channel::never();
    let second = Duration::from_secs(1);
    let stats = request_stats(hub.socket_path(), second, &never).unwrap();
    assert_eq!(stats["workers"], 1, "the asking connection is no worker");
    assert!(stats.contains_key("listener_healthy"));

    // A socket nobody answers on (pgbus's Ruby hub ignores the frame): NoAnswer at the timeout.
    let silent_path = fx.dir.join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&silent_path).unwrap();
    let short = Duration::from_millis(100);
    let started = Instant::now();
    let error = request_stats(&silent_path, short, &never).unwrap_err();
    assert!(matches!(error, StatsError::NoAnswer { .. }), "{error}");
    assert!(started.elapsed() >= short);
    let missing = request_stats(&fx.dir.join("missing.sock"), short, &never).unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("cannot reach master hub at "),
        "{missing}"
    );

    // Cancelled while waiting for an answer: at once.
    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    cancel.send(()).unwrap();
    let error = request_stats(&silent_path, Duration::from_secs(30), &cancelled).unwrap_err();
    assert_eq!(error, StatsError::Interrupted);
}

#[test]
fn a_worker_that_never_reads_is_evicted_even_if_a_forked_child_holds_its_socket() {
    let Some(mut fx) = Fixture::new() else { return };
    let mut config = fx.config("evict");
    config.durable_queue_limit = 3;
    config.hard_queue_limit = 8;
    let hub = MasterHub::start(config).unwrap();
    let mut stuck = Peer::connect(&hub);
    stuck.subscribe("flood");
    let mut healthy = Peer::connect(&hub);
    healthy.subscribe("flood");
    // A child forked from the hub's process now holds copies of every hub-side fd
    // (as a Puma worker forked from the master does). Only shutdown(2) reaches it.
    let child = unsafe { libc::fork() };
    if child == 0 {
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    let payload = "y".repeat(7000);
    let mut sent = 0;
    while hub.stats().evicted_workers == 0 && sent < 5000 {
        fx.notify("flood", &payload);
        sent += 1;
        healthy.expect_wake("flood", Some(&payload)); // the healthy worker keeps draining
    }
    assert_eq!(
        hub.stats().evicted_workers,
        1,
        "evicted after {sent} notifies"
    );
    // The stuck worker now reads: queued frames, then EOF (not a hang), despite the child's copy.
    stuck
        .stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut eof = false;
    for _ in 0..10_000 {
        if stuck.next().is_none() {
            eof = true;
            break;
        }
    }
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(eof, "the evicted worker sees EOF");
    wait_until("evicted worker removed", || hub.stats().workers == 1);
    fx.notify("flood", "after");
    loop {
        match healthy.next_non_status() {
            Some(Message::Wake(wake)) if wake.payload.as_deref() == Some("after") => break,
            Some(Message::Wake(_)) => continue,
            other => panic!("healthy worker: {other:?}"),
        }
    }
}

#[test]
fn durable_wakes_are_dropped_past_the_limit_ephemeral_never() {
    let Some(mut fx) = Fixture::new() else { return };
    let mut config = fx.config("drops");
    config.durable_queue_limit = 3;
    config.hard_queue_limit = 100_000;
    let hub = MasterHub::start(config).unwrap();
    let mut slow = Peer::connect(&hub);
    slow.subscribe("d");
    // Fill the socket buffer with big ephemeral frames so the outbox backs up.
    let big = "z".repeat(7900);
    for _ in 0..200 {
        fx.notify("d", &big);
    }
    for _ in 0..20 {
        fx.notify("d", "");
    }
    wait_until("durable drops", || hub.stats().dropped_durable_wakes > 0);
    let mut ephemeral = 0;
    let mut durable = 0;
    while ephemeral + durable < 220 {
        match slow.next_non_status() {
            Some(Message::Wake(wake)) if wake.payload.is_some() => ephemeral += 1,
            Some(Message::Wake(_)) => durable += 1,
            _ => break,
        }
        if ephemeral == 200 && durable + hub.stats().dropped_durable_wakes as usize == 20 {
            break;
        }
    }
    assert_eq!(ephemeral, 200, "no ephemeral wake dropped");
    assert_eq!(hub.stats().evicted_workers, 0);
}

#[test]
fn terminated_backend_reconnects_and_reports_health() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("terminate")).unwrap();
    let mut peer = Peer::connect(&hub);
    peer.subscribe("survive");
    // Only this hub's backend: other runs on the same server have their own.
    let pid = hub.stats().backend.expect("the hub's backend").pid as i32;
    let killed: bool = fx
        .sql
        .query_one("select pg_terminate_backend($1)", &[&pid])
        .unwrap()
        .get(0);
    assert!(killed);
    let mut saw_unhealthy = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no recovery");
        match peer.next() {
            Some(Message::Status { healthy: false }) => saw_unhealthy = true,
            Some(Message::Status { healthy: true }) if saw_unhealthy => break,
            Some(_) => {}
            None => panic!("hub closed the worker"),
        }
    }
    // Nothing NOTIFYed: the re-LISTEN alone wakes the subscriber (durable) so
    // it re-reads what was committed while the hub's connection was down.
    peer.expect_wake("survive", None);
    fx.notify("survive", "again");
    peer.expect_wake("survive", Some("again"));
    assert!(hub.stats().reconnects >= 1);
}

#[test]
fn catch_up_reaches_every_queue_past_the_durable_limit() {
    let Some(mut fx) = Fixture::new() else { return };
    let mut config = fx.config("catch-up");
    config.durable_queue_limit = 16;
    let hub = MasterHub::start(config).unwrap();
    let mut peer = Peer::connect(&hub);
    let queues: Vec<String> = (0..2000).map(|i| format!("catch_up_{i}")).collect();
    for queue in &queues {
        peer.subscribe(queue);
    }
    let pid = hub.stats().backend.expect("the hub's backend").pid as i32;
    fx.sql
        .execute("select pg_terminate_backend($1)", &[&pid])
        .unwrap();
    // The peer reads nothing until the hub is LISTENing again, so every
    // catch-up wake is owed at once: 125 times the durable limit.
    wait_until("re-LISTENed", || {
        let stats = hub.stats();
        stats.reconnects >= 1 && stats.listener_healthy
    });
    fx.notify("catch_up_0", "live");
    let mut owed: std::collections::HashSet<String> = queues.iter().cloned().collect();
    let mut live = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !owed.is_empty() || !live {
        assert!(
            Instant::now() < deadline,
            "{} catch-up wakes never came",
            owed.len()
        );
        // Status frames come every 200 ms: read them here, under the deadline.
        match peer.next() {
            Some(Message::Status { .. }) => {}
            Some(Message::Wake(wake)) if wake.payload.as_deref() == Some("live") => live = true,
            Some(Message::Wake(wake)) => {
                assert!(wake.payload.is_none(), "{wake:?}");
                assert!(owed.remove(&*wake.queue), "woken twice: {wake:?}");
            }
            other => panic!("{} catch-up wakes still owed, got {other:?}", owed.len()),
        }
    }
    assert_eq!(hub.stats().dropped_durable_wakes, 0);
    assert_eq!(hub.stats().evicted_workers, 0);
}
