//! What workers' readers and the accept loop ask of the router, and the
//! bounded queue they send it on: the one type the hub's tasks share, so
//! none of them depends on the router.

use super::registry::WorkerId;
use crate::protocol::Replace;
use tokio::sync::mpsc;

pub enum Command {
    /// A connection of our uid was accepted.
    Accepted {
        stream: tokio::net::UnixStream,
        peer_pid: Option<i32>,
    },
    Sub {
        worker: WorkerId,
        queue: String,
        /// When its frame was read (the sub->ack histogram starts here).
        read_at: std::time::Instant,
    },
    Unsub {
        worker: WorkerId,
        queue: String,
    },
    /// Our `{"t":"stats"}` extension.
    Stats(WorkerId),
    /// The worker's answer to a planned stop's `move`: it is starting its own
    /// LISTEN connection, cut at `token` (see `router/moves.rs`).
    MoveAnswer {
        worker: WorkerId,
        token: String,
    },
    /// A new hub asks to take this one's socket path over, or says it has (`Router::replace`).
    Replace {
        worker: WorkerId,
        replace: Replace,
    },
    /// A worker failing back asks for the cut between its own connection
    /// (`channel`, its private channel) and this hub (`Router::commit_marker`).
    MarkerCommit {
        worker: WorkerId,
        channel: String,
        token: String,
    },
    /// The worker's connection ended.
    Gone(WorkerId),
}

pub type Commands = mpsc::Sender<Command>;
