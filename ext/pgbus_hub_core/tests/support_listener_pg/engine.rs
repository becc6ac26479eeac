// Shared by listener_pg.rs and listener_pg_more.rs (include!d: items, no mods).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgbus_hub_core::conninfo::{Connected, ConnectionOptions};
use pgbus_hub_core::delivery::{self, Delivery};
use pgbus_hub_core::listener::{
    self, Event, ListenError, ListenerConfig, ListenerHandle, ListenerStats, StandaloneListener,
};
use pgbus_hub_core::log::{Level, LogSink, Record};
use pgbus_hub_core::protocol::Wake;
use tokio::sync::mpsc;

use support_pg::{configured_database_url, default_database_url, skip_or_fail};

const WAIT: Duration = Duration::from_secs(10);

fn database_url() -> String {
    configured_database_url().unwrap_or_else(default_database_url)
}

/// The run's own database (`rake test` creates one per run and sets this), for
/// the tests below that spell out their own connection strings.
fn test_dbname() -> String {
    std::env::var("PGBUS_HUB_TEST_DBNAME").unwrap_or_else(|_| "pgbus_hub_test".to_string())
}

fn tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "t{}_{:x}_{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The options, or None when no PostgreSQL answers and the run allows skipping
/// (`support_pg::skip_or_fail`).
async fn options() -> Option<ConnectionOptions> {
    let url = database_url();
    let configured = configured_database_url().is_some();
    let options = match ConnectionOptions::parse(&url) {
        Ok(options) => options,
        Err(error) => return skip_or_fail(configured, &format!("no PostgreSQL ({error})")),
    };
    match tokio::time::timeout(Duration::from_secs(5), options.connect()).await {
        Ok(Ok(session)) => {
            session.close(Duration::from_millis(100)).await;
            Some(options)
        }
        Ok(Err(error)) => skip_or_fail(configured, &format!("no PostgreSQL ({error})")),
        Err(_) => skip_or_fail(configured, "no PostgreSQL (connect timed out)"),
    }
}

/// A second session for NOTIFY and inspection.
async fn admin(options: &ConnectionOptions) -> Connected {
    options
        .clone()
        .with_application_name("pgbus-listener-test-admin")
        .connect()
        .await
        .expect("admin connection")
}

async fn notify(admin: &Connected, channel: &str, payload: &str) {
    admin
        .client
        .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .expect("pg_notify");
}

struct Engine {
    handle: ListenerHandle,
    stats: Arc<ListenerStats>,
    join: tokio::task::JoinHandle<()>,
    events: mpsc::UnboundedReceiver<Event>,
}

/// An engine with bare channel names (prefix and suffix ""), unless `pgmq`.
fn engine_with(options: ConnectionOptions, pgmq: bool, log: LogSink) -> Engine {
    let mut config = ListenerConfig::new(options, log);
    if !pgmq {
        config.channel_prefix = String::new();
        config.channel_suffix = String::new();
    }
    let (sender, events) = mpsc::unbounded_channel();
    let (handle, stats, join) = listener::spawn(config, move |event| {
        let _ = sender.send(event);
    });
    Engine {
        handle,
        stats,
        join,
        events,
    }
}

fn engine(options: ConnectionOptions) -> Engine {
    engine_with(options, false, LogSink::silent())
}

impl Engine {
    async fn listen(&self, queue: &str) -> Result<(), ListenError> {
        tokio::time::timeout(WAIT, self.handle.listen(queue))
            .await
            .expect("listen answered in time")
            .unwrap_or(Err(ListenError::Stopped))
    }

    async fn next_event(&mut self) -> Event {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("engine alive")
    }

    /// The next wake, skipping health events.
    async fn next_wake(&mut self) -> (String, Option<String>) {
        loop {
            if let Event::Wake(wake) = self.next_event().await {
                return (wake.queue.to_string(), wake.payload.map(|p| p.to_string()));
            }
        }
    }

    /// The queues of the next catch-up (sorted), skipping health events.
    async fn next_catch_up(&mut self) -> Vec<String> {
        loop {
            if let Event::CatchUp(queues) = self.next_event().await {
                let mut queues: Vec<String> =
                    queues.iter().map(|queue| queue.to_string()).collect();
                queues.sort();
                return queues;
            }
        }
    }

    async fn wait_healthy(&mut self) {
        support_wait::wait_until_async("the engine healthy", || self.stats.healthy()).await;
    }

    async fn stop(self) {
        self.handle.stop();
        tokio::time::timeout(Duration::from_secs(2), self.join)
            .await
            .expect("engine exits within 2 s after stop")
            .expect("engine did not panic");
    }
}


async fn admin_for(options: &ConnectionOptions, db: &str) -> Connected {
    options
        .clone()
        .with_dbname(db)
        .with_application_name("pgbus-listener-test-admin")
        .connect()
        .await
        .expect("admin connection to the scratch database")
}
