//! The hub's end of one worker's socket ([`WorkerConnection`]): a writer
//! task that drains its outbox, and a reader task that decodes its frames and
//! turns them into commands for the router. Neither ever blocks another worker.

use super::command::{Command, Commands};
use super::limits::{
    CATCH_UP_POLL_FIRST, CATCH_UP_POLL_MAX, CATCH_UP_UNREAD_LIMIT, FRAMES_PER_BATCH,
    FRAME_COMPLETION_TIMEOUT, MAX_PENDING_SUBS,
};
use super::outbox::{Backpressure, Enqueued, Outbox};
use super::server::sever;
use super::HubShared;
use crate::log::LogSink;
use crate::protocol::{Frame, Marker, Message, Move, Replace};
use crate::sync::lock;
use crate::transport::connection::{FrameReader, FrameWriter, ReadEnd};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::net::UnixStream;
use tokio::sync::Notify;

pub use super::registry::WorkerId;

pub struct WorkerConnection {
    pub id: WorkerId,
    /// The peer process (SO_PEERCRED), for log lines an operator can act on.
    peer_pid: Option<i32>,
    fd: RawFd,
    outbox: Mutex<Outbox>,
    ready: Notify,
    pending_subs: AtomicUsize,
    /// A cap refusal was logged for this connection already.
    refusal_logged: AtomicBool,
}

impl WorkerConnection {
    /// The peer process (SO_PEERCRED), if the kernel said.
    pub fn peer_pid(&self) -> Option<i32> {
        self.peer_pid
    }

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
        id: WorkerId,
        peer_pid: Option<i32>,
        stream: UnixStream,
        shared: Arc<HubShared>,
        commands: Commands,
    ) -> Arc<Self> {
        let worker = Arc::new(Self {
            id,
            peer_pid,
            fd: stream.as_raw_fd(),
            outbox: Mutex::default(),
            ready: Notify::new(),
            pending_subs: AtomicUsize::new(0),
            refusal_logged: AtomicBool::new(false),
        });
        let (read, write) = stream.into_split();
        tokio::spawn(write_loop(
            worker.clone(),
            FrameWriter::new(write),
            shared.clone(),
        ));
        tokio::spawn(read_loop(
            worker.clone(),
            FrameReader::new(read, FRAME_COMPLETION_TIMEOUT),
            shared.log.clone(),
            commands,
        ));
        worker
    }

    pub(super) fn outbox(&self) -> MutexGuard<'_, Outbox> {
        lock(&self.outbox)
    }

    /// Queues `frame` under `backpressure`'s rules; wakes the writer, or
    /// evicts this worker when the rules say so.
    pub fn offer(&self, backpressure: &Backpressure, frame: Frame, droppable: bool) -> Enqueued {
        let mut outbox = self.outbox();
        let outcome = backpressure.offer(&mut outbox, frame, droppable, &|| self.label());
        if outcome == Enqueued::Evicted && outbox.close() {
            sever(self.fd);
            crate::events::evicted(self.id, self.peer_pid);
        }
        drop(outbox);
        if matches!(outcome, Enqueued::Queued | Enqueued::Evicted) {
            self.ready.notify_one();
        }
        outcome
    }

    /// Queues the ack of a sub read at `read_at`: its sub->ack time is
    /// observed once the writer has written it. The router and the writer
    /// share the hub's one thread and nothing awaits between the two locks,
    /// so the ack is marked before the writer can take it.
    pub fn offer_ack(&self, backpressure: &Backpressure, frame: Frame, read_at: Instant) {
        if self.offer(backpressure, frame, false) == Enqueued::Queued {
            self.outbox().ack_queued(read_at);
        }
    }

    /// Owes this worker the catch-up wakes `frames` (see [`Outbox::owe_catch_up`]).
    pub fn owe_catch_up(&self, frames: Vec<Frame>) {
        if self.outbox().owe_catch_up(frames) {
            self.ready.notify_one();
        }
    }

    /// Queues what catch-up it is still owed as live frames (see [`Outbox::settle_catch_up`]).
    pub fn settle_catch_up(&self) {
        self.outbox().settle_catch_up();
    }

    /// True the first time only: a hostile peer's refusals are logged once.
    pub fn first_refusal(&self) -> bool {
        !self.refusal_logged.swap(true, Ordering::Relaxed)
    }

    /// One of this worker's subs got its answer (or needs none any more).
    pub fn sub_answered(&self) {
        self.pending_subs.fetch_sub(1, Ordering::Relaxed);
    }

    /// Closes the connection for good: shutdown(2) (reaching every forked copy), writer released.
    pub fn close(&self) {
        let mut outbox = self.outbox();
        if outbox.close() {
            sever(self.fd);
        }
        drop(outbox);
        self.ready.notify_one();
    }
}

async fn write_loop(
    worker: Arc<WorkerConnection>,
    mut writer: FrameWriter,
    shared: Arc<HubShared>,
) {
    let mut batch = Vec::with_capacity(FRAMES_PER_BATCH);
    let mut acks = Vec::new();
    let mut catch_up_poll = CATCH_UP_POLL_FIRST;
    loop {
        batch.clear();
        let catch_up_room = match writer.unread_bytes() {
            Some(unread) if unread >= CATCH_UP_UNREAD_LIMIT => 0,
            _ => FRAMES_PER_BATCH,
        };
        let (closed, owed) = {
            let mut outbox = worker.outbox();
            outbox.take(&mut batch, FRAMES_PER_BATCH, catch_up_room);
            outbox.take_acks(&mut acks);
            (outbox.is_closed(), outbox.owes_catch_up())
        };
        if closed {
            break;
        }
        if batch.is_empty() {
            if owed {
                let _ = tokio::time::timeout(catch_up_poll, worker.ready.notified()).await;
                catch_up_poll = (catch_up_poll * 2).min(CATCH_UP_POLL_MAX);
            } else {
                worker.ready.notified().await;
            }
            continue;
        }
        catch_up_poll = CATCH_UP_POLL_FIRST;
        // Observed as the acks are handed to the socket, not after the write returns: a worker
        // holding its ack (a scrape right after its subscribe returned) must find it counted.
        // An ack whose write then fails is counted all the same (its worker is gone).
        for read_at in acks.drain(..) {
            shared.subscribe_ack.observe(read_at);
        }
        if writer.write_frames(&batch).await.is_err() {
            break; // EPIPE/ECONNRESET: the reader sees it too and cleans up.
        }
        shared
            .frames_sent
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
    }
    worker.close();
}

async fn read_loop(
    worker: Arc<WorkerConnection>,
    mut reader: FrameReader,
    log: LogSink,
    commands: Commands,
) {
    loop {
        let message = match reader.read_message().await {
            Ok(message) => message,
            Err(ReadEnd::Closed | ReadEnd::Broken(_)) => break,
            Err(ReadEnd::Stalled(after)) => {
                log.warn(format!(
                    "{} sent part of a frame and then nothing for {}s — disconnecting it",
                    worker.label(),
                    after.as_secs()
                ));
                break;
            }
            Err(ReadEnd::Protocol(e)) => {
                log.warn(format!(
                    "{} protocol error: {e} — disconnecting it",
                    worker.label()
                ));
                break;
            }
        };
        match command_for(&worker, &log, message) {
            Next::Send(command) => {
                if commands.send(command).await.is_err() {
                    break; // the hub is stopping
                }
            }
            Next::Ignore => {}
            Next::Disconnect => break,
        }
    }
    {
        let mut outbox = worker.outbox();
        // Sever while our half still holds the fd open (and the lock: nobody
        // severs the fd once it is marked released and may be reused).
        if outbox.release_fd() {
            sever(worker.fd);
        }
    }
    worker.ready.notify_one();
    drop(reader);
    let _ = commands.send(Command::Gone(worker.id)).await;
}

/// What the reader does with one frame.
enum Next {
    Send(Command),
    /// Logged already.
    Ignore,
    /// Logged already: the worker is cut off.
    Disconnect,
}

fn command_for(worker: &Arc<WorkerConnection>, log: &LogSink, message: Message) -> Next {
    match message {
        Message::Sub(queue) => {
            if worker.pending_subs.load(Ordering::Relaxed) >= MAX_PENDING_SUBS {
                log.warn(format!(
                    "{} has {MAX_PENDING_SUBS} subscriptions awaiting LISTEN (a sub flood) — disconnecting it",
                    worker.label()
                ));
                return Next::Disconnect;
            }
            worker.pending_subs.fetch_add(1, Ordering::Relaxed);
            Next::Send(Command::Sub {
                worker: worker.id,
                queue,
                read_at: std::time::Instant::now(),
            })
        }
        Message::Unsub(queue) => Next::Send(Command::Unsub {
            worker: worker.id,
            queue,
        }),
        Message::Stats(_) => Next::Send(Command::Stats(worker.id)),
        Message::Move(Move::Answer { token }) => Next::Send(Command::MoveAnswer {
            worker: worker.id,
            token,
        }),
        Message::Marker(Marker::Commit { channel, token }) => Next::Send(Command::MarkerCommit {
            worker: worker.id,
            channel,
            token,
        }),
        Message::Replace(replace @ (Replace::Request | Replace::To(_))) => {
            Next::Send(Command::Replace {
                worker: worker.id,
                replace,
            })
        }
        Message::Unknown(object) => {
            let kind = object
                .get("t")
                .map(|t| t.to_string())
                .unwrap_or_else(|| "none".into());
            log.warn(format!(
                "{} sent unknown frame (t={kind}) — ignored",
                worker.label()
            ));
            Next::Ignore
        }
        other => {
            log.warn(format!(
                "{} sent a hub-to-worker frame ({}) — ignored",
                worker.label(),
                other.kind()
            ));
            Next::Ignore
        }
    }
}
