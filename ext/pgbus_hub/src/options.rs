//! Ruby option values -> core configuration: each constructor's keywords
//! (resolved, checked, defaults filled from `Pgbus::Hub::DEFAULTS`), parsed
//! once, in `initialize`, into the typed struct its object keeps: settings
//! as Rust values, the Ruby objects it hands output to in [`Targets`]
//! (marked by the object, so the GC sees them).

use crate::errors::arg_error;
use crate::pump::{Outputs, Targets};
use magnus::{prelude::*, r_hash::ForEach, Error, RClass, RHash, RString, Ruby, TryConvert, Value};
use pgbus_hub_core::conninfo::ConnectionOptions;
use pgbus_hub_core::hub::metrics::MetricsConfig;
use pgbus_hub_core::hub::HubConfig;
use pgbus_hub_core::listener::ListenerConfig;
use pgbus_hub_core::log::LogSink;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// One entry of a constructor's resolved keywords (Symbol keys; present:
/// `resolve` refused a missing required one and filled the defaults).
fn get<T: TryConvert>(ruby: &Ruby, resolved: RHash, key: &str) -> Result<T, Error> {
    match resolved.get(ruby.to_symbol(key)) {
        Some(value) => T::try_convert(value),
        None => Err(arg_error(ruby, format!("missing option {key}"))),
    }
}

fn seconds(ruby: &Ruby, resolved: RHash, key: &str) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(get(ruby, resolved, key)?)
        .map_err(|_| arg_error(ruby, format!("{key} must be a positive number of seconds")))
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
    /// A TCP port (0: any free one), or nil for none.
    Port,
    /// true or false (nothing else: a typo such as "false" would read as true).
    Flag,
}

use Kind::{Count, Flag, Object, Port, Queue, Required, RequiredText, Seconds, Text};

const MASTER_HUB: &[(&str, Kind)] = &[
    ("connection", Required),
    ("socket_path", RequiredText),
    ("logger", Object),
    ("log_file", Object),
    ("health_check_ms", Count),
    ("status_interval", Seconds),
    ("durable_queue_limit", Count),
    ("hard_queue_limit", Count),
    ("max_channels_per_connection", Count),
    ("max_channels", Count),
    ("channel_prefix", Text),
    ("channel_suffix", Text),
    ("standby", Flag),
    ("metrics_port", Port),
    ("metrics_bind", Text),
];

const LISTENER: &[(&str, Kind)] = &[
    ("connection", Required),
    ("dispatch_queue", Queue),
    ("logger", Object),
    ("on_listening", Object),
    ("wake_message", Object),
    ("health_check_ms", Count),
    ("channel_prefix", Text),
    ("channel_suffix", Text),
    ("standby", Flag),
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
        ],
        "Listener" => LISTENER.to_vec(),
        "FailoverListener" => [LISTENER, &[("socket_path", RequiredText)]].concat(),
        CONFIGURE => MASTER_HUB
            .iter()
            .filter_map(|&(key, kind)| match kind {
                Required | Object => None,
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
        Port if value.is_nil() => Ok(value),
        Port => match magnus::Integer::from_value(value).map(|n| n.to_u16()) {
            Some(Ok(_)) => Ok(value),
            _ => Err(refused(
                "a port (an Integer, 0 to 65535; 0: any free one) or nil",
            )),
        },
        Flag if value.is_kind_of(ruby.class_true_class())
            || value.is_kind_of(ruby.class_false_class()) =>
        {
            Ok(value)
        }
        Flag => Err(refused("true or false")),
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

/// The libpq keywords an ActiveRecord configuration passes on to the hub, by
/// their libpq names (docs/configuration.md, "Connection options").
const ACTIVE_RECORD_LIBPQ_KEYS: [&str; 9] = [
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

/// `Pgbus::Hub.active_record_connection(config)`: the connection for an
/// ActiveRecord database configuration: its url, else its libpq keywords
/// (database and username as dbname and user; values as Strings but
/// `variables`); adapter-only keys (pool, encoding, ...) and nils left out.
fn active_record_connection(ruby: &Ruby, config: RHash) -> Result<Value, Error> {
    let url = [
        ruby.to_symbol("url").as_value(),
        ruby.str_new("url").as_value(),
    ]
    .into_iter()
    .find_map(|key| config.get(key).filter(|url| !url.is_nil()));
    if let Some(url) = url {
        return Ok(url);
    }
    let libpq = ruby.hash_new();
    config.foreach(|key: Value, value: Value| {
        let key: String = key.funcall("to_s", ())?;
        let key = match key.as_str() {
            "database" => "dbname",
            "username" => "user",
            other => other,
        };
        if !value.is_nil() && ACTIVE_RECORD_LIBPQ_KEYS.contains(&key) {
            let value = if key == "variables" {
                value
            } else {
                value.funcall("to_s", ())?
            };
            libpq.aset(ruby.to_symbol(key), value)?;
        }
        Ok(ForEach::Continue)
    })?;
    Ok(libpq.as_value())
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

/// A native class's `initialize(**options)`: its keywords checked (see
/// `resolve`), parsed once into the typed options `cell` keeps (a second
/// `initialize` is refused), and `outputs` aimed at the Ruby objects among them.
pub fn initialize<T>(
    ruby: &Ruby,
    class: &str,
    args: &[Value],
    cell: &OnceLock<T>,
    outputs: &Outputs,
    parse: impl FnOnce(&Ruby, RHash) -> Result<T, Error>,
) -> Result<(), Error> {
    let given = match args {
        [] => ruby.hash_new(),
        [hash] => RHash::try_convert(*hash)?,
        _ => {
            return Err(arg_error(
                ruby,
                format!("{class}.new takes keyword options only"),
            ))
        }
    };
    let resolved = resolve(ruby, class.to_string(), given)?;
    let wake_message = resolved.get(ruby.to_symbol("wake_message"));
    if wake_message.is_some_and(|given| given.to_bool() && RClass::from_value(given).is_none()) {
        let why = "wake_message must be a class (built with queue_name: and payload: keywords)";
        return Err(arg_error(ruby, why));
    }
    cell.set(parse(ruby, resolved)?)
        .map_err(|_| arg_error(ruby, format!("{class} is already initialized")))?;
    outputs.aim(Targets::parse(ruby, resolved));
    Ok(())
}

/// What `initialize` parsed; an error for an object it never ran on
/// (`allocate` without `new`).
pub fn kept<'a, T>(ruby: &Ruby, cell: &'a OnceLock<T>, owner: &str) -> Result<&'a T, Error> {
    cell.get()
        .ok_or_else(|| arg_error(ruby, format!("{owner} was never initialized")))
}

/// A listener's settings (MasterHub's, FailoverListener's, Listener's).
pub struct ListenerOptions {
    connection: ConnectionOptions,
    health_check: Duration,
    channel_prefix: String,
    channel_suffix: String,
    standby: bool,
}

impl ListenerOptions {
    fn parse(ruby: &Ruby, resolved: RHash) -> Result<Self, Error> {
        let health_check_ms: u64 = get(ruby, resolved, "health_check_ms")?;
        Ok(Self {
            connection: connection(ruby, get(ruby, resolved, "connection")?)?,
            health_check: Duration::from_millis(health_check_ms),
            channel_prefix: get(ruby, resolved, "channel_prefix")?,
            channel_suffix: get(ruby, resolved, "channel_suffix")?,
            standby: get(ruby, resolved, "standby")?,
        })
    }

    pub fn config(&self, log: LogSink) -> ListenerConfig {
        ListenerConfig {
            connection: self.connection.clone(),
            health_check: self.health_check,
            channel_prefix: self.channel_prefix.clone(),
            channel_suffix: self.channel_suffix.clone(),
            standby: self.standby,
            log,
        }
    }
}

pub struct MasterHubOptions {
    listener: ListenerOptions,
    pub socket_path: String,
    /// `log_file:`: the hub writes its log itself, to this file ("-": standard
    /// output; `pgbus-hub serve`), instead of handing it to `logger:`.
    pub log_file: Option<String>,
    status_interval: Duration,
    durable_queue_limit: usize,
    hard_queue_limit: usize,
    max_channels_per_connection: usize,
    max_channels: usize,
    /// `metrics_port:` / `metrics_bind:` (no port: no endpoint).
    metrics: Option<MetricsConfig>,
}

impl MasterHubOptions {
    pub fn parse(ruby: &Ruby, resolved: RHash) -> Result<Self, Error> {
        Ok(Self {
            listener: ListenerOptions::parse(ruby, resolved)?,
            socket_path: get(ruby, resolved, "socket_path")?,
            log_file: log_file(ruby, resolved)?,
            status_interval: seconds(ruby, resolved, "status_interval")?,
            durable_queue_limit: get(ruby, resolved, "durable_queue_limit")?,
            hard_queue_limit: get(ruby, resolved, "hard_queue_limit")?,
            max_channels_per_connection: get(ruby, resolved, "max_channels_per_connection")?,
            max_channels: get(ruby, resolved, "max_channels")?,
            metrics: get::<Option<u16>>(ruby, resolved, "metrics_port")?
                .map(|port| {
                    get(ruby, resolved, "metrics_bind").map(|bind| MetricsConfig { bind, port })
                })
                .transpose()?,
        })
    }

    pub fn config(&self, log: LogSink) -> HubConfig {
        HubConfig {
            listener: self.listener.config(log),
            socket_path: PathBuf::from(&self.socket_path),
            status_interval: self.status_interval,
            durable_queue_limit: self.durable_queue_limit,
            hard_queue_limit: self.hard_queue_limit,
            max_channels_per_connection: self.max_channels_per_connection,
            max_channels: self.max_channels,
            metrics: self.metrics.clone(),
        }
    }
}

/// `log_file:` (a String, or nil), refused beside a `logger:` (which would get nothing).
fn log_file(ruby: &Ruby, resolved: RHash) -> Result<Option<String>, Error> {
    let log_file: Option<Value> = resolved.lookup(ruby.to_symbol("log_file"))?;
    let Some(log_file) = log_file.filter(|value| !value.is_nil()) else {
        return Ok(None);
    };
    let logger: Option<Value> = resolved.lookup(ruby.to_symbol("logger"))?;
    if logger.is_some_and(|logger| !logger.is_nil()) {
        return Err(arg_error(
            ruby,
            "MasterHub: give logger: or log_file:, not both",
        ));
    }
    match RString::from_value(log_file) {
        Some(path) => Ok(Some(path.to_string()?)),
        None => Err(Error::new(
            ruby.exception_type_error(),
            format!("MasterHub: log_file must be a String (a path, or \"-\" for standard output), got {}", log_file.class().inspect()),
        )),
    }
}

pub struct HubClientOptions {
    pub socket_path: String,
    pub ack_timeout: Duration,
}

impl HubClientOptions {
    pub fn parse(ruby: &Ruby, resolved: RHash) -> Result<Self, Error> {
        Ok(Self {
            socket_path: get(ruby, resolved, "socket_path")?,
            ack_timeout: seconds(ruby, resolved, "ack_timeout")?,
        })
    }
}

/// FailoverListener's (a hub to try at `socket_path`) and Listener's (none).
pub struct FailoverListenerOptions {
    pub listener: ListenerOptions,
    pub socket_path: Option<String>,
}

impl FailoverListenerOptions {
    pub fn parse(ruby: &Ruby, resolved: RHash) -> Result<Self, Error> {
        Ok(Self {
            listener: ListenerOptions::parse(ruby, resolved)?,
            socket_path: resolved.lookup(ruby.to_symbol("socket_path"))?,
        })
    }
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
    Ok(())
}
