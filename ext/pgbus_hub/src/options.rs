//! Ruby option values -> core configuration: each constructor's keywords
//! (resolved, checked, defaults filled from `Pgbus::Hub::DEFAULTS`), kept in
//! the object's `@options`, and their conversion to the core's configs.

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

/// The libpq keywords an ActiveRecord configuration passes on to the hub,
/// by their libpq names (docs/configuration.md, "Connection options"); adapter-only keys (pool,
/// encoding, ...) are left out.
const ACTIVE_RECORD_LIBPQ_KEYS: &[&str] = &[
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "sslmode",
    "connect_timeout",
    "options",
    "variables",
];

/// `Pgbus::Hub.active_record_connection(configuration_hash)`: the connection
/// for an ActiveRecord database configuration: its `url`, else its libpq
/// keywords (ActiveRecord's `database` and `username` as `dbname` and `user`).
fn active_record_connection(ruby: &Ruby, config: RHash) -> Result<Value, Error> {
    if let Some(url) = config
        .get(ruby.to_symbol("url"))
        .filter(|url| !url.is_nil())
    {
        return Ok(url);
    }
    let libpq = ruby.hash_new();
    config.foreach(|key: Value, value: Value| {
        let key: String = key.funcall("to_s", ())?;
        let key = match key.as_str() {
            "database" => "dbname",
            "username" => "user",
            key => key,
        };
        if ACTIVE_RECORD_LIBPQ_KEYS.contains(&key) && !value.is_nil() {
            let value = match key {
                "variables" => value,
                _ => value.funcall::<_, _, RString>("to_s", ())?.as_value(),
            };
            libpq.aset(ruby.to_symbol(key), value)?;
        }
        Ok(ForEach::Continue)
    })?;
    Ok(libpq.as_value())
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

/// What a keyword accepts. Defaults of the tunable kinds are `Pgbus::Hub::DEFAULTS[key]`.
#[derive(Clone, Copy)]
enum Kind {
    /// Required; the native side converts (and refuses) it.
    Required,
    /// Required String.
    RequiredText,
    /// Required, responds to `<<` (a dispatch queue).
    Queue,
    /// Optional Ruby object (logger, callback); default nil.
    Object,
    /// Positive Integer.
    Count,
    /// Positive number of seconds (Float).
    Seconds,
    /// String.
    Text,
    /// An exception class (default nil).
    ErrorClass,
}

use Kind::{Count, ErrorClass, Object, Queue, Required, RequiredText, Seconds, Text};

const MASTER_HUB: &[(&str, Kind)] = &[
    ("connection", Required),
    ("socket_path", RequiredText),
    ("logger", Object),
    ("health_check_ms", Count),
    ("status_interval", Seconds),
    ("durable_queue_limit", Count),
    ("hard_queue_limit", Count),
    ("max_channels_per_connection", Count),
    ("max_channels", Count),
    ("channel_prefix", Text),
    ("channel_suffix", Text),
];

const LISTENER: &[(&str, Kind)] = &[
    ("connection", Required),
    ("dispatch_queue", Queue),
    ("logger", Object),
    ("on_listening", Object),
    ("health_check_ms", Count),
    ("channel_prefix", Text),
    ("channel_suffix", Text),
];

/// The keywords of each Ruby constructor that takes options, and of
/// Pgbus::Hub.configure (the master hub's tunables, socket_path optional).
fn schema(owner: &str) -> Option<Vec<(&'static str, Kind)>> {
    Some(match owner {
        "MasterHub" => MASTER_HUB.to_vec(),
        "HubClient" => vec![
            ("socket_path", RequiredText),
            ("dispatch_queue", Queue),
            ("on_failure", Object),
            ("logger", Object),
            ("ack_timeout", Seconds),
            ("unavailable_error", ErrorClass),
        ],
        "Listener" => LISTENER.to_vec(),
        "FailoverListener" => [LISTENER, &[("socket_path", RequiredText)]].concat(),
        CONFIGURE => MASTER_HUB
            .iter()
            .filter_map(|&(key, kind)| match kind {
                Required | Object | ErrorClass => None,
                RequiredText => Some((key, Text)),
                kind => Some((key, kind)),
            })
            .collect(),
        _ => return None,
    })
}

fn keys(schema: &[(&str, Kind)]) -> String {
    schema
        .iter()
        .map(|(key, _)| format!(":{key}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_owner(ruby: &Ruby, owner: &str) -> Error {
    arg_error(ruby, format!("no options are defined for {owner}"))
}

/// `value` checked against `kind` (returned as the option's value).
fn check(ruby: &Ruby, owner: &str, key: &str, kind: Kind, value: Value) -> Result<Value, Error> {
    let refused = |what: &str| {
        arg_error(
            ruby,
            format!("{owner}: {key} must be {what}, got {}", value.inspect()),
        )
    };
    match kind {
        Required | Object => Ok(value),
        ErrorClass if value.is_nil() || magnus::ExceptionClass::from_value(value).is_some() => {
            Ok(value)
        }
        ErrorClass => Err(refused("an exception class")),
        Queue if value.respond_to("<<", false)? => Ok(value),
        Queue => Err(arg_error(
            ruby,
            format!("{owner}: {key} must respond to <<"),
        )),
        Count => match magnus::Integer::from_value(value).map(|n| n.to_i64()) {
            Some(Ok(n)) if n > 0 => Ok(value),
            _ => Err(refused("a positive Integer")),
        },
        Seconds => match magnus::Float::from_value(value)
            .map(|f| f.to_f64())
            .or_else(|| {
                magnus::Integer::from_value(value)
                    .and_then(|n| n.to_i64().ok())
                    .map(|n| n as f64)
            }) {
            Some(seconds) if seconds > 0.0 && seconds.is_finite() => Ok(ruby.into_value(seconds)),
            _ => Err(refused("a positive number")),
        },
        RequiredText | Text if RString::from_value(value).is_some() => Ok(value),
        RequiredText | Text => Err(Error::new(
            ruby.exception_type_error(),
            format!(
                "{owner}: {key} must be a String, got {}",
                value.class().inspect()
            ),
        )),
    }
}

/// `Pgbus::Hub.options(owner, given)`: the frozen options Hash of a constructor,
/// defaults filled, unknown or missing keywords refused by name, each value checked.
fn resolve(ruby: &Ruby, owner: String, given: RHash) -> Result<RHash, Error> {
    let schema = schema(&owner).ok_or_else(|| unknown_owner(ruby, &owner))?;
    let mut unknown = Vec::new();
    given.foreach(|key: Value, _: Value| {
        let name = magnus::Symbol::from_value(key).map(|s| s.name().map(|n| n.to_string()));
        match name {
            Some(Ok(name)) if schema.iter().any(|(k, _)| *k == name) => {}
            _ => unknown.push(key.inspect()),
        }
        Ok(ForEach::Continue)
    })?;
    if !unknown.is_empty() {
        return Err(arg_error(
            ruby,
            format!(
                "{owner}: unknown option(s) {} (valid: {})",
                unknown.join(", "),
                keys(&schema)
            ),
        ));
    }
    let defaults: RHash = crate::defaults::hash(ruby)?;
    let resolved = ruby.hash_new();
    let mut missing = Vec::new();
    for &(key, kind) in &schema {
        let symbol = ruby.to_symbol(key);
        let value = match given.get(symbol) {
            Some(value) => check(ruby, &owner, key, kind, value)?,
            None if matches!(kind, Required | RequiredText | Queue) => {
                missing.push(format!(":{key}"));
                continue;
            }
            None => defaults
                .get(symbol)
                .unwrap_or_else(|| ruby.qnil().as_value()),
        };
        resolved.aset(symbol, value)?;
    }
    if !missing.is_empty() {
        return Err(arg_error(
            ruby,
            format!("{owner}: missing required option(s) {}", missing.join(", ")),
        ));
    }
    resolved.freeze();
    Ok(resolved)
}

/// `Pgbus::Hub.check_option(owner, key, value)`: one keyword's value, checked
/// as the constructor would (for setters such as Pgbus::Hub.configure's).
fn check_option(
    ruby: &Ruby,
    owner: String,
    key: magnus::Symbol,
    value: Value,
) -> Result<Value, Error> {
    let schema = schema(&owner).ok_or_else(|| unknown_owner(ruby, &owner))?;
    let name = key.name()?;
    let Some(&(_, kind)) = schema.iter().find(|(k, _)| *k == name) else {
        return Err(arg_error(
            ruby,
            format!("{owner}: unknown option :{name} (valid: {})", keys(&schema)),
        ));
    };
    check(ruby, &owner, &name, kind, value)
}

/// A listen scope as given (a Symbol or a String), by name; None for any other kind.
fn scope_name(value: Value) -> Result<Option<String>, Error> {
    if let Some(symbol) = magnus::Symbol::from_value(value) {
        return Ok(Some(symbol.name()?.into_owned()));
    }
    RString::from_value(value)
        .map(|text| text.to_string())
        .transpose()
}

/// The owner named in `Pgbus::Hub.configure`'s errors.
const CONFIGURE: &str = "Pgbus::Hub.configure";

/// `Pgbus::Hub.check_setting(key, value)`: a `Pgbus::Hub.configure` setting
/// checked as it is set (a typo fails the boot, not every worker's first
/// subscription); returns the value to keep.
fn check_setting(ruby: &Ruby, key: magnus::Symbol, value: Value) -> Result<Value, Error> {
    match &*key.name()? {
        "logger" => Ok(value),
        "connection" | "socket_path" if value.is_nil() => Ok(value),
        "connection" => connection(ruby, value).map(|_| value),
        "listen_scope" => match scope_name(value)?.as_deref() {
            Some(name @ ("master" | "process")) => Ok(ruby.to_symbol(name).as_value()),
            _ => Err(arg_error(
                ruby,
                format!(
                    "{CONFIGURE}: listen_scope must be :master or :process, got {}",
                    value.inspect()
                ),
            )),
        },
        _ => check_option(ruby, CONFIGURE.to_owned(), key, value),
    }
}

/// pgbus 0.13.1's hint after a refused `streams_listen_scope`.
const PGBUS_SCOPE_HINT: &str =
    "Must be :master (one shared LISTEN connection per web host) or :process (one per worker)";

/// `Pgbus::Hub.check_pgbus_listen_scope(scope, error_class)`: pgbus 0.13.1's
/// `streams_listen_scope=` check, its exact messages raised as `error_class`
/// (pgbus's ConfigurationError), for a pgbus without the setting.
fn check_pgbus_listen_scope(
    ruby: &Ruby,
    scope: Value,
    error_class: magnus::ExceptionClass,
) -> Result<magnus::Symbol, Error> {
    let Some(name) = scope_name(scope)? else {
        let class = scope.class().inspect();
        let message = format!("Invalid streams_listen_scope type: {class}. {PGBUS_SCOPE_HINT}");
        return Err(Error::new(error_class, message));
    };
    let symbol = ruby.to_symbol(&name);
    if matches!(&*name, "master" | "process") {
        return Ok(symbol);
    }
    let message = format!(
        "Invalid streams_listen_scope: {}. {PGBUS_SCOPE_HINT}",
        symbol.inspect()
    );
    Err(Error::new(error_class, message))
}

/// A native class's `initialize(**options)`: the resolved options in
/// `@options` (frozen; GC-visible, so the Ruby threads' objects stay alive),
/// the creating pid in `@owner_pid` (`threads::stop` joins only there).
pub fn initialize(
    ruby: &Ruby,
    object: impl magnus::Object,
    owner: &str,
    args: &[Value],
) -> Result<(), Error> {
    let given = match args {
        [] => ruby.hash_new(),
        [hash] => RHash::try_convert(*hash)?,
        _ => {
            return Err(arg_error(
                ruby,
                format!("{owner}.new takes keyword options only"),
            ))
        }
    };
    object.ivar_set("@options", resolve(ruby, owner.to_string(), given)?)?;
    object.ivar_set("@owner_pid", pgbus_hub_core::process::current_pid())
}

/// The options `initialize` resolved.
pub fn of(object: impl magnus::Object) -> Result<RHash, Error> {
    object.ivar_get("@options")
}

/// One of the options `initialize` resolved.
pub fn option(ruby: &Ruby, object: impl magnus::Object, key: &str) -> Result<Value, Error> {
    of(object)?.aref(ruby.to_symbol(key))
}

/// A queue name as pgbus passes it (String or Symbol), as text.
pub fn queue_name(queue: Value) -> Result<String, Error> {
    queue.funcall("to_s", ())
}

pub fn init(hub: magnus::RModule) -> Result<(), Error> {
    hub.define_module_function("options", magnus::function!(resolve, 2))?;
    hub.define_module_function("check_option", magnus::function!(check_option, 3))?;
    hub.define_module_function("check_setting", magnus::function!(check_setting, 2))?;
    hub.define_module_function(
        "active_record_connection",
        magnus::function!(active_record_connection, 1),
    )?;
    hub.define_module_function(
        "check_pgbus_listen_scope",
        magnus::function!(check_pgbus_listen_scope, 2),
    )?;
    Ok(())
}
