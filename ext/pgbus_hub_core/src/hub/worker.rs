//! One connected worker: a bounded outbox drained by a writer task, and a
//! reader task that decodes its frames. Neither ever blocks another worker.

use super::server::sever;
use super::Core;
use crate::protocol::{Decoder, Message};
use crate::sync::lock;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::Notify;

pub use super::registry::WorkerId;

pub use crate::protocol::Frame;

/// Read and write buffer size: a few typical frames per syscall, small per worker.
const IO_CHUNK_BYTES: usize = 64 * 1024;

/// A peer that starts a frame must finish it within this time; half a frame
/// then silence is an attack or a dead peer, not a slow worker.
const FRAME_COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

/// Unacked subs one worker may have in flight. pgbus waits for each ack per
/// request thread (a few dozen at most); far more is a flood and is cut off.
pub const MAX_PENDING_SUBS: usize = 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Enqueued {
    Queued,
    /// A durable wake over `durable_queue_limit`: dropped (it self-heals on the next read).
    Dropped,
    /// Over `hard_queue_limit`: the worker was severed (its client fails over).
    Evicted,
    /// The worker is already gone.
    Closed,
}

#[derive(Default)]
struct Outbox {
    frames: VecDeque<(Frame, bool)>,
    durable: usize,
    closed: bool,
    /// Set (under this lock) before the reader drops its half: from then on the fd may be reused.
    fd_released: bool,
}

pub struct Worker {
    pub id: WorkerId,
    /// The peer process (SO_PEERCRED), for log lines an operator can act on.
    peer_pid: Option<i32>,
    fd: RawFd,
    outbox: Mutex<Outbox>,
    ready: Notify,
    pending_subs: AtomicUsize,
}

impl Worker {
    /// "connection 3 (pid 4242)": the hub's connection number (connections
    /// are not Puma's worker numbers) and the process on the other end.
    pub fn label(&self) -> String {
        match self.peer_pid {
            Some(pid) => format!("connection {} (pid {pid})", self.id),
            None => format!("connection {}", self.id),
        }
    }

    /// Splits `stream` and spawns its reader and writer on the current runtime.
    pub fn spawn(
        core: Arc<Core>,
        id: WorkerId,
        peer_pid: Option<i32>,
        stream: UnixStream,
    ) -> Arc<Self> {
        let worker = Arc::new(Self {
            id,
            peer_pid,
            fd: stream.as_raw_fd(),
            outbox: Mutex::default(),
            ready: Notify::new(),
            pending_subs: AtomicUsize::new(0),
        });
        let (read, write) = stream.into_split();
        tokio::spawn(write_loop(worker.clone(), write, core.clone()));
        tokio::spawn(read_loop(worker.clone(), read, core));
        worker
    }

    /// One of this worker's subs got its answer (or needs none any more).
    pub fn sub_answered(&self) {
        self.pending_subs.fetch_sub(1, Ordering::Relaxed);
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        lock(&self.outbox)
    }

    /// Non-blocking. Durable wakes (`droppable`) stop at `durable_limit`;
    /// everything past `hard_limit` queued frames evicts the worker.
    pub fn enqueue(
        &self,
        frame: Frame,
        droppable: bool,
        durable_limit: usize,
        hard_limit: usize,
    ) -> Enqueued {
        let mut outbox = self.outbox();
        if outbox.closed {
            return Enqueued::Closed;
        }
        if droppable && outbox.durable >= durable_limit {
            return Enqueued::Dropped;
        }
        outbox.frames.push_back((frame, droppable));
        outbox.durable += usize::from(droppable);
        if outbox.frames.len() > hard_limit {
            drop(outbox);
            self.close();
            return Enqueued::Evicted;
        }
        drop(outbox);
        self.ready.notify_one();
        Enqueued::Queued
    }

    /// Closes the connection for good: shutdown(2) (reaching every forked copy), writer released.
    pub fn close(&self) {
        let mut outbox = self.outbox();
        outbox.closed = true;
        outbox.frames.clear();
        if !outbox.fd_released {
            sever(self.fd);
        }
        drop(outbox);
        self.ready.notify_one();
    }

    /// Takes queued frames (up to about one chunk) for the writer.
    fn take_batch(&self, into: &mut Vec<u8>) -> (usize, bool) {
        let mut outbox = self.outbox();
        let mut count = 0;
        while into.len() < IO_CHUNK_BYTES {
            let Some((frame, droppable)) = outbox.frames.pop_front() else {
                break;
            };
            outbox.durable -= usize::from(droppable);
            into.extend_from_slice(&frame);
            count += 1;
        }
        (count, outbox.closed)
    }
}

async fn write_loop(worker: Arc<Worker>, mut write: OwnedWriteHalf, core: Arc<Core>) {
    let mut buffer = Vec::with_capacity(IO_CHUNK_BYTES);
    loop {
        buffer.clear();
        let (count, closed) = worker.take_batch(&mut buffer);
        if closed {
            break;
        }
        if count == 0 {
            worker.ready.notified().await;
            continue;
        }
        if write.write_all(&buffer).await.is_err() {
            break; // EPIPE/ECONNRESET: the reader sees it too and cleans up.
        }
        core.counters
            .frames_sent
            .fetch_add(count as u64, Ordering::Relaxed);
    }
    worker.close();
}

async fn read_loop(worker: Arc<Worker>, mut read: OwnedReadHalf, core: Arc<Core>) {
    let mut decoder = Decoder::new();
    let mut buffer = vec![0u8; IO_CHUNK_BYTES];
    'connection: loop {
        let received = if decoder.has_partial_frame() {
            match tokio::time::timeout(FRAME_COMPLETION_TIMEOUT, read.read(&mut buffer)).await {
                Ok(received) => received,
                Err(_) => {
                    core.log.warn(format!(
                        "{} sent part of a frame and then nothing for {}s — disconnecting it",
                        worker.label(),
                        FRAME_COMPLETION_TIMEOUT.as_secs()
                    ));
                    break;
                }
            }
        } else {
            read.read(&mut buffer).await
        };
        match received {
            Ok(0) | Err(_) => break,
            Ok(n) => decoder.feed(&buffer[..n]),
        }
        loop {
            let message = match decoder
                .next_frame()
                .map(|frame| frame.map(Message::from_object))
            {
                Ok(None) => break,
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) | Err(e) => {
                    core.log.warn(format!(
                        "{} protocol error: {e} — disconnecting it",
                        worker.label()
                    ));
                    break 'connection;
                }
            };
            if !handle(&core, &worker, message) {
                break 'connection;
            }
        }
    }
    {
        let mut outbox = worker.outbox();
        outbox.closed = true;
        // Sever while our half still holds the fd open, then mark it released.
        if !outbox.fd_released {
            sever(worker.fd);
            outbox.fd_released = true;
        }
    }
    worker.ready.notify_one();
    core.remove_worker(worker.id);
    drop(read);
}

/// Applies one frame from a worker; false = disconnect it.
fn handle(core: &Arc<Core>, worker: &Arc<Worker>, message: Message) -> bool {
    match message {
        Message::Sub(queue) => {
            if worker.pending_subs.load(Ordering::Relaxed) >= MAX_PENDING_SUBS {
                core.log.warn(format!(
                    "{} has {MAX_PENDING_SUBS} subscriptions awaiting LISTEN (a sub flood) — disconnecting it",
                    worker.label()
                ));
                return false;
            }
            worker.pending_subs.fetch_add(1, Ordering::Relaxed);
            core.subscribe(worker.clone(), queue);
        }
        Message::Unsub(queue) => core.unsubscribe(worker.id, &queue),
        Message::Unknown(object)
            if object.get("t").and_then(|t| t.as_str()) == Some(crate::protocol::STATS_KIND) =>
        {
            core.send_stats(worker);
        }
        Message::Unknown(object) => {
            let kind = object
                .get("t")
                .map(|t| t.to_string())
                .unwrap_or_else(|| "none".into());
            core.log.warn(format!(
                "{} sent unknown frame (t={kind}) — ignored",
                worker.label()
            ));
        }
        other => core.log.warn(format!(
            "{} sent a hub-to-worker frame ({}) — ignored",
            worker.label(),
            other.kind()
        )),
    }
    true
}
