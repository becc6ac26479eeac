//! `Pgbus::Hub::Protocol`: frame encoding and blocking frame reads from any Ruby IO.

use crate::errors::{protocol_error, PROTOCOL_ERROR};
use crate::json::{hash_to_object, object_to_hash};
use magnus::{function, prelude::*, Error, RHash, RModule, RString, Ruby, Value};
use pgbus_hub_core::protocol::{self, HEADER_BYTES, MAX_FRAME_BYTES};

/// `Protocol.encode(hash) -> String` (binary): the whole frame.
fn encode(ruby: &Ruby, hash: RHash) -> Result<RString, Error> {
    let object = hash_to_object(ruby, hash)?;
    let frame = protocol::encode_object(&object).map_err(|e| protocol_error(ruby, e))?;
    Ok(ruby.str_from_slice(&frame))
}

/// `Protocol.read_frame(io) -> Hash | nil`: nil on EOF (clean or mid-frame)
/// and on ECONNRESET; ProtocolError on a bad frame.
fn read_frame(ruby: &Ruby, io: Value) -> Result<Option<RHash>, Error> {
    let Some(header) = read_exactly(ruby, io, HEADER_BYTES)? else {
        return Ok(None);
    };
    let header: [u8; HEADER_BYTES] = header
        .try_into()
        .expect("read_exactly returns exactly n bytes");
    let length = protocol::body_length(header).map_err(|e| protocol_error(ruby, e))?;
    let Some(body) = read_exactly(ruby, io, length)? else {
        return Ok(None);
    };
    let object = protocol::decode_body(&body).map_err(|e| protocol_error(ruby, e))?;
    object_to_hash(ruby, object).map(Some)
}

/// `io.read(count)`, with a short or nil result (EOF) and ECONNRESET as `None`.
fn read_exactly(ruby: &Ruby, io: Value, count: usize) -> Result<Option<Vec<u8>>, Error> {
    let data: Option<RString> = match io.funcall("read", (count,)) {
        Ok(data) => data,
        Err(e)
            if e.is_kind_of(
                ruby.module_errno()
                    .const_get::<_, magnus::ExceptionClass>("ECONNRESET")?,
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    // SAFETY: copied at once, before any other Ruby call.
    let bytes = data.map(|s| unsafe { s.as_slice() }.to_vec());
    Ok(bytes.filter(|b| b.len() == count))
}

pub fn init(ruby: &Ruby, hub: RModule) -> Result<(), Error> {
    let module = hub.define_module("Protocol")?;
    module.define_module_function("encode", function!(encode, 1))?;
    module.define_module_function("read_frame", function!(read_frame, 1))?;
    module.const_set("MAX_FRAME_BYTES", MAX_FRAME_BYTES)?;
    module.const_set("HEADER_BYTES", HEADER_BYTES)?;
    module.const_set("ProtocolError", ruby.get_inner(&PROTOCOL_ERROR))?;
    Ok(())
}
