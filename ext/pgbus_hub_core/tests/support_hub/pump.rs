//! The embedder's pump thread, played by a test thread: it calls a
//! [`DrivenReader`]'s `next_batch` until `closed` (which is also what
//! resolves the client's acks) and forwards every delivery in order.

use pgbus_hub_core::client::{ClientConfig, DrivenReader, HubClient};
use pgbus_hub_core::delivery::{Delivery, WakeSource};
use pgbus_hub_core::log::LogSink;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The pump thread's name (what `support_os::threads_named` counts).
pub const THREAD_NAME: &str = "test-pump";

pub struct Pump {
    deliveries: crossbeam_channel::Receiver<Delivery>,
    thread: JoinHandle<()>,
}

/// A worker's client of the hub at `socket_path`, its deliveries pumped
/// by a test thread; it waits `ack_timeout` for an ack (as pgbus's would).
pub fn driven_client(
    socket_path: &std::path::Path,
    ack_timeout: Duration,
) -> (Arc<HubClient>, Pump) {
    let (client, reader) = HubClient::connect_driven(ClientConfig {
        socket_path: socket_path.to_owned(),
        ack_timeout,
        log: LogSink::silent(),
        drops: Default::default(),
    })
    .expect("connect");
    (Arc::new(client), Pump::start(&Arc::new(reader)))
}

impl Pump {
    pub fn start(reader: &Arc<DrivenReader>) -> Self {
        let (sender, deliveries) = crossbeam_channel::unbounded();
        let reader = Arc::clone(reader);
        let thread = thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || loop {
                let batch = reader.next_batch(64, Duration::from_millis(500));
                for item in batch.items {
                    let _ = sender.send(item);
                }
                if batch.closed {
                    return;
                }
            })
            .expect("spawn the pump");
        Self { deliveries, thread }
    }

    pub fn recv_timeout(&self, timeout: Duration) -> Option<Delivery> {
        self.deliveries.recv_timeout(timeout).ok()
    }

    /// Waits for the pump to see `closed` (the client stopped or died, and
    /// everything it delivered was forwarded).
    pub fn join(self) -> crossbeam_channel::Receiver<Delivery> {
        self.thread.join().expect("the pump panicked");
        self.deliveries
    }
}
