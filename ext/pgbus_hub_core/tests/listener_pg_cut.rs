//! Issue 56, plan step 2: two LISTEN connections cut at one marker
//! (docs/architecture.md, "The cut") under a third session's NOTIFYs
//! (numbered payloads every 3 ms, through neither engine): the old side
//! delivers up to the marker and nothing after it, the new side from the
//! marker on; together every number exactly once, in order, split exactly
//! at the marker. Only the marker decides where: no sleep aligns anything.
//!
//! Database and isolation as listener_pg.rs: each test's own channel names.

#![allow(dead_code, unused_imports)]

mod support_pg;
mod support_wait;

include!("support_listener_pg/engine.rs");

use pgbus_hub_core::listener::{
    cut_token, Cut, CutError, ListenerState, Start, PRIVATE_CHANNEL_PREFIX,
};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Pause between two NOTIFYs: ~300 a second, a steady stream.
const NOTIFY_PAUSE: Duration = Duration::from_millis(3);

/// Numbers each side must have delivered before the next step: the stream
/// runs before, during and after the cut.
const STEADY: usize = 100;

/// What a side handed on, in order: a number or a marker.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Number(u32),
    Marker(String),
}

type Items = Arc<Mutex<Vec<Item>>>;

/// Numbered NOTIFYs on `channel` from a session of its own, until stopped;
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

/// An engine with bare channel names whose wakes and markers are collected.
fn collected_engine(options: ConnectionOptions, start: Start) -> (Engine, Items) {
    let mut config = ListenerConfig::new(options, LogSink::silent());
    config.channel_prefix = String::new();
    config.channel_suffix = String::new();
    let items: Items = Arc::default();
    // Collected into `items` only: the events channel has no sender.
    let (_, events) = mpsc::unbounded_channel();
    let into = Arc::clone(&items);
    let (handle, stats, join) = listener::spawn_with(config, start, move |event| {
        if let Some(item) = item_of(&event) {
            into.lock().unwrap().push(item);
        }
    });
    let engine = Engine {
        handle,
        stats,
        join,
        events,
    };
    (engine, items)
}

fn item_of(event: &Event) -> Option<Item> {
    match event {
        Event::Wake(wake) => Some(Item::Number(
            wake.payload.as_deref().unwrap().parse().unwrap(),
        )),
        Event::Marker(token) => Some(Item::Marker(token.clone())),
        Event::Healthy(_) | Event::CatchUp(_) => None,
    }
}

fn snapshot(items: &Items) -> Vec<Item> {
    items.lock().unwrap().clone()
}

fn numbers(items: &[Item]) -> Vec<u32> {
    items
        .iter()
        .filter_map(|item| match item {
            Item::Number(n) => Some(*n),
            Item::Marker(_) => None,
        })
        .collect()
}

/// `items` split at the marker `token`: (before, after); None without it.
fn split_at_marker(items: &[Item], token: &str) -> Option<(Vec<Item>, Vec<Item>)> {
    let at = items
        .iter()
        .position(|item| *item == Item::Marker(token.to_owned()))?;
    Some((items[..at].to_vec(), items[at + 1..].to_vec()))
}

/// The numbers after the marker `token` (0 before it is read).
fn after_marker(items: &Items, token: &str) -> usize {
    split_at_marker(&snapshot(items), token).map_or(0, |(_, after)| numbers(&after).len())
}

/// The old side's numbers up to the marker, then the new side's after it:
/// every number once, in order, and the old side delivered nothing after.
fn assert_cut_exactly(old: &[Item], new: &[Item], token: &str, sent: u32) -> (usize, usize) {
    let (old_before, old_after) = split_at_marker(old, token).expect("the old side's marker");
    assert!(
        old_after.is_empty(),
        "the old side delivered {} items after its marker",
        old_after.len()
    );
    let (_, new_after) = split_at_marker(new, token).expect("the new side's marker");
    let (old_before, new_after) = (numbers(&old_before), numbers(&new_after));
    let joined: Vec<u32> = old_before.iter().chain(&new_after).copied().collect();
    let expected: Vec<u32> = (0..sent).collect();
    if joined != expected {
        let last_old = old_before.last();
        let first_new = new_after.first();
        panic!(
            "not every number once, in order: sent {sent}, joined {} (old side up to {last_old:?}, \
             new side from {first_new:?})",
            joined.len()
        );
    }
    (old_before.len(), new_after.len())
}

#[tokio::test]
async fn a_cut_committed_live_splits_two_connections_at_one_marker() {
    let Some(options) = options().await else {
        return;
    };
    let channel = tag();
    let (old, old_items) = collected_engine(options.clone(), Start::default());
    old.listen(&channel).await.expect("the old side LISTENs");
    let notifier = Notifier::start(&channel);
    support_wait::wait_until_async("the old side delivering", || {
        numbers(&snapshot(&old_items)).len() >= STEADY
    })
    .await;
    // The new side LISTENs too: both deliver the stream for a while.
    let (new, new_items) = collected_engine(options, Start::default());
    new.listen(&channel).await.expect("the new side LISTENs");
    support_wait::wait_until_async("the new side delivering", || {
        numbers(&snapshot(&new_items)).len() >= STEADY
    })
    .await;

    let token = cut_token();
    old.handle.stop_at(Some(&token));
    let old_channel = old.stats.private_channel().expect("a private channel");
    let cut = Cut::new(old_channel, token.clone()).unwrap();
    let committed = tokio::time::timeout(WAIT, new.handle.commit_cut(cut)).await;
    assert_eq!(committed.expect("answered in time"), Ok(Ok(())));
    support_wait::wait_until_async("the new side past its marker", || {
        after_marker(&new_items, &token) >= STEADY
    })
    .await;
    let sent = notifier.stop();
    support_wait::wait_until_async("the new side's last number", || {
        numbers(&snapshot(&new_items)).last() == Some(&(sent - 1))
    })
    .await;
    // The old side read past its marker, and dropped it.
    support_wait::wait_until_async("the old side reading past its marker", || {
        old.stats.ignored_notifications() > 0
    })
    .await;
    old.stop().await;
    new.stop().await;

    let (old_all, new_all) = (snapshot(&old_items), snapshot(&new_items));
    let (from_old, from_new) = assert_cut_exactly(&old_all, &new_all, &token, sent);
    // Both read K at one position: what the new side read before its marker
    // is exactly the tail of what the old side delivered before its own.
    let (old_before, _) = split_at_marker(&old_all, &token).unwrap();
    let (new_before, _) = split_at_marker(&new_all, &token).unwrap();
    let (old_before, new_before) = (numbers(&old_before), numbers(&new_before));
    assert!(new_before.len() >= STEADY);
    assert!(
        old_before.ends_with(&new_before),
        "the new side's numbers before the marker ({:?}..{:?}) are not the old side's last ones (..{:?})",
        new_before.first(),
        new_before.last(),
        old_before.last()
    );
    eprintln!("live cut: {sent} sent, {from_old} by the old side, {from_new} by the new one");
}

#[tokio::test]
async fn a_start_with_a_set_and_a_cut_takes_over_at_its_first_transactions_marker() {
    let Some(options) = options().await else {
        return;
    };
    let channel = tag();
    let (old, old_items) = collected_engine(options.clone(), Start::default());
    old.listen(&channel).await.expect("the old side LISTENs");
    let notifier = Notifier::start(&channel);
    support_wait::wait_until_async("the old side delivering", || {
        numbers(&snapshot(&old_items)).len() >= STEADY
    })
    .await;

    // The new side: a worker's own listener, its set and the cut in its
    // first transaction.
    let token = cut_token();
    old.handle.stop_at(Some(&token));
    let old_channel = old.stats.private_channel().expect("a private channel");
    let start = Start {
        queues: vec![channel.clone()],
        cut: Some(Cut::new(old_channel, token.clone()).unwrap()),
    };
    let mut config = ListenerConfig::new(options, LogSink::silent());
    config.channel_prefix = String::new();
    config.channel_suffix = String::new();
    let (deliveries, received) = delivery::channel();
    let new = StandaloneListener::start_with(config, deliveries, start).unwrap();
    let new_items: Items = Arc::default();
    let collecting = Arc::new(AtomicBool::new(true));
    let collector = {
        let (into, collecting) = (Arc::clone(&new_items), Arc::clone(&collecting));
        std::thread::spawn(move || {
            while collecting.load(Ordering::SeqCst) {
                let item = match received.recv_timeout(Duration::from_millis(50)) {
                    Some(Delivery::Wake(wake)) => {
                        Item::Number(wake.payload.as_deref().unwrap().parse().unwrap())
                    }
                    Some(Delivery::Marker { token }) => Item::Marker(token),
                    Some(other) => panic!("unexpected {other:?}"),
                    None => continue,
                };
                into.lock().unwrap().push(item);
            }
        })
    };
    support_wait::wait_until_async("the new side past its marker", || {
        after_marker(&new_items, &token) >= STEADY
    })
    .await;
    // Its set was LISTENed in that transaction: a listen is answered at once.
    let listened = new.listen(&channel, Duration::from_secs(1));
    assert_eq!(listened, Ok(()));
    let sent = notifier.stop();
    support_wait::wait_until_async("the new side's last number", || {
        numbers(&snapshot(&new_items)).last() == Some(&(sent - 1))
    })
    .await;
    support_wait::wait_until_async("the old side reading past its marker", || {
        old.stats.ignored_notifications() > 0
    })
    .await;
    collecting.store(false, Ordering::SeqCst);
    collector.join().unwrap();
    new.stop(); // blocks this runtime a moment: the old side stopped at its marker
    old.stop().await;

    let (old_all, new_all) = (snapshot(&old_items), snapshot(&new_items));
    // What preceded the marker was the old side's: the new side dropped it.
    assert_eq!(new_all.first(), Some(&Item::Marker(token.clone())));
    let (from_old, from_new) = assert_cut_exactly(&old_all, &new_all, &token, sent);
    eprintln!(
        "start with a cut: {sent} sent, {from_old} by the old side, {from_new} by the new one"
    );
}

/// The old side in the middle of a handover (issue 46) when the cut is
/// committed: its given-up connection frozen (a NAT entry lost), its new one
/// up and holding what it reads after the handover marker, the cut's marker
/// among it. Thawed, the given-up connection delivers up to the handover
/// marker, then the held ones are delivered: the cut's marker in its place,
/// nothing after it.
#[tokio::test]
async fn a_cut_during_a_handover_is_held_and_delivered_in_its_place() {
    let Some(options) = options().await else {
        return;
    };
    let proxy = support_pg::FreezableProxy::start(&database_url());
    let channel = tag();
    let through_proxy = ConnectionOptions::parse(&proxy.url).unwrap();
    let (old, old_items) = collected_engine(through_proxy, Start::default());
    old.listen(&channel).await.expect("the old side LISTENs");
    let notifier = Notifier::start(&channel);
    let (new, new_items) = collected_engine(options, Start::default());
    new.listen(&channel).await.expect("the new side LISTENs");
    support_wait::wait_until_async("both sides delivering", || {
        numbers(&snapshot(&old_items)).len() >= STEADY
            && numbers(&snapshot(&new_items)).len() >= STEADY
    })
    .await;
    proxy.freeze_existing();
    support_wait::wait_until_async("the old side handing over", || {
        old.stats.state() == ListenerState::HandingOver
    })
    .await;

    let token = cut_token();
    old.handle.stop_at(Some(&token));
    let old_channel = old.stats.private_channel().expect("a private channel");
    let cut = Cut::new(old_channel, token.clone()).unwrap();
    let committed = tokio::time::timeout(WAIT, new.handle.commit_cut(cut)).await;
    assert_eq!(committed.expect("answered in time"), Ok(Ok(())));
    support_wait::wait_until_async("the new side past its marker", || {
        after_marker(&new_items, &token) >= STEADY
    })
    .await;
    // The old side's marker is held behind its frozen connection's backlog.
    assert_eq!(after_marker(&old_items, &token), 0);
    assert!(split_at_marker(&snapshot(&old_items), &token).is_none());
    proxy.thaw();
    support_wait::wait_until_async("the old side's handover", || old.stats.handovers() == 1).await;
    let sent = notifier.stop();
    support_wait::wait_until_async("the new side's last number", || {
        numbers(&snapshot(&new_items)).last() == Some(&(sent - 1))
    })
    .await;
    support_wait::wait_until_async("the old side reading past its marker", || {
        old.stats.ignored_notifications() > 0
    })
    .await;
    assert_eq!(old.stats.abandoned_connections(), 0);
    old.stop().await;
    new.stop().await;

    let (from_old, from_new) =
        assert_cut_exactly(&snapshot(&old_items), &snapshot(&new_items), &token, sent);
    eprintln!(
        "cut during a handover: {sent} sent, {from_old} by the old side, {from_new} by the new one"
    );
}

#[tokio::test]
async fn a_cut_is_refused_without_a_listening_connection_and_the_private_channel_is_published() {
    // Nothing listens on port 1: the engine stays connecting.
    let options =
        ConnectionOptions::parse("host=127.0.0.1 port=1 user=nobody connect_timeout=1").unwrap();
    let (engine, _) = collected_engine(options, Start::default());
    let private = engine.stats.private_channel().expect("published at once");
    assert!(private.starts_with(PRIVATE_CHANNEL_PREFIX));
    let other = Cut::new(format!("{PRIVATE_CHANNEL_PREFIX}1.2"), cut_token()).unwrap();
    let answer = tokio::time::timeout(WAIT, engine.handle.commit_cut(other)).await;
    assert_eq!(
        answer.expect("answered in time"),
        Ok(Err(CutError::NotListening))
    );
    engine.stop().await;
}
