//! Every difference between the operating systems the crate builds for, in
//! one place: no `cfg(target_os)` lives anywhere else. Linux is what the crate
//! was written for (its code paths here are the ones it always had); macOS and
//! FreeBSD get the nearest equivalent, or nothing where this machine cannot
//! show that their equivalent does what Linux's does.
//!
//! The constructs: the client's wake-up descriptor ([`Wakeup`]); the TCP
//! options of a PostgreSQL connection ([`TCP_USER_TIMEOUT`],
//! [`TCP_KEEPALIVE_IDLE`]); the client's hub socket ([`unix_stream_socket`],
//! [`SEND_FLAGS`]); a refused connect that may be a full backlog
//! ([`refusal_may_be_busy`]); the hub's measure of what a worker has not read
//! yet ([`unread_bytes`]).

use rustix::io::Errno;
use rustix::net::{SendFlags, SocketFlags};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

/// A descriptor that makes the client's driven reader's poll return:
/// readable from `signal` until `clear`, whichever thread signals.
#[cfg(target_os = "linux")]
pub struct Wakeup(OwnedFd);

#[cfg(target_os = "linux")]
impl Wakeup {
    /// What the descriptor is, for the error when it cannot be had.
    pub const KIND: &'static str = "eventfd";

    pub fn new() -> io::Result<Self> {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(Self(fd))
    }

    /// Async-signal-safe and callable from any thread.
    pub fn signal(&self) {
        // EAGAIN (the counter is full) still leaves it signalled.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    pub fn clear(&self) {
        // EAGAIN: it was not signalled.
        let _ = rustix::io::read(&self.0, &mut [0u8; 8]);
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Elsewhere (macOS has no eventfd): a non-blocking socket pair, close-on-exec
/// as std creates every descriptor; `signal` writes a byte to one end, the
/// poll watches the other, `clear` drains it.
#[cfg(not(target_os = "linux"))]
pub struct Wakeup {
    read: std::os::unix::net::UnixStream,
    write: std::os::unix::net::UnixStream,
}

#[cfg(not(target_os = "linux"))]
impl Wakeup {
    /// What the descriptor is, for the error when it cannot be had.
    pub const KIND: &'static str = "socket pair";

    pub fn new() -> io::Result<Self> {
        let (read, write) = std::os::unix::net::UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        Ok(Self { read, write })
    }

    /// Async-signal-safe (one write(2)) and callable from any thread.
    pub fn signal(&self) {
        // EAGAIN (the buffer is full of earlier signals) still leaves it signalled;
        // no SIGPIPE: both ends live as long as `self`.
        let _ = io::Write::write(&mut &self.write, &[1]);
    }

    pub fn clear(&self) {
        let mut drained = [0u8; 64];
        // Until EAGAIN: every signal so far is cleared. Bounded by the socket
        // buffer (signals pile up only while nobody polls).
        while io::Read::read(&mut &self.read, &mut drained).is_ok_and(|n| n > 0) {}
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

/// TCP_USER_TIMEOUT (libpq's `tcp_user_timeout`): Linux only. macOS and
/// FreeBSD have no such option; libpq skips the setting there (it sets it
/// only `#ifdef TCP_USER_TIMEOUT`), and so do we: a dead peer is then noticed
/// by the keepalives and the listener's health check alone.
#[cfg(target_os = "linux")]
pub const TCP_USER_TIMEOUT: Option<libc::c_int> = Some(libc::TCP_USER_TIMEOUT);
#[cfg(not(target_os = "linux"))]
pub const TCP_USER_TIMEOUT: Option<libc::c_int> = None;

/// The idle time before the first keepalive probe (libpq's
/// `keepalives_idle`): TCP_KEEPIDLE, which macOS calls TCP_KEEPALIVE (libpq
/// picks the same). TCP_KEEPINTVL and TCP_KEEPCNT have one name everywhere.
#[cfg(not(target_vendor = "apple"))]
pub const TCP_KEEPALIVE_IDLE: libc::c_int = libc::TCP_KEEPIDLE;
#[cfg(target_vendor = "apple")]
pub const TCP_KEEPALIVE_IDLE: libc::c_int = libc::TCP_KEEPALIVE;

/// A non-blocking, close-on-exec Unix stream socket whose sends never raise
/// SIGPIPE (with [`SEND_FLAGS`]). macOS cannot set the first two at
/// socket(2), so they are set right after (as std does there: a fork+exec by
/// another thread in between could inherit it), and SIGPIPE is turned off on
/// the socket itself (SO_NOSIGPIPE): macOS has no MSG_NOSIGNAL.
pub fn unix_stream_socket() -> Result<OwnedFd, Errno> {
    use rustix::net::{socket_with, AddressFamily, SocketType};
    #[cfg(not(target_vendor = "apple"))]
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    #[cfg(target_vendor = "apple")]
    let flags = SocketFlags::empty();
    let socket = socket_with(AddressFamily::UNIX, SocketType::STREAM, flags, None)?;
    #[cfg(target_vendor = "apple")]
    {
        rustix::io::ioctl_fioclex(&socket)?;
        rustix::io::ioctl_fionbio(&socket, true)?;
        rustix::net::sockopt::set_socket_nosigpipe(&socket, true)?;
    }
    Ok(socket)
}

/// send(2) flags for the client's socket: no SIGPIPE from a closed peer
/// (EPIPE instead). macOS: the socket says so itself (see [`unix_stream_socket`]).
#[cfg(not(target_vendor = "apple"))]
pub const SEND_FLAGS: SendFlags = SendFlags::NOSIGNAL;
#[cfg(target_vendor = "apple")]
pub const SEND_FLAGS: SendFlags = SendFlags::empty();

/// Whether a connect(2) to a Unix socket that failed with `errno` may have
/// met a live listener whose backlog is full (so: retry, briefly). Linux says
/// EAGAIN for a full backlog and ECONNREFUSED only when nobody listens; macOS
/// and the BSDs answer a full backlog with ECONNREFUSED too, indistinguishable
/// from a socket nobody listens on.
#[cfg(target_os = "linux")]
pub fn refusal_may_be_busy(_errno: i32) -> bool {
    false
}
#[cfg(not(target_os = "linux"))]
pub fn refusal_may_be_busy(errno: i32) -> bool {
    errno == libc::ECONNREFUSED
}

/// Bytes written to the stream socket `fd` that its peer has not read yet,
/// or None where unknown. The hub's catch-up throttle (`hub::worker_connection`) keeps
/// a worker's unread bytes low with it; None turns the throttle off.
///
/// Linux: SIOCOUTQ (a Unix stream's data waits in the peer's receive queue,
/// charged to the sender, kernel overhead included). macOS (SO_NWRITE) and
/// FreeBSD (FIONWRITE) report their send buffer, and whether a Unix stream's
/// unread bytes are counted there could not be found out here (no such host):
/// the throttle is off there until [`unread_bytes_candidate`]'s test has run
/// on one. Off means catch-up wakes are written as fast as the socket takes
/// them, so a live wake may wait behind a socket buffer full of them.
pub fn unread_bytes(fd: RawFd) -> Option<usize> {
    if UNREAD_BYTES_TRUSTED {
        unread_bytes_candidate(fd)
    } else {
        None
    }
}

/// Whether [`unread_bytes_candidate`] is known to count a Unix stream's
/// unread bytes on this OS (its test shows it). The hub's `limits` report
/// the catch-up throttle off (`catch_up_unread_limit` null) where it is not.
pub const UNREAD_BYTES_TRUSTED: bool = cfg!(target_os = "linux");

/// The OS's measure of a socket's unsent or unread bytes, trusted or not.
#[cfg(target_os = "linux")]
fn unread_bytes_candidate(fd: RawFd) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int through the pointer,
    // which points at a live local; the caller keeps `fd` open.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    (rc == 0).then(|| usize::try_from(queued).unwrap_or(0))
}

#[cfg(target_os = "freebsd")]
fn unread_bytes_candidate(fd: RawFd) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONWRITE writes one c_int through the pointer, which points
    // at a live local; the caller keeps `fd` open.
    let rc = unsafe { libc::ioctl(fd, libc::FIONWRITE, &mut queued) };
    (rc == 0).then(|| usize::try_from(queued).unwrap_or(0))
}

#[cfg(target_vendor = "apple")]
fn unread_bytes_candidate(fd: RawFd) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    let mut size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_NWRITE writes one c_int (`size` bytes) through the pointer,
    // which points at a live local; the caller keeps `fd` open.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_NWRITE,
            std::ptr::addr_of_mut!(queued).cast(),
            &mut size,
        )
    };
    (rc == 0).then(|| usize::try_from(queued).unwrap_or(0))
}

#[cfg(not(any(target_os = "linux", target_os = "freebsd", target_vendor = "apple")))]
fn unread_bytes_candidate(_fd: RawFd) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// What decides whether the catch-up throttle can be on: the OS's
    /// measure sees bytes written and not yet read, and sees them go once the
    /// peer reads them. Where the measure is not trusted yet (macOS, FreeBSD)
    /// it is the finding `UNREAD_BYTES_TRUSTED` waits for, run on such a host
    /// with `cargo test -p pgbus-hub-core --lib unread_bytes_measure -- --ignored`:
    /// passing there means the throttle can be turned on.
    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "a finding, not a requirement: run it with --ignored (see above)"
    )]
    fn the_unread_bytes_measure_counts_what_the_peer_has_not_read() {
        let (mut ours, mut peer) = UnixStream::pair().unwrap();
        // Less than the smallest default socket buffer (macOS: 8 KiB), so the
        // write does not wait for the peer.
        let written = vec![7u8; 2_000];
        ours.write_all(&written).unwrap();
        let unread = unread_bytes_candidate(ours.as_raw_fd());
        assert!(
            unread.is_some_and(|n| n >= written.len()),
            "{unread:?} unread after {} bytes written",
            written.len()
        );
        let mut read = vec![0u8; written.len()];
        peer.read_exact(&mut read).unwrap();
        let unread = unread_bytes_candidate(ours.as_raw_fd());
        assert!(
            unread.is_some_and(|n| n < written.len()),
            "{unread:?} unread after the peer read everything"
        );
        assert_eq!(
            unread_bytes(ours.as_raw_fd()).is_some(),
            UNREAD_BYTES_TRUSTED
        );
    }

    #[test]
    fn a_wakeup_stays_signalled_until_cleared() {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let wakeup = Wakeup::new().unwrap();
        let ready = |wakeup: &Wakeup| {
            let mut fds = [PollFd::from_borrowed_fd(wakeup.fd(), PollFlags::IN)];
            poll(&mut fds, Some(&Timespec::default())).unwrap()
        };
        assert_eq!(ready(&wakeup), 0);
        wakeup.signal();
        wakeup.signal();
        assert_eq!(ready(&wakeup), 1);
        assert_eq!(ready(&wakeup), 1);
        wakeup.clear();
        assert_eq!(ready(&wakeup), 0);
    }

    #[test]
    fn the_client_socket_is_non_blocking_and_close_on_exec() {
        let socket = unix_stream_socket().unwrap();
        assert!(rustix::io::fcntl_getfd(&socket)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC));
        // SAFETY: F_GETFL only reads the open descriptor's status flags.
        let flags = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags & libc::O_NONBLOCK, 0, "flags {flags:#x}");
    }
}
