//! Every Ruby exception class the extension raises, and the one place core
//! errors are converted into them.

use magnus::{prelude::*, value::Lazy, Error, ExceptionClass, RModule, Ruby};
use pgbus_hub_core::protocol::ProtocolError;

fn hub_module(ruby: &Ruby) -> RModule {
    ruby.class_object()
        .const_get::<_, RModule>("Pgbus")
        .and_then(|pgbus| pgbus.const_get("Hub"))
        .expect("Pgbus::Hub is defined by init before any error class is used")
}

/// `Pgbus::Hub::ProtocolError < Pgbus::Hub::Error`.
pub static PROTOCOL_ERROR: Lazy<ExceptionClass> = Lazy::new(|ruby| {
    hub_module(ruby)
        .const_get("ProtocolError")
        .expect("defined in init")
});

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let base = hub.define_error("Error", ruby.exception_standard_error())?;
    hub.define_error("ProtocolError", base)?;
    Ok(())
}

pub fn protocol_error(ruby: &Ruby, error: ProtocolError) -> Error {
    Error::new(ruby.get_inner(&PROTOCOL_ERROR), error.to_string())
}

pub fn type_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_type_error(), message.into())
}
