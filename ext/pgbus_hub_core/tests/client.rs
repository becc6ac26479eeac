//! HubClient against a stub hub: real Unix sockets, real threads, a real fork.
//! A test thread plays the embedder's pump (it reads the socket for the client).

mod support_hub;
mod support_wait;

use pgbus_hub_core::client::{ClientConfig, ClientError, DrivenReader, HubClient, Listening};
use pgbus_hub_core::delivery::{Delivery, WakeSource};
use pgbus_hub_core::log::{Level, LogSink, Record};
use pgbus_hub_core::protocol::{Message, Wake};
use pgbus_hub_core::transport::socket::ClientSocket;
use std::os::fd::AsRawFd;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};
use support_hub::pump::{self, Pump};
use support_hub::{AckMode, Behaviour, StubHub};
use support_wait::wait_until as wait_for;

/// The leak and fork tests need the process to themselves (fd and thread
/// counts; no other thread mid-malloc at fork). They take the write side.
static SERIAL: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    SERIAL.read().unwrap_or_else(|p| p.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    SERIAL.write().unwrap_or_else(|p| p.into_inner())
}

/// A client with a running pump.
struct Setup {
    hub: StubHub,
    client: Arc<HubClient>,
    deliveries: Pump,
    logs: crossbeam_channel::Receiver<Record>,
}

fn setup_with(behaviour: Behaviour, ack_timeout: Duration) -> Setup {
    let (log, logs) = LogSink::channel();
    let d = driven_with(behaviour, ack_timeout, log);
    Setup {
        hub: d.hub,
        client: d.client,
        deliveries: Pump::start(&d.reader),
        logs,
    }
}

fn setup(behaviour: Behaviour) -> Setup {
    setup_with(behaviour, Duration::from_secs(2))
}

fn never_ack() -> Behaviour {
    Behaviour {
        ack: AckMode::Never,
        ..Behaviour::default()
    }
}

fn wake(queue: &str, payload: Option<&str>) -> Message {
    Message::Wake(Wake::new(queue, payload))
}

fn unavailable_message(result: Result<Listening, ClientError>) -> String {
    match result {
        Err(ClientError::Unavailable(message)) => message,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Collects exactly one Failed and checks none follows.
fn expect_one_failure(deliveries: &Pump) -> String {
    let reason = loop {
        match deliveries.recv_timeout(Duration::from_secs(5)) {
            Some(Delivery::Failed { reason }) => break reason,
            Some(Delivery::Wake { .. } | Delivery::Listening { .. }) => continue,
            None => panic!("no Delivery::Failed within 5 s"),
        }
    };
    assert_eq!(deliveries.recv_timeout(Duration::from_millis(200)), None);
    reason
}

#[test]
fn ensure_listening_blocks_until_the_hub_acks() {
    let _serial = shared();
    let delay = Duration::from_millis(300);
    let s = setup(Behaviour {
        ack: AckMode::Delay(delay),
        ..Behaviour::default()
    });
    let started = Instant::now();
    s.client.ensure_listening("pgbus_chat").expect("acked");
    assert!(started.elapsed() >= delay, "returned before the ack");
    assert_eq!(s.hub.subs(), vec!["pgbus_chat".to_owned()]);
    assert!(!s.client.is_dead());
    assert_eq!(s.client.dead_reason(), None);
}

#[test]
fn concurrent_waiters_on_one_queue_are_released_fifo() {
    let _serial = shared();
    let s = setup(never_ack());
    let spawn_waiter = |client: &Arc<HubClient>| {
        let client = Arc::clone(client);
        thread::spawn(move || client.ensure_listening("q"))
    };
    let first = spawn_waiter(&s.client);
    s.hub.wait_received(1);
    let second = spawn_waiter(&s.client);
    s.hub.wait_received(2);

    s.hub.send(&Message::Ack("q".into()));
    wait_for("the first waiter", || first.is_finished());
    first.join().unwrap().expect("first acked");
    thread::sleep(Duration::from_millis(100));
    assert!(!second.is_finished(), "one ack released two waiters");

    s.hub.send(&Message::Ack("q".into()));
    second.join().unwrap().expect("second acked");

    // An ack nobody waits for is ignored (logged at debug), the client lives on.
    s.hub.send(&Message::Ack("q".into()));
    let record = s
        .logs
        .recv_timeout(Duration::from_secs(5))
        .expect("a debug record");
    assert_eq!(record.level, Level::Debug);
    assert!(record.message.contains("no waiter"), "{record:?}");
    assert!(!s.client.is_dead());
}

#[test]
fn many_threads_many_queues_all_acked() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let client = Arc::clone(&s.client);
            thread::spawn(move || {
                for i in 0..50 {
                    client
                        .ensure_listening(&format!("q{}", (t * 7 + i) % 5))
                        .expect("acked");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(s.hub.subs().len(), 16 * 50);
    assert!(!s.client.is_dead());
}

#[test]
fn wakes_arrive_in_order_durable_ephemeral_unicode_and_7999_bytes() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    s.client.ensure_listening("chat").unwrap();
    let big = "é".repeat(3999) + "x"; // 7999 bytes, NOTIFY's payload ceiling
    assert_eq!(big.len(), 7999);
    let mut expected = vec![
        wake("chat", None),
        wake("chat", Some("<turbo-stream>héllo ✓ 🚀</turbo-stream>")),
        wake("chat", Some(&big)),
        wake("chat", Some("")),
    ];
    for i in 0..1000 {
        let queue = if i % 2 == 0 { "chat" } else { "other" };
        expected.push(wake(queue, Some(&i.to_string())));
    }
    // One write for everything: the reader must split frames itself.
    let mut bytes = Vec::new();
    for message in &expected {
        bytes.extend(message.encode().unwrap());
    }
    s.hub.send_raw(&bytes);
    for message in expected {
        let Message::Wake(wake) = message else {
            unreachable!()
        };
        assert_eq!(
            s.deliveries.recv_timeout(Duration::from_secs(5)),
            Some(Delivery::Wake(wake))
        );
    }
    assert!(!s.client.is_dead());
}

#[test]
fn a_frame_split_across_writes_is_reassembled() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let frame = wake("q", Some("split")).encode().unwrap();
    for byte in &frame {
        s.hub.send_raw(std::slice::from_ref(byte));
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        s.deliveries.recv_timeout(Duration::from_secs(5)),
        Some(Delivery::Wake(Wake::new("q", Some("split"))))
    );
}

#[test]
fn status_is_tracked_and_optimistic_before_the_first() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    assert!(s.client.hub_healthy(), "optimistic before any status");
    s.hub.send(&Message::Status { healthy: false });
    wait_for("unhealthy", || !s.client.hub_healthy());
    s.hub.send(&Message::Status { healthy: true });
    wait_for("healthy again", || s.client.hub_healthy());
    assert!(!s.client.is_dead(), "healthy:false is not death");
    s.hub.close_all();
    wait_for("dead", || s.client.is_dead());
    assert!(!s.client.hub_healthy(), "false once dead");
}

#[test]
fn no_ack_times_out_kills_the_client_and_later_calls_fail_fast() {
    let _serial = shared();
    let s = setup_with(never_ack(), Duration::from_millis(200));
    let started = Instant::now();
    let message = unavailable_message(s.client.ensure_listening("slow"));
    let waited = started.elapsed();
    assert_eq!(message, "master hub ack timeout for slow");
    assert!(message.contains("ack"));
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2));
    assert!(s.client.is_dead());
    assert!(!s.client.hub_healthy());
    let reason = s.client.dead_reason().unwrap();
    assert_eq!(reason, "sub ack for slow not received within 0.2s");
    assert_eq!(expect_one_failure(&s.deliveries), reason);

    let started = Instant::now();
    assert_eq!(
        unavailable_message(s.client.ensure_listening("next")),
        "master hub is unavailable: sub ack for slow not received within 0.2s"
    );
    assert!(started.elapsed() < Duration::from_millis(50), "not fast");
    // The warning names the reason and the fallback.
    let warned = s.logs.try_iter().any(|r| {
        r.level == Level::Warn
            && r.message
                == "[pgbus-hub] HubClient: sub ack for slow not received within 0.2s — falling back to a per-worker listener"
    });
    assert!(warned);
    // The hub sees EOF: the socket was shut down.
    s.hub.wait_no_connections();
}

#[test]
fn hub_closing_mid_wait_releases_waiters_and_fails_once() {
    let _serial = shared();
    let s = setup_with(never_ack(), Duration::from_secs(10));
    let waiters: Vec<_> = ["a", "b", "a"]
        .into_iter()
        .map(|q| {
            let client = Arc::clone(&s.client);
            thread::spawn(move || (q, client.ensure_listening(q)))
        })
        .collect();
    s.hub.wait_received(3);
    let started = Instant::now();
    s.hub.close_all();
    for waiter in waiters {
        let (queue, result) = waiter.join().unwrap();
        assert_eq!(
            unavailable_message(result),
            format!("master hub died while awaiting ack for {queue}")
        );
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(s.client.is_dead());
    assert_eq!(
        expect_one_failure(&s.deliveries),
        "master hub closed the transport"
    );
    // Stop after death: still no second Failed.
    s.client.stop();
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn oversize_announcement_kills_the_client_once() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    s.client.ensure_listening("q").unwrap();
    s.hub.send_raw(&[0x7f, 0xff, 0xff, 0xff]);
    let reason = expect_one_failure(&s.deliveries);
    assert!(
        reason.starts_with("master hub protocol error: frame too large"),
        "{reason}"
    );
    assert!(s.client.is_dead());
    assert_eq!(s.client.dead_reason(), Some(reason));
}

#[test]
fn garbage_and_bad_fields_from_the_hub_kill_the_client() {
    let _serial = shared();
    for bytes in [
        b"\x00\x00\x00\x05hello".to_vec(),
        b"\x00\x00\x00\x02[]".to_vec(),
        br#"{"t":"wake"}"#.to_vec(),
    ] {
        let s = setup(Behaviour::default());
        let framed = if bytes.starts_with(b"{") {
            let mut framed = (bytes.len() as u32).to_be_bytes().to_vec();
            framed.extend(&bytes);
            framed
        } else {
            bytes
        };
        s.hub.send_raw(&framed);
        let reason = expect_one_failure(&s.deliveries);
        assert!(
            reason.starts_with("master hub protocol error: malformed frame"),
            "{reason}"
        );
        assert!(s.client.is_dead());
    }
}

#[test]
fn hub_dying_mid_frame_is_a_transport_death() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let frame = wake("q", None).encode().unwrap();
    s.hub.send_raw(&frame[..frame.len() - 2]);
    thread::sleep(Duration::from_millis(50));
    s.hub.close_all();
    assert_eq!(
        expect_one_failure(&s.deliveries),
        "master hub closed the transport mid-frame"
    );
}

#[test]
fn unknown_frames_are_logged_and_ignored() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    let mut object = pgbus_hub_core::protocol::Object::new();
    object.insert("t".into(), "shiny".into());
    s.hub.send(&Message::Unknown(object));
    s.hub.send(&wake("q", None));
    assert_eq!(
        s.deliveries.recv_timeout(Duration::from_secs(5)),
        Some(Delivery::Wake(Wake::durable("q")))
    );
    let record = s.logs.try_iter().find(|r| r.level == Level::Warn).unwrap();
    assert_eq!(
        record.message,
        r#"[pgbus-hub] HubClient: hub sent unknown frame "shiny"; ignored"#
    );
    assert!(!s.client.is_dead());
}

#[test]
fn nack_rejects_that_waiter_only_and_the_client_lives() {
    let _serial = shared();
    let s = setup(Behaviour {
        nack_prefix: Some("bad".into()),
        ..Behaviour::default()
    });
    let error = s.client.ensure_listening("bad_queue").unwrap_err();
    assert_eq!(
        error,
        ClientError::Rejected {
            queue: "bad_queue".into(),
            reason: "queue name is not allowed".into()
        }
    );
    assert_eq!(
        error.to_string(),
        "master hub refused bad_queue: queue name is not allowed"
    );
    assert!(!s.client.is_dead());
    s.client.ensure_listening("good").expect("still usable");
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn remove_listening_writes_exactly_the_unsub_frame() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    s.client.remove_listening("pgbus_chat");
    s.hub.wait_received(1);
    let body = br#"{"t":"unsub","q":"pgbus_chat"}"#;
    let mut expected = (body.len() as u32).to_be_bytes().to_vec();
    expected.extend_from_slice(body);
    assert_eq!(s.hub.raw(), expected);
    assert_eq!(s.hub.received(), vec![Message::Unsub("pgbus_chat".into())]);
}

#[test]
fn remove_listening_on_a_dead_or_stopped_client_is_a_no_op() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    s.hub.close_all();
    wait_for("dead", || s.client.is_dead());
    let started = Instant::now();
    s.client.remove_listening("q");
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(
        expect_one_failure(&s.deliveries),
        "master hub closed the transport"
    );

    let s = setup(Behaviour::default());
    s.client.stop();
    s.client.remove_listening("q");
    assert!(s.hub.received().is_empty());
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

fn connect_error(path: &std::path::Path) -> String {
    match HubClient::connect_driven(ClientConfig::new(path)) {
        Err(ClientError::Unavailable(message)) => message,
        Err(other) => panic!("unexpected {other:?}"),
        Ok(_) => panic!("connected to {}", path.display()),
    }
}

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
    assert!(
        message.contains("must be shorter than 108 bytes"),
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
    // Queue connections until the kernel says the backlog is full (EAGAIN).
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
    let waiter = thread::spawn(move || client.ensure_listening("q"));
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
        unavailable_message(s.client.ensure_listening("q")),
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
    let writer = thread::spawn(move || client.remove_listening(&"q".repeat(3 << 20)));
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
    let message = unavailable_message(s.client.ensure_listening(&"q".repeat(3 << 20)));
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
    let error = s.client.ensure_listening(&"q".repeat(5 << 20)).unwrap_err();
    assert!(matches!(error, ClientError::Rejected { .. }));
    assert!(!s.client.is_dead());
    s.client.ensure_listening("q").unwrap();
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
    s.client.ensure_listening("before_fork").unwrap();
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
        match client.ensure_listening("from_child") {
            Err(ClientError::Unavailable(m))
                if m == "master hub client was inherited across fork; connect a new one" => {}
            _ => code |= 4,
        }
        if client.dead_reason().is_none() {
            code |= 8;
        }
        client.remove_listening("from_child");
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
    client
        .ensure_listening("after_fork")
        .expect("parent still works");
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

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Live test pump threads. Counting only ours: the test runner starts and
/// ends its own threads concurrently, so the process-wide count is not stable.
fn pump_thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == pump::THREAD_NAME)
        .count()
}

/// A pumped client, stopped (or dropped) at once.
fn connect_and_stop(hub: &StubHub, subscribe: bool, stop: bool) {
    let (client, reader) = HubClient::connect_driven(ClientConfig::new(hub.path())).unwrap();
    let pump = Pump::start(&Arc::new(reader));
    if subscribe {
        client.ensure_listening("q").unwrap();
    }
    if stop {
        client.stop();
    } // else: Drop stops it
    drop(client);
    // The pump sees `closed`, drops the reader (its eventfd) and ends.
    let deliveries = pump.join();
    assert_eq!(deliveries.try_recv().ok(), None, "stop sends nothing");
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
    wait_for("no pump outliving its client", || pump_thread_count() == 0);
    // No growth. (Fewer is fine: another test's leftovers may close meanwhile.)
    // Waited for: the stub hub's per-connection threads close their ends
    // just after the hub has forgotten the connection.
    wait_for("fds back to the baseline", || fd_count() <= fds);
    println!("leak check: fds {fds} -> {}, pump threads 0", fd_count());
}

// ---- The reading side itself: a client whose reader no thread pumps yet.

struct Driven {
    hub: StubHub,
    client: Arc<HubClient>,
    reader: Arc<DrivenReader>,
}

fn driven_with(behaviour: Behaviour, ack_timeout: Duration, log: LogSink) -> Driven {
    let hub = StubHub::start(behaviour);
    let config = ClientConfig {
        socket_path: hub.path().to_owned(),
        ack_timeout,
        log,
    };
    let (client, reader) = HubClient::connect_driven(config).expect("connect");
    hub.wait_connections(1);
    Driven {
        hub,
        client: Arc::new(client),
        reader: Arc::new(reader),
    }
}

fn driven(behaviour: Behaviour, ack_timeout: Duration) -> Driven {
    driven_with(behaviour, ack_timeout, LogSink::silent())
}

#[test]
fn driven_reader_resolves_acks_and_delivers_wakes_in_order() {
    let _serial = shared();
    let d = driven(Behaviour::default(), Duration::from_secs(2));
    let pump = Pump::start(&d.reader);
    d.client
        .ensure_listening("q")
        .expect("acked by the pump's read");
    let expected: Vec<Delivery> = (0..200)
        .map(|i| Delivery::Wake(Wake::new("q", (i % 2 == 1).then(|| format!("p{i}")))))
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
            d.client.ensure_listening(&format!("new_{i}")),
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
    d.client.ensure_listening("q").expect("acked");
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
