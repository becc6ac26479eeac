//! The hub client's reading side: no thread of its own. The embedder's pump
//! thread calls [`WakeSource::next_batch`](crate::delivery::WakeSource::next_batch), which polls the socket itself,
//! decodes what arrived and hands the client each frame (see the module doc
//! of [`crate::client`] for why). [`Wakeup`] is how another thread ends
//! that poll early (Ruby's unblock function, the pump's stop).

use super::{lock, read, Inner};
use crate::delivery::{Batch, DeliveryReceiver, WakeSource};
use crate::os::Wakeup;
use crate::process::Owner;
use crate::protocol::Decoder;
use crate::transport::socket::Readiness;
use std::io;
use std::mem::ManuallyDrop;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::{Duration, Instant};

/// The hub client's wakes, read by the caller's thread (see
/// [`super::HubClient::connect_driven`]). One thread at a time waits in
/// `next_batch`; `interrupt` may be called from any thread.
///
/// Decoded wakes still pass through the client's delivery channel (an
/// uncontended push and pop, no wake-up): `kill` queues `Failed` there under
/// the state lock, after every wake, whichever thread found the transport dead.
pub struct DrivenReader {
    // ManuallyDrop: in a forked child these are leaked (see Drop).
    pub(super) inner: ManuallyDrop<Arc<Inner>>,
    pub(super) receiver: ManuallyDrop<DeliveryReceiver>,
    pub(super) wakeup: Wakeup,
    pub(super) owner: Owner,
}

/// What one wait on the socket ended with.
enum Ready {
    Read(io::Result<usize>),
    Interrupted,
    TimedOut,
    /// Stopped or dead: nothing more will be read.
    Closed,
}

/// What one read did to the client.
enum Step {
    Continue,
    /// The transport died: this is why.
    Died(String),
}

impl Inner {
    /// Polls the socket (and `wakeup`, if any) for at most `timeout`, then
    /// reads what is there. The socket stays read-locked throughout, so `stop`
    /// cannot close (and the kernel reuse) the fd under the poll; its
    /// shutdown(2) ends the poll at once.
    fn wait_and_read(
        &self,
        decoder: &mut Decoder,
        wakeup: Option<&Wakeup>,
        timeout: Duration,
    ) -> Ready {
        let socket = read(&self.socket);
        let Some(socket) = socket
            .as_ref()
            .filter(|_| !self.dead.load(Ordering::Acquire))
        else {
            return Ready::Closed;
        };
        match socket.wait_readable(wakeup.map(|w| w.fd()), timeout) {
            Readiness::TimedOut => Ready::TimedOut,
            Readiness::Signalled => Ready::Interrupted,
            Readiness::Readable => Ready::Read(socket.read_into(decoder)),
        }
    }

    /// Hands the client every whole frame one read brought (a death is
    /// recorded, and queues `Failed`); nothing once the client is dead or
    /// stopped.
    fn take_read(&self, decoder: &mut Decoder, read: io::Result<usize>) {
        if self.dead.load(Ordering::Acquire) {
            return;
        }
        let step = panic::catch_unwind(AssertUnwindSafe(|| absorb(self, decoder, read)))
            .unwrap_or_else(|panic| Step::Died(crash_reason(panic)));
        if let Step::Died(reason) = step {
            self.mark_dead(reason);
        }
    }

    /// A sub waiting for its ack reads the socket itself, for at most
    /// `timeout`, when the pump is not reading it (it is busy in the app,
    /// e.g. blocked on a full dispatch queue): acks then never wait behind
    /// the app. Wakes read here wait in the delivery channel, in order, for
    /// the pump's next `next_batch`. The pump's wake-up is not watched here:
    /// an interrupted pump gets the socket back within `timeout`.
    /// True when this thread was the reader (it waited on the socket itself).
    pub(super) fn read_for_waiter(&self, timeout: Duration) -> bool {
        let mut decoder = match self.reading.try_lock() {
            Ok(decoder) => decoder,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false, // the pump is reading
        };
        match self.wait_and_read(&mut decoder, None, timeout) {
            Ready::Read(read) => self.take_read(&mut decoder, read),
            Ready::TimedOut => {}
            Ready::Interrupted | Ready::Closed => return false,
        }
        true
    }
}

/// Handles what one read into `decoder` returned: every whole frame goes to
/// the client.
fn absorb(inner: &Inner, decoder: &mut Decoder, read: io::Result<usize>) -> Step {
    match read {
        Ok(0) if decoder.has_partial_frame() => {
            return Step::Died("master hub closed the transport mid-frame".into())
        }
        Ok(0) => return Step::Died("master hub closed the transport".into()),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) =>
        {
            return Step::Continue
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
            return Step::Died("master hub reset the transport".into())
        }
        Err(e) => return Step::Died(format!("master hub transport error: {e}")),
    }
    loop {
        match decoder.next_message() {
            Ok(Some(message)) => inner.handle_frame(message),
            Ok(None) => return Step::Continue,
            Err(e) => return Step::Died(format!("master hub protocol error: {e}")),
        }
    }
}

/// The reason recorded when reading panicked (a bug; the client dies cleanly).
fn crash_reason(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    format!("master hub reader crashed: {what}")
}

impl WakeSource for DrivenReader {
    /// Returns wakes already decoded; otherwise polls the socket (resolving
    /// acks, nacks and status on the way) until wakes arrive, `interrupt`,
    /// or `timeout`. Once the client died or was stopped: what is left (a
    /// death's one `Failed`), then `closed`.
    fn next_batch(&self, max: usize, timeout: Duration) -> Batch {
        if !self.owner.is_current() {
            return Batch {
                closed: true,
                ..Batch::default()
            };
        }
        // None past Instant's range (e.g. Duration::MAX): each wait gets `timeout`.
        let deadline = Instant::now().checked_add(timeout);
        let inner = &**self.inner;
        let mut decoder = lock(&inner.reading);
        loop {
            let mut batch = Batch::default();
            self.receiver.take_ready(&mut batch, max);
            if !batch.items.is_empty() || batch.closed {
                return batch;
            }
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
            match inner.wait_and_read(&mut decoder, Some(&self.wakeup), left) {
                // A death queues `Failed` for the next pass; once dead, the next wait reports Closed.
                Ready::Read(read) => inner.take_read(&mut decoder, read),
                Ready::Interrupted => {
                    self.wakeup.clear();
                    batch.interrupted = true;
                    return batch;
                }
                Ready::TimedOut => return batch,
                Ready::Closed => {
                    // kill() marks the client dead and queues `Failed` under
                    // the state lock: once we have held it, everything this
                    // client will ever deliver is in the channel.
                    drop(lock(&inner.state));
                    self.receiver.take_ready(&mut batch, max);
                    batch.closed = batch.items.is_empty();
                    return batch;
                }
            }
        }
    }

    fn interrupt(&self) {
        self.wakeup.signal();
    }
}

impl Drop for DrivenReader {
    fn drop(&mut self) {
        if self.owner.is_current() {
            // SAFETY: each field is dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.receiver);
                ManuallyDrop::drop(&mut self.inner);
            }
        }
        // Forked child: the channel's and the client's locks may have been
        // held by parent threads at fork time; leak rather than touch them.
        // (The eventfd is this process's own copy: closing it is harmless.)
    }
}
