//! Hands wakes from native code to the Ruby pump thread (started in
//! `threads`): [`Pump::hand_batch_to_ruby`] waits without the GVL on a
//! [`WakeSource`] (the hub client's socket, or a listener's channel) and is
//! interrupted by Thread#kill / stop through `WakeSource::interrupt`; back
//! on the pump's Ruby thread it builds the wakes in the class pgbus expects
//! and hands them, a failure and listen confirmations to the owner's
//! [`Targets`] (its dispatch queue and callbacks).

use crate::errors::panicked;
use crate::logs::LogPump;
use crate::nogvl::nogvl;
use magnus::gc::Marker;
use magnus::value::{Lazy, Opaque};
use magnus::{kwargs, prelude::*, Error, RArray, RClass, RHash, Ruby, Value};
use pgbus_hub_core::delivery::{Delivery, WakeSource};
use pgbus_hub_core::log::Record;
use pgbus_hub_core::process::Owner;
use pgbus_hub_core::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Wakes handed to Ruby per batch: bounds how long one batch holds the GVL
/// while still amortising the GVL hand-off over a burst.
const BATCH: usize = 512;

/// A wait re-checks `closed` at least this often (covers a lost interrupt).
const POLL: Duration = Duration::from_millis(500);

/// `Pgbus::Hub::WakeMessage`: a wake in a dispatch queue when pgbus is not
/// loaded (pgbus's own `Listener::WakeMessage` otherwise, see [`wake_class`]).
static WAKE_MESSAGE: Lazy<RClass> = Lazy::new(|ruby| {
    crate::errors::hub_module(ruby)
        .const_get("WakeMessage")
        .expect("defined in init")
});

/// The class wakes are built in: the object's `wake_message:` option, else
/// the one the running pgbus builds its wakes in, else ours; and whether it
/// has a payload. Looked up at the first delivery, then kept (a batch is
/// often one wake). A consumer that is not pgbus's dispatcher (ActionCable's
/// adapter) names ours: a pgbus before 0.13.1 has a WakeMessage without a
/// payload, and a raw channel's message is nothing but its payload.
fn wake_class(
    ruby: &Ruby,
    kept: &OnceLock<(Opaque<RClass>, bool)>,
    given: Option<Opaque<Value>>,
) -> Result<(RClass, bool), Error> {
    if let Some((class, with_payload)) = kept.get() {
        return Ok((ruby.get_inner(*class), *with_payload));
    }
    // `options::initialize` let only a class through.
    let given = given.and_then(|class| RClass::from_value(ruby.get_inner(class)));
    let class = match given {
        Some(class) => class,
        None => match pgbus_wake_message(ruby)? {
            Some(class) => class,
            None => ruby.get_inner(&WAKE_MESSAGE),
        },
    };
    let members: RArray = class.funcall("members", ())?;
    let with_payload = members.includes(ruby.to_symbol("payload"));
    let _ = kept.set((Opaque::from(class), with_payload));
    Ok((class, with_payload))
}

/// `::Pgbus::Web::Streamer::Listener::WakeMessage` if defined (autoloaded
/// like Ruby's `defined?` + reference would); by constant lookups, as the
/// pump thread has no Ruby frame to `eval` in.
fn pgbus_wake_message(ruby: &Ruby) -> Result<Option<RClass>, Error> {
    let mut scope = ruby.class_object().as_value();
    for name in ["Pgbus", "Web", "Streamer", "Listener", "WakeMessage"] {
        let defined = scope.is_kind_of(ruby.class_module())
            && scope.funcall::<_, _, bool>("const_defined?", (name, false))?;
        if !defined {
            return Ok(None);
        }
        scope = scope.funcall("const_get", (name, false))?;
    }
    Ok(RClass::from_value(scope))
}

const PAYLOADLESS_WARNING: &str =
    "[pgbus-hub] this pgbus's WakeMessage has no payload: ephemeral payloads arrive as durable wakes";

pub struct Pump {
    source: Arc<dyn WakeSource>,
    closed: AtomicBool,
    /// Set once a payload was dropped for a pgbus whose WakeMessage has none.
    warned_payloadless: AtomicBool,
    /// Set once the failure was handed to `on_failure`.
    failed: AtomicBool,
}

impl Pump {
    pub fn new(source: Arc<dyn WakeSource>) -> Self {
        Self {
            source,
            closed: AtomicBool::new(false),
            warned_payloadless: AtomicBool::new(false),
            failed: AtomicBool::new(false),
        }
    }

    /// After this, `next_batch` returns nil (the pump thread ends).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.source.interrupt();
    }

    /// Waits (without the GVL) for the next batch and delivers it on this
    /// Ruby thread: each wake `<<` into `owner`'s `dispatch_queue` option,
    /// built in the class pgbus expects; the failure to its `on_failure`, at
    /// most once; a `listen_async` confirmation to its `on_listening`
    /// (queue, ticket). A pgbus whose WakeMessage has no payload gets an
    /// ephemeral payload as a durable wake (its stream re-reads), with one
    /// warning. A StandardError raised by one of them is logged and the
    /// batch goes on. False once closed.
    fn hand_batch_to_ruby(&self, ruby: &Ruby, outputs: &Outputs) -> Result<bool, Error> {
        let batch = nogvl(
            || self.source.next_batch(BATCH, POLL),
            || self.source.interrupt(),
        )
        .ok_or_else(|| panicked(ruby, "the wake pump"))?;
        if batch.items.is_empty() && (batch.closed || self.closed.load(Ordering::SeqCst)) {
            return Ok(false);
        }
        let targets = outputs.targets();
        let target = |target: Option<Opaque<Value>>| {
            target.map_or(ruby.qnil().as_value(), |t| ruby.get_inner(t))
        };
        let (logger, queue) = (target(targets.logger), target(targets.dispatch_queue));
        let (class, with_payload) = wake_class(ruby, &outputs.wake_class, targets.wake_message)?;
        for item in batch.items {
            let (what, delivered) = match item {
                Delivery::Wake(wake) => {
                    // One copy each, into the Ruby Strings.
                    let queue_name = ruby.str_new(&wake.queue);
                    let payload = wake.payload.as_deref().map(|p| ruby.str_new(p));
                    let built = if with_payload {
                        class.funcall(
                            "new",
                            (kwargs!("queue_name" => queue_name, "payload" => payload),),
                        )
                    } else {
                        if payload.is_some()
                            && !self.warned_payloadless.swap(true, Ordering::SeqCst)
                        {
                            log(logger, "warn", PAYLOADLESS_WARNING);
                        }
                        class.funcall("new", (kwargs!("queue_name" => queue_name),))
                    };
                    let pushed = built.and_then(|wake: Value| queue.funcall("<<", (wake,)));
                    ("wake delivery", pushed)
                }
                Delivery::Failed { .. } if !self.failed.swap(true, Ordering::SeqCst) => {
                    ("on_failure", call_option(target(targets.on_failure), ()))
                }
                Delivery::Failed { .. } => continue,
                // A cut's marker and a hub's `move` are the worker's
                // FailoverListener's to act on (docs/architecture.md, "Planned
                // events"); a bare HubClient's pump drops them: its hub closes
                // it after the grace, as it would a peer that ignores `move`.
                Delivery::Marker { .. } | Delivery::Move { .. } => continue,
                Delivery::Listening { queue, ticket } => (
                    "on_listening",
                    call_option(target(targets.on_listening), (queue, ticket)),
                ),
            };
            if let Err(error) = delivered {
                survive(ruby, logger, what, error)?;
            }
        }
        Ok(true)
    }
}

/// `callback.call(*args)` unless the option is nil.
fn call_option<A: magnus::ArgList>(callback: Value, args: A) -> Result<Value, Error> {
    if callback.is_nil() {
        return Ok(callback);
    }
    callback.funcall("call", args)
}

/// `logger.public_send(severity, message)` unless nil; a broken logger must
/// not stop the thread that logs.
fn log(logger: Value, severity: &str, message: impl AsRef<str>) {
    if !logger.is_nil() {
        let _: Result<Value, Error> = logger.funcall(severity, (message.as_ref(),));
    }
}

/// A StandardError raised by an app's object (dispatch queue, callback) is
/// logged and the Ruby thread goes on; anything else (Thread#kill, a
/// non-StandardError Exception) propagates.
fn survive(ruby: &Ruby, logger: Value, what: &str, error: Error) -> Result<(), Error> {
    if !error.is_kind_of(ruby.exception_standard_error()) {
        return Err(error);
    }
    let raised = error
        .value()
        .map_or_else(|| error.to_string(), |e| e.inspect());
    log(
        logger,
        "error",
        format!("[pgbus-hub] {what} raised {raised}"),
    );
    Ok(())
}

/// The Ruby objects among an object's resolved keywords (`options::initialize`
/// aims its [`Outputs`] at them): where its wakes, failure, listen
/// confirmations and log records go. None where the keyword is nil (or
/// false) or not one of the class's.
#[derive(Default)]
pub struct Targets {
    pub dispatch_queue: Option<Opaque<Value>>,
    pub logger: Option<Opaque<Value>>,
    pub on_failure: Option<Opaque<Value>>,
    pub on_listening: Option<Opaque<Value>>,
    /// The class each wake is built in (`wake_message:`); None: pgbus's, else ours.
    pub wake_message: Option<Opaque<Value>>,
}

impl Targets {
    pub fn parse(ruby: &Ruby, resolved: RHash) -> Self {
        let object = |key: &str| {
            resolved
                .get(ruby.to_symbol(key))
                .filter(|value| value.to_bool())
                .map(Opaque::from)
        };
        Self {
            dispatch_queue: object("dispatch_queue"),
            logger: object("logger"),
            on_failure: object("on_failure"),
            on_listening: object("on_listening"),
            wake_message: object("wake_message"),
        }
    }

    /// Called from the owner's `DataTypeFunctions::mark`.
    pub fn mark(&self, marker: &Marker) {
        for value in [
            self.dispatch_queue,
            self.logger,
            self.on_failure,
            self.on_listening,
            self.wake_message,
        ]
        .into_iter()
        .flatten()
        {
            marker.mark(value);
        }
    }
}

/// The two streams a native object hands to its Ruby threads (`threads`):
/// wakes for the pump thread (HubClient, FailoverListener) and log records
/// for the log thread (all three); where they go ([`Targets`]), and the
/// process that made the object (the only one that joins its threads).
#[derive(Default)]
pub struct Outputs {
    pump: Mutex<Option<Arc<Pump>>>,
    logs: Mutex<Option<Arc<LogPump>>>,
    targets: OnceLock<Targets>,
    owner: OnceLock<Owner>,
    wake_class: OnceLock<(Opaque<RClass>, bool)>,
}

/// An object `initialize` never ran on has nowhere to deliver.
static NO_TARGETS: Targets = Targets {
    dispatch_queue: None,
    logger: None,
    on_failure: None,
    on_listening: None,
    wake_message: None,
};

fn current<T>(slot: &Mutex<Option<Arc<T>>>) -> Option<Arc<T>> {
    lock(slot).clone()
}

fn replace<T>(slot: &Mutex<Option<Arc<T>>>, value: Option<Arc<T>>) -> Option<Arc<T>> {
    std::mem::replace(&mut *lock(slot), value)
}

impl Outputs {
    /// From `initialize`: where the outputs go; this process is the owner.
    pub fn aim(&self, targets: Targets) {
        let _ = self.owner.set(Owner::current());
        let _ = self.targets.set(targets);
    }

    pub fn targets(&self) -> &Targets {
        self.targets.get().unwrap_or(&NO_TARGETS)
    }

    /// True in the process whose `initialize` made the object (never in a forked child).
    pub fn in_owner_process(&self) -> bool {
        self.owner.get().is_some_and(|owner| owner.is_current())
    }

    /// Called from the owner's `DataTypeFunctions::mark`.
    pub fn mark(&self, marker: &Marker) {
        self.targets().mark(marker);
        if let Some((class, _)) = self.wake_class.get() {
            marker.mark(*class);
        }
    }

    pub fn open(&self, wakes: Arc<dyn WakeSource>, records: crossbeam_channel::Receiver<Record>) {
        replace(&self.pump, Some(Arc::new(Pump::new(wakes))));
        self.open_logs(records);
    }

    /// Log records only (the master hub has no wakes to hand out).
    pub fn open_logs(&self, records: crossbeam_channel::Receiver<Record>) {
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

    /// The pump thread's one call, looped until false (as `drain_logs` is
    /// the log thread's): the open pump's next batch to Ruby; false once closed.
    pub fn pump_wakes(&self, ruby: &Ruby) -> Result<bool, Error> {
        current(&self.pump).map_or(Ok(false), |pump| pump.hand_batch_to_ruby(ruby, self))
    }

    pub fn drain_logs(&self, ruby: &Ruby, logger: Value) -> Result<bool, Error> {
        current(&self.logs).map_or(Ok(false), |logs| logs.drain(ruby, logger))
    }
}

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
