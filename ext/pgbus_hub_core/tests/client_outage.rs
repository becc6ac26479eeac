//! HubClient while the hub reports its database connection down
//! (`status{healthy:false}`): subs return `AfterReconnect` within the grace
//! period instead of waiting out `ack_timeout`, the client stays alive (no
//! fail-over), waiters already pending are released at the status flip, and
//! the worker logs one WARN per outage.

mod support_hub;
mod support_os;
mod support_wait;

use pgbus_hub_core::client::{ClientConfig, HubClient, Listening, UNHEALTHY_ACK_GRACE};
use pgbus_hub_core::delivery::Delivery;
use pgbus_hub_core::log::{Level, LogSink};
use pgbus_hub_core::protocol::Message;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use support_hub::pump::Pump;
use support_hub::{AckMode, Behaviour, StubHub};
use support_wait::wait_until;

/// Far above the grace period, so a test that waited it out would show.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn subs_during_an_outage_return_after_reconnect_promptly_and_the_client_stays() {
    let hub = StubHub::start(Behaviour {
        ack: AckMode::Never,
        ..Behaviour::default()
    });
    let (log, logs) = LogSink::channel();
    let config = ClientConfig {
        socket_path: hub.path().to_owned(),
        ack_timeout: ACK_TIMEOUT,
        log,
        drops: Default::default(),
    };
    let (client, reader) = HubClient::connect_driven(config).expect("connect");
    let (client, deliveries) = (Arc::new(client), Pump::start(&Arc::new(reader)));
    hub.wait_connections(1);

    // A sub waiting for its ack when the hub's database goes away is released at the flip.
    let waiting = {
        let client = Arc::clone(&client);
        thread::spawn(move || {
            let started = Instant::now();
            (client.subscribe("before"), started.elapsed())
        })
    };
    hub.wait_received(1);
    hub.send(&Message::Status { healthy: false });
    let (result, waited) = waiting.join().expect("waiter");
    assert_eq!(result.expect("not an error"), Listening::AfterReconnect);
    assert!(waited < ACK_TIMEOUT / 2, "waited {waited:?}");
    wait_until("the unhealthy status", || !client.hub_healthy());

    // While unhealthy: at most the grace period per sub, never dead.
    for i in 0..5 {
        let started = Instant::now();
        let result = client.subscribe(&format!("during_{i}"));
        assert_eq!(result.expect("not an error"), Listening::AfterReconnect);
        assert!(started.elapsed() < UNHEALTHY_ACK_GRACE + Duration::from_millis(500));
    }
    // Our hub acks a sub at once during an outage: after `healthy: false`
    // an ack means "LISTENed on reconnect", not "listening now".
    let acked_in_outage = {
        let client = Arc::clone(&client);
        thread::spawn(move || client.subscribe("acked_in_outage"))
    };
    hub.wait_received(7);
    hub.send(&Message::Ack("acked_in_outage".into()));
    assert_eq!(
        acked_in_outage
            .join()
            .expect("waiter")
            .expect("not an error"),
        Listening::AfterReconnect
    );
    assert!(!client.is_dead());
    assert_eq!(
        hub.subs().len(),
        7,
        "every sub reached the hub, which keeps it"
    );
    assert!(
        deliveries.recv_timeout(Duration::ZERO).is_none(),
        "no Failed delivery: no fail-over"
    );

    // Healthy again: subs are acked as usual, late acks for the earlier subs are ignored.
    hub.send(&Message::Status { healthy: true });
    wait_until("the healthy status", || client.hub_healthy());
    for queue in ["before", "during_0"] {
        hub.send(&Message::Ack(queue.into()));
    }
    let acker = {
        let client = Arc::clone(&client);
        thread::spawn(move || client.subscribe("after"))
    };
    hub.wait_received(8);
    hub.send(&Message::Ack("after".into()));
    assert_eq!(
        acker.join().expect("acker").expect("acked"),
        Listening::Active
    );

    let warns: Vec<String> = logs
        .try_iter()
        .filter(|r| r.level == Level::Warn)
        .map(|r| r.message)
        .collect();
    assert_eq!(warns.len(), 1, "one WARN per outage: {warns:?}");
    assert!(warns[0].contains("database connection down"), "{warns:?}");
    match deliveries.recv_timeout(Duration::ZERO) {
        None => {}
        Some(Delivery::Failed { reason }) => panic!("failed over: {reason}"),
        Some(other) => panic!("unexpected delivery {other:?}"),
    }
    client.stop();
}

#[test]
fn a_hub_that_is_healthy_but_silent_still_times_out_and_fails_over() {
    let hub = StubHub::start(Behaviour {
        ack: AckMode::Never,
        ..Behaviour::default()
    });
    let (log, _logs) = LogSink::channel();
    let config = ClientConfig {
        socket_path: hub.path().to_owned(),
        ack_timeout: Duration::from_millis(300),
        log,
        drops: Default::default(),
    };
    let (client, reader) = HubClient::connect_driven(config).expect("connect");
    let deliveries = Pump::start(&Arc::new(reader));
    hub.wait_connections(1);
    assert!(client.subscribe("q").is_err());
    assert!(client.is_dead());
    assert!(matches!(
        deliveries.recv_timeout(Duration::from_secs(2)),
        Some(Delivery::Failed { .. })
    ));
}
