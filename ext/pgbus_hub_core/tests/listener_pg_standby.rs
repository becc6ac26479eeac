//! Issue 57: the standby (docs/architecture.md, "Standby: a second LISTEN
//! connection aligned by the marker"). A second session NOTIFYs numbered
//! payloads every 2 ms; the serving connection's backend is terminated
//! (`pg_terminate_backend`, only this test's own, found by its
//! application_name): the standby serves from where it stopped, every number
//! once, in order, with no reconnect and no catch-up. Only the alignment
//! marker decides what each connection delivers: nothing here waits a time.
//!
//! Database and isolation as listener_pg.rs: each test's own channel names
//! and application_name, and only backends carrying it are counted or terminated.

#![allow(dead_code, unused_imports)]

mod support_pg;
mod support_wait;

include!("support_listener_pg/engine.rs");
include!("support_listener_pg/flow_proxy.rs");

use pgbus_hub_core::listener::Start;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Pause between two NOTIFYs: ~300 a second with the round trip, a stream where the re-LISTEN
/// gap of a single connection loses numbers.
const NOTIFY_PAUSE: Duration = Duration::from_millis(2);

/// Numbers delivered before and after each fault.
const STEADY: usize = 100;

/// What the engine handed on, in order.
#[derive(Default)]
struct Seen {
    numbers: Vec<u32>,
    /// `Healthy(false)` and `CatchUp`: a promotion has neither.
    outages: usize,
    catch_ups: usize,
}

type Shared = Arc<Mutex<Seen>>;

/// Numbered NOTIFYs on `channel` from a session of its own until stopped;
/// returns how many it sent (0..sent).
struct Notifier {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u32>,
}

impl Notifier {
    fn start(channel: &str) -> Self {
        let (url, channel) = (database_url(), channel.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut sql = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut sent = 0u32;
            while !stopping.load(Ordering::SeqCst) {
                sql.execute("select pg_notify($1, $2)", &[&channel, &sent.to_string()])
                    .unwrap();
                sent += 1;
                std::thread::sleep(NOTIFY_PAUSE);
            }
            sent
        });
        Self { stop, thread }
    }

    fn stop(self) -> u32 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// An engine (with a standby or not) on bare channel names whose connections
/// carry `name` as application_name; what it hands on is collected.
fn collected(options: &ConnectionOptions, name: &str, standby: bool) -> (Engine, Shared) {
    collected_logged(options, name, standby, LogSink::silent())
}

fn collected_logged(
    options: &ConnectionOptions,
    name: &str,
    standby: bool,
    log: LogSink,
) -> (Engine, Shared) {
    let mut config = ListenerConfig::new(options.clone().with_application_name(name), log);
    config.channel_prefix = String::new();
    config.channel_suffix = String::new();
    config.standby = standby;
    let seen: Shared = Arc::default();
    let into = Arc::clone(&seen);
    let on_event = move |event: Event| {
        let mut seen = into.lock().unwrap();
        match event {
            Event::Wake(wake) => seen
                .numbers
                .push(wake.payload.as_deref().unwrap().parse().unwrap()),
            Event::Healthy(false) => seen.outages += 1,
            Event::CatchUp(_) => seen.catch_ups += 1,
            Event::Healthy(true) | Event::Marker(_) => {}
        }
    };
    let (handle, stats, join) = listener::spawn_with(config, Start::default(), on_event);
    // Collected into `seen` only: the events channel has no sender.
    let (_, events) = mpsc::unbounded_channel();
    let engine = Engine {
        handle,
        stats,
        join,
        events,
    };
    (engine, seen)
}

fn delivered(seen: &Shared) -> usize {
    seen.lock().unwrap().numbers.len()
}

/// The pids of the backends carrying `name`.
async fn backends(admin: &Connected, name: &str) -> Vec<u32> {
    let rows = admin
        .client
        .query(
            "select pid from pg_stat_activity where application_name = $1 order by pid",
            &[&name],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|row| u32::try_from(row.get::<_, i32>(0)).unwrap())
        .collect()
}

/// Terminates `pid`, one of this test's own backends (`name`).
async fn terminate(admin: &Connected, name: &str, pid: u32) {
    let terminated: bool = admin
        .client
        .query_one(
            "select pg_terminate_backend(pid) from pg_stat_activity \
             where application_name = $1 and pid = $2",
            &[&name, &i32::try_from(pid).unwrap()],
        )
        .await
        .expect("our own backend")
        .get(0);
    assert!(terminated, "backend {pid} terminated");
}

/// The standby's pid: the backend carrying `name` that does not serve.
async fn standby_pid(admin: &Connected, name: &str, engine: &Engine) -> Option<u32> {
    let serving = engine.stats.backend_pid()?;
    let pids = backends(admin, name).await;
    (pids.len() == 2)
        .then(|| pids.into_iter().find(|pid| *pid != serving))
        .flatten()
}

async fn wait_aligned(engine: &Engine) {
    support_wait::wait_until_async("the standby aligned", || {
        engine.stats.standby_aligned() && engine.stats.listen_connections() == 2
    })
    .await;
}

async fn wait_more(seen: &Shared, more: usize) {
    let target = delivered(seen) + more;
    support_wait::wait_until_async("more numbers delivered", || delivered(seen) >= target).await;
}

/// Stops the stream, waits for its last number and checks every number
/// arrived once, in order, with no outage and no catch-up.
async fn assert_every_number_once_in_order(notifier: Notifier, seen: &Shared) {
    let sent = notifier.stop();
    support_wait::wait_until_async("the last number", || {
        seen.lock().unwrap().numbers.last() == Some(&(sent - 1))
    })
    .await;
    let seen = seen.lock().unwrap();
    let expected: Vec<u32> = (0..sent).collect();
    if seen.numbers != expected {
        let duplicated = seen.numbers.len().saturating_sub(sent as usize);
        let first_wrong = seen
            .numbers
            .iter()
            .zip(&expected)
            .position(|(got, want)| got != want);
        panic!(
            "not every number once, in order: sent {sent}, delivered {} (first difference at \
             {first_wrong:?}, at least {duplicated} extra)",
            seen.numbers.len()
        );
    }
    assert_eq!(
        (seen.outages, seen.catch_ups),
        (0, 0),
        "a promotion is no outage"
    );
}

#[tokio::test]
async fn the_serving_connection_terminated_the_standby_serves_from_where_it_stopped() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&options, &name, true);
    // Subscribed after the start: the standby (connecting, or up) LISTENs it too.
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    assert_eq!(
        backends(&admin, &name).await.len(),
        2,
        "census 2 with a standby"
    );

    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;
    for promotion in 1..=2 {
        let serving = engine.stats.backend_pid().expect("a serving backend");
        terminate(&admin, &name, serving).await;
        support_wait::wait_until_async("the standby promoted", || {
            engine.stats.standby_promotions() == promotion
        })
        .await;
        assert_ne!(engine.stats.backend_pid(), Some(serving));
        wait_more(&seen, STEADY).await;
        // A new standby connects and aligns: the next loss is covered too.
        wait_aligned(&engine).await;
        wait_more(&seen, STEADY).await;
    }
    assert_eq!(engine.stats.reconnects(), 0, "promotions are no reconnects");
    assert_eq!(backends(&admin, &name).await.len(), 2);
    assert_every_number_once_in_order(notifier, &seen).await;
    engine.stop().await;
}

#[tokio::test]
async fn the_standby_terminated_a_new_one_aligns_and_then_covers_the_serving_connection() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&options, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    let serving = engine.stats.backend_pid().expect("a serving backend");
    let old_standby = standby_pid(&admin, &name, &engine)
        .await
        .expect("a standby");
    terminate(&admin, &name, old_standby).await;
    // Another standby, aligned: the old one's loss reset the alignment
    // before the new one connected, so aligned with another pid is the new one's.
    let realigned = async {
        loop {
            wait_aligned(&engine).await;
            match standby_pid(&admin, &name, &engine).await {
                Some(pid) if pid != old_standby => break,
                _ => tokio::task::yield_now().await,
            }
        }
    };
    tokio::time::timeout(support_wait::WAIT, realigned)
        .await
        .expect("a new standby aligned in time");
    assert_eq!(
        engine.stats.backend_pid(),
        Some(serving),
        "the serving connection kept serving"
    );
    assert_eq!(engine.stats.standby_promotions(), 0);
    wait_more(&seen, STEADY).await;

    terminate(&admin, &name, serving).await;
    support_wait::wait_until_async("the standby promoted", || {
        engine.stats.standby_promotions() == 1
    })
    .await;
    wait_more(&seen, STEADY).await;
    assert_every_number_once_in_order(notifier, &seen).await;
    engine.stop().await;
}

#[tokio::test]
async fn subscriptions_while_the_standby_is_up_realign_it_in_place() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&options, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let standby = standby_pid(&admin, &name, &engine)
        .await
        .expect("a standby");
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // A new channel, then one withdrawn: the ack comes after both connections'
    // LISTENs ran, and the same standby aligns again at its new marker
    // (the last listen is answered after the UNLISTEN before it, in order).
    let (other, withdrawn) = (tag(), tag());
    engine.listen(&other).await.expect("LISTEN");
    engine.listen(&withdrawn).await.expect("LISTEN");
    engine.handle.unlisten(&withdrawn);
    engine
        .listen(&channel)
        .await
        .expect("answered at once: already LISTENed");
    engine.listen(&tag()).await.expect("LISTEN");
    wait_aligned(&engine).await;
    assert_eq!(
        standby_pid(&admin, &name, &engine).await,
        Some(standby),
        "realigned in place, not replaced"
    );
    wait_more(&seen, STEADY).await;

    terminate(&admin, &name, engine.stats.backend_pid().unwrap()).await;
    support_wait::wait_until_async("the standby promoted", || {
        engine.stats.standby_promotions() == 1
    })
    .await;
    wait_more(&seen, STEADY).await;
    assert_every_number_once_in_order(notifier, &seen).await;
    engine.stop().await;
}

#[tokio::test]
async fn both_backends_terminated_at_once_reconnect_as_today_and_a_new_standby_aligns() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&options, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // Both in one statement: what was committed meanwhile reached only them.
    let old = backends(&admin, &name).await;
    assert_eq!(old.len(), 2);
    admin
        .client
        .execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    // Not exact: today's reconnect, with its catch-up wakes (the standby may
    // first be promoted, then found dead too).
    support_wait::wait_until_async("reconnected", || {
        engine.stats.reconnects() == 1 && seen.lock().unwrap().catch_ups == 1
    })
    .await;
    wait_aligned(&engine).await;
    let new = backends(&admin, &name).await;
    assert!(new.iter().all(|pid| !old.contains(pid)), "two new backends");
    wait_more(&seen, STEADY).await;

    let sent = notifier.stop();
    support_wait::wait_until_async("the last number", || {
        seen.lock().unwrap().numbers.last() == Some(&(sent - 1))
    })
    .await;
    // What is delivered is still once and in order (only some are missing).
    let numbers = seen.lock().unwrap().numbers.clone();
    assert!(
        numbers.windows(2).all(|pair| pair[0] < pair[1]),
        "once, in order"
    );
    engine.stop().await;
}

/// Both connections' paths frozen (a NAT entry lost for every open flow;
/// new connections pass). Either the serving connection is given up first
/// and the standby promoted, frozen too, and given up in turn; or the
/// standby's probe gives it up first, and the serving connection is given
/// up with no standby aligned. Both end in a give-up and the next
/// connection up through the path: not exact (a double fault), but never
/// twice and never out of order, whether the given-up connection is kept
/// for a handover or (a promoted one still dropping what the lost one
/// delivered) closed.
#[tokio::test]
async fn both_paths_frozen_deliver_nothing_twice() {
    let Some(_) = options().await else {
        return;
    };
    let proxy = support_pg::FreezableProxy::start(&database_url());
    let via_proxy = ConnectionOptions::parse(&proxy.url).unwrap();
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&via_proxy, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    proxy.freeze_existing();
    support_wait::wait_until_async(
        "a frozen connection given up, a new one up through the path",
        || engine.stats.reconnects() == 1 && engine.stats.healthy(),
    )
    .await;
    proxy.thaw();
    wait_aligned(&engine).await;
    wait_more(&seen, STEADY).await;

    let sent = notifier.stop();
    support_wait::wait_until_async("the last number", || {
        seen.lock().unwrap().numbers.last() == Some(&(sent - 1))
    })
    .await;
    let numbers = seen.lock().unwrap().numbers.clone();
    eprintln!(
        "both paths frozen: sent {sent}, delivered {}, promotions {}, handovers {}, abandoned {}",
        numbers.len(),
        engine.stats.standby_promotions(),
        engine.stats.handovers(),
        engine.stats.abandoned_connections()
    );
    let out_of_order = numbers.windows(2).filter(|pair| pair[0] >= pair[1]).count();
    assert_eq!(out_of_order, 0, "nothing twice, in order");
    engine.stop().await;
}

/// Only the serving connection's path frozen: the standby reads on and
/// holds what the serving connection cannot read; the serving connection is
/// given up (its health check) and the standby delivers what it held, then
/// its stream: every number once, in order, and some of them from what was held.
#[tokio::test]
async fn the_serving_path_frozen_the_standby_delivers_what_it_held_ahead() {
    let Some(_) = options().await else {
        return;
    };
    let proxy = FlowProxy::start(&database_url());
    let via_proxy = ConnectionOptions::parse(&proxy.url).unwrap();
    let (log, records) = LogSink::channel();
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected_logged(&via_proxy, &name, true, log);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // The serving connection was the proxy's first: the standby connects
    // once it serves.
    proxy.set(0, true);
    support_wait::wait_until_async(
        "the frozen serving connection given up, the standby promoted",
        || engine.stats.standby_promotions() == 1,
    )
    .await;
    wait_more(&seen, STEADY).await;
    assert_every_number_once_in_order(notifier, &seen).await;
    assert_eq!(engine.stats.reconnects(), 0);
    engine.stop().await;
    proxy.set(0, false);

    let promotion = records
        .try_iter()
        .find(|record| record.message.contains("serves from where it stopped"))
        .expect("the promotion logged");
    let held: usize = promotion
        .message
        .split(" notifications it held delivered")
        .next()
        .and_then(|before| before.rsplit('(').next())
        .and_then(|count| count.parse().ok())
        .expect("the held count in the promotion's log line");
    eprintln!(
        "serving path frozen: the standby delivered {held} held notifications at its promotion"
    );
    assert!(
        held > 0,
        "the standby held what the frozen connection did not read: {promotion:?}"
    );
}

/// Only the standby's path frozen while the stream flows: its own probe
/// gives it up (the serving connection's stream says nothing of it), a new
/// one aligns, and the serving connection's loss after that is exact.
#[tokio::test]
async fn the_standby_path_frozen_its_probe_replaces_it() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let proxy = FlowProxy::start(&database_url());
    let via_proxy = ConnectionOptions::parse(&proxy.url).unwrap();
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&via_proxy, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // The standby is the proxy's latest flow (the serving connection, its
    // first, came before every standby).
    let standby_flow = proxy.flows() - 1;
    assert!(standby_flow > 0);
    proxy.set(standby_flow, true);
    support_wait::wait_until_async("a new standby through the proxy", || {
        proxy.flows() > standby_flow + 1
    })
    .await;
    wait_aligned(&engine).await;
    wait_more(&seen, STEADY).await;
    assert_eq!(engine.stats.standby_promotions(), 0);

    terminate(&admin, &name, engine.stats.backend_pid().unwrap()).await;
    support_wait::wait_until_async("the standby promoted", || {
        engine.stats.standby_promotions() == 1
    })
    .await;
    wait_more(&seen, STEADY).await;
    assert_every_number_once_in_order(notifier, &seen).await;
    assert_eq!(engine.stats.reconnects(), 0);
    engine.stop().await;
    proxy.set(standby_flow, false);
}

/// The serving connection terminated right after a subscription's ack,
/// before it can have read the marker of that change: the standby stayed
/// aligned through the change, so the promotion is exact, for the stream
/// and for what was NOTIFYed on the new channel after its ack.
#[tokio::test]
async fn the_serving_connection_lost_right_after_a_set_change_is_covered() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&options, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // Numbers on the new channels from 1_000_000 on, apart from the stream's.
    let mut next_extra = 1_000_000u32;
    let mut withdrawn: Option<String> = None;
    for promotion in 1..=3 {
        let added = tag();
        engine.listen(&added).await.expect("LISTEN");
        if let Some(old) = withdrawn.take() {
            engine.handle.unlisten(&old);
        }
        // Committed after the ack: owed.
        notify(&admin, &added, &next_extra.to_string()).await;
        next_extra += 1;
        terminate(&admin, &name, engine.stats.backend_pid().unwrap()).await;
        notify(&admin, &added, &next_extra.to_string()).await;
        next_extra += 1;
        support_wait::wait_until_async("the standby promoted", || {
            engine.stats.standby_promotions() == promotion
        })
        .await;
        wait_aligned(&engine).await;
        wait_more(&seen, STEADY).await;
        withdrawn = Some(added);
    }
    let extra: Vec<u32> = seen
        .lock()
        .unwrap()
        .numbers
        .iter()
        .copied()
        .filter(|number| *number >= 1_000_000)
        .collect();
    assert_eq!(extra, (1_000_000..next_extra).collect::<Vec<u32>>());
    seen.lock()
        .unwrap()
        .numbers
        .retain(|number| *number < 1_000_000);
    assert_every_number_once_in_order(notifier, &seen).await;
    assert_eq!(engine.stats.reconnects(), 0);
    engine.stop().await;
}

/// As above, with the serving connection's path 300 ms slow (its server's
/// bytes late): it reads the marker of a change well after the ack, and
/// is terminated in between. The standby stays aligned through the change
/// (the marker carries it): the promotion is exact.
#[tokio::test]
async fn a_slow_serving_connection_lost_between_a_set_change_and_its_marker_is_covered() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let proxy = FlowProxy::start(&database_url());
    let via_proxy = ConnectionOptions::parse(&proxy.url).unwrap();
    let (name, channel) = (tag(), tag());
    let (engine, seen) = collected(&via_proxy, &name, true);
    engine.listen(&channel).await.expect("LISTEN");
    wait_aligned(&engine).await;
    let notifier = Notifier::start(&channel);
    wait_more(&seen, STEADY).await;

    // The serving connection was the proxy's first.
    proxy.delay(0, Duration::from_millis(300));
    wait_more(&seen, STEADY).await;
    let added = tag();
    engine.listen(&added).await.expect("LISTEN");
    notify(&admin, &added, "1000000").await;
    terminate(&admin, &name, engine.stats.backend_pid().unwrap()).await;
    notify(&admin, &added, "1000001").await;
    support_wait::wait_until_async("the standby promoted", || {
        engine.stats.standby_promotions() == 1
    })
    .await;
    wait_more(&seen, STEADY).await;
    let extra: Vec<u32> = seen
        .lock()
        .unwrap()
        .numbers
        .iter()
        .copied()
        .filter(|number| *number >= 1_000_000)
        .collect();
    assert_eq!(extra, [1_000_000, 1_000_001]);
    seen.lock()
        .unwrap()
        .numbers
        .retain(|number| *number < 1_000_000);
    assert_every_number_once_in_order(notifier, &seen).await;
    assert_eq!(engine.stats.reconnects(), 0);
    engine.stop().await;
}

#[tokio::test]
async fn the_census_is_one_connection_without_a_standby_and_two_with_it() {
    let Some(options) = options().await else {
        return;
    };
    let admin = admin(&options).await;
    let (plain_name, standby_name, channel) = (tag(), tag(), tag());
    let (plain, _) = collected(&options, &plain_name, false);
    let (standby, _) = collected(&options, &standby_name, true);
    plain.listen(&channel).await.expect("LISTEN");
    standby.listen(&channel).await.expect("LISTEN");
    wait_aligned(&standby).await;
    support_wait::wait_until_async("the plain engine healthy", || plain.stats.healthy()).await;
    assert_eq!(plain.stats.listen_connections(), 1);
    assert!(!plain.stats.standby_aligned());
    assert_eq!(backends(&admin, &plain_name).await.len(), 1);
    assert_eq!(backends(&admin, &standby_name).await.len(), 2);
    plain.stop().await;
    standby.stop().await;
}
