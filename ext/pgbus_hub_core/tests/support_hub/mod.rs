//! A small stub master hub for client tests: a real `UnixListener`, one
//! thread per connection, speaking the protocol via `pgbus_hub_core::protocol`.
//! No PostgreSQL: subs are acked (or not) according to [`AckMode`].

#![allow(dead_code)]

use pgbus_hub_core::protocol::{Decoder, Message};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub mod pump;

#[derive(Clone, Debug)]
pub enum AckMode {
    /// Ack every sub as soon as it is read.
    Immediate,
    /// Sleep, then ack (the connection reads nothing meanwhile).
    Delay(Duration),
    /// Never ack; the test acks by hand with [`StubHub::send`].
    Never,
}

#[derive(Clone, Debug)]
pub struct Behaviour {
    pub ack: AckMode,
    /// Subs for queues starting with this prefix get a `nack` instead.
    pub nack_prefix: Option<String>,
    /// Accept connections but never read from them.
    pub never_read: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            ack: AckMode::Immediate,
            nack_prefix: None,
            never_read: false,
        }
    }
}

#[derive(Default)]
struct StubHubRecord {
    /// Live connections (write side), by id; removed when the peer hangs up.
    conns: HashMap<u64, Arc<Mutex<UnixStream>>>,
    /// Every frame read from any connection, in order.
    received: Vec<Message>,
    /// Every byte read from any connection, in order.
    raw: Vec<u8>,
    accepted: usize,
}

pub struct StubHub {
    dir: PathBuf,
    path: PathBuf,
    shared: Arc<(Mutex<StubHubRecord>, Condvar)>,
    behaviour: Arc<Mutex<Behaviour>>,
    acceptor: Option<thread::JoinHandle<()>>,
}

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A fresh, short directory (socket paths must fit sun_path).
pub fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "phc-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

impl StubHub {
    pub fn start(behaviour: Behaviour) -> Self {
        let dir = temp_dir();
        let path = dir.join("hub.sock");
        let listener = UnixListener::bind(&path).expect("bind stub hub");
        let shared: Arc<(Mutex<StubHubRecord>, Condvar)> = Arc::default();
        let behaviour = Arc::new(Mutex::new(behaviour));
        let acceptor = {
            let shared = Arc::clone(&shared);
            let behaviour = Arc::clone(&behaviour);
            let ids = Arc::new(AtomicU64::new(0));
            thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { break };
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    let writer = Arc::new(Mutex::new(stream.try_clone().expect("clone")));
                    {
                        let mut state = shared.0.lock().unwrap();
                        if state.accepted == usize::MAX {
                            // Shutting down: the wake-up connection from `Drop`.
                            break;
                        }
                        state.accepted += 1;
                        state.conns.insert(id, Arc::clone(&writer));
                        shared.1.notify_all();
                    }
                    let shared = Arc::clone(&shared);
                    let behaviour = Arc::clone(&behaviour);
                    thread::spawn(move || serve(id, stream, writer, shared, behaviour));
                }
            })
        };
        Self {
            dir,
            path,
            shared,
            behaviour,
            acceptor: Some(acceptor),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    /// Waits until `test` holds for the shared state (or panics after 5 s).
    fn wait_until(&self, what: &str, test: impl Fn(&StubHubRecord) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (lock, condvar) = &*self.shared;
        let mut state = lock.lock().unwrap();
        while !test(&state) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "stub hub: timed out waiting for {what}");
            state = condvar.wait_timeout(state, left).unwrap().0;
        }
    }

    /// Waits for the `n`-th connection to be accepted.
    pub fn wait_connections(&self, n: usize) {
        self.wait_until("connections", |s| s.accepted >= n);
    }

    /// Waits until `n` frames have been read in total.
    pub fn wait_received(&self, n: usize) {
        self.wait_until("frames", |s| s.received.len() >= n);
    }

    /// Waits until no connection is open any more.
    pub fn wait_no_connections(&self) {
        self.wait_until("all connections to close", |s| s.conns.is_empty());
    }

    pub fn received(&self) -> Vec<Message> {
        self.shared.0.lock().unwrap().received.clone()
    }

    pub fn raw(&self) -> Vec<u8> {
        self.shared.0.lock().unwrap().raw.clone()
    }

    pub fn subs(&self) -> Vec<String> {
        self.received()
            .into_iter()
            .filter_map(|m| match m {
                Message::Sub(q) => Some(q),
                _ => None,
            })
            .collect()
    }

    fn writers(&self) -> Vec<Arc<Mutex<UnixStream>>> {
        self.shared
            .0
            .lock()
            .unwrap()
            .conns
            .values()
            .cloned()
            .collect()
    }

    /// Sends raw bytes to every open connection.
    pub fn send_raw(&self, bytes: &[u8]) {
        for writer in self.writers() {
            let _ = writer.lock().unwrap().write_all(bytes);
        }
    }

    pub fn send(&self, message: &Message) {
        self.send_raw(&message.encode().expect("encode"));
    }

    /// Shuts every open connection down (the client sees EOF).
    pub fn close_all(&self) {
        for writer in self.writers() {
            let _ = writer.lock().unwrap().shutdown(Shutdown::Both);
        }
    }
}

impl Drop for StubHub {
    fn drop(&mut self) {
        self.close_all();
        self.shared.0.lock().unwrap().accepted = usize::MAX;
        // Wake the acceptor so it sees the flag and exits (closing the listener).
        let _ = UnixStream::connect(&self.path);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(
    id: u64,
    mut stream: UnixStream,
    writer: Arc<Mutex<UnixStream>>,
    shared: Arc<(Mutex<StubHubRecord>, Condvar)>,
    behaviour: Arc<Mutex<Behaviour>>,
) {
    let write = |message: Message| {
        let frame = message.encode().expect("encode");
        let _ = writer.lock().unwrap().write_all(&frame);
    };
    let mut decoder = Decoder::new();
    let mut buffer = vec![0u8; 16 * 1024];
    'conn: loop {
        if behaviour.lock().unwrap().never_read {
            // Hold the connection open until the peer or the test closes it,
            // without consuming a byte: poll for hang-up only.
            let mut poll_fd = libc::pollfd {
                fd: std::os::unix::io::AsRawFd::as_raw_fd(&stream),
                events: crate::support_os::PEER_HANGUP_EVENTS,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll_fd, 1, 50) };
            if ready > 0 && poll_fd.revents & crate::support_os::PEER_HANGUP_SEEN != 0 {
                break;
            }
            continue;
        }
        let count = match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(count) => count,
        };
        decoder.feed(&buffer[..count]);
        {
            let mut state = shared.0.lock().unwrap();
            state.raw.extend_from_slice(&buffer[..count]);
        }
        loop {
            let object = match decoder.next_frame() {
                Ok(Some(object)) => object,
                Ok(None) => break,
                Err(_) => break 'conn,
            };
            let Ok(message) = Message::from_object(object) else {
                break 'conn;
            };
            {
                let mut state = shared.0.lock().unwrap();
                state.received.push(message.clone());
                shared.1.notify_all();
            }
            if let Message::Sub(queue) = message {
                let current = behaviour.lock().unwrap().clone();
                if current
                    .nack_prefix
                    .as_deref()
                    .is_some_and(|prefix| queue.starts_with(prefix))
                {
                    write(Message::Nack {
                        queue,
                        reason: "queue name is not allowed".into(),
                    });
                    continue;
                }
                match current.ack {
                    AckMode::Immediate => write(Message::Ack(queue)),
                    AckMode::Delay(delay) => {
                        thread::sleep(delay);
                        write(Message::Ack(queue));
                    }
                    AckMode::Never => {}
                }
            }
        }
    }
    let mut state = shared.0.lock().unwrap();
    state.conns.remove(&id);
    shared.1.notify_all();
}
