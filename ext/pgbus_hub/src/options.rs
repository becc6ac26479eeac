//! Ruby option values -> core configuration. The Ruby glue (lib/) owns the
//! keyword names and defaults; this only converts what it passes.

use crate::errors::arg_error;
use magnus::{prelude::*, r_hash::ForEach, Error, RHash, RString, Ruby, TryConvert, Value};
use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::listener::ListenerConfig;
use pgbus_hub_core::log::LogSink;
use std::time::Duration;

/// A required entry of the options Hash the glue built (Symbol keys).
pub fn required<T: TryConvert>(ruby: &Ruby, options: RHash, key: &str) -> Result<T, Error> {
    match options.get(ruby.to_symbol(key)) {
        Some(value) => T::try_convert(value),
        None => Err(arg_error(ruby, format!("missing option {key}"))),
    }
}

/// `connection:` as a libpq URL / keyword String, or a Hash of libpq keywords
/// (Symbol or String keys) whose `:variables` Hash becomes `SET name = value`.
pub fn connection(ruby: &Ruby, value: Value) -> Result<ConnectionOptions, Error> {
    let parsed = if let Some(text) = RString::from_value(value) {
        ConnectionOptions::parse(&text.to_string()?)
    } else if let Some(hash) = RHash::from_value(value) {
        let mut pairs = Vec::new();
        let mut variables = Vec::new();
        hash.foreach(|key: Value, value: Value| {
            let key: String = key.funcall("to_s", ())?;
            if key == "variables" {
                let vars = RHash::try_convert(value)?;
                vars.foreach(|name: Value, value: Value| {
                    variables.push((name.funcall("to_s", ())?, value.funcall("to_s", ())?));
                    Ok(ForEach::Continue)
                })?;
            } else if !value.is_nil() {
                pairs.push((key, value.funcall("to_s", ())?));
            }
            Ok(ForEach::Continue)
        })?;
        ConnectionOptions::from_pairs(pairs).and_then(|options| options.with_variables(variables))
    } else {
        return Err(Error::new(
            ruby.exception_type_error(),
            format!(
                "connection: must be a String (libpq URL or keywords) or a Hash, got {}",
                value.class().inspect()
            ),
        ));
    };
    parsed.map_err(|e| arg_error(ruby, format!("invalid connection: {e}")))
}

pub fn listener_config(ruby: &Ruby, options: RHash, log: LogSink) -> Result<ListenerConfig, Error> {
    let health_check_ms: u64 = required(ruby, options, "health_check_ms")?;
    Ok(ListenerConfig {
        connection: connection(ruby, required(ruby, options, "connection")?)?,
        health_check: Duration::from_millis(health_check_ms),
        channel_prefix: required(ruby, options, "channel_prefix")?,
        channel_suffix: required(ruby, options, "channel_suffix")?,
        log,
    })
}

pub fn seconds(ruby: &Ruby, options: RHash, key: &str) -> Result<Duration, Error> {
    let seconds: f64 = required(ruby, options, key)?;
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| arg_error(ruby, format!("{key} must be a positive number of seconds")))
}
