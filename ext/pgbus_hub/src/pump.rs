//! Hands wakes from native threads to the Ruby pump thread (see
//! lib/pgbus/hub/pump.rb): `next_batch` waits without the GVL and is
//! interrupted by Thread#kill / stop through the receiver's `Interrupter`.

use crate::errors::panicked;
use crate::logs::LogPump;
use crate::nogvl::nogvl;
use magnus::{Error, RArray, Ruby};
use pgbus_hub_core::delivery::{Delivery, DeliveryReceiver};
use pgbus_hub_core::log::Record;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Wakes handed to Ruby per batch: bounds how long one batch holds the GVL
/// while still amortising the GVL hand-off over a burst.
const BATCH: usize = 512;

/// A wait re-checks `closed` at least this often (covers a lost interrupt).
const POLL: Duration = Duration::from_millis(500);

pub struct Pump {
    receiver: DeliveryReceiver,
    closed: AtomicBool,
}

impl Pump {
    pub fn new(receiver: DeliveryReceiver) -> Self {
        Self {
            receiver,
            closed: AtomicBool::new(false),
        }
    }

    /// After this, `next_batch` returns nil (the pump thread ends).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.receiver.interrupter().interrupt();
    }

    /// `[[queue, payload_or_nil], ..., [:failed, reason]]` or nil when closed.
    pub fn next_batch(&self, ruby: &Ruby) -> Result<Option<RArray>, Error> {
        let interrupter = self.receiver.interrupter();
        let batch = nogvl(
            || self.receiver.next_batch(BATCH, POLL),
            || interrupter.interrupt(),
        )
        .ok_or_else(|| panicked(ruby, "the wake pump"))?;
        if batch.items.is_empty() && (batch.closed || self.closed.load(Ordering::SeqCst)) {
            return Ok(None);
        }
        let array = ruby.ary_new();
        for item in batch.items {
            match item {
                Delivery::Wake { queue, payload } => array.push((queue, payload))?,
                Delivery::Failed { reason } => array.push((ruby.to_symbol("failed"), reason))?,
            }
        }
        Ok(Some(array))
    }
}

/// The two streams a native source (HubClient, Listener) hands to its Ruby
/// threads: wakes for the pump thread and log records for the log thread.
#[derive(Default)]
pub struct Outputs(Mutex<Option<(Arc<Pump>, Arc<LogPump>)>>);

impl Outputs {
    fn get(&self) -> Option<(Arc<Pump>, Arc<LogPump>)> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn open(&self, deliveries: DeliveryReceiver, records: crossbeam_channel::Receiver<Record>) {
        let outputs = (
            Arc::new(Pump::new(deliveries)),
            Arc::new(LogPump::new(records)),
        );
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(outputs);
    }

    /// Ends both Ruby threads (their next call returns nil).
    pub fn close(&self) {
        if let Some((pump, logs)) = self.get() {
            pump.close();
            logs.close();
        }
    }

    pub fn next_batch(&self, ruby: &Ruby) -> Result<Option<RArray>, Error> {
        self.get()
            .map_or(Ok(None), |(pump, _)| pump.next_batch(ruby))
    }

    pub fn next_logs(&self, ruby: &Ruby) -> Result<Option<RArray>, Error> {
        self.get().map_or(Ok(None), |(_, logs)| logs.next(ruby))
    }
}
