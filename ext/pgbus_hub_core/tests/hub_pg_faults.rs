//! Continued from hub_pg.rs (split for size): bad input, refused names, outages, socket rules,
//! peers of another uid, fork, thread count, engine restart, raw channels, large payloads.
//!
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
    // A `marker` request (a worker failing back) is committed on the
    // private channel it names, and the connection kept.
    odd.send(Message::Marker(pgbus_hub_core::protocol::Marker::Commit {
        channel: "pgbus_hub.handover.1.2".into(),
        token: "move.1.2.3".into(),
    }));
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
    // Nothing listened between the two engines: a reconnect's catch-up first.
    for queue in ["r1", "r2", "r3"] {
        peer.expect_wake(queue, None);
    }
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
