//! `Pgbus::Hub::Listener`: the per-worker LISTEN connection (the fallback when
//! there is no hub, and the standalone engine). Same engine as the hub's.
//! lib/pgbus/hub/listener.rb owns the keywords, pump and log threads.

use crate::errors::{hub_error, invalid_queue, panicked};
use crate::nogvl::nogvl_cancellable;
use crate::options::listener_config;
use crate::pump::Outputs;
use magnus::{method, prelude::*, Error, RArray, RHash, RModule, Ruby, Symbol};
use pgbus_hub_core::listener::StandaloneListener;
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::sync::lock;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
#[magnus::wrap(class = "Pgbus::Hub::Listener")]
pub struct RbListener {
    /// Shared by concurrent calls (one per request thread); `stop` takes it out.
    listener: Mutex<Option<Arc<StandaloneListener>>>,
    outputs: Outputs,
}

impl RbListener {
    fn listener(&self) -> Option<Arc<StandaloneListener>> {
        lock(&self.listener).clone()
    }

    fn native_start(ruby: &Ruby, rb_self: &Self, options: RHash) -> Result<(), Error> {
        if rb_self.listener().is_some() {
            return Ok(()); // idempotent, like pgbus's Listener#start
        }
        let (log, records) = LogSink::channel();
        let config = listener_config(ruby, options, log)?;
        let (deliveries, receiver) = pgbus_hub_core::delivery::channel();
        let listener = StandaloneListener::start(config, deliveries)
            .map_err(|e| hub_error(ruby, format!("cannot start the listener thread: {e}")))?;
        *lock(&rb_self.listener) = Some(Arc::new(listener));
        rb_self.outputs.open(Arc::new(receiver), records);
        Ok(())
    }

    /// `:done` once LISTEN ran; nil when it did not within `timeout` seconds
    /// (pgbus's Listener contract); InvalidQueueError for a name that cannot work.
    fn native_ensure_listening(
        ruby: &Ruby,
        rb_self: &Self,
        queue: String,
        timeout: f64,
    ) -> Result<Option<Symbol>, Error> {
        let Some(listener) = rb_self.listener() else {
            return Err(hub_error(ruby, "Listener#ensure_listening before start"));
        };
        let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
        // Thread#kill / Thread#raise end the wait at once (the LISTEN stays queued).
        let outcome = nogvl_cancellable(move |cancelled| {
            listener.ensure_listening_or_cancel(&queue, timeout, cancelled)
        })
        .ok_or_else(|| panicked(ruby, "Listener#ensure_listening"))?;
        match outcome.value {
            Ok(()) => Ok(Some(ruby.to_symbol("done"))),
            // Never raise over Ruby's pending interrupt (see Cancellable).
            Err(e) if e.is_invalid_name() && !outcome.interrupted => {
                Err(invalid_queue(ruby, e.to_string()))
            }
            Err(_) => Ok(None),
        }
    }

    fn native_remove_listening(&self, queue: String) {
        if let Some(listener) = self.listener() {
            listener.remove_listening(&queue);
        }
    }

    fn native_connected(&self) -> bool {
        self.listener().is_some_and(|l| l.stats().healthy())
    }

    fn native_stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let hash = ruby.hash_new();
        if let Some(listener) = rb_self.listener() {
            let stats = listener.stats();
            hash.aset(ruby.to_symbol("healthy"), stats.healthy())?;
            hash.aset(ruby.to_symbol("reconnects"), stats.reconnects())?;
            hash.aset(ruby.to_symbol("notifications"), stats.notifications())?;
            hash.aset(ruby.to_symbol("channels"), stats.channels())?;
            hash.aset(ruby.to_symbol("backend_pid"), stats.backend_pid())?;
            hash.aset(ruby.to_symbol("last_error"), stats.last_error())?;
        }
        Ok(hash)
    }

    /// Stops without the GVL; Thread#kill / Thread#raise end the wait for
    /// the engine's thread at once (it finishes shutting down detached: see
    /// `StandaloneListener::stop_or_cancel`), and the outputs are closed either way.
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let taken = lock(&rb_self.listener).take();
        let stopped = match taken {
            Some(listener) => {
                nogvl_cancellable(move |cancelled| listener.stop_or_cancel(cancelled))
                    .map(|stop| stop.value)
            }
            None => Some(()),
        };
        rb_self.outputs.close();
        stopped.ok_or_else(|| panicked(ruby, "Listener#stop"))
    }

    fn native_next_batch(ruby: &Ruby, rb_self: &Self) -> Result<Option<RArray>, Error> {
        rb_self.outputs.next_batch(ruby)
    }

    fn native_next_logs(ruby: &Ruby, rb_self: &Self) -> Result<Option<RArray>, Error> {
        rb_self.outputs.next_logs(ruby)
    }
}

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let class = hub.define_class("Listener", ruby.class_object())?;
    class.define_alloc_func::<RbListener>();
    class.define_private_method("native_start", method!(RbListener::native_start, 1))?;
    class.define_private_method(
        "native_ensure_listening",
        method!(RbListener::native_ensure_listening, 2),
    )?;
    class.define_private_method(
        "native_remove_listening",
        method!(RbListener::native_remove_listening, 1),
    )?;
    class.define_method("connected?", method!(RbListener::native_connected, 0))?;
    class.define_private_method("native_stats", method!(RbListener::native_stats, 0))?;
    class.define_private_method("native_stop", method!(RbListener::native_stop, 0))?;
    class.define_private_method(
        "native_next_batch",
        method!(RbListener::native_next_batch, 0),
    )?;
    class.define_private_method("native_next_logs", method!(RbListener::native_next_logs, 0))?;
    Ok(())
}
