//! The master hub against the real local PostgreSQL and real Unix sockets.
//!
//! Tests take one lock so census counts (rows of `pg_stat_activity`) are not
//! disturbed by another test's hub. Skips (with a message) when no server answers.

mod support_pg;
mod support_wait;

use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::hub::{self, HubConfig, MasterHub};
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::protocol::{Decoder, Message, Wake};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use support_pg::database_url;
use support_wait::wait_until;

static SERIAL: Mutex<()> = Mutex::new(());

struct Fixture {
    _serial: MutexGuard<'static, ()>,
    url: String,
    dir: PathBuf,
    sql: postgres::Client,
    /// This fixture's hubs' application_name: the census counts only them
    /// (other tests and runs on the server have their own).
    tag: String,
}

impl Fixture {
    fn new() -> Option<Self> {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let url = database_url()?;
        let dir = std::env::temp_dir().join(format!(
            "pgbus-hub-test-{}-{:?}",
            std::process::id(),
            Instant::now()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        static FIXTURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let tag = format!(
            "pgbus-listen-{}-{}",
            std::process::id(),
            FIXTURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        Some(Self {
            _serial: serial,
            url,
            dir,
            sql,
            tag,
        })
    }

    fn config(&self, name: &str) -> HubConfig {
        HubConfig {
            listener: support_pg::listener_config(&self.url, &self.tag, LogSink::silent()),
            socket_path: self.dir.join(format!("{name}.sock")),
            status_interval: Duration::from_millis(200),
            durable_queue_limit: 256,
            hard_queue_limit: 1024,
            max_channels_per_connection: hub::DEFAULT_MAX_CHANNELS_PER_CONNECTION,
            max_channels: hub::DEFAULT_MAX_CHANNELS,
        }
    }

    fn notify(&mut self, queue: &str, payload: &str) {
        support_pg::notify(&mut self.sql, queue, payload);
    }

    fn census(&mut self) -> i64 {
        support_pg::census(&mut self.sql, &self.tag)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A worker as pgbus's HubClient behaves on the wire.
struct Peer {
    stream: UnixStream,
    decoder: Decoder,
}

impl Peer {
    fn connect(hub: &MasterHub) -> Self {
        let stream = UnixStream::connect(hub.socket_path()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Self {
            stream,
            decoder: Decoder::new(),
        }
    }

    fn send(&mut self, message: Message) {
        self.stream.write_all(&message.encode().unwrap()).unwrap();
    }

    /// The next frame, or None on EOF/reset/timeout.
    fn next(&mut self) -> Option<Message> {
        let mut buffer = [0u8; 65536];
        loop {
            if let Some(object) = self.decoder.next_frame().unwrap() {
                return Some(Message::from_object(object).unwrap());
            }
            match self.stream.read(&mut buffer) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.decoder.feed(&buffer[..n]),
            }
        }
    }

    /// Skips status frames; returns the next other frame.
    fn next_non_status(&mut self) -> Option<Message> {
        loop {
            match self.next()? {
                Message::Status { .. } => continue,
                other => return Some(other),
            }
        }
    }

    fn subscribe(&mut self, queue: &str) {
        self.send(Message::Sub(queue.into()));
        loop {
            match self.next_non_status() {
                Some(Message::Ack(q)) if q == queue => return,
                Some(Message::Wake(_)) => continue,
                other => panic!("expected ack for {queue}, got {other:?}"),
            }
        }
    }

    fn expect_wake(&mut self, queue: &str, payload: Option<&str>) {
        match self.next_non_status() {
            Some(Message::Wake(wake)) => {
                assert_eq!(wake, Wake::new(queue, payload));
            }
            other => panic!("expected a wake for {queue}, got {other:?}"),
        }
    }
}

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

impl Peer {
    /// Sends our `{"t":"stats"}` extension; returns the answer's `stats` object.
    fn ask_stats(&mut self) -> serde_json::Map<String, serde_json::Value> {
        self.send(Message::Stats(None));
        match self.next_non_status() {
            Some(Message::Stats(Some(stats))) => stats,
            other => panic!("expected a stats answer, got {other:?}"),
        }
    }
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

#[test]
fn bad_input_closes_only_that_connection() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("bad")).unwrap();
    let mut good = Peer::connect(&hub);
    good.subscribe("ok");
    let inputs: Vec<Vec<u8>> = vec![
        vec![0x00, 0x40, 0x00, 0x01],                // oversize announcement
        b"\x00\x00\x00\x05[1,2]".to_vec(),           // not an object
        b"\x00\x00\x00\x03{\"t".to_vec(),            // malformed JSON
        b"\x00\x00\x00\x0b{\"t\":\"sub\"}".to_vec(), // sub without q
        b"\x00\x00\x00\x00".to_vec(),                // zero length
    ];
    for bytes in inputs {
        let mut bad = Peer::connect(&hub);
        bad.stream.write_all(&bytes).unwrap();
        loop {
            match bad.next() {
                Some(Message::Status { .. }) => continue,
                None => break,
                other => panic!("bad peer got {other:?}"),
            }
        }
    }
    // An unknown t is ignored, the connection kept.
    let mut odd = Peer::connect(&hub);
    odd.stream
        .write_all(&{
            let mut object = serde_json::Map::new();
            object.insert("t".into(), "bogus".into());
            pgbus_hub_core::protocol::encode_object(&object).unwrap()
        })
        .unwrap();
    odd.subscribe("odd");
    fx.notify("ok", "fine");
    good.expect_wake("ok", Some("fine"));
}

#[test]
fn refused_queue_names_get_a_nack_not_an_ack() {
    let Some(fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("names")).unwrap();
    let mut peer = Peer::connect(&hub);
    peer.send(Message::Sub("".into()));
    assert!(matches!(peer.next_non_status(), Some(Message::Nack { .. })));
    let long = "n".repeat(64);
    peer.send(Message::Sub(long));
    assert!(matches!(peer.next_non_status(), Some(Message::Nack { .. })));
    assert_eq!(hub.stats().channels, 0);
    peer.subscribe("fine");
}

#[test]
fn during_an_outage_valid_subs_are_acked_at_once_refused_names_still_nacked() {
    let Some(fx) = Fixture::new() else { return };
    let mut config = fx.config("outage");
    // Nothing listens on port 1: the hub's database stays unreachable.
    config.listener.connection =
        ConnectionOptions::parse("host=127.0.0.1 port=1 user=nobody").unwrap();
    let hub = MasterHub::start(config).unwrap();
    let mut peer = Peer::connect(&hub);
    // pgbus's client gets no status until the first attempt failed; then `healthy: false`.
    assert!(matches!(
        peer.next(),
        Some(Message::Status { healthy: false })
    ));
    for queue in ["first", "second"] {
        let started = Instant::now();
        peer.subscribe(queue); // acked without a LISTEN: it runs on reconnect
                               // Far below pgbus's ack budget (health check + 2 s): no fail-over.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    peer.send(Message::Sub("n".repeat(64)));
    assert!(matches!(peer.next_non_status(), Some(Message::Nack { .. })));
    let stats = hub.stats();
    assert!(!stats.listener_healthy);
    assert_eq!(
        (stats.workers, stats.channels),
        (1, 2),
        "both subs kept for the reconnect"
    );
}

#[test]
fn socket_rules_private_mode_stale_replacement_and_refusals() {
    use std::os::unix::fs::PermissionsExt;
    let Some(fx) = Fixture::new() else { return };
    let config = fx.config("rules");
    let path = config.socket_path.clone();
    std::fs::write(&path, "not a socket").unwrap();
    let refused = MasterHub::start(config.clone())
        .err()
        .expect("refuses a regular file");
    assert!(refused.contains("not a socket"), "{refused}");
    std::fs::remove_file(&path).unwrap();

    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // a stale socket
    let mut hub = MasterHub::start(config.clone()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let busy = MasterHub::start(config.clone())
        .err()
        .expect("refuses a live socket");
    assert!(busy.contains("already serving"), "{busy}");
    hub.stop();
    hub.stop();
    assert!(!path.exists(), "stop unlinks its socket");

    let mut long = config;
    long.socket_path = fx.dir.join("x".repeat(120));
    let too_long = MasterHub::start(long).err().expect("path too long");
    assert!(too_long.contains("bytes"), "{too_long}");
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(fx) = Fixture::new() else { return };
    let ruby = std::path::Path::new("/usr/bin/ruby");
    if unsafe { libc::geteuid() } != 0
        || !ruby.exists()
        || std::process::Command::new("setpriv")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("skipping: needs root, setpriv and /usr/bin/ruby to run a peer as another uid");
        return;
    }
    let hub = MasterHub::start(fx.config("uid")).unwrap();
    // Loosen the mode only so the other uid can reach the peer check at all.
    std::fs::set_permissions(&fx.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(hub.socket_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = format!(
        "require 'socket'; s = UNIXSocket.new({:?}); puts((s.read(100) || '').bytesize)",
        hub.socket_path().display().to_string()
    );
    let output = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/ruby",
            "-e",
            &script,
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "0",
        "refused peer reads EOF, no status"
    );
    assert_eq!(hub.stats().rejected_peers, 1);
    let mut own = Peer::connect(&hub);
    own.subscribe("still-served");
}

#[test]
fn a_forked_child_leaves_the_hub_alone() {
    let Some(mut fx) = Fixture::new() else { return };
    let mut hub = MasterHub::start(fx.config("fork")).unwrap();
    let mut peer = Peer::connect(&hub);
    peer.subscribe("forked");
    let child = unsafe { libc::fork() };
    if child == 0 {
        // The child: every entry point must be inert, and drop must not stop the parent's hub.
        let ok = !hub.is_running() && {
            hub.stop();
            true
        };
        drop(hub);
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    assert!(hub.is_running());
    assert!(hub.socket_path().exists());
    fx.notify("forked", "parent still serves");
    peer.expect_wake("forked", Some("parent still serves"));
    hub.stop();
    assert!(!hub.is_running());
}

fn process_threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sub-ack and fan-out latency are `rake bench` figures (2 and 3), measured
/// against baselines in the same run; here only what must hold on any machine.
#[test]
fn the_hubs_threads_do_not_grow_with_workers() {
    let Some(mut fx) = Fixture::new() else { return };
    let before = process_threads();
    let hub = MasterHub::start(fx.config("threads")).unwrap();
    let mut peers = vec![Peer::connect(&hub)];
    peers[0].subscribe("fan");
    let with_one = process_threads() - before;
    peers.extend((1..32).map(|_| Peer::connect(&hub)));
    for peer in peers.iter_mut().skip(1) {
        peer.subscribe("fan");
    }
    fx.notify("fan", "all");
    for peer in &mut peers {
        peer.expect_wake("fan", Some("all"));
    }
    let with_32 = process_threads() - before;
    // 32 connections, all from this one process.
    assert_eq!((hub.stats().workers, hub.stats().worker_processes), (32, 1));
    assert_eq!(
        with_one, with_32,
        "the hub's thread count does not grow with workers"
    );
    assert_eq!(hub.stats().threads, 1);
}

#[test]
fn an_ended_engine_is_restarted_and_relistens_every_channel() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("restart")).unwrap();
    let mut peer = Peer::connect(&hub);
    for queue in ["r1", "r2", "r3"] {
        peer.subscribe(queue);
    }
    let before = hub.stats().backend.expect("the hub's backend").pid;
    hub.end_engine();
    wait_until("the engine restarted and healthy", || {
        let stats = hub.stats();
        stats.listener_restarts == 1
            && stats.listener_healthy
            && stats.backend.is_some_and(|b| b.pid != before)
    });
    for queue in ["r1", "r2", "r3"] {
        fx.notify(queue, "after restart");
        peer.expect_wake(queue, Some("after restart"));
    }
    // The ended engine's connection is closed: still one per host.
    wait_until("census 1", || fx.census() == 1);
    assert_eq!(hub.stats().channels, 3);
}

/// Raw channels (ActionCable's) beside pgbus's queues, over the one LISTEN
/// connection: `listen`/`notify` frames, verbatim payloads (empty stays empty).
#[test]
fn raw_channels_and_queues_share_one_connection() {
    let Some(mut fx) = Fixture::new() else { return };
    let hub = MasterHub::start(fx.config("raw")).unwrap();
    let mut cable = Peer::connect(&hub);
    let mut streams = Peer::connect(&hub);
    streams.subscribe("orders");
    let room = "cable_room:42";
    let frame = |json: &str| {
        let mut bytes = (json.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes
    };
    cable
        .stream
        .write_all(&frame(&format!(r#"{{"t":"listen","c":"{room}"}}"#)))
        .unwrap();
    let ack = cable.next_non_status().expect("an ack");
    assert_eq!(
        ack.encode().unwrap(),
        frame(&format!(r#"{{"t":"ack","c":"{room}"}}"#))
    );
    fx.sql
        .execute("select pg_notify($1, $2)", &[&room, &"<p>hi</p>"])
        .unwrap();
    fx.sql
        .execute("select pg_notify($1, '')", &[&room])
        .unwrap();
    fx.notify("orders", "");
    for payload in ["<p>hi</p>", ""] {
        let wake = cable.next_non_status().expect("a notify");
        assert_eq!(
            wake.encode().unwrap(),
            frame(&format!(r#"{{"t":"notify","c":"{room}","p":"{payload}"}}"#))
        );
    }
    streams.expect_wake("orders", None);
    assert_eq!(fx.census(), 1);

    // A raw channel in the queues' namespace is refused by name, the peer kept.
    cable
        .stream
        .write_all(&frame(r#"{"t":"listen","c":"pgmq.q_orders.INSERT"}"#))
        .unwrap();
    let nack = cable.next_non_status().expect("a nack");
    let Message::Nack { reason, .. } = &nack else {
        panic!("expected a nack, got {nack:?}")
    };
    assert!(reason.contains("is a queue's channel"), "{reason}");
    let encoded = String::from_utf8(nack.encode().unwrap()[4..].to_vec()).unwrap();
    assert!(
        encoded.starts_with(r#"{"t":"nack","c":"pgmq.q_orders.INSERT","reason":"#),
        "{encoded}"
    );
    cable
        .stream
        .write_all(&frame(&format!(r#"{{"t":"unlisten","c":"{room}"}}"#)))
        .unwrap();
    wait_until("raw channel unlistened", || hub.stats().channels == 1);
}

/// A payload past NOTIFY's 8000-byte limit, stored by its broadcaster: the
/// hub reads the row once and every subscriber gets the whole payload, in order.
#[test]
fn a_large_payload_is_read_once_and_fanned_out_in_order() {
    use pgbus_hub_core::protocol::{
        large_payload_ddl, large_payload_insert, LARGE_PAYLOAD_MARK, LARGE_PAYLOAD_TABLE,
    };
    let Some(mut fx) = Fixture::new() else { return };
    fx.sql.batch_execute(&large_payload_ddl()).unwrap();
    let hub = MasterHub::start(fx.config("large")).unwrap();
    let channel = format!("cable_large_{}", std::process::id());
    let mut peers: Vec<Peer> = (0..3).map(|_| Peer::connect(&hub)).collect();
    for peer in &mut peers {
        peer.send(Message::Sub(pgbus_hub_core::protocol::channel_key(
            &channel,
        )));
        assert!(matches!(peer.next_non_status(), Some(Message::Ack(_))));
    }
    let large = "x".repeat(100 * 1024);
    let id: i64 = fx
        .sql
        .query_one(&large_payload_insert(), &[&large])
        .unwrap()
        .get(0);
    for payload in [
        format!("{LARGE_PAYLOAD_MARK}{id}"),
        format!("{LARGE_PAYLOAD_MARK}-1"),
        "after".into(),
    ] {
        fx.sql
            .execute("select pg_notify($1, $2)", &[&channel, &payload])
            .unwrap();
    }
    for peer in &mut peers {
        for expected in [large.as_str(), "after"] {
            match peer.next_non_status() {
                Some(Message::Wake(wake)) => assert_eq!(wake.payload.as_deref(), Some(expected)),
                other => panic!("expected a notify, got {other:?}"),
            }
        }
    }
    fx.sql
        .execute(
            &format!("DELETE FROM {LARGE_PAYLOAD_TABLE} WHERE id = $1"),
            &[&id],
        )
        .unwrap();
}
