//! `Pgbus::Hub::MasterHub`: the native hub, one PostgreSQL LISTEN connection
//! fanned out to workers over a Unix socket. Its log thread (started,
//! listed and joined by `stop`) is in `threads`.

use crate::errors::{hub_error, panicked};
use crate::nogvl::nogvl_cancellable;
use crate::options::{self, MasterHubOptions};
use crate::pump::Outputs;
use crate::threads::{self, NativeObject};
use magnus::gc::Marker;
use magnus::typed_data::DataTypeFunctions;
use magnus::{method, prelude::*, typed_data::Obj, Error, RHash, RModule, Ruby, Value};
use pgbus_hub_core::hub::MasterHub;
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::sync::lock;
use std::sync::{Mutex, OnceLock};

const CLASS: &str = "MasterHub";

#[derive(Default, magnus::TypedData)]
#[magnus(class = "Pgbus::Hub::MasterHub", mark)]
pub struct RbMasterHub {
    options: OnceLock<MasterHubOptions>,
    hub: Mutex<Option<MasterHub>>,
    outputs: Outputs,
}

impl DataTypeFunctions for RbMasterHub {
    fn mark(&self, marker: &Marker) {
        self.outputs.mark(marker);
    }
}

impl RbMasterHub {
    fn hub(&self) -> std::sync::MutexGuard<'_, Option<MasterHub>> {
        lock(&self.hub)
    }

    fn initialize(ruby: &Ruby, rb_self: Obj<Self>, args: &[Value]) -> Result<(), Error> {
        let (cell, outputs) = (&rb_self.options, &rb_self.outputs);
        options::initialize(ruby, CLASS, args, cell, outputs, MasterHubOptions::parse)
    }

    fn options(&self, ruby: &Ruby) -> Result<&MasterHubOptions, Error> {
        options::kept(ruby, &self.options, CLASS)
    }

    fn socket_path(ruby: &Ruby, rb_self: &Self) -> Result<String, Error> {
        Ok(rb_self.options(ruby)?.socket_path.clone())
    }

    /// Binds the socket, starts the native thread and the log thread;
    /// raises Pgbus::Hub::Error with the reason.
    fn start(ruby: &Ruby, rb_self: Obj<Self>) -> Result<Obj<Self>, Error> {
        Self::native_start(ruby, &rb_self)?;
        threads::start(ruby, rb_self, "pgbus-hub")?;
        Ok(rb_self)
    }

    fn native_start(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        if rb_self.hub().as_ref().is_some_and(MasterHub::is_running) {
            return Err(hub_error(ruby, "master hub is already running"));
        }
        let (log, records) = LogSink::channel();
        let config = rb_self.options(ruby)?.config(log);
        let hub = MasterHub::start(config).map_err(|reason| hub_error(ruby, reason))?;
        *rb_self.hub() = Some(hub);
        rb_self.outputs.open_logs(records);
        Ok(())
    }

    fn native_running(&self) -> bool {
        self.hub().as_ref().is_some_and(MasterHub::is_running)
    }

    fn native_stats(ruby: &Ruby, rb_self: &Self) -> Result<RHash, Error> {
        let hash = ruby.hash_new();
        let guard = rb_self.hub();
        let Some(stats) = guard.as_ref().map(MasterHub::stats) else {
            return Ok(hash);
        };
        drop(guard);
        for (key, value) in stats.fields() {
            hash.aset(ruby.to_symbol(&key), crate::json::to_ruby(ruby, value)?)?;
        }
        Ok(hash)
    }
}

impl NativeObject for RbMasterHub {
    /// Idempotent; inert in a forked child (the core checks the owner pid).
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let taken = rb_self.hub().take();
        if let Some(mut hub) = taken {
            // Joining the hub thread can take up to its stop grace: never with
            // the GVL held, and Thread#kill/raise end the wait at once.
            nogvl_cancellable(move |cancel| hub.stop_or_cancel(cancel))
                .ok_or_else(|| panicked(ruby, "MasterHub#stop"))?;
        }
        Ok(())
    }

    fn outputs(&self) -> &Outputs {
        &self.outputs
    }
}

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let class = hub.define_class("MasterHub", ruby.class_object())?;
    class.define_alloc_func::<RbMasterHub>();
    class.define_method("initialize", method!(RbMasterHub::initialize, -1))?;
    class.define_method("socket_path", method!(RbMasterHub::socket_path, 0))?;
    class.define_method("start", method!(RbMasterHub::start, 0))?;
    class.define_method("stop", method!(threads::stop::<RbMasterHub>, 0))?;
    class.define_method("threads", method!(threads::alive::<RbMasterHub>, 0))?;
    class.define_method("running?", method!(RbMasterHub::native_running, 0))?;
    class.define_method("stats", method!(RbMasterHub::native_stats, 0))?;
    Ok(())
}
