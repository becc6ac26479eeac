//! pgbus-hub core: one PostgreSQL LISTEN connection per host, shared by the
//! workers of a preforking server over a Unix socket. Knows nothing of Ruby.
//!
//! Layout (one job per module):
//! - [`protocol`]: frames (4-byte length + JSON object), encoder and incremental decoder.
//! - [`log`]: log records from native threads, forwarded through a bounded channel.
//! - [`log_file`]: those records as timestamped lines on a file or stdout (`pgbus-hub serve`).
//! - [`process`]: fork awareness (owner pid checks).
//! - [`owned_thread`]: the thread an object runs: stop with an unblock, a drop that only signals, inert after fork.
//! - [`conninfo`]: libpq-style connection options (URL, keywords, pairs) -> tokio-postgres config + TLS.
//! - [`listener`]: the LISTEN engine: one PostgreSQL connection, channel set, health check,
//!   reconnect + re-LISTEN; used by the master hub and by the per-worker fallback listener.
//! - [`hub`]: the master hub: Unix socket server, routing table, per-worker outboxes.
//! - [`client`]: the worker's hub client: subscribe with acks (waiters), the reading side the
//!   embedder's pump thread drives (no thread of its own), the failure model.
//! - [`delivery`]: wakes and failures handed to the embedding runtime (Ruby's pump thread).
//! - [`failover`]: a worker's listener: the hub client until it fails, then a LISTEN connection of its own.
//! - [`transport`]: the framed hub-worker connection (socket path rules; the hub's tokio halves;
//!   the client's non-blocking socket).
//! - [`os`]: every difference between the OSes (Linux, macOS, FreeBSD), in one place.
//! - [`shutdown`]: the one stop signal of a group of tasks.
//! - [`sync`]: the lock helpers (a poisoned lock is taken as it is).

pub mod client;
pub mod conninfo;
pub mod delivery;
pub mod events;
pub mod failover;
pub mod failover_state;
pub mod hub;
pub mod listener;
pub mod log;
pub mod log_file;
pub mod os;
pub mod owned_thread;
pub mod process;
pub mod protocol;
pub mod shutdown;
pub mod sync;
pub mod transport;
