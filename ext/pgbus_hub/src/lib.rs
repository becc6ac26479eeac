//! Ruby binding for pgbus-hub-core. Converts between Ruby and the core (an
//! ActiveRecord configuration into a connection too); no logic of its own
//! (which listener a worker gets and pgbus's scope check are Ruby glue in `lib/`).
//!
//! One file per Ruby class (each ends in an `init`); each class's keywords
//! are checked and parsed once into its typed options (`options`); errors
//! become Ruby exceptions in `errors` only; Ruby <-> JSON conversion lives in `json`.

mod defaults;
mod errors;
mod events;
mod failover_listener;
mod hub_client;
mod json;
mod logs;
mod master_hub;
mod nogvl;
mod options;
mod protocol;
mod pump;
mod threads;

use magnus::{function, prelude::*, Error, Ruby, Value};

/// `Pgbus::Hub.check_connection(value)`: the connection as the hub would use
/// it (password hidden), or the ArgumentError/TypeError the hub would raise,
/// so a configuration is refused where it is written, not at the first LISTEN.
fn check_connection(ruby: &Ruby, value: Value) -> Result<String, Error> {
    Ok(options::connection(ruby, value)?.to_string())
}

/// `Pgbus::Hub.database_of(connection)`: the server(s) and database a
/// connection reaches, libpq's defaults applied, to compare two configurations.
fn database_of(ruby: &Ruby, value: Value) -> Result<String, Error> {
    Ok(options::connection(ruby, value)?.database())
}

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let hub = ruby.define_module("Pgbus")?.define_module("Hub")?;
    errors::init(ruby, hub)?;
    defaults::init(ruby, hub)?;
    options::init(hub)?;
    protocol::init(ruby, hub)?;
    pump::init(ruby, hub)?;
    master_hub::init(ruby, hub)?;
    hub_client::init(ruby, hub)?;
    failover_listener::init(ruby, hub)?;
    events::init(hub)?;
    hub.define_module_function("check_connection", function!(check_connection, 1))?;
    hub.define_module_function("database_of", function!(database_of, 1))?;
    Ok(())
}
