//! Every Ruby exception class the extension raises, and the one place core
//! errors are converted into them.

use magnus::{prelude::*, value::Lazy, Error, ExceptionClass, RModule, Ruby};
use pgbus_hub_core::protocol::ProtocolError;

/// `Pgbus::Hub`, once `init` defined it.
pub fn hub_module(ruby: &Ruby) -> RModule {
    ruby.class_object()
        .const_get::<_, RModule>("Pgbus")
        .and_then(|pgbus| pgbus.const_get("Hub"))
        .expect("Pgbus::Hub is defined by init before any of its constants is used")
}

/// `Pgbus::Hub::Error < StandardError`: the base of everything we raise.
pub static HUB_ERROR: Lazy<ExceptionClass> = Lazy::new(|ruby| {
    hub_module(ruby)
        .const_get("Error")
        .expect("defined in init")
});

/// `Pgbus::Hub::ProtocolError < Pgbus::Hub::Error`.
pub static PROTOCOL_ERROR: Lazy<ExceptionClass> = Lazy::new(|ruby| {
    hub_module(ruby)
        .const_get("ProtocolError")
        .expect("defined in init")
});

/// `Pgbus::Hub::HubUnavailableError < Pgbus::Hub::Error`.
pub static HUB_UNAVAILABLE: Lazy<ExceptionClass> = Lazy::new(|ruby| {
    hub_module(ruby)
        .const_get("HubUnavailableError")
        .expect("defined in init")
});

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let base = hub.define_error("Error", ruby.exception_standard_error())?;
    hub.define_error("ProtocolError", base)?;
    hub.define_error("HubUnavailableError", base)?;
    Ok(())
}

pub fn unavailable(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.get_inner(&HUB_UNAVAILABLE), message.into())
}

pub fn protocol_error(ruby: &Ruby, error: ProtocolError) -> Error {
    Error::new(ruby.get_inner(&PROTOCOL_ERROR), error.to_string())
}

pub fn type_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_type_error(), message.into())
}

pub fn arg_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.exception_arg_error(), message.into())
}

/// `Pgbus::Hub::Error` with a reason (e.g. the hub could not bind its socket).
pub fn hub_error(ruby: &Ruby, message: impl Into<String>) -> Error {
    Error::new(ruby.get_inner(&HUB_ERROR), message.into())
}

/// A panic caught at the GVL boundary: a bug, reported instead of aborting Ruby.
pub fn panicked(ruby: &Ruby, what: &str) -> Error {
    Error::new(
        ruby.exception_runtime_error(),
        format!("pgbus-hub: internal error in {what} (a bug; please report it)"),
    )
}
