//! The client's side of a hub connection: one non-blocking Unix socket. The
//! thread waiting for wakes polls it (with one more descriptor that another
//! thread can signal) and reads straight into a [`Decoder`]'s buffer; a
//! writer sends one whole frame within a deadline. rustix wraps the
//! syscalls std lacks (poll, send without SIGPIPE, a connect that can be
//! abandoned), so none of this needs `unsafe`.

use std::io::{self, Read};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{connect, send, SocketAddrUnix};

use crate::os;
use crate::protocol::Decoder;

/// How often a connect that found the hub's listen backlog full tries again.
/// A non-blocking connect(2) to a Unix socket cannot be waited for (poll has
/// nothing to report until it is retried); a full backlog means the hub is
/// behind on accepting, so a few ms more are nothing, and a cancel is seen
/// at once (the pause is a wait on the cancel channel).
const CONNECT_RETRY: Duration = Duration::from_millis(5);

/// How long a refused connect is retried where a refusal may mean a full
/// backlog (macOS, the BSDs: see [`os::refusal_may_be_busy`]): a hub that
/// accepts at all drains its backlog well within it; a socket nobody listens
/// on (a hub killed with -9) is reported as refused after it.
pub const REFUSED_BUT_MAYBE_BUSY: Duration = Duration::from_millis(200);

/// How long a write blocked on a full socket buffer waits before looking at
/// its cancel channel again: an unblock function is honoured well within the
/// 50 ms Ruby callers are promised, and a stalled hub costs 100 wake-ups a second.
const WRITE_CANCEL_CHECK: Duration = Duration::from_millis(10);

/// Why [`ClientSocket::connect`] returned without a connection.
#[derive(Debug)]
pub enum ConnectError {
    /// The cancel channel received while the hub's backlog was full.
    Cancelled,
    Failed(io::Error),
}

/// Why [`ClientSocket::write_frame`] gave up.
#[derive(Debug)]
pub enum WriteError {
    /// The peer read too little for the whole frame to go out by the deadline.
    Stalled,
    /// The cancel channel received while the socket buffer was full, after
    /// `sent` bytes of the frame went out (0: none). The rest is the
    /// caller's to send before anything else, or the stream's framing is lost.
    Cancelled {
        sent: usize,
    },
    Failed(io::Error),
}

/// What [`ClientSocket::wait_readable`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Bytes, EOF or an error are there to read (or poll failed: the read says why).
    Readable,
    /// The other descriptor was signalled.
    Signalled,
    TimedOut,
}

#[derive(Debug)]
pub struct ClientSocket {
    stream: UnixStream,
}

impl ClientSocket {
    /// Connects like a blocking connect(2) would (it waits while the hub's
    /// listen backlog is full), but gives up as soon as `cancel` receives.
    pub fn connect(path: &Path, cancel: &Receiver<()>) -> Result<Self, ConnectError> {
        let failed = |errno: Errno| ConnectError::Failed(errno.into());
        let address = SocketAddrUnix::new(path).map_err(failed)?;
        let socket = os::unix_stream_socket().map_err(failed)?;
        let mut refused_since = None;
        loop {
            match connect(&socket, &address) {
                Ok(()) => {
                    return Ok(Self {
                        stream: UnixStream::from(socket),
                    })
                }
                // EAGAIN: the backlog is full (Unix sockets never say EINPROGRESS).
                Err(Errno::AGAIN) => {
                    if cancel.recv_timeout(CONNECT_RETRY).is_ok() {
                        return Err(ConnectError::Cancelled);
                    }
                }
                Err(Errno::INTR) => {}
                Err(errno)
                    if os::refusal_may_be_busy(errno.raw_os_error())
                        && refused_since.get_or_insert_with(Instant::now).elapsed()
                            < REFUSED_BUT_MAYBE_BUSY =>
                {
                    if cancel.recv_timeout(CONNECT_RETRY).is_ok() {
                        return Err(ConnectError::Cancelled);
                    }
                }
                Err(errno) => return Err(failed(errno)),
            }
        }
    }

    /// The descriptor number (for a forked child to close its copy).
    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Waits at most `timeout` (None past `Timespec`'s range: no limit) until
    /// the socket has something to read or `signal`, if any, is readable.
    pub fn wait_readable(&self, signal: Option<BorrowedFd<'_>>, timeout: Duration) -> Readiness {
        // On the stack: the pump polls once per wait.
        let socket = PollFd::new(&self.stream, PollFlags::IN);
        let mut fds = match signal {
            Some(signal) => [socket, PollFd::from_borrowed_fd(signal, PollFlags::IN)],
            None => [socket.clone(), socket],
        };
        let fds = &mut fds[..if signal.is_some() { 2 } else { 1 }];
        let timeout = Timespec::try_from(timeout).ok();
        match poll(fds, timeout.as_ref()) {
            Ok(0) => Readiness::TimedOut,
            Ok(_) if fds.get(1).is_some_and(|fd| !fd.revents().is_empty()) => Readiness::Signalled,
            // Readable, or EINTR and the like: the non-blocking read tells.
            _ => Readiness::Readable,
        }
    }

    /// One non-blocking read into the decoder's buffer (WouldBlock if empty).
    pub fn read_into(&self, decoder: &mut Decoder) -> io::Result<usize> {
        let mut stream = &self.stream;
        decoder.read_with(|buffer| stream.read(buffer))
    }

    /// Sends all of `frame`, waiting for buffer space until `deadline` (None:
    /// no limit) or until `cancel` receives. A closed peer is an error
    /// (EPIPE), never a SIGPIPE.
    pub fn write_frame(
        &self,
        frame: &[u8],
        deadline: Option<Instant>,
        cancel: &Receiver<()>,
    ) -> Result<(), WriteError> {
        let mut written = 0;
        while written < frame.len() {
            match send(&self.stream, &frame[written..], os::SEND_FLAGS) {
                Ok(sent) => written += sent,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) if cancel.try_recv().is_ok() => {
                    return Err(WriteError::Cancelled { sent: written })
                }
                Err(Errno::AGAIN) => self.wait_writable(deadline)?,
                Err(errno) => return Err(WriteError::Failed(errno.into())),
            }
        }
        Ok(())
    }

    /// Until the socket takes more bytes or reports an error (the next send
    /// says which), `deadline`, or [`WRITE_CANCEL_CHECK`] (the caller then
    /// looks at its cancel channel and sends again).
    fn wait_writable(&self, deadline: Option<Instant>) -> Result<(), WriteError> {
        let wait = match deadline {
            None => WRITE_CANCEL_CHECK,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(WriteError::Stalled);
                }
                left.min(WRITE_CANCEL_CHECK)
            }
        };
        let timeout = Timespec::try_from(wait).ok();
        let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
        match poll(&mut fds, timeout.as_ref()) {
            // Ok(0) is the deadline or a cancel check: the next pass sees which.
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(errno) => Err(WriteError::Failed(errno.into())),
        }
    }

    /// Ends reads and writes at once, in this process and the peer's (EOF).
    pub fn shutdown(&self) {
        // ENOTCONN if the peer is already gone: nothing left to do.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that reads nothing: fill the buffer, then a write waits for
    /// space until its cancel channel receives, and says whether it had begun.
    #[test]
    fn a_write_blocked_on_a_full_buffer_ends_when_cancelled() {
        let (ours, _silent_peer) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let socket = ClientSocket { stream: ours };
        let chunk = [0u8; 4096];
        while send(&socket.stream, &chunk, os::SEND_FLAGS).is_ok() {}
        let (cancel, cancelled) = crossbeam_channel::bounded(1);
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            cancel.send(()).unwrap();
            Instant::now()
        });
        let outcome = socket.write_frame(&chunk, None, &cancelled);
        let returned = Instant::now();
        let cancelled_at = canceller.join().unwrap();
        assert!(
            matches!(outcome, Err(WriteError::Cancelled { sent: 0 })),
            "{outcome:?}"
        );
        // Within a cancel check of it (10 ms); the bound is loose so a loaded
        // machine cannot fail it: without the cancel the write never returns.
        assert!(returned - cancelled_at < Duration::from_secs(1));
    }

    /// A frame larger than the buffer, cancelled once the buffer is full:
    /// the caller learns how much went out (the rest is its to send).
    #[test]
    fn a_write_cancelled_part_way_says_how_much_was_sent() {
        let (ours, _silent_peer) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let socket = ClientSocket { stream: ours };
        let frame = vec![0u8; 4 << 20];
        let (cancel, cancelled) = crossbeam_channel::bounded(1);
        cancel.send(()).unwrap(); // seen at the first full buffer
        let outcome = socket.write_frame(&frame, None, &cancelled);
        assert!(
            matches!(outcome, Err(WriteError::Cancelled { sent }) if sent > 0 && sent < frame.len()),
            "{outcome:?}"
        );
    }
}
