//! `Pgbus::Hub::FailoverListener` (and its subclass `Listener`, the same
//! without a hub to try): a worker's listener, served by the master hub
//! until it fails, then by a LISTEN connection of its own
//! (`pgbus_hub_core::failover`), with pgbus's Listener surface. Its pump
//! and log threads (started, listed and joined by `stop`) are in `threads`.

use crate::errors::{hub_error, panicked};
use crate::nogvl::{nogvl_cancellable, nogvl_resuming};
use crate::options::{self, FailoverListenerOptions};
use crate::pump::Outputs;
use crate::threads::{self, NativeObject};
use magnus::gc::Marker;
use magnus::typed_data::DataTypeFunctions;
use magnus::{
    method, prelude::*, typed_data::Obj, value::Lazy, Error, RClass, RHash, RModule, Ruby, Symbol,
    Value,
};
use pgbus_hub_core::failover::{FailoverConfig, FailoverListener, FailoverState, Listened};
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Default, magnus::TypedData)]
#[magnus(class = "Pgbus::Hub::FailoverListener", mark)]
pub struct RbFailoverListener {
    options: OnceLock<FailoverListenerOptions>,
    /// Shared by concurrent calls (one per request thread); `stop` takes it out.
    listener: Mutex<Option<Arc<FailoverListener>>>,
    /// Set by the first `start` (the next ones return at once).
    started: AtomicBool,
    outputs: Outputs,
}

impl DataTypeFunctions for RbFailoverListener {
    fn mark(&self, marker: &Marker) {
        self.outputs.mark(marker);
    }
}

impl RbFailoverListener {
    fn listener(&self) -> Option<Arc<FailoverListener>> {
        lock(&self.listener).clone()
    }

    fn initialize(ruby: &Ruby, rb_self: Obj<Self>, args: &[Value]) -> Result<(), Error> {
        let listener_class: RClass = ruby.get_inner(&LISTENER);
        let class = if rb_self.is_kind_of(listener_class) {
            "Listener"
        } else {
            "FailoverListener"
        };
        let (cell, outputs) = (&rb_self.options, &rb_self.outputs);
        options::initialize(
            ruby,
            class,
            args,
            cell,
            outputs,
            FailoverListenerOptions::parse,
        )
    }

    /// Idempotent, like pgbus's Listener#start: starts the listener, then
    /// its pump and log threads.
    fn start(ruby: &Ruby, rb_self: Obj<Self>) -> Result<Obj<Self>, Error> {
        if rb_self.started.swap(true, Ordering::SeqCst) {
            return Ok(rb_self);
        }
        if let Err(error) = Self::native_start(ruby, &rb_self) {
            rb_self.started.store(false, Ordering::SeqCst);
            return Err(error);
        }
        threads::start(ruby, rb_self, "pgbus-hub listener")?;
        Ok(rb_self)
    }

    /// Connects to the hub at `:socket_path` (if given) without the GVL;
    /// Thread#kill / Thread#raise end a wait on a full listen backlog at once.
    fn native_start(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let options = options::kept(ruby, &rb_self.options, "FailoverListener")?;
        let ((listener, wakes), records) = loop {
            let (log, records) = LogSink::channel();
            let config = FailoverConfig {
                socket_path: options.socket_path.clone().map(Into::into),
                listener: options.listener.config(log),
            };
            let started = nogvl_cancellable(move |cancelled| {
                FailoverListener::start_or_cancel(config, cancelled)
            })
            .ok_or_else(|| panicked(ruby, "FailoverListener#start"))?;
            match started.value {
                Ok(started) => break (started, records),
                // Never raise over Ruby's pending interrupt.
                Err(_) if started.interrupted => {
                    drop(records);
                    ruby.thread_check_ints()?;
                }
                Err(error) => return Err(hub_error(ruby, error.to_string())),
            }
        };
        *lock(&rb_self.listener) = Some(Arc::new(listener));
        rb_self.outputs.open(Arc::new(wakes), records);
        Ok(())
    }

    /// `:done` once LISTEN is active; nil when not confirmed in time, for a
    /// name no LISTEN can take (logged once), when interrupted, and after
    /// `stop` (pgbus's dispatcher may still ask while its streamer shuts
    /// down). Before `start`: an error. Waits without the GVL.
    fn ensure_listening(
        ruby: &Ruby,
        rb_self: &Self,
        queue: Value,
    ) -> Result<Option<Symbol>, Error> {
        let queue = options::queue_name(queue)?;
        let Some(listener) = rb_self.listener() else {
            if rb_self.started.load(Ordering::SeqCst) {
                return Ok(None);
            }
            return Err(hub_error(ruby, "ensure_listening before start"));
        };
        let listened = nogvl_resuming(
            ruby,
            listener.listen_budget(),
            |cancelled| listener.ensure_listening_or_cancel(&queue, cancelled),
            |listened| *listened == Listened::NotConfirmed,
        )?
        .ok_or_else(|| panicked(ruby, "FailoverListener#ensure_listening"))?;
        Ok((listened.value == Listened::Done).then(|| ruby.to_symbol("done")))
    }

    fn remove_listening(&self, queue: Value) -> Result<(), Error> {
        let queue = options::queue_name(queue)?;
        if let Some(listener) = self.listener() {
            listener.remove_listening(&queue);
        }
        Ok(())
    }

    /// `listen(queue)`: subscribes without waiting and returns a ticket;
    /// `on_listening` is called with the queue and that ticket on the pump
    /// thread once its LISTEN is active (a LISTEN not confirmed is asked
    /// again while subscribed). In order with `unlisten`.
    fn listen(ruby: &Ruby, rb_self: &Self, queue: Value) -> Result<u64, Error> {
        let queue = options::queue_name(queue)?;
        let listener = rb_self
            .listener()
            .ok_or_else(|| hub_error(ruby, "listen before start (or after stop)"))?;
        Ok(listener.listen_async(&queue))
    }

    /// `unlisten(queue)`: unsubscribes, in order with `listen`.
    fn unlisten(&self, queue: Value) -> Result<(), Error> {
        let queue = options::queue_name(queue)?;
        if let Some(listener) = self.listener() {
            listener.unlisten_async(&queue);
        }
        Ok(())
    }

    /// `Listener#connected?`: its connection is up.
    fn connected(&self) -> bool {
        self.listener()
            .and_then(|l| l.local())
            .is_some_and(|local| local.stats().healthy())
    }

    fn failed_over(&self) -> bool {
        self.listener().is_some_and(|l| l.failed_over())
    }

    /// The hub serves and its last status said healthy (false on the local
    /// listener and after `stop`).
    fn hub_healthy(&self) -> bool {
        self.listener().is_some_and(|l| l.hub_healthy())
    }

    /// Who serves (`FailoverState`'s word): nil before `start`, `:stopped` after `stop`.
    fn state(ruby: &Ruby, rb_self: &Self) -> Option<Symbol> {
        let state = match rb_self.listener() {
            Some(listener) => listener.state(),
            None if rb_self.started.load(Ordering::SeqCst) => FailoverState::Stopped,
            None => return None,
        };
        Some(ruby.to_symbol(state.as_str()))
    }

    /// `state` and `dropped_payloads`, and the own connection's health (only
    /// those two while the hub serves).
    fn stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let hash = ruby.hash_new();
        if let Some(state) = Self::state(ruby, rb_self) {
            hash.aset(ruby.to_symbol("state"), state)?;
        }
        if let Some(listener) = rb_self.listener() {
            hash.aset(
                ruby.to_symbol("dropped_payloads"),
                listener.dropped_payloads(),
            )?;
        }
        if let Some(local) = rb_self.listener().and_then(|l| l.local()) {
            let stats = local.stats();
            hash.aset(
                ruby.to_symbol("listener_state"),
                ruby.to_symbol(stats.state().as_str()),
            )?;
            hash.aset(ruby.to_symbol("healthy"), stats.healthy())?;
            hash.aset(ruby.to_symbol("reconnects"), stats.reconnects())?;
            hash.aset(ruby.to_symbol("handovers"), stats.handovers())?;
            hash.aset(
                ruby.to_symbol("abandoned_connections"),
                stats.abandoned_connections(),
            )?;
            // The own connection's census (2 with standby while the standby is up).
            hash.aset(
                ruby.to_symbol("listen_connections"),
                stats.listen_connections(),
            )?;
            hash.aset(ruby.to_symbol("standby_aligned"), stats.standby_aligned())?;
            hash.aset(
                ruby.to_symbol("standby_promotions"),
                stats.standby_promotions(),
            )?;
            hash.aset(ruby.to_symbol("notifications"), stats.notifications())?;
            hash.aset(ruby.to_symbol("channels"), stats.channels())?;
            hash.aset(ruby.to_symbol("backend_pid"), stats.backend_pid())?;
            hash.aset(ruby.to_symbol("last_error"), stats.last_error())?;
        }
        Ok(hash)
    }
}

impl NativeObject for RbFailoverListener {
    /// Stops without the GVL; Thread#kill / Thread#raise end the wait for
    /// the side's threads at once (stopped all the same).
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let taken = lock(&rb_self.listener).take();
        let stopped = match taken {
            Some(listener) => {
                nogvl_cancellable(move |cancelled| listener.stop_or_cancel(cancelled))
                    .map(|stop| stop.value)
            }
            None => Some(()),
        };
        stopped.ok_or_else(|| panicked(ruby, "FailoverListener#stop"))
    }

    fn outputs(&self) -> &Outputs {
        &self.outputs
    }
}

/// `Pgbus::Hub::Listener`: the same, without a hub to try (the `:process`
/// scope, single mode, standalone).
static LISTENER: Lazy<RClass> = Lazy::new(|ruby| {
    crate::errors::hub_module(ruby)
        .const_get("Listener")
        .expect("defined in init")
});

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let class = hub.define_class("FailoverListener", ruby.class_object())?;
    class.define_alloc_func::<RbFailoverListener>();
    class.define_method("initialize", method!(RbFailoverListener::initialize, -1))?;
    class.define_method("start", method!(RbFailoverListener::start, 0))?;
    class.define_method(
        "ensure_listening",
        method!(RbFailoverListener::ensure_listening, 1),
    )?;
    class.define_method(
        "remove_listening",
        method!(RbFailoverListener::remove_listening, 1),
    )?;
    class.define_method("listen", method!(RbFailoverListener::listen, 1))?;
    class.define_method("unlisten", method!(RbFailoverListener::unlisten, 1))?;
    let listener = hub.define_class("Listener", class)?;
    listener.define_method("connected?", method!(RbFailoverListener::connected, 0))?;
    class.define_method("failed_over?", method!(RbFailoverListener::failed_over, 0))?;
    class.define_method("hub_healthy?", method!(RbFailoverListener::hub_healthy, 0))?;
    class.define_method("state", method!(RbFailoverListener::state, 0))?;
    class.define_method("stats", method!(RbFailoverListener::stats, 0))?;
    class.define_method("stop", method!(threads::stop::<RbFailoverListener>, 0))?;
    class.define_method("threads", method!(threads::alive::<RbFailoverListener>, 0))?;
    Ok(())
}
