//! `Pgbus::Hub::MasterHub`: the native hub. lib/pgbus/hub/master_hub.rb owns
//! the keywords and defaults and calls the `native_*` methods below.

use crate::errors::{hub_error, panicked};
use crate::logs::LogPump;
use crate::nogvl::nogvl_cancellable;
use crate::options::{listener_config, required, seconds};
use magnus::{method, prelude::*, Error, RArray, RHash, RModule, Ruby};
use pgbus_hub_core::hub::{HubConfig, MasterHub};
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::sync::lock;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Default)]
#[magnus::wrap(class = "Pgbus::Hub::MasterHub")]
pub struct RbMasterHub {
    hub: Mutex<Option<MasterHub>>,
    logs: Mutex<Option<Arc<LogPump>>>,
}

impl RbMasterHub {
    fn hub(&self) -> std::sync::MutexGuard<'_, Option<MasterHub>> {
        lock(&self.hub)
    }

    fn pump(&self) -> Option<Arc<LogPump>> {
        lock(&self.logs).clone()
    }

    /// Binds and starts; raises Pgbus::Hub::Error with the reason.
    fn native_start(ruby: &Ruby, rb_self: &Self, options: RHash) -> Result<(), Error> {
        if rb_self.hub().as_ref().is_some_and(MasterHub::is_running) {
            return Err(hub_error(ruby, "master hub is already running"));
        }
        let (log, records) = LogSink::channel();
        let config = HubConfig {
            listener: listener_config(ruby, options, log)?,
            socket_path: PathBuf::from(required::<String>(ruby, options, "socket_path")?),
            status_interval: seconds(ruby, options, "status_interval")?,
            durable_queue_limit: required(ruby, options, "durable_queue_limit")?,
            hard_queue_limit: required(ruby, options, "hard_queue_limit")?,
            max_channels_per_connection: required(ruby, options, "max_channels_per_connection")?,
            max_channels: required(ruby, options, "max_channels")?,
        };
        let hub = MasterHub::start(config).map_err(|reason| hub_error(ruby, reason))?;
        *rb_self.hub() = Some(hub);
        *lock(&rb_self.logs) = Some(Arc::new(LogPump::new(records)));
        Ok(())
    }

    /// Idempotent; inert in a forked child (the core checks the owner pid).
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let taken = rb_self.hub().take();
        if let Some(mut hub) = taken {
            // Joining the hub thread can take up to its stop grace: never with
            // the GVL held, and Thread#kill/raise end the wait at once.
            nogvl_cancellable(move |cancel| hub.stop_or_cancel(cancel))
                .ok_or_else(|| panicked(ruby, "MasterHub#stop"))?;
        }
        if let Some(pump) = rb_self.pump() {
            pump.close();
        }
        Ok(())
    }

    fn native_running(&self) -> bool {
        self.hub().as_ref().is_some_and(MasterHub::is_running)
    }

    /// Blocks (without the GVL) for the next log records; nil once stopped and drained.
    fn native_next_logs(ruby: &Ruby, rb_self: &Self) -> Result<Option<RArray>, Error> {
        match rb_self.pump() {
            Some(pump) => pump.next(ruby),
            None => Ok(None),
        }
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

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let class = hub.define_class("MasterHub", ruby.class_object())?;
    class.define_alloc_func::<RbMasterHub>();
    class.define_private_method("native_start", method!(RbMasterHub::native_start, 1))?;
    class.define_private_method("native_stop", method!(RbMasterHub::native_stop, 0))?;
    class.define_private_method(
        "native_next_logs",
        method!(RbMasterHub::native_next_logs, 0),
    )?;
    class.define_method("running?", method!(RbMasterHub::native_running, 0))?;
    class.define_private_method("native_stats", method!(RbMasterHub::native_stats, 0))?;
    Ok(())
}
