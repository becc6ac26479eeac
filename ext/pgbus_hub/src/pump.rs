//! Hands wakes from native threads to the Ruby pump thread (see
//! lib/pgbus/hub/pump.rb): `next_batch` waits without the GVL and is
//! interrupted by Thread#kill / stop through the receiver's `Interrupter`.

use crate::errors::panicked;
use crate::nogvl::nogvl;
use magnus::{Error, RArray, Ruby};
use pgbus_hub_core::delivery::{Delivery, DeliveryReceiver};
use std::sync::atomic::{AtomicBool, Ordering};
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
