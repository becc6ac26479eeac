//! The test database and the two probes the PostgreSQL tests share: a
//! NOTIFY on a queue's channel, and the census of one tag's connections;
//! and the listener configuration their fixtures start with.

#![allow(dead_code)]

use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::listener::ListenerConfig;
use pgbus_hub_core::log::LogSink;
use std::time::Duration;

/// A listener on `url` whose connections carry `tag` as application_name
/// (the census counts them), on pgmq's channels, with a 100 ms health check
/// (short, so outages and reconnects show within a test's waits).
pub fn listener_config(url: &str, tag: &str, log: LogSink) -> ListenerConfig {
    ListenerConfig {
        connection: ConnectionOptions::parse(url)
            .unwrap()
            .with_application_name(tag),
        health_check: Duration::from_millis(100),
        channel_prefix: "pgmq.q_".into(),
        channel_suffix: ".INSERT".into(),
        standby: false,
        log,
    }
}

/// Set to 1 on a machine without PostgreSQL to let the tests that need it
/// skip. Unset, a missing server fails them: `cargo test` must never pass by
/// testing nothing. `rake test` and `.ci/run` never set it.
pub const SKIP_VARIABLE: &str = "PGBUS_HUB_SKIP_PG_TESTS";

/// The run's database (`rake test` sets PGBUS_HUB_TEST_DATABASE_URL to one
/// of its own), else the default socket's; None (the test skips) only when
/// it does not answer and [`SKIP_VARIABLE`] allows skipping.
pub fn database_url() -> Option<String> {
    let configured = configured_database_url();
    let url = configured.clone().unwrap_or_else(default_database_url);
    match postgres::Client::connect(&url, postgres::NoTls) {
        Ok(_) => Some(url),
        Err(e) => skip_or_fail(
            configured.is_some(),
            &format!("no PostgreSQL at {url} ({e})"),
        ),
    }
}

/// Where the tests look when nothing is configured (bin/setup creates it).
pub fn default_database_url() -> String {
    "host=/var/run/postgresql dbname=pgbus_hub_test".into()
}

/// PGBUS_HUB_TEST_DATABASE_URL, else DATABASE_URL, when either is set.
pub fn configured_database_url() -> Option<String> {
    std::env::var("PGBUS_HUB_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
}

/// None after saying why the test skips, when [`SKIP_VARIABLE`] is 1 and no
/// database was configured for the run; otherwise a panic.
pub fn skip_or_fail<T>(configured: bool, why: &str) -> Option<T> {
    assert!(
        !configured,
        "{why} (configured for this run, so this is a failure, not a skip)"
    );
    assert!(
        skipping_allowed(),
        "{why}; set {SKIP_VARIABLE}=1 to skip the PostgreSQL tests on a machine without a server"
    );
    eprintln!("skipping ({SKIP_VARIABLE}=1): {why}");
    None
}

pub fn skipping_allowed() -> bool {
    std::env::var(SKIP_VARIABLE).is_ok_and(|value| value == "1")
}

/// NOTIFY on pgmq's channel for `queue`.
pub fn notify(sql: &mut postgres::Client, queue: &str, payload: &str) {
    sql.execute(
        "select pg_notify($1, $2)",
        &[&format!("pgmq.q_{queue}.INSERT"), &payload],
    )
    .unwrap();
}

/// Connections whose application_name is `tag` (a test's own).
pub fn census(sql: &mut postgres::Client, tag: &str) -> i64 {
    sql.query_one(
        "select count(*) from pg_stat_activity where application_name = $1",
        &[&tag],
    )
    .unwrap()
    .get(0)
}

/// A TCP proxy in front of the test server that can be frozen: while frozen
/// it forwards nothing either way (the server looks hung, the connection
/// stays open: packets dropped, no RST), until thawed. For tests that need a
/// stop to be slow, or a database path that black-holes. A close crosses it
/// like the bytes before it, once thawed.
pub struct FreezableProxy {
    pub url: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Each connection's own freeze (see [`Self::freeze_existing`]).
    flows: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>>>,
}

impl FreezableProxy {
    /// Listens on 127.0.0.1 (any port) and forwards each connection to the server `url` names.
    pub fn start(url: &str) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        use tokio_postgres::config::Host;
        let options = ConnectionOptions::parse(url).unwrap();
        let config = options.config();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let upstream = match config.get_hosts().first() {
            Some(Host::Unix(dir)) => Upstream::Unix(dir.join(format!(".s.PGSQL.{port}"))),
            Some(Host::Tcp(host)) => Upstream::Tcp(format!("{host}:{port}")),
            None => panic!("{url} names no host"),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut keywords = format!(
            "host=127.0.0.1 port={} dbname={} user={}",
            listener.local_addr().unwrap().port(),
            config.get_dbname().unwrap_or("postgres"),
            config.get_user().unwrap_or("postgres"),
        );
        if let Some(password) = config.get_password() {
            keywords += &format!(" password={}", String::from_utf8_lossy(password));
        }
        let frozen = Arc::new(AtomicBool::new(false));
        let flows = Arc::new(Mutex::new(Vec::new()));
        let (proxy_frozen, proxy_flows) = (frozen.clone(), flows.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (to_server, from_server, server_closer) = upstream.connect();
                let client_reader = client.try_clone().unwrap();
                let client_closer = client.try_clone().unwrap();
                let flow = Arc::new(AtomicBool::new(false));
                proxy_flows.lock().unwrap().push(flow.clone());
                let all = proxy_frozen.clone();
                let held = move || all.load(Ordering::SeqCst) || flow.load(Ordering::SeqCst);
                // Either side's close reaches the other (a terminated
                // backend's FIN, a severed client's), as through a real
                // network, not a socket the other direction's copy keeps open.
                forward(client_reader, to_server, held.clone(), server_closer);
                forward(from_server, client, held, move || {
                    let _ = client_closer.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self {
            url: keywords,
            frozen,
            flows,
        }
    }

    pub fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Freezes the connections open now; new ones pass (a NAT or firewall
    /// entry lost for the existing flows, the path itself fine).
    pub fn freeze_existing(&self) {
        for flow in self.flows.lock().unwrap().iter() {
            flow.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Forwards again, what it held first: the path was a black hole, not a
    /// reset (no connection through it was closed meanwhile).
    pub fn thaw(&self) {
        for flow in self.flows.lock().unwrap().iter() {
            flow.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        self.frozen
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

enum Upstream {
    Unix(std::path::PathBuf),
    Tcp(String),
}

/// Shuts a stream down both ways (every copy of it).
type Closer = Box<dyn FnOnce() + Send>;

impl Upstream {
    /// The server side as a (writer, reader, closer) triple.
    fn connect(
        &self,
    ) -> (
        Box<dyn std::io::Write + Send>,
        Box<dyn std::io::Read + Send>,
        Closer,
    ) {
        match self {
            Upstream::Unix(path) => {
                let stream = std::os::unix::net::UnixStream::connect(path).unwrap();
                let closer = stream.try_clone().unwrap();
                (
                    Box::new(stream.try_clone().unwrap()),
                    Box::new(stream),
                    Box::new(move || {
                        let _ = closer.shutdown(std::net::Shutdown::Both);
                    }),
                )
            }
            Upstream::Tcp(address) => {
                let stream = std::net::TcpStream::connect(address).unwrap();
                let closer = stream.try_clone().unwrap();
                (
                    Box::new(stream.try_clone().unwrap()),
                    Box::new(stream),
                    Box::new(move || {
                        let _ = closer.shutdown(std::net::Shutdown::Both);
                    }),
                )
            }
        }
    }
}

/// Copies `from` to `to` on a thread of its own, holding whatever it read
/// while `held()`. Ends when either side closes (after the freeze: an end is
/// forwarded like the bytes before it), then calls `ended`.
fn forward(
    mut from: impl std::io::Read + Send + 'static,
    mut to: impl std::io::Write + Send + 'static,
    held: impl Fn() -> bool + Send + 'static,
    ended: impl FnOnce() + Send + 'static,
) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16384];
        loop {
            let n = from.read(&mut buffer).unwrap_or(0);
            while held() {
                std::thread::sleep(Duration::from_millis(5));
            }
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        ended();
    });
}
