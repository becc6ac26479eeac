//! One stats request to a running hub, for an operator's tools
//! (`pgbus-hub status`, `Pgbus::Hub.stats`): our `{"t":"stats"}` frame and
//! its answer, on a connection of its own that the hub does not count as a worker.

use crate::protocol::{Decoder, Message, Object};
use crate::transport::socket::{ClientSocket, ConnectError, Readiness};
use crossbeam_channel::Receiver;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a wait for the answer looks at its cancel channel: an unblock
/// function is honoured within the 50 ms Ruby callers are promised.
const CANCEL_CHECK: Duration = Duration::from_millis(10);

#[derive(Debug, PartialEq, Eq)]
pub enum StatsError {
    /// Nothing answers at the path (or it is not a socket): why.
    Unreachable { socket_path: PathBuf, why: String },
    /// Connected, but no stats frame came within the timeout (pgbus's Ruby hub never answers one).
    NoAnswer {
        socket_path: PathBuf,
        timeout: Duration,
    },
    /// The hub hung up without answering (it refuses peers of another uid).
    Closed { socket_path: PathBuf },
    /// The caller cancelled (an embedder's unblock function).
    Interrupted,
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable { socket_path, why } => {
                write!(f, "cannot reach master hub at {}: {why}", socket_path.display())
            }
            Self::NoAnswer {
                socket_path,
                timeout,
            } => write!(
                f,
                "the hub at {} did not answer a stats request within {:?}s (not a pgbus-hub MasterHub?)",
                socket_path.display(),
                timeout.as_secs_f64()
            ),
            Self::Closed { socket_path } => write!(
                f,
                "the hub at {} closed the connection without answering \
                 (it refuses peers of another uid: run this as the user that runs Puma)",
                socket_path.display()
            ),
            Self::Interrupted => f.write_str("the stats request was interrupted"),
        }
    }
}

impl std::error::Error for StatsError {}

/// The counters of the hub at `socket_path` (its stats frame's `stats` object).
pub fn request_stats(
    socket_path: &Path,
    timeout: Duration,
    cancel: &Receiver<()>,
) -> Result<Object, StatsError> {
    let unreachable = |why: String| StatsError::Unreachable {
        socket_path: socket_path.to_owned(),
        why,
    };
    let closed = || StatsError::Closed {
        socket_path: socket_path.to_owned(),
    };
    crate::transport::check_socket_path(socket_path).map_err(unreachable)?;
    let socket = ClientSocket::connect(socket_path, cancel).map_err(|e| match e {
        ConnectError::Cancelled => StatsError::Interrupted,
        ConnectError::Failed(e) => unreachable(e.to_string()),
    })?;
    let frame = Message::Stats(None)
        .encode()
        .expect("a one-key object always encodes");
    let deadline = Instant::now() + timeout;
    socket
        .write_frame(&frame, Some(deadline), cancel)
        .map_err(|_| closed())?;
    let answer = await_answer(&socket, deadline, cancel, |message| match message {
        Message::Stats(Some(stats)) => Some(stats),
        _ => None,
    });
    answer.map_err(|unanswered| match unanswered {
        Unanswered::Closed => closed(),
        Unanswered::TimedOut => StatsError::NoAnswer {
            socket_path: socket_path.to_owned(),
            timeout,
        },
        Unanswered::Interrupted => StatsError::Interrupted,
    })
}

/// Why [`await_answer`] returned no answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// The peer hung up (or sent what does not decode).
    Closed,
    TimedOut,
    Interrupted,
}

/// Reads frames from `socket` until `pick` takes one (the others, status
/// frames say, are skipped), by `deadline` or until `cancel` receives: one
/// request and its answer on a connection of its own (`stats`, a hub's `replace`).
pub(crate) fn await_answer<T>(
    socket: &ClientSocket,
    deadline: Instant,
    cancel: &Receiver<()>,
    mut pick: impl FnMut(Message) -> Option<T>,
) -> Result<T, Unanswered> {
    let mut decoder = Decoder::default();
    loop {
        while let Some(message) = decoder.next_message().map_err(|_| Unanswered::Closed)? {
            if let Some(answer) = pick(message) {
                return Ok(answer);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Unanswered::TimedOut);
        }
        if cancel.try_recv().is_ok() {
            return Err(Unanswered::Interrupted);
        }
        if socket.wait_readable(None, left.min(CANCEL_CHECK)) == Readiness::Readable {
            match socket.read_into(&mut decoder) {
                Ok(0) => return Err(Unanswered::Closed),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Unanswered::Closed),
            }
        }
    }
}
