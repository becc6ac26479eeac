//! `Pgbus::Hub::DEFAULTS` and the ack-budget formulas: every default the Ruby
//! classes use comes from the core, defined once.

use magnus::{function, prelude::*, Error, RModule, Ruby};
use pgbus_hub_core::{client, hub, listener, protocol};
use std::time::Duration;

fn listen_ack_timeout(health_check_ms: u64) -> f64 {
    listener::listen_ack_timeout(Duration::from_millis(health_check_ms)).as_secs_f64()
}

fn hub_ack_timeout(health_check_ms: u64) -> f64 {
    client::hub_ack_timeout(Duration::from_millis(health_check_ms)).as_secs_f64()
}

/// `Pgbus::Hub.socket_name(pid)`: pgbus's socket file name for a master pid (or "*").
fn socket_name(pid: magnus::Value) -> Result<String, Error> {
    Ok(hub::socket_file_name(
        &pid.funcall::<_, _, String>("to_s", ())?,
    ))
}

/// `Pgbus::Hub.stale_sockets(dir)`: the hub sockets in `dir` that hubs killed
/// without cleanup left (what a hub starting there removes), sorted.
fn stale_sockets(dir: String) -> Vec<String> {
    hub::stale_sockets(std::path::Path::new(&dir))
        .into_iter()
        .map(|path| path.to_string_lossy().into_owned())
        .collect()
}

/// `Pgbus::Hub.channel_key(name)`: what `ensure_listening` takes to LISTEN on
/// raw channel `name` (verbatim, ActionCable's) instead of a pgbus queue.
fn channel_key(name: String) -> String {
    protocol::channel_key(&name)
}

pub fn init(ruby: &Ruby, hub_module: RModule) -> Result<(), Error> {
    let defaults = ruby.hash_new();
    let health_check_ms =
        u64::try_from(listener::DEFAULT_HEALTH_CHECK.as_millis()).unwrap_or(u64::MAX);
    defaults.aset(ruby.to_symbol("health_check_ms"), health_check_ms)?;
    for (key, text) in [
        ("channel_prefix", listener::DEFAULT_CHANNEL_PREFIX),
        ("channel_suffix", listener::DEFAULT_CHANNEL_SUFFIX),
    ] {
        let value = ruby.str_new(text);
        value.freeze(); // shared by every configuration that keeps the default
        defaults.aset(ruby.to_symbol(key), value)?;
    }
    defaults.aset(ruby.to_symbol("standby"), listener::DEFAULT_STANDBY)?;
    defaults.aset(
        ruby.to_symbol("durable_queue_limit"),
        hub::DEFAULT_DURABLE_QUEUE_LIMIT,
    )?;
    defaults.aset(
        ruby.to_symbol("hard_queue_limit"),
        hub::DEFAULT_HARD_QUEUE_LIMIT,
    )?;
    defaults.aset(
        ruby.to_symbol("max_channels_per_connection"),
        hub::DEFAULT_MAX_CHANNELS_PER_CONNECTION,
    )?;
    defaults.aset(ruby.to_symbol("max_channels"), hub::DEFAULT_MAX_CHANNELS)?;
    // No port: no metrics endpoint unless asked for (docs/monitoring.md).
    defaults.aset(ruby.to_symbol("metrics_port"), ruby.qnil())?;
    let bind = ruby.str_new(hub::metrics::DEFAULT_METRICS_BIND);
    bind.freeze();
    defaults.aset(ruby.to_symbol("metrics_bind"), bind)?;
    defaults.aset(
        ruby.to_symbol("status_interval"),
        hub::DEFAULT_STATUS_INTERVAL.as_secs_f64(),
    )?;
    defaults.aset(
        ruby.to_symbol("ack_timeout"),
        client::DEFAULT_ACK_TIMEOUT.as_secs_f64(),
    )?;
    defaults.freeze();
    hub_module.const_set("DEFAULTS", defaults)?;
    hub_module.const_set("DEFAULT_SOCKET_ENV", hub::SOCKET_ENV)?;
    // Raw channels (ActionCable): their routing key, and large payloads' storage.
    hub_module.define_module_function("channel_key", function!(channel_key, 1))?;
    hub_module.const_set("LARGE_PAYLOAD_MARK", protocol::LARGE_PAYLOAD_MARK)?;
    hub_module.const_set("LARGE_PAYLOAD_TABLE", protocol::LARGE_PAYLOAD_TABLE)?;
    hub_module.const_set("LARGE_PAYLOAD_DDL", protocol::large_payload_ddl())?;
    hub_module.const_set("LARGE_PAYLOAD_INSERT", protocol::large_payload_insert())?;
    hub_module.const_set("NOTIFY_PAYLOAD_LIMIT", protocol::NOTIFY_PAYLOAD_LIMIT)?;
    hub_module.const_set("WORKER_PAYLOAD_LIMIT", hub::limits::WORKER_PAYLOAD_LIMIT)?;
    hub_module.define_module_function("socket_name", function!(socket_name, 1))?;
    hub_module.define_module_function("stale_sockets", function!(stale_sockets, 1))?;
    hub_module.define_module_function("listen_ack_timeout", function!(listen_ack_timeout, 1))?;
    hub_module.define_module_function("hub_ack_timeout", function!(hub_ack_timeout, 1))?;
    Ok(())
}

/// `Pgbus::Hub::DEFAULTS`, as `init` defined it.
pub fn hash(ruby: &Ruby) -> Result<magnus::RHash, Error> {
    crate::errors::hub_module(ruby).const_get("DEFAULTS")
}
