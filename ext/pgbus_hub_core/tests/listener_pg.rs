//! The LISTEN engine against a real PostgreSQL (no mocks).
//!
//! Database: `PGBUS_HUB_TEST_DATABASE_URL`, else `DATABASE_URL`, else
//! `host=/var/run/postgresql dbname=pgbus_hub_test`. A server that does not
//! answer fails each test, unless `PGBUS_HUB_SKIP_PG_TESTS=1` lets the default
//! one be missing (then each test says why it skips).
//!
//! Tests run in parallel (and alongside other suites on the same server), so
//! every test uses its own channel names (a per-test tag) and identifies the
//! engine's session by its backend pid or a unique application_name.

#![allow(dead_code, unused_imports)]

mod support_pg;
mod support_wait;

include!("support_listener_pg/engine.rs");

#[tokio::test]
async fn ack_means_listening_200_fresh_channels_none_lost() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options);
    let tag = tag();
    for i in 0..200 {
        let queue = format!("{tag}_{i}");
        engine.listen(&queue).await.expect("ack");
        // No wait between ack and NOTIFY: the ack itself is the guarantee.
        notify(&admin, &queue, "").await;
        assert_eq!(engine.next_wake().await, (queue, None), "iteration {i}");
    }
    assert_eq!(engine.stats.notifications(), 200);
    assert_eq!(engine.stats.channels(), 200);
    engine.stop().await;
}

#[tokio::test]
async fn one_connection_tagged_pgbus_listen_by_default() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options.clone());
    let tag = tag();
    for i in 0..20 {
        engine.listen(&format!("{tag}_{i}")).await.unwrap();
    }
    engine.wait_healthy().await;
    let pid = engine.stats.backend_pid().expect("backend pid") as i32;
    let row = admin
        .client
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "pgbus-listen");
    engine.stop().await;

    // Census by a unique name: exactly one session for an engine, whatever it listens to.
    let name = format!("pgbus-census-{}", tag);
    let engine = engine_with(
        options.with_application_name(&name),
        false,
        LogSink::silent(),
    );
    for i in 0..20 {
        engine.listen(&format!("{tag}_c{i}")).await.unwrap();
    }
    let count: i64 = admin
        .client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 1);
    engine.stop().await;
}

#[tokio::test]
async fn durable_and_ephemeral_payloads_in_order() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options);
    let queue = tag();
    engine.listen(&queue).await.unwrap();
    let big = "x".repeat(7999);
    let unicode = "héllo ✓ 😀 \"quoted\" 'single' \\ back";
    let payloads = ["", "hello", big.as_str(), unicode, "", "{\"json\":1}"];
    for payload in payloads {
        notify(&admin, &queue, payload).await;
    }
    for payload in payloads {
        let expected = (!payload.is_empty()).then(|| payload.to_string());
        assert_eq!(engine.next_wake().await, (queue.clone(), expected));
    }
    engine.stop().await;
}

#[tokio::test]
async fn pgmq_prefix_and_suffix_map_back_to_the_queue() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine_with(options, true, LogSink::silent());
    let queue = tag();
    engine.listen(&queue).await.unwrap();
    // Same stem without the suffix: not ours, ignored.
    notify(&admin, &format!("pgmq.q_{queue}"), "nope").await;
    notify(&admin, &format!("pgmq.q_{queue}.INSERT"), "").await;
    assert_eq!(engine.next_wake().await, (queue.clone(), None));
    // 7 + 49 + 7 = 63 bytes ok, 64 refused.
    let ok = "q".repeat(49);
    engine.listen(&ok).await.unwrap();
    let long = "q".repeat(50);
    assert_eq!(
        engine.listen(&long).await,
        Err(ListenError::NameTooLong {
            channel: format!("pgmq.q_{long}.INSERT"),
            bytes: 64
        })
    );
    engine.stop().await;
}

#[tokio::test]
async fn unlisten_stops_delivery() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options);
    let tag = tag();
    let (a, b, c) = (format!("{tag}_a"), format!("{tag}_b"), format!("{tag}_c"));
    engine.listen(&a).await.unwrap();
    engine.listen(&b).await.unwrap();
    engine.handle.unlisten(&a);
    // Commands run in order: once c is acked, the UNLISTEN of a has run.
    engine.listen(&c).await.unwrap();
    notify(&admin, &a, "lost").await;
    notify(&admin, &b, "kept").await;
    // Had a's NOTIFY been delivered it would come first (order is preserved).
    assert_eq!(engine.next_wake().await, (b.clone(), Some("kept".into())));
    assert_eq!(engine.stats.channels(), 2);
    // Listening again works.
    engine.listen(&a).await.unwrap();
    notify(&admin, &a, "again").await;
    assert_eq!(engine.next_wake().await, (a, Some("again".into())));
    engine.stop().await;
}

#[tokio::test]
async fn hostile_names_are_quoted_not_injected() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options);
    let tag = tag();
    let names = [
        format!("{tag}\"q"),
        format!("{tag}'q"),
        format!("{tag};q"),
        format!("{tag} with spaces"),
        format!("{tag}\"; SELECT pg_sleep(10); --"),
        format!("{tag}ünï✓"),
        format!("{tag}\\x"),
    ];
    for name in &names {
        engine.listen(name).await.expect(name);
    }
    for name in &names {
        notify(&admin, name, name).await;
    }
    for name in &names {
        assert_eq!(engine.next_wake().await, (name.clone(), Some(name.clone())));
    }
    engine.stop().await;
}

#[tokio::test]
async fn empty_and_over_long_names_are_refused_63_bytes_works() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (log, records) = LogSink::channel();
    let mut engine = engine_with(options, false, log);
    assert_eq!(engine.listen("").await, Err(ListenError::EmptyName));
    let stem = tag();
    let long = format!("{stem}{}", "z".repeat(64 - stem.len()));
    assert_eq!(
        engine.listen(&long).await,
        Err(ListenError::NameTooLong {
            channel: long.clone(),
            bytes: 64
        })
    );
    let fits = &long[..63];
    engine.listen(fits).await.unwrap();
    notify(&admin, fits, "").await;
    assert_eq!(engine.next_wake().await, (fits.to_string(), None));
    assert_eq!(engine.stats.channels(), 1);
    // The engine notes each refusal at debug; whoever asked reports it once (the
    // hub with a WARN naming the connection, a standalone caller by its error).
    let records: Vec<Record> = records.try_iter().collect();
    let refusals = |level| {
        records
            .iter()
            .filter(|r| r.level == level && r.message.contains("not LISTENing"))
            .count()
    };
    assert_eq!(
        (refusals(Level::Debug), refusals(Level::Warn)),
        (2, 0),
        "{records:?}"
    );
    engine.stop().await;
}

#[tokio::test]
async fn terminated_backend_reconnects_and_relistens() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let mut engine = engine(options);
    let tag = tag();
    let queues: Vec<String> = (0..3).map(|i| format!("{tag}_{i}")).collect();
    for queue in &queues {
        engine.listen(queue).await.unwrap();
    }
    assert_eq!(engine.next_event().await, Event::Healthy(true));
    let old_pid = engine.stats.backend_pid().unwrap() as i32;
    let killed: bool = admin
        .client
        .query_one("SELECT pg_terminate_backend($1)", &[&old_pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    assert_eq!(engine.next_event().await, Event::Healthy(false));
    assert_eq!(engine.next_event().await, Event::Healthy(true));
    let new_pid = engine.stats.backend_pid().unwrap() as i32;
    assert_ne!(new_pid, old_pid);
    assert_eq!(engine.stats.reconnects(), 1);
    assert!(engine.stats.last_error().is_some());
    // With no NOTIFY at all: every queue owed a durable wake right after the
    // re-LISTEN, so subscribers re-read what was committed in the gap.
    assert_eq!(engine.next_catch_up().await, queues);
    for queue in &queues {
        notify(&admin, queue, "after").await;
    }
    for queue in &queues {
        assert_eq!(
            engine.next_wake().await,
            (queue.clone(), Some("after".into()))
        );
    }
    engine.stop().await;
}
