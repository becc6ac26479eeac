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
        log,
    }
}

/// The run's database (`rake test` sets PGBUS_HUB_TEST_DATABASE_URL to one
/// of its own), or None (the test skips) when none is configured and nothing
/// answers on the default socket. A configured database that does not answer
/// fails the test: a run pointed at a server must never pass by skipping.
pub fn database_url() -> Option<String> {
    let configured = configured_database_url();
    let url = configured
        .clone()
        .unwrap_or_else(|| "host=/var/run/postgresql dbname=pgbus_hub_test".into());
    match postgres::Client::connect(&url, postgres::NoTls) {
        Ok(_) => Some(url),
        Err(e) => skip_or_fail(
            configured.is_some(),
            &format!("no PostgreSQL at {url} ({e})"),
        ),
    }
}

/// PGBUS_HUB_TEST_DATABASE_URL, else DATABASE_URL, when either is set.
pub fn configured_database_url() -> Option<String> {
    std::env::var("PGBUS_HUB_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
}

/// None after saying why the test skips, or a panic when the database was configured.
pub fn skip_or_fail<T>(configured: bool, why: &str) -> Option<T> {
    assert!(
        !configured,
        "{why} (configured for this run, so this is a failure, not a skip)"
    );
    eprintln!("skipping: {why}");
    None
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
