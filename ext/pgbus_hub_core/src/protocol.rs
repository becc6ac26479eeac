//! The hub wire format, byte-compatible with pgbus 0.13.1's `HubProtocol`.
//!
//! A frame is a 4-byte big-endian body length followed by a UTF-8 JSON object.
//! The body is at most [`MAX_FRAME_BYTES`]. A short read is never a frame: the
//! [`Decoder`] keeps partial bytes until the rest arrives, and a stream that
//! ends mid-frame is end-of-stream, not a truncated message.

use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt;

/// The length prefix: 4 bytes, big-endian (Ruby's `pack("N")`).
pub const HEADER_BYTES: usize = 4;

/// Largest body accepted or produced. The reference's ceiling, sized for
/// ephemeral HTML payloads; a larger announcement is a corrupt stream or a
/// runaway producer, and is rejected before anything is allocated for it.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Ruby's `JSON.parse`/`JSON.generate` refuse documents nested deeper than
/// 100 (`max_nesting`); we refuse the same documents so both peers agree.
pub const MAX_NESTING: usize = 100;

/// Our extension: `{"t":"stats"}` asks the master hub for its counters; it
/// answers `{"t":"stats","stats":{...}}`. pgbus's peers never send it and
/// treat the answer as an unknown frame, so it decodes as [`Message::Unknown`].
pub const STATS_KIND: &str = "stats";

/// A decoded frame: a JSON object, key order preserved.
pub type Object = Map<String, Value>;

/// Every way a frame can be bad. `Display` uses the reference's wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The announced (decoding) or actual (encoding) body length exceeds the cap.
    FrameTooLarge(usize),
    /// The body is not valid UTF-8.
    InvalidUtf8,
    /// The body is not JSON, is empty, or is nested too deeply.
    Malformed(String),
    /// The body is JSON but not an object; carries the Ruby class name it
    /// would have decoded to ("Array", "String", "NilClass", ...).
    NotAnObject(&'static str),
    /// A known message kind is missing a field or has one of the wrong type.
    BadField { kind: String, field: &'static str },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FrameTooLarge(n) => {
                write!(f, "frame too large: {n} bytes (max {MAX_FRAME_BYTES})")
            }
            Self::InvalidUtf8 => f.write_str("malformed frame: invalid UTF-8"),
            Self::Malformed(why) => write!(f, "malformed frame: {why}"),
            Self::NotAnObject(class) => {
                write!(f, "malformed frame: expected a JSON object, got {class}")
            }
            Self::BadField { kind, field } => {
                write!(f, "malformed frame: {kind:?} needs a string {field:?}")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// The messages pgbus's peers exchange ("t" is the discriminator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// worker → hub: subscribe to queue `q`; the hub answers with `Ack`.
    Sub(String),
    /// worker → hub: unsubscribe, fire-and-forget.
    Unsub(String),
    /// hub → worker: the LISTEN for `q` is active.
    Ack(String),
    /// hub → worker: a NOTIFY for queue `q`; `None` = durable, `Some` = ephemeral payload.
    Wake {
        queue: String,
        payload: Option<String>,
    },
    /// hub → worker: the hub's PostgreSQL listener health.
    Status { healthy: bool },
    /// hub → worker, our extension: the hub refuses to LISTEN for `queue`
    /// (empty name, channel over PostgreSQL's 63-byte limit). pgbus's Ruby
    /// client logs it as an unknown frame and times out, as it would anyway.
    Nack { queue: String, reason: String },
    /// Any other "t" (or none): decodes fine; receivers log and ignore it.
    Unknown(Object),
}

/// Field order matters: it is the reference encoder's (Ruby Hash insertion) order.
#[derive(Serialize)]
#[serde(tag = "t", rename_all = "lowercase")]
enum Wire<'a> {
    Sub { q: &'a str },
    Unsub { q: &'a str },
    Ack { q: &'a str },
    Wake { q: &'a str, p: Option<&'a str> },
    Status { healthy: bool },
    Nack { q: &'a str, reason: &'a str },
}

impl Message {
    /// The "t" discriminator ("unknown" for anything else): for logs, never the payload.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sub(_) => "sub",
            Self::Unsub(_) => "unsub",
            Self::Ack(_) => "ack",
            Self::Wake { .. } => "wake",
            Self::Status { .. } => "status",
            Self::Nack { .. } => "nack",
            Self::Unknown(_) => "unknown",
        }
    }

    /// The whole frame (header + body) for this message.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let wire = match self {
            Self::Sub(q) => Wire::Sub { q },
            Self::Unsub(q) => Wire::Unsub { q },
            Self::Ack(q) => Wire::Ack { q },
            Self::Wake { queue, payload } => Wire::Wake {
                q: queue,
                p: payload.as_deref(),
            },
            Self::Status { healthy } => Wire::Status { healthy: *healthy },
            Self::Nack { queue, reason } => Wire::Nack { q: queue, reason },
            Self::Unknown(object) => return encode_object(object),
        };
        frame_with(|body| serde_json::to_writer(body, &wire))
    }

    /// Interprets a decoded object. Known kinds with missing or mistyped
    /// fields are errors; an unknown or absent "t" is `Unknown`.
    pub fn from_object(object: Object) -> Result<Self, ProtocolError> {
        let kind = match object.get("t") {
            Some(Value::String(kind)) => kind.as_str(),
            _ => return Ok(Self::Unknown(object)),
        };
        let queue = || -> Result<String, ProtocolError> {
            match object.get("q") {
                Some(Value::String(q)) => Ok(q.clone()),
                _ => Err(ProtocolError::BadField {
                    kind: kind.to_owned(),
                    field: "q",
                }),
            }
        };
        Ok(match kind {
            "sub" => Self::Sub(queue()?),
            "unsub" => Self::Unsub(queue()?),
            "ack" => Self::Ack(queue()?),
            "wake" => {
                let payload = match object.get("p") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(p)) => Some(p.clone()),
                    Some(_) => {
                        return Err(ProtocolError::BadField {
                            kind: "wake".into(),
                            field: "p",
                        })
                    }
                };
                Self::Wake {
                    queue: queue()?,
                    payload,
                }
            }
            "nack" => match object.get("reason") {
                Some(Value::String(reason)) => Self::Nack {
                    queue: queue()?,
                    reason: reason.clone(),
                },
                _ => {
                    return Err(ProtocolError::BadField {
                        kind: "nack".into(),
                        field: "reason",
                    })
                }
            },
            "status" => match object.get("healthy") {
                Some(Value::Bool(healthy)) => Self::Status { healthy: *healthy },
                _ => {
                    return Err(ProtocolError::BadField {
                        kind: "status".into(),
                        field: "healthy",
                    })
                }
            },
            _ => Self::Unknown(object),
        })
    }
}

/// Encodes any JSON object as a frame (what Ruby's `HubProtocol.encode` does).
pub fn encode_object(object: &Object) -> Result<Vec<u8>, ProtocolError> {
    let depth = object_nesting(object);
    if depth > MAX_NESTING {
        return Err(ProtocolError::Malformed(format!(
            "nesting of {depth} is too deep"
        )));
    }
    frame_with(|body| serde_json::to_writer(body, object))
}

/// Reserves the header, lets `write_body` append the JSON, then fills the length in.
fn frame_with(
    write_body: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
) -> Result<Vec<u8>, ProtocolError> {
    let mut frame = vec![0u8; HEADER_BYTES];
    write_body(&mut frame).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let body_len = frame.len() - HEADER_BYTES;
    if body_len > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(body_len));
    }
    frame[..HEADER_BYTES].copy_from_slice(&(body_len as u32).to_be_bytes());
    Ok(frame)
}

/// Reads the body length from a header; rejects an over-cap announcement
/// before the caller allocates or waits for the body.
pub fn body_length(header: [u8; HEADER_BYTES]) -> Result<usize, ProtocolError> {
    let length = u32::from_be_bytes(header) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(length));
    }
    Ok(length)
}

/// Decodes one complete body (the bytes after the header).
pub fn decode_body(body: &[u8]) -> Result<Object, ProtocolError> {
    let text = std::str::from_utf8(body).map_err(|_| ProtocolError::InvalidUtf8)?;
    if text.is_empty() {
        // The reference hands "" to JSON.parse, which raises: an empty body is an error.
        return Err(ProtocolError::Malformed("empty frame body".into()));
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let depth = nesting(&value);
    if depth > MAX_NESTING {
        return Err(ProtocolError::Malformed(format!(
            "nesting of {depth} is too deep"
        )));
    }
    match value {
        Value::Object(object) => Ok(object),
        other => Err(ProtocolError::NotAnObject(ruby_class_name(&other))),
    }
}

/// Depth as Ruby's JSON counts it: each array or object adds one level.
fn nesting(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
        Value::Object(fields) => object_nesting(fields),
        _ => 0,
    }
}

fn object_nesting(fields: &Object) -> usize {
    1 + fields.values().map(nesting).max().unwrap_or(0)
}

fn ruby_class_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NilClass",
        Value::Bool(true) => "TrueClass",
        Value::Bool(false) => "FalseClass",
        Value::Number(n) if n.is_f64() => "Float",
        Value::Number(_) => "Integer",
        Value::String(_) => "String",
        Value::Array(_) => "Array",
        Value::Object(_) => "Hash",
    }
}

/// Incremental decoder: feed it whatever a read returned, take complete frames out.
///
/// After an error the stream is unusable (framing is lost); callers close the peer.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: Vec<u8>,
    /// Bytes before `start` were consumed; compacted lazily to keep feeding O(n).
    start: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes. Nothing is decoded until `next_frame`.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Object>, ProtocolError> {
        let pending = &self.buffer[self.start..];
        let Some(header) = pending.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        let length = body_length(header.try_into().expect("slice of HEADER_BYTES"))?;
        let Some(body) = pending.get(HEADER_BYTES..HEADER_BYTES + length) else {
            return Ok(None);
        };
        let object = decode_body(body)?;
        self.start += HEADER_BYTES + length;
        Ok(Some(object))
    }

    /// True when bytes of an unfinished frame are buffered (EOF now = peer died mid-frame).
    pub fn has_partial_frame(&self) -> bool {
        self.start < self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_cap_announcement_fails_on_the_header_alone() {
        let mut decoder = Decoder::new();
        decoder.feed(&[0x00, 0x40, 0x00, 0x01]);
        assert_eq!(
            decoder.next_frame(),
            Err(ProtocolError::FrameTooLarge(MAX_FRAME_BYTES + 1))
        );
    }

    #[test]
    fn message_round_trips_through_its_frame() {
        let message = Message::Wake {
            queue: "q".into(),
            payload: None,
        };
        let mut decoder = Decoder::new();
        decoder.feed(&message.encode().unwrap());
        let object = decoder.next_frame().unwrap().unwrap();
        assert_eq!(Message::from_object(object).unwrap(), message);
        assert!(!decoder.has_partial_frame());
    }

    #[test]
    fn known_kind_with_a_missing_queue_is_an_error() {
        let object = decode_body(br#"{"t":"sub"}"#).unwrap();
        assert!(matches!(
            Message::from_object(object),
            Err(ProtocolError::BadField { .. })
        ));
    }

    #[test]
    fn nesting_past_rubys_limit_is_rejected_both_ways() {
        let deep = format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        let body = format!(r#"{{"t":"x","d":{deep}}}"#);
        assert!(matches!(
            decode_body(body.as_bytes()),
            Err(ProtocolError::Malformed(_))
        ));
        let ok = format!(r#"{{"t":"x","d":{}{}}}"#, "[".repeat(99), "]".repeat(99));
        let object = decode_body(ok.as_bytes()).unwrap();
        assert!(encode_object(&object).is_ok());
        let object = serde_json::from_str::<Object>(&body).unwrap();
        assert!(encode_object(&object).is_err());
    }
}
