//! HubClient against a stub hub: real Unix sockets, real threads, a real fork.
//! A test thread plays the embedder's pump (it reads the socket for the client).

#![allow(dead_code, unused_imports)]

mod support_hub;
mod support_os;
mod support_wait;

include!("support_client/setup.rs");

#[test]
fn ensure_listening_blocks_until_the_hub_acks() {
    let _serial = shared();
    let delay = Duration::from_millis(300);
    let s = setup(Behaviour {
        ack: AckMode::Delay(delay),
        ..Behaviour::default()
    });
    let started = Instant::now();
    s.client.subscribe("pgbus_chat").expect("acked");
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
        thread::spawn(move || client.subscribe("q"))
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
                        .subscribe(&format!("q{}", (t * 7 + i) % 5))
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
    s.client.subscribe("chat").unwrap();
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
    let message = unavailable_message(s.client.subscribe("slow"));
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
        unavailable_message(s.client.subscribe("next")),
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
            thread::spawn(move || (q, client.subscribe(q)))
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
    s.client.subscribe("q").unwrap();
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

/// A sub cut part-way through its frame, against a stub hub that reads
/// nothing until [`start_reading`] (then it acks every sub).
struct CutSub {
    s: Setup,
    /// Its frame is larger than any socket buffer (and under the 4 MiB limit).
    queue: String,
    cancel: crossbeam_channel::Sender<()>,
    cancelled: crossbeam_channel::Receiver<()>,
}

/// The cancel is pending before the write, which sees it at the first full
/// socket buffer: part-way through the frame, as when Ruby's unblock function
/// fires there. The caller gets `Interrupted`; the client lives on.
fn cut_sub() -> CutSub {
    let s = setup_with(
        Behaviour {
            never_read: true,
            ..Behaviour::default()
        },
        Duration::from_secs(30),
    );
    let queue = "q".repeat(3 << 20);
    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    cancel.send(()).unwrap();
    assert_eq!(
        s.client.subscribe_or_cancel(&queue, &cancelled),
        Ok(Listening::Interrupted)
    );
    assert!(!s.client.is_dead(), "{:?}", s.client.dead_reason());
    CutSub {
        s,
        queue,
        cancel,
        cancelled,
    }
}

fn start_reading(s: &Setup) {
    s.hub.set_behaviour(Behaviour::default());
}

fn subscribe_in_thread(
    client: &Arc<HubClient>,
    queue: &str,
) -> thread::JoinHandle<Result<Listening, ClientError>> {
    let (client, queue) = (Arc::clone(client), queue.to_owned());
    thread::spawn(move || client.subscribe(&queue))
}

#[test]
fn a_sub_cancelled_part_way_through_its_frame_is_finished_by_the_next_sub_of_its_queue() {
    let _serial = shared();
    let CutSub { s, queue, .. } = cut_sub();
    // Called again (as the binding does after an unblock with nothing pending):
    // it finishes the frame, and the hub's ack for it answers this call.
    let resumed = subscribe_in_thread(&s.client, &queue);
    start_reading(&s);
    assert_eq!(resumed.join().unwrap(), Ok(Listening::Active));
    // One whole sub, no second one: the next frame is this unsub.
    s.client.unsubscribe("marker");
    s.hub.wait_received(2);
    assert_eq!(
        s.hub.received(),
        vec![Message::Sub(queue.clone()), Message::Unsub("marker".into())]
    );
    let mut wire = Message::Sub(queue).encode().unwrap();
    wire.extend(Message::Unsub("marker".into()).encode().unwrap());
    assert!(
        s.hub.raw() == wire,
        "the bytes on the wire are not exactly the two frames"
    );
    assert!(!s.client.is_dead());
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn a_frame_cut_part_way_goes_out_whole_before_another_queues_sub() {
    let _serial = shared();
    let CutSub {
        s,
        queue,
        cancel,
        cancelled,
    } = cut_sub();
    // Cancelled again while the tail waits for room: nothing of "other" goes out.
    cancel.send(()).unwrap();
    assert_eq!(
        s.client.subscribe_or_cancel("other", &cancelled),
        Ok(Listening::Interrupted)
    );
    assert!(!s.client.is_dead(), "{:?}", s.client.dead_reason());

    let other = subscribe_in_thread(&s.client, "other");
    start_reading(&s);
    assert_eq!(other.join().unwrap(), Ok(Listening::Active));
    assert_eq!(s.hub.subs(), vec![queue.clone(), "other".to_owned()]);
    // The cut sub's waiter went when another write finished its frame (its
    // caller waits for nothing): the next sub of its queue sends its own.
    assert_eq!(s.client.subscribe(&queue), Ok(Listening::Active));
    assert_eq!(s.hub.subs(), vec![queue.clone(), "other".to_owned(), queue]);
    assert!(!s.client.is_dead());
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
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

/// Issue 56's frames: a planned stop's `move` and its `marker` are
/// deliveries in stream order among the wakes (the FailoverListener acts on
/// them); a `move` to another hub (`to`), not acted on yet, is logged and
/// ignored as an unknown frame. The client stays alive either way.
#[test]
fn move_and_marker_frames_are_delivered_in_order_and_a_move_elsewhere_is_ignored() {
    use pgbus_hub_core::protocol::{Marker, Move};
    let _serial = shared();
    let s = setup(Behaviour::default());
    let leave = |to: Option<&str>| {
        Message::Move(Move::Leave {
            channel: "pgbus_hub.handover.1.2".into(),
            token: "move.1.2.3".into(),
            to: to.map(str::to_owned),
        })
    };
    s.hub.send(&leave(Some("/elsewhere.sock")));
    s.hub.send(&wake("q", None));
    s.hub.send(&leave(None));
    s.hub.send(&Message::Marker(Marker::Read {
        token: "move.1.2.3".into(),
    }));
    let deliveries: Vec<Delivery> = (0..3)
        .map(|_| s.deliveries.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(
        deliveries,
        [
            Delivery::Wake(Wake::durable("q")),
            Delivery::Move {
                channel: "pgbus_hub.handover.1.2".into(),
                token: "move.1.2.3".into()
            },
            Delivery::Marker {
                token: "move.1.2.3".into()
            },
        ]
    );
    let warnings: Vec<String> = s
        .logs
        .try_iter()
        .filter(|r| r.level == Level::Warn)
        .map(|r| r.message)
        .collect();
    assert_eq!(
        warnings,
        [r#"[pgbus-hub] HubClient: hub sent unknown frame "move"; ignored"#]
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
    let error = s.client.subscribe("bad_queue").unwrap_err();
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
    s.client.subscribe("good").expect("still usable");
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn remove_listening_writes_exactly_the_unsub_frame() {
    let _serial = shared();
    let s = setup(Behaviour::default());
    s.client.unsubscribe("pgbus_chat");
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
    s.client.unsubscribe("q");
    assert!(started.elapsed() < Duration::from_millis(50));
    assert_eq!(
        expect_one_failure(&s.deliveries),
        "master hub closed the transport"
    );

    let s = setup(Behaviour::default());
    s.client.stop();
    s.client.unsubscribe("q");
    assert!(s.hub.received().is_empty());
    assert_eq!(s.deliveries.recv_timeout(Duration::from_millis(100)), None);
}
