//! `Pgbus::Hub::MasterHub`: the native hub, one PostgreSQL LISTEN connection
//! fanned out to workers over a Unix socket. Its log thread (started,
//! listed and joined by `stop`) is in `threads`; with `log_file:` a native
//! thread writes the log instead (`pgbus-hub serve`), and `threads` is empty.

use crate::errors::{hub_error, panicked};
use crate::nogvl::nogvl_cancellable;
use crate::options::{self, MasterHubOptions};
use crate::pump::Outputs;
use crate::threads::{self, NativeObject};
use magnus::gc::Marker;
use magnus::typed_data::DataTypeFunctions;
use magnus::{method, prelude::*, typed_data::Obj, Error, RHash, RModule, Ruby, Value};
use pgbus_hub_core::hub::{HubConfig, MasterHub};
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::log_file::LogFile;
use pgbus_hub_core::owned_thread::OwnedThread;
use pgbus_hub_core::sync::lock;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long `stop` waits for the log file's writer to write what is left.
const LOG_WRITER_STOP: Duration = Duration::from_secs(5);

const CLASS: &str = "MasterHub";

#[derive(Default, magnus::TypedData)]
#[magnus(class = "Pgbus::Hub::MasterHub", mark)]
pub struct RbMasterHub {
    options: OnceLock<MasterHubOptions>,
    hub: Mutex<Option<MasterHub>>,
    outputs: Outputs,
    /// With `log_file:`: the file and the thread writing to it.
    log_file: Mutex<Option<(Arc<LogFile>, OwnedThread)>>,
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
        Self::native_start(ruby, &rb_self, MasterHub::start)?;
        threads::start(ruby, rb_self, "pgbus-hub")?;
        Ok(rb_self)
    }

    /// `start`, replacing a hub of ours that serves the socket path
    /// (`pgbus-hub serve`; `MasterHub::take_over`): it hands its workers over and yields.
    fn take_over(ruby: &Ruby, rb_self: Obj<Self>) -> Result<Obj<Self>, Error> {
        Self::native_start(ruby, &rb_self, MasterHub::take_over)?;
        threads::start(ruby, rb_self, "pgbus-hub")?;
        Ok(rb_self)
    }

    /// A take-over waits for the old hub's answer (at most 2 s): never with the GVL held.
    fn start_without_gvl(
        ruby: &Ruby,
        start: fn(HubConfig) -> Result<MasterHub, String>,
        config: HubConfig,
    ) -> Result<MasterHub, Error> {
        nogvl_cancellable(move |_bounded| start(config))
            .ok_or_else(|| panicked(ruby, "MasterHub#start"))?
            .value
            .map_err(|reason| hub_error(ruby, reason))
    }

    fn native_start(
        ruby: &Ruby,
        rb_self: &Self,
        start: fn(HubConfig) -> Result<MasterHub, String>,
    ) -> Result<(), Error> {
        if rb_self.hub().as_ref().is_some_and(MasterHub::is_running) {
            return Err(hub_error(ruby, "master hub is already running"));
        }
        let (log, records) = LogSink::channel();
        let options = rb_self.options(ruby)?;
        let config = options.config(log);
        let Some(path) = &options.log_file else {
            let hub = Self::start_without_gvl(ruby, start, config)?;
            *rb_self.hub() = Some(hub);
            rb_self.outputs.open_logs(records);
            return Ok(());
        };
        // The writer first: what the hub logs as it starts (or fails to) is written.
        let file = LogFile::open((path != "-").then(|| PathBuf::from(path)))
            .map_err(|e| hub_error(ruby, format!("cannot open the log {path}: {e}")))?;
        let writer = file
            .spawn_writer(records)
            .map_err(|e| hub_error(ruby, format!("cannot start the log writer: {e}")))?;
        *lock(&rb_self.log_file) = Some((file, writer));
        let hub = Self::start_without_gvl(ruby, start, config);
        match hub {
            Ok(hub) => *rb_self.hub() = Some(hub),
            Err(error) => {
                Self::stop_log_file(ruby, rb_self)?;
                return Err(error);
            }
        }
        Ok(())
    }

    /// `reopen_log`: with `log_file:`, opens the file again at its path
    /// (logrotate moved it) and says so there; nothing otherwise.
    fn reopen_log(&self) {
        if let Some((file, _)) = lock(&self.log_file).as_ref() {
            file.reopen();
        }
    }

    /// Writes what is left of the log and ends its writer (bounded, without the GVL).
    fn stop_log_file(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let Some((_, writer)) = lock(&rb_self.log_file).take() else {
            return Ok(());
        };
        nogvl_cancellable(move |cancel| writer.stop_or_cancel(cancel, Some(LOG_WRITER_STOP)))
            .map(drop)
            .ok_or_else(|| panicked(ruby, "MasterHub#stop"))
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
        Self::stop_log_file(ruby, rb_self)
    }

    fn outputs(&self) -> &Outputs {
        &self.outputs
    }
}

/// `Pgbus::Hub.prometheus_text(stats)`: a hub's stats Hash (`Pgbus::Hub.stats`,
/// `MasterHub#stats`; with `census:` when counted) as Prometheus text, the
/// families `GET /metrics` serves (`pgbus-hub status --prometheus`).
fn prometheus_text(ruby: &Ruby, stats: RHash) -> Result<String, Error> {
    let stats = crate::json::hash_to_object(ruby, stats)?;
    pgbus_hub_core::hub::metrics::render(&stats).map_err(|e| hub_error(ruby, e))
}

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    hub.define_module_function("prometheus_text", magnus::function!(prometheus_text, 1))?;
    let class = hub.define_class("MasterHub", ruby.class_object())?;
    class.define_alloc_func::<RbMasterHub>();
    class.define_method("initialize", method!(RbMasterHub::initialize, -1))?;
    class.define_method("socket_path", method!(RbMasterHub::socket_path, 0))?;
    class.define_method("start", method!(RbMasterHub::start, 0))?;
    class.define_method("take_over", method!(RbMasterHub::take_over, 0))?;
    class.define_method("stop", method!(threads::stop::<RbMasterHub>, 0))?;
    class.define_method("threads", method!(threads::alive::<RbMasterHub>, 0))?;
    class.define_method("running?", method!(RbMasterHub::native_running, 0))?;
    class.define_method("stats", method!(RbMasterHub::native_stats, 0))?;
    class.define_method("reopen_log", method!(RbMasterHub::reopen_log, 0))?;
    Ok(())
}
