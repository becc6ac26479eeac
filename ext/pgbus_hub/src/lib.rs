//! Ruby binding for pgbus-hub-core. Converts between Ruby and the core; no logic of its own.
//!
//! One file per Ruby class (each ends in an `init`); errors become Ruby
//! exceptions in `errors` only; Ruby <-> JSON conversion lives in `json`.

mod errors;
mod json;
mod protocol;

use magnus::{prelude::*, Error, Ruby};

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    let hub = ruby.define_module("Pgbus")?.define_module("Hub")?;
    errors::init(ruby, hub)?;
    protocol::init(ruby, hub)?;
    Ok(())
}
