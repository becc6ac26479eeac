//! The core tests' one poll-until helper (a thread's and a task's).

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// How long a test waits for a condition before it fails: far above any
/// wait a passing test makes on a loaded 2-core machine (the longest are a
/// reconnect through backoff and a fresh PostgreSQL backend, under 3 s), so
/// only a condition that never comes reaches it.
pub const WAIT: Duration = Duration::from_secs(30);

const POLL: Duration = Duration::from_millis(5);

/// Polls `condition` until it holds; panics naming `what` after [`WAIT`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// [`wait_until`] for a tokio task (sleeps without blocking the runtime).
pub async fn wait_until_async(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}
