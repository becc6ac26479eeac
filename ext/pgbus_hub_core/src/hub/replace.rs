//! A new hub (N) takes the socket path S over from a hub of ours that serves
//! it (O): `pgbus-hub serve` started while a Puma master's own hub, or an
//! older sidecar, serves S (docs/architecture.md, "3. A new hub replaces an
//! old one"). N serves at a temporary name in S's directory, asks O
//! (`replace`), renames its socket onto S (rename(2) replaces the name
//! atomically: every connect finds O before and N after, never nothing) and
//! tells O the path is its own now (`replace` with `to`). O then stops as a
//! planned stop does, handing every worker over to its own connection at a
//! marker; each fails back to N at S, aligned at a marker again. Nothing is
//! lost or doubled on the way.
//!
//! Refused (N does not start): a hub of another user (O's peer check closes
//! the connection), a hub on another database, a hub that does not answer
//! `replace` (an older pgbus-hub, pgbus's own Ruby hub: stop it first).

use crate::client::{await_answer, Unanswered};
use crate::protocol::{Message, Replace};
use crate::transport::socket::{ClientSocket, ConnectError};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long N waits for O's answer: O's router answers at once; a hub that
/// logs the frame as unknown never does.
const REPLACE_ANSWER: Duration = Duration::from_secs(2);

/// An old hub's refusal while its LISTEN connection is down: it cannot tell
/// its database yet, so the new one asks again ([`REPLACE_WAIT`]).
pub(super) const DATABASE_DOWN: &str = "its database connection is down";

/// How long a new hub asks again while the old one's connection is down (a
/// Puma master whose hub is still connecting as the sidecar starts).
const REPLACE_WAIT: Duration = Duration::from_secs(10);
const ASK_AGAIN: Duration = Duration::from_millis(250);

/// The hub at a socket path agreed to be replaced.
pub struct Agreed {
    socket: ClientSocket,
    pub pid: u32,
}

/// Asks the hub at `socket_path` whether a hub LISTENing on `database` may
/// replace it, again while its database connection is down (at most [`REPLACE_WAIT`]).
pub fn ask(socket_path: &Path, database: &str) -> Result<Agreed, String> {
    let deadline = Instant::now() + REPLACE_WAIT;
    loop {
        match ask_once(socket_path, database) {
            Err(refused) if refused.ends_with(DATABASE_DOWN) && Instant::now() < deadline => {
                std::thread::sleep(ASK_AGAIN);
            }
            outcome => return outcome,
        }
    }
}

fn ask_once(socket_path: &Path, database: &str) -> Result<Agreed, String> {
    let path = socket_path.display();
    let never = crossbeam_channel::never();
    let socket = ClientSocket::connect(socket_path, &never).map_err(|e| match e {
        ConnectError::Failed(e) => format!("cannot reach the hub serving {path}: {e}"),
        ConnectError::Cancelled => format!("connecting to {path} was interrupted"),
    })?;
    let deadline = Instant::now() + REPLACE_ANSWER;
    let request = Message::Replace(Replace::Request)
        .encode()
        .expect("a one-key object always encodes");
    let closed = || {
        format!(
            "the hub serving {path} closed the connection: a hub of another user, or one stopping"
        )
    };
    socket
        .write_frame(&request, Some(deadline), &never)
        .map_err(|_| closed())?;
    let answer = await_answer(&socket, deadline, &never, |message| match message {
        Message::Replace(answer) => Some(answer),
        _ => None,
    });
    match answer {
        Ok(Replace::Serving { pid, database: theirs }) if theirs == database => {
            Ok(Agreed { socket, pid })
        }
        Ok(Replace::Serving { pid, database: theirs }) => Err(format!(
            "{path} is served by a hub of database {theirs:?}, pid {pid} (this one's: {database:?}): not replacing it"
        )),
        Ok(Replace::Refused { reason }) => Err(format!(
            "the hub serving {path} refused to be replaced: {reason}"
        )),
        Ok(other) => Err(format!(
            "the hub serving {path} answered replace with {other:?}: not replacing it"
        )),
        Err(Unanswered::Closed) => Err(closed()),
        Err(Unanswered::TimedOut | Unanswered::Interrupted) => Err(format!(
            "another process is already serving {path} and does not answer replace within {:?}s \
             (an older pgbus-hub, or pgbus's own hub): stop it first",
            REPLACE_ANSWER.as_secs_f64()
        )),
    }
}

impl Agreed {
    /// Tells the old hub that `socket_path` is the new one's now: it hands
    /// its workers over and yields. Its answer is not awaited.
    pub fn hand_over(self, socket_path: &Path) -> Result<(), String> {
        let to = Message::Replace(Replace::To(socket_path.display().to_string()))
            .encode()
            .map_err(|e| format!("cannot encode replace: {e}"))?;
        let deadline = Instant::now() + REPLACE_ANSWER;
        self.socket
            .write_frame(&to, Some(deadline), &crossbeam_channel::never())
            .map_err(|_| format!("cannot tell the old hub (pid {}) to yield", self.pid))
    }
}
