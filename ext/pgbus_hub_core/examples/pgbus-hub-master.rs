//! A master hub without Ruby, for Rust users and manual testing:
//!
//!     cargo run -p pgbus-hub-core --example pgbus-hub-master -- \
//!         "host=/var/run/postgresql dbname=pgbus_hub_test" /tmp/hub.sock
//!
//! Serves until standard input closes (Ctrl-D), then stops cleanly. Log lines go to stderr.

use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::hub::{
    HubConfig, MasterHub, DEFAULT_DURABLE_QUEUE_LIMIT, DEFAULT_HARD_QUEUE_LIMIT,
    DEFAULT_MAX_CHANNELS, DEFAULT_MAX_CHANNELS_PER_CONNECTION,
};
use pgbus_hub_core::listener::ListenerConfig;
use pgbus_hub_core::log::LogSink;
use std::io::Read;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [connection, socket_path] = args.as_slice() else {
        eprintln!("usage: pgbus-hub-master CONNECTION SOCKET_PATH");
        std::process::exit(2);
    };
    let connection = ConnectionOptions::parse(connection).unwrap_or_else(|e| {
        eprintln!("pgbus-hub-master: {e}");
        std::process::exit(2)
    });
    let (log, records) = LogSink::channel();
    std::thread::spawn(move || {
        for record in records {
            eprintln!("[{:?}] {}", record.level, record.message);
        }
    });
    let config = HubConfig {
        listener: ListenerConfig::new(connection, log),
        socket_path: socket_path.into(),
        status_interval: Duration::from_secs(1),
        durable_queue_limit: DEFAULT_DURABLE_QUEUE_LIMIT,
        hard_queue_limit: DEFAULT_HARD_QUEUE_LIMIT,
        max_channels_per_connection: DEFAULT_MAX_CHANNELS_PER_CONNECTION,
        max_channels: DEFAULT_MAX_CHANNELS,
        metrics: None,
    };
    let mut hub = MasterHub::start(config).unwrap_or_else(|e| {
        eprintln!("pgbus-hub-master: {e}");
        std::process::exit(1)
    });
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    eprintln!("{:?}", hub.stats());
    hub.stop();
}
