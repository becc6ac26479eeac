//! Log records from native threads, delivered to whoever owns the hub or client.
//!
//! Native code never calls into Ruby: it sends a [`Record`] down a bounded
//! channel that a Ruby thread drains (the binding does that), and mirrors it to
//! the `log` facade for Rust users. A full channel drops the record and counts
//! it rather than blocking a native thread on a slow logger.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Records buffered before dropping: a burst of per-worker warnings (e.g. 1000
/// hostile peers refused at once) fits; a logger stuck for longer loses lines, not latency.
pub const LOG_CHANNEL_CAPACITY: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub level: Level,
    pub message: String,
}

/// Cheap to clone; every component of one hub or client shares one sink.
#[derive(Clone, Debug, Default)]
pub struct LogSink {
    sender: Option<Sender<Record>>,
    dropped: Arc<AtomicU64>,
}

impl LogSink {
    /// Only the `log` facade (no channel).
    pub fn silent() -> Self {
        Self::default()
    }

    /// A sink plus the receiving end its owner drains.
    pub fn channel() -> (Self, Receiver<Record>) {
        let (sender, receiver) = crossbeam_channel::bounded(LOG_CHANNEL_CAPACITY);
        (
            Self {
                sender: Some(sender),
                dropped: Arc::default(),
            },
            receiver,
        )
    }

    pub fn log(&self, level: Level, message: impl Into<String>) {
        let message = message.into();
        let facade = match level {
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        log::log!(target: "pgbus_hub", facade, "{message}");
        if let Some(sender) = &self.sender {
            if let Err(TrySendError::Full(_)) = sender.try_send(Record { level, message }) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn debug(&self, message: impl Into<String>) {
        self.log(Level::Debug, message)
    }
    pub fn info(&self, message: impl Into<String>) {
        self.log(Level::Info, message)
    }
    pub fn warn(&self, message: impl Into<String>) {
        self.log(Level::Warn, message)
    }
    pub fn error(&self, message: impl Into<String>) {
        self.log(Level::Error, message)
    }

    /// Records lost because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_channel_drops_and_counts_instead_of_blocking() {
        let (sink, receiver) = LogSink::channel();
        for i in 0..LOG_CHANNEL_CAPACITY + 3 {
            sink.info(format!("line {i}"));
        }
        assert_eq!(sink.dropped(), 3);
        assert_eq!(
            receiver.try_recv().unwrap(),
            Record {
                level: Level::Info,
                message: "line 0".into()
            }
        );
    }
}
