//! Hands wakes from native code to the Ruby pump thread (see
//! lib/pgbus/hub/native_object.rb): `next_batch` waits without the GVL on a
//! [`WakeSource`] (the hub client's socket, or a listener's channel) and is
//! interrupted by Thread#kill / stop through `WakeSource::interrupt`; back
//! on the pump's Ruby thread it builds the wakes in the class pgbus expects.

use crate::errors::panicked;
use crate::logs::LogPump;
use crate::nogvl::nogvl;
use magnus::{kwargs, prelude::*, value::Lazy, Error, RArray, RClass, Ruby, Value};
use pgbus_hub_core::delivery::{Delivery, WakeSource};
use pgbus_hub_core::log::Record;
use pgbus_hub_core::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Wakes handed to Ruby per batch: bounds how long one batch holds the GVL
/// while still amortising the GVL hand-off over a burst.
const BATCH: usize = 512;

/// A wait re-checks `closed` at least this often (covers a lost interrupt).
const POLL: Duration = Duration::from_millis(500);

/// `Pgbus::Hub::WakeMessage`: a wake in a dispatch queue when pgbus is not
/// loaded (pgbus's own `Listener::WakeMessage` otherwise, see [`wake_class`]).
static WAKE_MESSAGE: Lazy<RClass> = Lazy::new(|ruby| {
    ruby.eval("::Pgbus::Hub::WakeMessage")
        .expect("defined in init")
});

/// The class the running pgbus builds its wakes in, else ours.
fn wake_class(ruby: &Ruby) -> Result<RClass, Error> {
    let pgbus: Option<RClass> = ruby.eval(
        "::Pgbus::Web::Streamer::Listener::WakeMessage if defined?(::Pgbus::Web::Streamer::Listener::WakeMessage)",
    )?;
    Ok(pgbus.unwrap_or_else(|| ruby.get_inner(&WAKE_MESSAGE)))
}

const PAYLOADLESS_WARNING: &str = "[pgbus-hub] this pgbus's WakeMessage has no payload: \
                                   ephemeral payloads arrive as durable wakes";

pub struct Pump {
    source: Arc<dyn WakeSource>,
    closed: AtomicBool,
    /// Set once a payload was dropped for a pgbus whose WakeMessage has none.
    warned_payloadless: AtomicBool,
}

impl Pump {
    pub fn new(source: Arc<dyn WakeSource>) -> Self {
        Self {
            source,
            closed: AtomicBool::new(false),
            warned_payloadless: AtomicBool::new(false),
        }
    }

    /// After this, `next_batch` returns nil (the pump thread ends).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.source.interrupt();
    }

    /// `[wake, ..., :failed]` or nil when closed. A pgbus whose WakeMessage
    /// has no payload gets an ephemeral payload as a durable wake (its stream
    /// re-reads), with one warning to `logger`.
    pub fn next_batch(&self, ruby: &Ruby, logger: Value) -> Result<Option<RArray>, Error> {
        let batch = nogvl(
            || self.source.next_batch(BATCH, POLL),
            || self.source.interrupt(),
        )
        .ok_or_else(|| panicked(ruby, "the wake pump"))?;
        if batch.items.is_empty() && (batch.closed || self.closed.load(Ordering::SeqCst)) {
            return Ok(None);
        }
        let class = wake_class(ruby)?;
        let members: RArray = class.funcall("members", ())?;
        let with_payload = members.includes(ruby.to_symbol("payload"));
        let array = ruby.ary_new_capa(batch.items.len());
        for item in batch.items {
            let Delivery::Wake(wake) = item else {
                array.push(ruby.to_symbol("failed"))?;
                continue;
            };
            // One copy each, into the Ruby Strings.
            let queue = ruby.str_new(&wake.queue);
            let built: Value = if with_payload {
                let payload = wake.payload.as_deref().map(|p| ruby.str_new(p));
                class.funcall(
                    "new",
                    (kwargs!("queue_name" => queue, "payload" => payload),),
                )?
            } else {
                if wake.payload.is_some()
                    && !logger.is_nil()
                    && !self.warned_payloadless.swap(true, Ordering::SeqCst)
                {
                    // A broken logger must not stop the pump.
                    let _: Result<Value, Error> = logger.funcall("warn", (PAYLOADLESS_WARNING,));
                }
                class.funcall("new", (kwargs!("queue_name" => queue),))?
            };
            array.push(built)?;
        }
        Ok(Some(array))
    }
}

/// The two streams a native source (HubClient, Listener) hands to its Ruby
/// threads: wakes for the pump thread and log records for the log thread.
#[derive(Default)]
pub struct Outputs {
    pump: Mutex<Option<Arc<Pump>>>,
    logs: Mutex<Option<Arc<LogPump>>>,
}

fn current<T>(slot: &Mutex<Option<Arc<T>>>) -> Option<Arc<T>> {
    lock(slot).clone()
}

fn replace<T>(slot: &Mutex<Option<Arc<T>>>, value: Option<Arc<T>>) -> Option<Arc<T>> {
    std::mem::replace(&mut *lock(slot), value)
}

impl Outputs {
    pub fn open(&self, wakes: Arc<dyn WakeSource>, records: crossbeam_channel::Receiver<Record>) {
        replace(&self.pump, Some(Arc::new(Pump::new(wakes))));
        replace(&self.logs, Some(Arc::new(LogPump::new(records))));
    }

    /// Ends both Ruby threads (their next call returns nil). The wake source
    /// is released here, not at GC, once the pump thread's last call returns
    /// (a hub client's source holds an eventfd); the log pump stays until
    /// its records are drained.
    pub fn close(&self) {
        if let Some(pump) = replace(&self.pump, None) {
            pump.close();
        }
        if let Some(logs) = current(&self.logs) {
            logs.close();
        }
    }

    pub fn next_batch(&self, ruby: &Ruby, logger: Value) -> Result<Option<RArray>, Error> {
        current(&self.pump).map_or(Ok(None), |pump| pump.next_batch(ruby, logger))
    }

    pub fn next_logs(&self, ruby: &Ruby) -> Result<Option<RArray>, Error> {
        current(&self.logs).map_or(Ok(None), |logs| logs.next(ruby))
    }
}

/// Defines, on `$class`, the two private methods the Ruby threads of a class
/// holding [`Outputs`] in its `outputs` field call (lib/pgbus/hub/native_object.rb):
/// `native_next_batch(logger)` (the pump) and `native_next_logs` (the log thread).
/// A macro, not a generic function: magnus's `method!` wraps a concrete fn.
macro_rules! define_output_methods {
    ($class:expr, $ty:ty) => {{
        fn next_batch(
            ruby: &magnus::Ruby,
            rb_self: &$ty,
            logger: magnus::Value,
        ) -> Result<Option<magnus::RArray>, magnus::Error> {
            rb_self.outputs.next_batch(ruby, logger)
        }
        fn next_logs(
            ruby: &magnus::Ruby,
            rb_self: &$ty,
        ) -> Result<Option<magnus::RArray>, magnus::Error> {
            rb_self.outputs.next_logs(ruby)
        }
        $class.define_private_method("native_next_batch", magnus::method!(next_batch, 1))?;
        $class.define_private_method("native_next_logs", magnus::method!(next_logs, 0))?;
    }};
}
pub(crate) use define_output_methods;

/// Defines `Pgbus::Hub::WakeMessage` (queue_name, payload; keyword_init).
pub fn init(ruby: &Ruby, hub: magnus::RModule) -> Result<(), Error> {
    let struct_class: RClass = ruby.eval("::Struct")?;
    let class: Value = struct_class.funcall(
        "new",
        (
            ruby.to_symbol("queue_name"),
            ruby.to_symbol("payload"),
            kwargs!("keyword_init" => true),
        ),
    )?;
    hub.const_set("WakeMessage", class)
}
