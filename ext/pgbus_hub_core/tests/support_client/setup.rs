// Shared by client.rs and client_failures.rs (include!d: items, no mods).
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
            Some(
                Delivery::Wake { .. }
                | Delivery::Listening { .. }
                | Delivery::Marker { .. }
                | Delivery::Move { .. },
            ) => continue,
            None => panic!("no Delivery::Failed within 5 s"),
        }
    };
    assert_eq!(deliveries.recv_timeout(Duration::from_millis(200)), None);
    reason
}


fn connect_error(path: &std::path::Path) -> String {
    match HubClient::connect_driven(ClientConfig::new(path)) {
        Err(ClientError::Unavailable(message)) => message,
        Err(other) => panic!("unexpected {other:?}"),
        Ok(_) => panic!("connected to {}", path.display()),
    }
}

fn fd_count() -> usize {
    support_os::open_fds()
}

/// Live test pump threads (None: the OS does not list thread names). Counting
/// only ours: the test runner starts and ends its own threads concurrently,
/// so the process-wide count is not stable.
fn pump_thread_count() -> Option<usize> {
    support_os::threads_named(pump::THREAD_NAME)
}

/// A pumped client, stopped (or dropped) at once.
fn connect_and_stop(hub: &StubHub, subscribe: bool, stop: bool) {
    let (client, reader) = HubClient::connect_driven(ClientConfig::new(hub.path())).unwrap();
    let pump = Pump::start(&Arc::new(reader));
    if subscribe {
        client.subscribe("q").unwrap();
    }
    if stop {
        client.stop();
    } // else: Drop stops it
    drop(client);
    // The pump sees `closed`, drops the reader (its eventfd) and ends.
    let deliveries = pump.join();
    assert_eq!(deliveries.try_recv().ok(), None, "stop sends nothing");
}

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
        drops: Default::default(),
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
