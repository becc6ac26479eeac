//! `Pgbus::Hub::Events`: this process's native events (`pgbus_hub_core::events`)
//! for the Ruby thread that publishes them (lib/pgbus/hub/events.rb). Native
//! threads only queue them; `next_event` waits for one without the GVL.

use crate::errors::panicked;
use crate::nogvl::nogvl;
use magnus::{function, prelude::*, Error, RArray, RHash, RModule, Ruby, Value};
use pgbus_hub_core::events::{self, Field};
use std::time::Duration;

/// The suffix of every event's name (ActiveSupport's `name.library` convention).
const SUFFIX: &str = ".pgbus_hub";

fn field(ruby: &Ruby, field: Field) -> Value {
    match field {
        Field::Word(word) => ruby.to_symbol(word).as_value(),
        Field::Text(text) => ruby.str_new(&text).as_value(),
        Field::Int(n) => ruby.integer_from_i64(n).as_value(),
        Field::Seconds(s) => ruby.float_from_f64(s).as_value(),
        Field::Flag(flag) => ruby.into_value(flag),
        Field::Nil => ruby.qnil().as_value(),
    }
}

/// `Events.next_event(timeout)`: `[name, payload]` (payload: Symbol keys),
/// or nil after `timeout` seconds, an `interrupt`, Thread#kill / #raise, or
/// with events off.
fn next_event(ruby: &Ruby, timeout: f64) -> Result<Option<RArray>, Error> {
    let timeout = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
    let event = nogvl(|| events::next(timeout), events::interrupt)
        .ok_or_else(|| panicked(ruby, "Pgbus::Hub::Events.next_event"))?;
    let Some(event) = event else {
        return Ok(None);
    };
    let payload = ruby.hash_new();
    for (key, value) in event.fields() {
        payload.aset(ruby.to_symbol(key), field(ruby, value))?;
    }
    let name = format!("{}{SUFFIX}", event.name());
    Ok(Some(ruby.ary_new_from_values(&[
        ruby.str_new(&name).as_value(),
        payload.as_value(),
    ])))
}

/// `Events.stats`: `{enabled:, queued:, dropped:}`.
fn stats(ruby: &Ruby) -> Result<RHash, Error> {
    let stats = events::stats();
    let hash = ruby.hash_new();
    hash.aset(ruby.to_symbol("enabled"), events::enabled())?;
    hash.aset(ruby.to_symbol("queued"), stats.queued)?;
    hash.aset(ruby.to_symbol("dropped"), stats.dropped)?;
    Ok(hash)
}

pub fn init(hub: RModule) -> Result<(), Error> {
    let module = hub.define_module("Events")?;
    module.define_module_function("enable", function!(events::enable, 0))?;
    module.define_module_function("disable", function!(events::disable, 0))?;
    module.define_module_function("enabled?", function!(events::enabled, 0))?;
    module.define_module_function("next_event", function!(next_event, 1))?;
    module.define_module_function("interrupt", function!(events::interrupt, 0))?;
    module.define_module_function("stats", function!(stats, 0))?;
    Ok(())
}
