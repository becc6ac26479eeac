//! `Pgbus::Hub::HubClient`: a worker's connection to the master hub, the
//! transport alone (no connection of its own to fall back on). Its pump and log
//! threads (started, listed and joined by `stop`) are in `threads`.

use crate::errors::{panicked, unavailable};
use crate::nogvl::{nogvl_cancellable, nogvl_resuming};
use crate::options::{self, HubClientOptions};
use crate::pump::Outputs;
use crate::threads::{self, NativeObject};
use magnus::gc::Marker;
use magnus::scan_args::{get_kwargs, scan_args};
use magnus::typed_data::DataTypeFunctions;
use magnus::{method, prelude::*, typed_data::Obj, Error, RHash, RModule, Ruby, Symbol, Value};
use pgbus_hub_core::client::{ClientConfig, ClientError, HubClient, Listening};
use pgbus_hub_core::delivery::Drops;
use pgbus_hub_core::failover::RefusedNames;
use pgbus_hub_core::hub::SOCKET_ENV;
use pgbus_hub_core::log::LogSink;
use pgbus_hub_core::sync::lock;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

const CLASS: &str = "HubClient";

#[derive(Default, magnus::TypedData)]
#[magnus(class = "Pgbus::Hub::HubClient", mark)]
pub struct RbHubClient {
    options: OnceLock<HubClientOptions>,
    client: Mutex<Option<Arc<HubClient>>>,
    /// The client's log (a refused name is reported there).
    log: Mutex<Option<LogSink>>,
    refused: RefusedNames,
    outputs: Outputs,
}

impl DataTypeFunctions for RbHubClient {
    fn mark(&self, marker: &Marker) {
        self.outputs.mark(marker);
    }
}

impl RbHubClient {
    fn client(&self) -> Option<Arc<HubClient>> {
        lock(&self.client).clone()
    }

    fn initialize(ruby: &Ruby, rb_self: Obj<Self>, args: &[Value]) -> Result<(), Error> {
        let (cell, outputs) = (&rb_self.options, &rb_self.outputs);
        options::initialize(ruby, CLASS, args, cell, outputs, HubClientOptions::parse)
    }

    fn options(&self, ruby: &Ruby) -> Result<&HubClientOptions, Error> {
        options::kept(ruby, &self.options, CLASS)
    }

    fn socket_path(ruby: &Ruby, rb_self: &Self) -> Result<String, Error> {
        Ok(rb_self.options(ruby)?.socket_path.clone())
    }

    /// Seconds an `ensure_listening` waits for the hub's ack.
    fn ack_timeout(ruby: &Ruby, rb_self: &Self) -> Result<f64, Error> {
        Ok(rb_self.options(ruby)?.ack_timeout.as_secs_f64())
    }

    /// Raises HubUnavailableError "cannot reach master hub at PATH: ...".
    fn connect(ruby: &Ruby, rb_self: Obj<Self>) -> Result<Obj<Self>, Error> {
        Self::native_connect(ruby, &rb_self)?;
        threads::start(ruby, rb_self, "pgbus-hub client")?;
        Ok(rb_self)
    }

    /// Connects without the GVL (a hub whose listen backlog is full makes
    /// connect wait); Thread#kill / Thread#raise end the wait at once,
    /// leaving nothing open.
    fn native_connect(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        if rb_self.client().is_some_and(|c| !c.is_dead()) {
            let twice = ClientError::Unavailable("HubClient#connect called twice".into());
            return Err(unavailable(ruby, twice.to_string()));
        }
        let options = rb_self.options(ruby)?;
        let ((client, reader), records) = loop {
            let (log, records) = LogSink::channel();
            *lock(&rb_self.log) = Some(log.clone());
            let config = ClientConfig {
                socket_path: options.socket_path.clone().into(),
                ack_timeout: options.ack_timeout,
                drops: Drops::new(log.clone()),
                log,
            };
            // Driven: the Ruby pump thread reads the socket itself (no reader thread).
            let connected = nogvl_cancellable(move |cancelled| {
                HubClient::connect_driven_or_cancel(config, cancelled)
            })
            .ok_or_else(|| panicked(ruby, "HubClient#connect"))?;
            match connected.value {
                // Any failure while interrupted too: never raise over the interrupt.
                Err(error) if connected.interrupted => {
                    drop(error);
                    drop(records);
                    ruby.thread_check_ints()?;
                }
                connected => {
                    break (
                        connected.map_err(|e| unavailable(ruby, e.to_string()))?,
                        records,
                    )
                }
            }
        };
        *lock(&rb_self.client) = Some(Arc::new(client));
        rb_self.outputs.open(Arc::new(reader), records);
        Ok(())
    }

    /// `:done` once the hub acked (its LISTEN is active); nil while the hub
    /// reports its database down (the hub LISTENs it on reconnect), and for
    /// a name the hub refused (logged once). Waits without the GVL.
    /// Raises HubUnavailableError (dead, died while waiting, ack timeout).
    fn ensure_listening(
        ruby: &Ruby,
        rb_self: &Self,
        queue: Value,
    ) -> Result<Option<Symbol>, Error> {
        let queue = options::queue_name(queue)?;
        let not_connected = || ClientError::Unavailable("HubClient is not connected".into());
        let client = rb_self
            .client()
            .ok_or_else(|| unavailable(ruby, not_connected().to_string()))?;
        // Thread#kill / Thread#raise end the wait at once (the sub stays registered).
        let listening = nogvl_resuming(
            ruby,
            client.ack_timeout(),
            |cancelled| client.subscribe_or_cancel(&queue, cancelled),
            |outcome| matches!(outcome, Ok(Listening::Interrupted)),
        )?
        .ok_or_else(|| panicked(ruby, "HubClient#ensure_listening"))?;
        if listening.interrupted && listening.value.is_err() {
            return Ok(None); // never raise over Ruby's pending interrupt
        }
        if let Err(ClientError::Rejected { reason, .. }) = &listening.value {
            if let Some(log) = &*lock(&rb_self.log) {
                rb_self.refused.report(log, &queue, reason);
            }
            return Ok(None);
        }
        let listening = listening
            .value
            .map_err(|e| unavailable(ruby, e.to_string()))?;
        Ok(match listening {
            Listening::Active => Some(ruby.to_symbol("done")),
            Listening::AfterReconnect | Listening::Interrupted => None,
        })
    }

    /// Fire-and-forget; never raises on a dead hub.
    fn remove_listening(&self, queue: Value) -> Result<(), Error> {
        let queue = options::queue_name(queue)?;
        if let Some(client) = self.client() {
            client.unsubscribe(&queue);
        }
        Ok(())
    }

    fn native_hub_healthy(&self) -> bool {
        self.client().is_some_and(|c| c.hub_healthy())
    }

    fn native_dead(&self) -> bool {
        self.client().is_none_or(|c| c.is_dead())
    }
}

impl NativeObject for RbHubClient {
    /// Stops without the GVL; Thread#kill / Thread#raise end the wait for
    /// the socket's last users at once (stopped all the same: see
    /// `HubClient::stop_or_cancel`).
    fn native_stop(ruby: &Ruby, rb_self: &Self) -> Result<(), Error> {
        let stopped = match rb_self.client() {
            Some(client) => nogvl_cancellable(move |cancelled| client.stop_or_cancel(cancelled))
                .map(|stop| stop.value),
            None => Some(()),
        };
        stopped.ok_or_else(|| panicked(ruby, "HubClient#stop"))
    }

    fn outputs(&self) -> &Outputs {
        &self.outputs
    }
}

/// How long `Pgbus::Hub.stats` waits for an answer by default: a hub
/// answers at once unless wedged, and `pgbus-hub status` must not hang.
const STATS_TIMEOUT_SECONDS: f64 = 2.0;

/// `Pgbus::Hub.stats(socket_path: $PGBUS_STREAMS_HUB_SOCKET, timeout: 2.0)`:
/// a running hub's counters (our {"t":"stats"} frame, Symbol keys), asked
/// without the GVL. HubUnavailableError when nothing there answers stats
/// (pgbus's Ruby hub does not); nil when Ruby interrupted the wait.
fn stats(ruby: &Ruby, args: &[Value]) -> Result<Option<RHash>, Error> {
    let args = scan_args::<(), (), (), (), RHash, ()>(args)?;
    let keywords = get_kwargs::<_, (), (Option<Value>, Option<f64>), ()>(
        args.keywords,
        &[],
        &["socket_path", "timeout"],
    )?;
    let (socket_path, timeout) = keywords.optional;
    let socket_path = match socket_path.filter(|path| !path.is_nil()) {
        Some(path) => path.funcall::<_, _, String>("to_s", ())?,
        None => std::env::var(SOCKET_ENV).unwrap_or_default(),
    };
    if socket_path.is_empty() {
        let hint = format!("no hub socket given (set {SOCKET_ENV} or pass socket_path:)");
        return Err(unavailable(ruby, hint));
    }
    let timeout = Duration::try_from_secs_f64(timeout.unwrap_or(STATS_TIMEOUT_SECONDS))
        .map_err(|_| crate::errors::arg_error(ruby, "timeout must be a positive number"))?;
    // Resumed after a wake-up with nothing pending (Ruby calls the unblock function for
    // more than Thread#kill and Thread#raise): `pgbus-hub status` got nil so, 3 times in 86.
    // Any error seen after an interrupt may be the interrupt's (a cut write reads as closed).
    let answer = nogvl_resuming(
        ruby,
        timeout,
        |cancelled| pgbus_hub_core::client::request_stats(socket_path.as_ref(), timeout, cancelled),
        Result::is_err,
    )?
    .ok_or_else(|| panicked(ruby, "Pgbus::Hub.stats"))?;
    if answer.interrupted {
        return Ok(None); // never raise over Ruby's pending interrupt
    }
    let stats = answer.value.map_err(|e| unavailable(ruby, e.to_string()))?;
    let hash = ruby.hash_new();
    for (key, value) in stats {
        hash.aset(ruby.to_symbol(&key), crate::json::to_ruby(ruby, value)?)?;
    }
    Ok(Some(hash))
}

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    hub.define_module_function("stats", magnus::function!(stats, -1))?;
    let class = hub.define_class("HubClient", ruby.class_object())?;
    class.define_alloc_func::<RbHubClient>();
    // Where pgbus's FailoverListener looks for it.
    class.const_set(
        "HubUnavailableError",
        ruby.get_inner(&crate::errors::HUB_UNAVAILABLE),
    )?;
    class.define_method("initialize", method!(RbHubClient::initialize, -1))?;
    class.define_method("socket_path", method!(RbHubClient::socket_path, 0))?;
    class.define_method("ack_timeout", method!(RbHubClient::ack_timeout, 0))?;
    class.define_method("connect", method!(RbHubClient::connect, 0))?;
    class.define_method(
        "ensure_listening",
        method!(RbHubClient::ensure_listening, 1),
    )?;
    class.define_method(
        "remove_listening",
        method!(RbHubClient::remove_listening, 1),
    )?;
    class.define_method("hub_healthy?", method!(RbHubClient::native_hub_healthy, 0))?;
    class.define_method("dead?", method!(RbHubClient::native_dead, 0))?;
    class.define_method("stop", method!(threads::stop::<RbHubClient>, 0))?;
    class.define_method("threads", method!(threads::alive::<RbHubClient>, 0))?;
    Ok(())
}
