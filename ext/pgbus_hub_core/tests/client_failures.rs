//! Continued from client.rs (split for size).
//!
//! HubClient against a stub hub: real Unix sockets, real threads, a real fork.
//! A test thread plays the embedder's pump (it reads the socket for the client).

#![allow(dead_code, unused_imports)]

mod support_hub;
mod support_os;
mod support_wait;

include!("support_client/setup.rs");

#[test]
fn connect_failures_are_unavailable_with_a_clear_reason() {
    let _serial = shared();
    let dir = support_hub::temp_dir();

    let missing = dir.join("missing.sock");
    let message = connect_error(&missing);
    assert!(
        message.starts_with(&format!(
            "cannot reach master hub at {}: ",
            missing.display()
        )),
        "{message}"
    );
    assert!(message.contains("No such file or directory"), "{message}");

    let refused = dir.join("refused.sock");
    drop(std::os::unix::net::UnixListener::bind(&refused).unwrap());
    assert!(connect_error(&refused).contains("Connection refused"));

    let not_a_socket = dir.join("plain-file");
    std::fs::write(&not_a_socket, b"x").unwrap();
    assert!(connect_error(&not_a_socket).starts_with("cannot reach master hub at "));

    let long = dir.join("x".repeat(120));
    let message = connect_error(&long);
    // 108 on Linux, 104 on macOS and the BSDs.
    let limit = pgbus_hub_core::transport::SUN_PATH_BYTES;
    assert!(
        message.contains(&format!("must be shorter than {limit} bytes")),
        "{message}"
    );

    assert!(connect_error(std::path::Path::new("")).contains("empty"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn connect_waits_on_a_full_backlog_until_cancelled_and_leaves_nothing_open() {
    let _serial = exclusive();
    let dir = support_hub::temp_dir();
    let path = dir.join("full.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // SAFETY: a valid listening socket; listen(2) again only shrinks its backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    // Queue connections until the kernel says the backlog is full (Linux:
    // EAGAIN; macOS, the BSDs: ECONNREFUSED).
    let (full, full_seen) = crossbeam_channel::bounded(1);
    full.send(()).unwrap(); // taken by the first EAGAIN
    let mut fillers = Vec::new();
    while let Ok(filler) = ClientSocket::connect(&path, &full_seen) {
        fillers.push(filler);
    }
    let fds = fd_count();
    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    let config = ClientConfig::new(&path);
    let connecting = thread::spawn(move || HubClient::connect_driven_or_cancel(config, &cancelled));
    if pgbus_hub_core::os::refusal_may_be_busy(libc::ECONNREFUSED) {
        // A refusal there may as well be a dead hub's socket: retried for a
        // while (REFUSED_BUT_MAYBE_BUSY), then reported.
        let outcome = connecting.join().unwrap().err();
        assert!(
            matches!(&outcome, Some(ClientError::Unavailable(why)) if why.contains("refused")),
            "{outcome:?}"
        );
    } else {
        thread::sleep(Duration::from_millis(200));
        assert!(
            !connecting.is_finished(),
            "connect did not wait for the backlog"
        );
        cancel.send(()).unwrap();
        assert_eq!(
            connecting.join().unwrap().err(),
            Some(ClientError::Interrupted)
        );
    }
    assert_eq!(fd_count(), fds, "the abandoned socket stayed open");

    // Once the hub catches up, the same path connects.
    for _ in &fillers {
        drop(listener.accept().unwrap());
    }
    let (client, _reader) = HubClient::connect_driven(ClientConfig::new(&path)).unwrap();
    assert!(!client.is_dead());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stop_releases_a_blocked_ensure_listening_without_failure() {
    let _serial = shared();
    let s = setup_with(never_ack(), Duration::from_secs(30));
    let client = Arc::clone(&s.client);
    let waiter = thread::spawn(move || client.subscribe("q"));
    s.hub.wait_received(1);
    let started = Instant::now();
    s.client.stop();
    assert_eq!(
        unavailable_message(waiter.join().unwrap()),
        "master hub client stopped while awaiting ack for q"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(200)), None);
    assert!(s.client.is_dead());
    assert_eq!(
        s.client.dead_reason().as_deref(),
        Some("master hub client stopped")
    );
    assert_eq!(
        unavailable_message(s.client.subscribe("q")),
        "master hub is unavailable: master hub client stopped"
    );
    s.client.stop(); // idempotent
    s.hub.wait_no_connections();
}

#[test]
fn stop_returns_within_2s_when_the_hub_never_reads() {
    let _serial = shared();
    let s = setup_with(
        Behaviour {
            never_read: true,
            ..Behaviour::default()
        },
        Duration::from_secs(30),
    );
    // A 3 MiB unsub overflows the socket buffer: the write blocks.
    let client = Arc::clone(&s.client);
    let writer = thread::spawn(move || client.unsubscribe(&"q".repeat(3 << 20)));
    thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished(), "the write did not block");
    let started = Instant::now();
    s.client.stop();
    let took = started.elapsed();
    println!("stop with a wedged hub took {took:?}");
    assert!(took < Duration::from_secs(2), "stop took {took:?}");
    wait_for("the blocked writer", || writer.is_finished());
    writer.join().unwrap();
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(200)), None);
}

#[test]
fn a_write_stalled_past_ack_timeout_kills_the_client() {
    let _serial = shared();
    let s = setup_with(
        Behaviour {
            never_read: true,
            ..Behaviour::default()
        },
        Duration::from_millis(300),
    );
    let started = Instant::now();
    let message = unavailable_message(s.client.subscribe(&"q".repeat(3 << 20)));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        message,
        "master hub is unavailable: write to master hub stalled for 0.3s"
    );
    assert_eq!(
        expect_one_failure(&s.deliveries),
        "write to master hub stalled for 0.3s"
    );
}

#[test]
fn an_unencodable_queue_is_rejected_locally() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let error = s.client.subscribe(&"q".repeat(5 << 20)).unwrap_err();
    assert!(matches!(error, ClientError::Rejected { .. }));
    assert!(!s.client.is_dead());
    s.client.subscribe("q").unwrap();
}

#[test]
fn drop_without_stop_closes_the_connection() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let Setup {
        hub,
        client,
        deliveries,
        ..
    } = s;
    drop(Arc::into_inner(client).unwrap());
    hub.wait_no_connections();
    assert_eq!(deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn a_forked_child_is_inert_and_the_parent_keeps_working() {
    let _serial = exclusive();
    let s = setup(Behaviour::default());
    s.client.subscribe("before_fork").unwrap();
    let client = Arc::into_inner(s.client).unwrap();

    // SAFETY: the child only calls the client (inert paths, no locks) and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut code = 0;
        if !client.is_dead() {
            code |= 1;
        }
        if client.hub_healthy() {
            code |= 2;
        }
        match client.subscribe("from_child") {
            Err(ClientError::Unavailable(m))
                if m == "master hub client was inherited across fork; connect a new one" => {}
            _ => code |= 4,
        }
        if client.dead_reason().is_none() {
            code |= 8;
        }
        client.unsubscribe("from_child");
        client.stop();
        drop(client);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child crashed: {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child checks failed");

    assert!(!client.is_dead());
    client.subscribe("after_fork").expect("parent still works");
    s.hub.send(&wake("after_fork", None));
    assert_eq!(
        s.deliveries.recv_timeout(Duration::from_secs(5)),
        Some(Delivery::Wake(Wake::durable("after_fork")))
    );
    assert_eq!(
        s.hub.received(),
        vec![
            Message::Sub("before_fork".into()),
            Message::Sub("after_fork".into())
        ]
    );
    client.stop();
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn thousand_connect_stop_cycles_leak_no_fds_or_threads() {
    let _serial = exclusive();
    let hub = StubHub::start(Behaviour::default());
    // Warm up (lazy statics, the first accept) before taking the baseline.
    connect_and_stop(&hub, true, true);
    hub.wait_no_connections();
    let fds = fd_count();
    for i in 0..1000 {
        connect_and_stop(&hub, i % 10 == 0, i % 2 == 0);
    }
    hub.wait_no_connections();
    // Every pump of the 1000 was joined; another test's (detached, its client
    // stopped as that test ended) may still be on its way out. One that
    // never ends outlived its client.
    wait_for("no pump outliving its client", || {
        pump_thread_count().is_none_or(|pumps| pumps == 0)
    });
    // No growth. (Fewer is fine: another test's leftovers may close meanwhile.)
    // Waited for: the stub hub's per-connection threads close their ends
    // just after the hub has forgotten the connection.
    wait_for("fds back to the baseline", || fd_count() <= fds);
    println!(
        "leak check: fds {fds} -> {}, pump threads {:?} (None: not countable here)",
        fd_count(),
        pump_thread_count()
    );
}

// ---- The reading side itself: a client whose reader no thread pumps yet.

#[test]
fn driven_reader_resolves_acks_and_delivers_wakes_in_order() {
    let _serial = shared();
    let d = driven(Behaviour::default(), Duration::from_secs(2));
    let pump = Pump::start(&d.reader);
    d.client.subscribe("q").expect("acked by the pump's read");
    // Durable wakes of one queue coalesce while undelivered (`delivery`): one queue each here.
    let expected: Vec<Delivery> = (0..200)
        .map(|i| match i % 2 {
            1 => Delivery::Wake(Wake::new("q", Some(format!("p{i}")))),
            _ => Delivery::Wake(Wake::durable(format!("q{i}"))),
        })
        .collect();
    for item in &expected {
        let Delivery::Wake(item) = item else {
            unreachable!()
        };
        d.hub.send(&Message::Wake(item.clone()));
    }
    let got: Vec<Delivery> = (0..200)
        .map(|_| pump.recv_timeout(Duration::from_secs(5)).expect("wake"))
        .collect();
    assert_eq!(got, expected);
    d.client.stop();
    assert!(pump.join().try_recv().is_err(), "stop sends no Failed");
}

#[test]
fn driven_acks_do_not_wait_for_a_pump_away_in_the_app() {
    let _serial = shared();
    // No thread calls next_batch (an embedder's pump blocked on a full dispatch
    // queue) while wakes pile up: each sub reads the socket for its own ack.
    let d = driven(Behaviour::default(), Duration::from_secs(2));
    let expected: Vec<Delivery> = (0..100)
        .map(|i| Delivery::Wake(Wake::new("busy", Some(format!("p{i}")))))
        .collect();
    for item in &expected {
        let Delivery::Wake(item) = item else {
            unreachable!()
        };
        d.hub.send(&Message::Wake(item.clone()));
    }
    for i in 0..10 {
        assert_eq!(
            d.client.subscribe(&format!("new_{i}")),
            Ok(Listening::Active)
        );
    }
    assert!(!d.client.is_dead());
    // Once the pump is back: every wake, in order, none lost, none twice.
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let batch = d.reader.next_batch(64, Duration::from_secs(5));
        assert!(!batch.items.is_empty(), "wakes missing after {}", got.len());
        got.extend(batch.items);
    }
    assert_eq!(got, expected);
    assert!(d
        .reader
        .next_batch(8, Duration::from_millis(200))
        .items
        .is_empty());
}

#[test]
fn driven_interrupt_releases_a_blocked_wait_at_once() {
    let _serial = shared();
    let d = driven(Behaviour::default(), Duration::from_secs(2));
    let reader = Arc::clone(&d.reader);
    let started = Instant::now();
    let waiting = thread::spawn(move || reader.next_batch(8, Duration::from_secs(30)));
    thread::sleep(Duration::from_millis(50));
    d.reader.interrupt();
    let batch = waiting.join().unwrap();
    assert!(batch.interrupted && batch.items.is_empty() && !batch.closed);
    assert!(started.elapsed() < Duration::from_secs(10));
    // Cleared: the next wait is a real wait again, and the client still works.
    let pump = Pump::start(&d.reader);
    d.client.subscribe("q").expect("acked");
    d.client.stop();
    pump.join();
}

#[test]
fn driven_hub_eof_is_one_failed_then_closed_and_stop_ends_a_blocked_pump() {
    let _serial = shared();
    let d = driven(never_ack(), Duration::from_secs(2));
    let pump = Pump::start(&d.reader);
    d.hub.send(&wake("q", Some("before")));
    d.hub.close_all();
    assert_eq!(
        pump.recv_timeout(Duration::from_secs(5)),
        Some(Delivery::Wake(Wake::new("q", Some("before"))))
    );
    match pump.recv_timeout(Duration::from_secs(5)) {
        Some(Delivery::Failed { reason }) => {
            assert!(reason.contains("closed the transport"), "{reason}")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    // The pump saw `closed` after Failed.
    assert!(pump.join().try_recv().is_err());
    assert!(d.client.is_dead());

    // A pump blocked in a long wait is released by stop (shutdown(2) ends the poll).
    let d = driven(never_ack(), Duration::from_secs(2));
    let reader = Arc::clone(&d.reader);
    let waiting = thread::spawn(move || reader.next_batch(8, Duration::from_secs(30)));
    thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    d.client.stop();
    let batch = waiting.join().unwrap();
    assert!(batch.closed && batch.items.is_empty(), "{batch:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn driven_wait_accepts_any_timeout() {
    let _serial = shared();
    let d = driven(Behaviour::default(), Duration::from_secs(2));
    let reader = Arc::clone(&d.reader);
    let waiting = thread::spawn(move || reader.next_batch(8, Duration::MAX));
    thread::sleep(Duration::from_millis(50));
    d.reader.interrupt();
    assert!(waiting.join().unwrap().interrupted);
}
