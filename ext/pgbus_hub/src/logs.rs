//! Hands native log records to a Ruby thread: `drain` blocks without the GVL
//! until records arrive, the source is closed, or Ruby interrupts it.

use crate::nogvl::nogvl;
use crossbeam_channel::{Receiver, Sender};
use magnus::{prelude::*, Error, Ruby, Value};
use pgbus_hub_core::log::{Level, Record};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Records handed to Ruby per wake-up: bounds the time one batch holds the GVL.
const BATCH: usize = 256;

/// The drain thread re-checks for close this often even without records (a
/// missed interrupt can delay its exit by at most this).
const POLL: Duration = Duration::from_millis(500);

pub struct LogPump {
    records: Receiver<Record>,
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    closed: AtomicBool,
}

impl LogPump {
    pub fn new(records: Receiver<Record>) -> Self {
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        Self {
            records,
            wake_tx,
            wake_rx,
            closed: AtomicBool::new(false),
        }
    }

    /// After this, `next` returns what is left, then nil.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.wake_tx.try_send(());
    }

    /// Waits (without the GVL) for records and adds them to `logger` (a
    /// Ruby Logger) on this Ruby thread; false once closed and drained.
    pub fn drain(&self, ruby: &Ruby, logger: Value) -> Result<bool, Error> {
        let batch = nogvl(
            || {
                let mut batch = Vec::new();
                if !self.closed.load(Ordering::SeqCst) {
                    crossbeam_channel::select! {
                        recv(self.records) -> record => batch.extend(record.ok()),
                        recv(self.wake_rx) -> _ => {},
                        default(POLL) => {},
                    }
                }
                batch.extend(self.records.try_iter().take(BATCH));
                batch
            },
            || {
                let _ = self.wake_tx.try_send(());
            },
        )
        .unwrap_or_default();
        if batch.is_empty() && self.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        for record in batch {
            // Ruby Logger's severities.
            let severity = match record.level {
                Level::Debug => 0,
                Level::Info => 1,
                Level::Warn => 2,
                Level::Error => 3,
            };
            let added: Result<Value, Error> =
                logger.funcall("add", (severity, record.message, "pgbus-hub"));
            match added {
                // A broken logger must not stop the drain.
                Err(error) if !error.is_kind_of(ruby.exception_standard_error()) => {
                    return Err(error)
                }
                _ => {}
            }
        }
        Ok(true)
    }
}
