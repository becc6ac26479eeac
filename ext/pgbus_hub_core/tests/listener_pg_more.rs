//! Continued from listener_pg.rs (split for size).
//!
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

/// The application_name PostgreSQL shows for the (healthy) engine's session.
async fn session_application_name(admin: &Connected, engine: &Engine) -> String {
    let pid = engine.stats.backend_pid().unwrap() as i32;
    admin
        .client
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn listen_while_down_is_acked_only_after_reconnect() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let db = format!("pgbus_listener_{}", tag());
    admin
        .client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .expect("create a scratch database (needs CREATEDB)");
    let db_admin = admin_for(&options, &db).await;
    let mut engine = engine(options.clone().with_dbname(&db));
    engine.listen("before").await.unwrap();
    assert_eq!(engine.next_event().await, Event::Healthy(true));
    let pid = engine.stats.backend_pid().unwrap() as i32;

    // Keep it down: no new connections to the database, then kill the session.
    admin
        .client
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"))
        .await
        .unwrap();
    admin
        .client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    assert_eq!(engine.next_event().await, Event::Healthy(false));
    let mut answer = engine.handle.listen("during");
    // A broadcast committed while the engine cannot connect: its NOTIFY reaches nobody.
    notify(&db_admin, "before", "lost in the gap").await;
    // Several reconnect attempts fail meanwhile; the request must stay unanswered.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(answer.try_recv().is_err(), "acked while down");
    assert!(!engine.stats.healthy());
    assert!(engine.stats.connect_failures() >= 1);

    admin
        .client
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    let acked = tokio::time::timeout(WAIT, answer)
        .await
        .expect("acked after reconnect");
    assert_eq!(acked, Ok(Ok(())));
    assert!(engine.stats.healthy());
    assert_eq!(engine.stats.reconnects(), 1);
    // Once LISTENing again, with no further traffic: a durable wake owed to
    // each queue of the set, the one broadcast to in the gap included; the
    // gap's payload itself is gone.
    assert_eq!(engine.next_catch_up().await, ["before", "during"]);
    notify(&db_admin, "during", "").await;
    notify(&db_admin, "before", "").await;
    assert_eq!(engine.next_wake().await, ("during".into(), None));
    assert_eq!(engine.next_wake().await, ("before".into(), None));
    engine.stop().await;
    db_admin.close(Duration::from_millis(200)).await;
    admin
        .client
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}

#[tokio::test]
async fn stop_answers_pending_listens_and_exits_while_unreachable() {
    // Nothing listens on port 1: every connect fails, the engine backs off.
    let options = ConnectionOptions::parse("host=127.0.0.1 port=1 user=nobody").unwrap();
    let (log, records) = LogSink::channel();
    let engine = engine_with(options, false, log);
    let answer = engine.handle.listen("never");
    support_wait::wait_until_async("two failed connects", || {
        engine.stats.connect_failures() >= 2
    })
    .await;
    let started = Instant::now();
    engine.handle.stop();
    assert_eq!(answer.await, Ok(Err(ListenError::Stopped)));
    let handle = engine.handle.clone();
    engine.join.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    // After the engine is gone, listen answers Stopped at once.
    assert_eq!(handle.listen("late").await, Ok(Err(ListenError::Stopped)));
    assert!(records
        .try_iter()
        .any(|r| r.level == Level::Warn && r.message.contains("connect")));
}

/// The reconnect backoff on a paused clock (virtual time; the test takes
/// milliseconds): the first retry at once, then 100 ms doubling to 5 s, each
/// step within its ±20 % jitter (plus 5 ms for the refused connect itself).
#[tokio::test(start_paused = true)]
async fn reconnect_backoff_doubles_from_100_ms_to_5_s() {
    // Nothing listens on port 1: every attempt is refused at once.
    let options = ConnectionOptions::parse("host=127.0.0.1 port=1 user=nobody").unwrap();
    let engine = engine(options);
    let started = tokio::time::Instant::now();
    let mut failed_at = Vec::new();
    while failed_at.len() < 10 {
        let failures = engine.stats.connect_failures() as usize;
        failed_at.resize(failures.max(failed_at.len()), started.elapsed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let gaps: Vec<Duration> = failed_at.windows(2).map(|pair| pair[1] - pair[0]).collect();
    let expected_ms = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000];
    for (gap, want) in gaps.iter().zip(expected_ms) {
        let want = Duration::from_millis(want);
        let slack = Duration::from_millis(5);
        assert!(
            *gap + slack >= want.mul_f64(0.8) && *gap <= want.mul_f64(1.2) + slack,
            "backoff steps {gaps:?}, expected about {expected_ms:?} ms"
        );
    }
    engine.stop().await;
}

#[tokio::test]
async fn sslmode_require_over_tcp_is_encrypted() {
    if options().await.is_none() {
        return;
    }
    let url = format!(
        "host=127.0.0.1 port=5432 dbname={} sslmode=require",
        test_dbname()
    );
    let options = ConnectionOptions::parse(&url).unwrap();
    let admin = match options.connect().await {
        Ok(admin) => admin,
        Err(error) => {
            println!("skipping: no TLS-enabled PostgreSQL on 127.0.0.1:5432 ({error})");
            return;
        }
    };
    for (mode, encrypted) in [("require", true), ("disable", false), ("prefer", true)] {
        let options = ConnectionOptions::parse(&format!(
            "host=127.0.0.1 port=5432 dbname={} sslmode={mode}",
            test_dbname()
        ))
        .unwrap();
        let mut engine = engine(options);
        engine.wait_healthy().await;
        let pid = engine.stats.backend_pid().unwrap() as i32;
        let ssl: bool = admin
            .client
            .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert_eq!(ssl, encrypted, "sslmode={mode}");
        engine.stop().await;
    }
}

#[tokio::test]
async fn url_keyword_and_pairs_forms_connect() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let tag = tag();
    let forms = vec![
        (
            "url",
            ConnectionOptions::parse(&format!(
                "postgresql:///{}?host=%2Fvar%2Frun%2Fpostgresql&application_name=url-{tag}",
                test_dbname()
            )),
        ),
        (
            "keywords",
            ConnectionOptions::parse(&format!(
                "host=/var/run/postgresql dbname = {} application_name='kw {tag}'",
                test_dbname()
            )),
        ),
        (
            "pairs",
            ConnectionOptions::from_pairs(vec![
                ("host".into(), "127.0.0.1".into()),
                ("port".into(), "5432".into()),
                ("dbname".into(), test_dbname()),
                ("sslmode".into(), "disable".into()),
                ("connect_timeout".into(), "5".into()),
                ("fallback_application_name".into(), format!("pairs-{tag}")),
            ]),
        ),
    ];
    for (form, parsed) in forms {
        let options = parsed.unwrap_or_else(|e| panic!("{form}: {e}"));
        let expected = options.application_name().to_string();
        let mut engine = engine(options);
        engine.wait_healthy().await;
        let name = session_application_name(&admin, &engine).await;
        assert_eq!(name, expected, "{form}");
        assert!(name.contains(&tag), "{form}: {name}");
        engine.stop().await;
    }
}

#[tokio::test]
async fn variables_are_set_after_connect_with_safe_quoting() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    // pg_stat_activity shows non-ASCII application_name bytes as '?': keep it ASCII.
    let name = format!("it's \"{}\" ; \\", tag());
    let options = options
        .with_variables(vec![
            ("statement_timeout".into(), "5s".into()),
            ("application_name".into(), name.clone()),
        ])
        .unwrap();
    let mut engine = engine(options);
    engine.wait_healthy().await;
    assert_eq!(session_application_name(&admin, &engine).await, name);
    engine.stop().await;
}

#[tokio::test]
async fn a_bad_variable_is_a_logged_connect_error() {
    let Some(options) = options().await else {
        return;
    };
    let options = options
        .with_variables(vec![("no_such_setting_pgbus".into(), "1".into())])
        .unwrap();
    let (log, records) = LogSink::channel();
    let engine = engine_with(options, false, log);
    let answer = engine.handle.listen("never");
    let deadline = Instant::now() + WAIT;
    let record = loop {
        // Never block the test's (single) runtime thread: the engine runs on it.
        if let Ok(record) = records.try_recv() {
            if record.message.contains("no_such_setting_pgbus") {
                break record;
            }
            continue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(Instant::now() < deadline, "no connect error logged");
    };
    assert_eq!(record.level, Level::Warn);
    assert!(
        record.message.contains("applying variables failed"),
        "{record:?}"
    );
    assert!(!engine.stats.healthy());
    assert!(engine
        .stats
        .last_error()
        .unwrap()
        .contains("no_such_setting_pgbus"));
    engine.handle.stop();
    assert_eq!(answer.await, Ok(Err(ListenError::Stopped)));
    engine.join.await.unwrap();
}

#[tokio::test]
async fn sub_to_ack_latency_over_500_new_channels() {
    let Some(options) = options().await else {
        return;
    };
    let mut engine = engine(options);
    engine.wait_healthy().await;
    let tag = tag();
    let mut samples = Vec::with_capacity(500);
    for i in 0..500 {
        let started = Instant::now();
        engine.listen(&format!("{tag}_{i}")).await.unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    println!(
        "sub->ack latency over 500 new channels: p50 {:?}, p99 {:?}, max {:?}",
        samples[250], samples[494], samples[499]
    );
    // Re-listening an already LISTENed channel answers without a round trip.
    let started = Instant::now();
    engine.listen(&format!("{tag}_0")).await.unwrap();
    println!(
        "sub->ack for an already LISTENed channel: {:?}",
        started.elapsed()
    );
    let _ = engine.events.try_recv();
    engine.stop().await;
}

#[test]
fn standalone_listener_delivers_and_stops_within_two_seconds() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(options) = runtime.block_on(options()) else {
        return;
    };
    let admin = runtime.block_on(admin(&options));
    let mut config = ListenerConfig::new(options, LogSink::silent());
    config.channel_prefix = String::new();
    config.channel_suffix = String::new();
    let (sender, receiver) = delivery::channel();
    let standalone = StandaloneListener::start(config, sender).unwrap();
    let queue = tag();
    standalone.listen(&queue, Duration::from_secs(5)).unwrap();
    assert_eq!(
        standalone.listen("", Duration::from_secs(5)),
        Err(ListenError::EmptyName)
    );
    runtime.block_on(notify(&admin, &queue, "payload"));
    runtime.block_on(notify(&admin, &queue, ""));
    assert_eq!(
        receiver.recv_timeout(WAIT),
        Some(Delivery::Wake(Wake::new(queue.as_str(), Some("payload"))))
    );
    assert_eq!(
        receiver.recv_timeout(WAIT),
        Some(Delivery::Wake(Wake::durable(queue.as_str())))
    );
    assert!(standalone.stats().healthy());
    assert_eq!(standalone.stats().notifications(), 2);

    standalone.unlisten(&queue);
    let other = format!("{queue}_2");
    standalone.listen(&other, Duration::from_secs(5)).unwrap();
    runtime.block_on(notify(&admin, &queue, "gone"));
    runtime.block_on(notify(&admin, &other, "here"));
    assert_eq!(
        receiver.recv_timeout(WAIT),
        Some(Delivery::Wake(Wake::new(other, Some("here"))))
    );

    let started = Instant::now();
    standalone.stop();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    standalone.stop(); // idempotent
    assert_eq!(
        standalone.listen(&queue, Duration::from_secs(1)),
        Err(ListenError::Stopped)
    );
    assert!(!standalone.stats().healthy());
    drop(standalone);
}

#[test]
fn standalone_ensure_listening_times_out_while_unreachable() {
    let options = ConnectionOptions::parse("host=127.0.0.1 port=1 user=nobody").unwrap();
    let (sender, _receiver) = delivery::channel();
    let standalone =
        StandaloneListener::start(ListenerConfig::new(options, LogSink::silent()), sender).unwrap();
    let started = Instant::now();
    assert_eq!(
        standalone.listen("q", Duration::from_millis(300)),
        Err(ListenError::Timeout)
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    let started = Instant::now();
    drop(standalone); // Drop stops and joins.
    assert!(started.elapsed() < Duration::from_secs(2));
}
