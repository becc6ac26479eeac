// Shared by hub_pg.rs and hub_pg_faults.rs (include!d: items, no mods).
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
            metrics: None,
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

fn process_threads() -> usize {
    support_os::process_threads().expect("this OS tells a process its thread count")
}
