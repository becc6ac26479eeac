//! The hub wire format, byte-compatible with pgbus 0.13.1's `HubProtocol`.
//!
//! A frame is a 4-byte big-endian body length followed by a UTF-8 JSON object.
//! The body is at most [`MAX_FRAME_BYTES`]. A short read is never a frame: the
//! [`Decoder`] keeps partial bytes until the rest arrives, and a stream that
//! ends mid-frame is end-of-stream, not a truncated message.
//!
//! Our extensions for planned events (docs/architecture.md, "Planned events"):
//! `move`, `marker` and `replace` ([`Move`], [`Marker`], [`Replace`]). pgbus's
//! Ruby peers, and pgbus-hub before them, decode them as unknown kinds (logged,
//! ignored). Their strings are decoded as they are: whether a `marker` may be
//! committed (a `pgbus_hub.handover.*` channel, a `move.` token of at most 100
//! bytes) is checked in one place, where a cut is made
//! ([`crate::listener::Cut::new`]), so a refused request is answered without
//! closing the peer's connection, and nothing reaches a NOTIFY unchecked.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

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

/// Our extension for raw channels (ActionCable's, any app's): a subscription
/// names either a pgbus queue (LISTENed as prefix + queue + suffix, pgbus's
/// frames) or a channel LISTENed verbatim (`listen`/`unlisten`/`notify`
/// frames, and `ack`/`nack` with `"c"` instead of `"q"`). pgbus's peers never
/// send these, so they never receive them. Inside the crate both are one
/// string key, the routing table's: a channel's key is its name after this
/// mark, which no LISTENable name contains (NUL is refused).
const CHANNEL_KEY_MARK: char = '\0';

/// A raw channel's NOTIFY payload that stands for a larger one (PostgreSQL
/// refuses payloads of 8000 bytes or more): this mark, then the id of a row
/// of [`LARGE_PAYLOAD_TABLE`] holding the payload. The listener reads the row
/// once and delivers its payload in the NOTIFY's place. A real broadcast never
/// starts with it: U+0001 appears escaped, never raw, in JSON text.
pub const LARGE_PAYLOAD_MARK: &str = "\u{1}pgbus-hub:";

/// Where broadcasters store payloads too large for NOTIFY (created by the
/// first large broadcast, rows removed after a bounded time by the broadcasters).
pub const LARGE_PAYLOAD_TABLE: &str = "pgbus_hub_large_payloads";

/// PostgreSQL refuses a NOTIFY payload of this many bytes or more: a
/// broadcaster stores such a payload in [`LARGE_PAYLOAD_TABLE`] instead.
pub const NOTIFY_PAYLOAD_LIMIT: usize = 8000;

/// How long a large payload's row stays. A listener reads it when the NOTIFY
/// arrives, in commit order, moments after the broadcast; a listener minutes
/// behind has failed its health check and reconnected, losing that NOTIFY
/// anyway. Five minutes also covers a broadcast made inside a transaction
/// that commits minutes later (created_at is the insert time), while the
/// table holds only five minutes of large broadcasts.
const LARGE_PAYLOAD_RETENTION: &str = "5 minutes";

/// The table's definition, for broadcasters to create it on first use
/// (IF NOT EXISTS: one statement, any number of processes).
pub fn large_payload_ddl() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {LARGE_PAYLOAD_TABLE} (id bigserial PRIMARY KEY, \
         payload text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    )
}

/// A broadcaster's one statement for a large payload (`$1`): removes the
/// rows past the retention and stores this one, returning its id (what
/// follows [`LARGE_PAYLOAD_MARK`] in the NOTIFY).
pub fn large_payload_insert() -> String {
    format!(
        "WITH expired AS (DELETE FROM {LARGE_PAYLOAD_TABLE} \
         WHERE created_at < now() - interval '{LARGE_PAYLOAD_RETENTION}') \
         INSERT INTO {LARGE_PAYLOAD_TABLE} (payload, created_at) VALUES ($1, clock_timestamp()) RETURNING id"
    )
}

/// The routing key of raw channel `channel`.
pub fn channel_key(channel: &str) -> String {
    format!("{CHANNEL_KEY_MARK}{channel}")
}

/// The raw channel a routing key names, if it names one (else it is a queue).
pub fn key_channel(key: &str) -> Option<&str> {
    key.strip_prefix(CHANNEL_KEY_MARK)
}

/// A decoded frame: a JSON object, key order preserved.
pub type Object = Map<String, Value>;

/// An encoded frame (header + body), shared: the hub encodes a wake once and
/// every worker's writer sends these same bytes (a refcount, never a copy).
pub type Frame = bytes::Bytes;

/// The one wake type, from the NOTIFY to the embedding runtime: the listener
/// makes it, the hub encodes it once, the client decodes it, the pump hands
/// it to Ruby. Cloning it never copies the queue name or the payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wake {
    pub queue: Arc<str>,
    /// None = durable (an empty NOTIFY payload), Some = ephemeral payload.
    pub payload: Option<Arc<str>>,
}

impl Wake {
    pub fn new(queue: impl Into<Arc<str>>, payload: Option<impl Into<Arc<str>>>) -> Self {
        Self {
            queue: queue.into(),
            payload: payload.map(Into::into),
        }
    }

    /// A durable wake (no payload): durable streams re-read their queue.
    pub fn durable(queue: impl Into<Arc<str>>) -> Self {
        Self {
            queue: queue.into(),
            payload: None,
        }
    }

    /// Durable wakes may be dropped under backpressure (the stream re-reads);
    /// an ephemeral one (and every raw channel's, which always carries its
    /// payload) is the only copy of its payload and never is.
    pub fn is_droppable(&self) -> bool {
        self.payload.is_none()
    }

    /// The whole frame, encoded once and shareable.
    pub fn encode(&self) -> Result<Frame, ProtocolError> {
        let wire = match key_channel(&self.queue) {
            Some(c) => Wire::Notify {
                c,
                p: self.payload.as_deref().unwrap_or_default(),
            },
            None => Wire::Wake {
                q: &self.queue,
                p: self.payload.as_deref(),
            },
        };
        frame_with(|body| serde_json::to_writer(body, &wire)).map(Frame::from)
    }
}

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
    /// A known message kind is missing a field or has one of the wrong type
    /// (for `replace`'s integers, one out of range).
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
                let what = match *field {
                    "healthy" => "a boolean",
                    "stats" => "an object",
                    "pid" | "moved" | "unmoved" => "an unsigned integer",
                    _ => "a string",
                };
                write!(f, "malformed frame: {kind:?} needs {what} {field:?}")
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
    /// hub → worker: a NOTIFY for queue `q`; `p` null = durable, a string = ephemeral payload.
    Wake(Wake),
    /// hub → worker: the hub's PostgreSQL listener health.
    Status { healthy: bool },
    /// hub → worker, our extension: the hub refuses to LISTEN for `queue`
    /// (empty name, channel over PostgreSQL's 63-byte limit). pgbus's Ruby
    /// client logs it as an unknown frame and times out, as it would anyway.
    Nack { queue: String, reason: String },
    /// Our extension, for `pgbus-hub status`: a request (`{"t":"stats"}`,
    /// None) from any connection, answered by the hub with
    /// `{"t":"stats","stats":{...}}` (Some). pgbus's peers never send it.
    Stats(Option<Object>),
    /// Our extension: a hub hands a worker over (`{"t":"move",...}`, both ways).
    Move(Move),
    /// Our extension: a cut's marker asked for and read (`{"t":"marker",...}`, both ways).
    Marker(Marker),
    /// Our extension: a new hub takes over from an old one (`{"t":"replace",...}`, both ways).
    Replace(Replace),
    /// Any other "t" (or none): decodes fine; receivers log and ignore it.
    Unknown(Object),
}

/// `move`: a hub hands a worker over (docs/architecture.md, "The frames").
/// One kind both ways; `c` tells the directions apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// hub → worker, `{"t":"move","c":C,"k":K}` (and `"to":S` when a hub
    /// replaces this one): leave this hub; the cut is `token` on `channel`,
    /// the hub's private channel. Without `to`: start your own LISTEN
    /// connection; with it: subscribe through the hub at the socket path `to`.
    Leave {
        channel: String,
        token: String,
        to: Option<String>,
    },
    /// worker → hub, `{"t":"move","k":K}`: the answer, on my way.
    Answer { token: String },
}

/// `marker`: a cut committed on request, and read (docs/architecture.md,
/// "The frames"). One kind both ways; `c` tells the directions apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// worker → hub, `{"t":"marker","c":C,"k":K}`: commit the cut, `NOTIFY
    /// channel, token` with `NOTIFY <your private channel>, token` in one
    /// transaction, and tell me when you read it. `channel` is the old side's
    /// private channel.
    Commit { channel: String, token: String },
    /// hub → worker, `{"t":"marker","k":K}`: I read `token`: every wake
    /// before this frame precedes the cut.
    Read { token: String },
}

/// `replace`: a new hub (N) takes over the socket path of an old one (O)
/// (docs/architecture.md, "3. A new hub replaces an old one"). One kind for
/// the request and every answer; the fields tell them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replace {
    /// N → O, `{"t":"replace"}`: may I take over?
    Request,
    /// O → N, `{"t":"replace","pid":P,"database":D}`: who serves, and on which database.
    Serving { pid: u32, database: String },
    /// O → N, `{"t":"replace","reason":R}`: no (O is stopping, or being replaced already).
    Refused { reason: String },
    /// N → O, `{"t":"replace","to":S}`: the socket path S is N's now; move every worker there.
    To(String),
    /// O → N, `{"t":"replace","moved":M,"unmoved":U}`: O yields; M workers
    /// moved at their markers, U closed without.
    Yielded { moved: u64, unmoved: u64 },
}

/// Field order matters: it is the reference encoder's (Ruby Hash insertion) order.
#[derive(Serialize)]
#[serde(tag = "t", rename_all = "lowercase")]
enum Wire<'a> {
    Sub {
        q: &'a str,
    },
    Unsub {
        q: &'a str,
    },
    Ack {
        q: &'a str,
    },
    Wake {
        q: &'a str,
        p: Option<&'a str>,
    },
    Status {
        healthy: bool,
    },
    Nack {
        q: &'a str,
        reason: &'a str,
    },
    Stats {
        #[serde(skip_serializing_if = "Option::is_none")]
        stats: Option<&'a Object>,
    },
    Listen {
        c: &'a str,
    },
    Unlisten {
        c: &'a str,
    },
    #[serde(rename = "ack")]
    AckChannel {
        c: &'a str,
    },
    #[serde(rename = "nack")]
    NackChannel {
        c: &'a str,
        reason: &'a str,
    },
    Notify {
        c: &'a str,
        p: &'a str,
    },
    #[serde(rename = "move")]
    MoveLeave {
        c: &'a str,
        k: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        to: Option<&'a str>,
    },
    #[serde(rename = "move")]
    MoveAnswer {
        k: &'a str,
    },
    #[serde(rename = "marker")]
    MarkerCommit {
        c: &'a str,
        k: &'a str,
    },
    #[serde(rename = "marker")]
    MarkerRead {
        k: &'a str,
    },
    #[serde(rename = "replace")]
    ReplaceRequest {},
    #[serde(rename = "replace")]
    ReplaceServing {
        pid: u32,
        database: &'a str,
    },
    #[serde(rename = "replace")]
    ReplaceRefused {
        reason: &'a str,
    },
    #[serde(rename = "replace")]
    ReplaceTo {
        to: &'a str,
    },
    #[serde(rename = "replace")]
    ReplaceYielded {
        moved: u64,
        unmoved: u64,
    },
}

impl Message {
    /// The "t" discriminator ("unknown" for anything else): for logs, never the payload.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sub(_) => "sub",
            Self::Unsub(_) => "unsub",
            Self::Ack(_) => "ack",
            Self::Wake(_) => "wake",
            Self::Status { .. } => "status",
            Self::Nack { .. } => "nack",
            Self::Stats(_) => STATS_KIND,
            Self::Move(_) => "move",
            Self::Marker(_) => "marker",
            Self::Replace(_) => "replace",
            Self::Unknown(_) => "unknown",
        }
    }

    /// The whole frame (header + body) for this message.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let wire = match self {
            Self::Sub(q) => match key_channel(q) {
                Some(c) => Wire::Listen { c },
                None => Wire::Sub { q },
            },
            Self::Unsub(q) => match key_channel(q) {
                Some(c) => Wire::Unlisten { c },
                None => Wire::Unsub { q },
            },
            Self::Ack(q) => match key_channel(q) {
                Some(c) => Wire::AckChannel { c },
                None => Wire::Ack { q },
            },
            Self::Wake(wake) => return wake.encode().map(Vec::from),
            Self::Status { healthy } => Wire::Status { healthy: *healthy },
            Self::Nack { queue, reason } => match key_channel(queue) {
                Some(c) => Wire::NackChannel { c, reason },
                None => Wire::Nack { q: queue, reason },
            },
            Self::Stats(stats) => Wire::Stats {
                stats: stats.as_ref(),
            },
            Self::Move(Move::Leave { channel, token, to }) => Wire::MoveLeave {
                c: channel,
                k: token,
                to: to.as_deref(),
            },
            Self::Move(Move::Answer { token }) => Wire::MoveAnswer { k: token },
            Self::Marker(Marker::Commit { channel, token }) => Wire::MarkerCommit {
                c: channel,
                k: token,
            },
            Self::Marker(Marker::Read { token }) => Wire::MarkerRead { k: token },
            Self::Replace(replace) => match replace {
                Replace::Request => Wire::ReplaceRequest {},
                Replace::Serving { pid, database } => Wire::ReplaceServing {
                    pid: *pid,
                    database,
                },
                Replace::Refused { reason } => Wire::ReplaceRefused { reason },
                Replace::To(to) => Wire::ReplaceTo { to },
                Replace::Yielded { moved, unmoved } => Wire::ReplaceYielded {
                    moved: *moved,
                    unmoved: *unmoved,
                },
            },
            Self::Unknown(object) => return encode_object(object),
        };
        frame_with(|body| serde_json::to_writer(body, &wire))
    }

    /// Decodes one complete body. A wake (the hot path: every NOTIFY, to
    /// every worker) is read straight from `body` into its shared strings;
    /// anything else, or a wake with any other field, goes through the
    /// general JSON object, so both paths accept and refuse the same bodies.
    pub fn decode(body: &[u8]) -> Result<Self, ProtocolError> {
        // Only a body that starts as every encoder writes a wake tries the
        // typed path: any other frame (sub, ack, status...) is parsed once.
        let typed = body
            .starts_with(br#"{"t":"wake""#)
            .then(|| serde_json::from_slice::<WakeIn<'_>>(body).ok())
            .flatten();
        if let Some(wire) = typed {
            if wire.t == "wake" {
                return Ok(Self::Wake(Wake {
                    queue: Arc::from(wire.q.as_ref()),
                    payload: wire.p.as_deref().map(Arc::from),
                }));
            }
        }
        Self::from_object(decode_body(body)?)
    }

    /// Interprets a decoded object, moving its strings out (no copies).
    /// Known kinds with missing or mistyped fields are errors; an unknown or
    /// absent "t" is `Unknown`.
    pub fn from_object(mut object: Object) -> Result<Self, ProtocolError> {
        let kind = match object.get("t") {
            Some(Value::String(kind)) => kind.clone(),
            _ => return Ok(Self::Unknown(object)),
        };
        let bad = |field| ProtocolError::BadField {
            kind: kind.clone(),
            field,
        };
        let mut take_string = |field: &'static str| match object.remove(field) {
            Some(Value::String(value)) => Ok(value),
            _ => Err(bad(field)),
        };
        // A queue ("q"), or with our extension a raw channel ("c"), as a routing key.
        let subject = |object: &mut Object| match (object.remove("q"), object.remove("c")) {
            (Some(Value::String(q)), None) => Ok(q),
            (None, Some(Value::String(c))) => Ok(channel_key(&c)),
            _ => Err(bad("q")),
        };
        Ok(match kind.as_str() {
            "sub" => Self::Sub(take_string("q")?),
            "unsub" => Self::Unsub(take_string("q")?),
            "listen" => Self::Sub(channel_key(&take_string("c")?)),
            "unlisten" => Self::Unsub(channel_key(&take_string("c")?)),
            "notify" => {
                let payload = take_string("p")?;
                Self::Wake(Wake {
                    queue: Arc::from(channel_key(&take_string("c")?)),
                    payload: Some(Arc::from(payload)),
                })
            }
            "ack" => Self::Ack(subject(&mut object)?),
            "wake" => {
                let payload = match object.remove("p") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(p)) => Some(Arc::from(p)),
                    Some(_) => return Err(bad("p")),
                };
                let queue = match object.remove("q") {
                    Some(Value::String(q)) => Arc::from(q),
                    _ => return Err(bad("q")),
                };
                Self::Wake(Wake { queue, payload })
            }
            "nack" => {
                let reason = take_string("reason")?;
                Self::Nack {
                    queue: subject(&mut object)?,
                    reason,
                }
            }
            "status" => match object.get("healthy") {
                Some(Value::Bool(healthy)) => Self::Status { healthy: *healthy },
                _ => return Err(bad("healthy")),
            },
            STATS_KIND => match object.remove("stats") {
                None => Self::Stats(None),
                Some(Value::Object(stats)) => Self::Stats(Some(stats)),
                Some(_) => return Err(bad("stats")),
            },
            "move" => {
                let token = take_string("k")?;
                match optional_string(&mut object, "c").map_err(bad)? {
                    Some(channel) => Self::Move(Move::Leave {
                        channel,
                        token,
                        to: optional_string(&mut object, "to").map_err(bad)?,
                    }),
                    // `to` belongs to the hub's `move` only.
                    None if object.contains_key("to") => return Err(bad("c")),
                    None => Self::Move(Move::Answer { token }),
                }
            }
            "marker" => {
                let token = take_string("k")?;
                Self::Marker(match optional_string(&mut object, "c").map_err(bad)? {
                    Some(channel) => Marker::Commit { channel, token },
                    None => Marker::Read { token },
                })
            }
            "replace" => Self::Replace(decode_replace(&mut object).map_err(bad)?),
            _ => Self::Unknown(object),
        })
    }
}

/// `field` as a string, None when absent; `Err(field)` when it is something else.
fn optional_string(
    object: &mut Object,
    field: &'static str,
) -> Result<Option<String>, &'static str> {
    match object.remove(field) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value)),
        Some(_) => Err(field),
    }
}

/// `field` as an unsigned integer; `Err(field)` when absent or anything else.
fn integer(object: &mut Object, field: &'static str) -> Result<u64, &'static str> {
    object
        .remove(field)
        .and_then(|value| value.as_u64())
        .ok_or(field)
}

/// Which `replace` it is, by the first of its fields present: `pid`
/// (with `database`), `reason`, `to`, `moved` (with `unmoved`), or none (the
/// request). Other fields are ignored, as in every kind.
fn decode_replace(object: &mut Object) -> Result<Replace, &'static str> {
    if object.contains_key("pid") {
        let pid = u32::try_from(integer(object, "pid")?).map_err(|_| "pid")?;
        let database = optional_string(object, "database")?.ok_or("database")?;
        return Ok(Replace::Serving { pid, database });
    }
    if let Some(reason) = optional_string(object, "reason")? {
        return Ok(Replace::Refused { reason });
    }
    if let Some(to) = optional_string(object, "to")? {
        return Ok(Replace::To(to));
    }
    if object.contains_key("moved") {
        return Ok(Replace::Yielded {
            moved: integer(object, "moved")?,
            unmoved: integer(object, "unmoved")?,
        });
    }
    Ok(Replace::Request)
}

/// A wake frame exactly as peers write it (`{"t":"wake","q":..,"p":..}`),
/// borrowed from the read buffer where no escape forces a copy.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WakeIn<'a> {
    #[serde(borrow)]
    t: Cow<'a, str>,
    #[serde(borrow)]
    q: Cow<'a, str>,
    #[serde(borrow, default)]
    p: Option<Cow<'a, str>>,
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

/// Free space the decoder offers each read: a few typical frames per
/// syscall while staying small per connection (one per worker in the hub).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Incremental decoder: reads land directly in its buffer ([`Decoder::read_with`])
/// or are copied in ([`Decoder::feed`]); complete frames come out.
///
/// After an error the stream is unusable (framing is lost); callers close the peer.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Zero-filled once when it grows; `start..end` holds unconsumed bytes.
    buffer: Vec<u8>,
    start: usize,
    end: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets `read` fill the free tail of the buffer (at least
    /// [`READ_CHUNK_BYTES`] / 2, usually more) and keeps what it reports
    /// reading: no intermediate buffer, no copy.
    pub fn read_with<E>(
        &mut self,
        read: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        self.make_room(READ_CHUNK_BYTES / 2);
        let count = read(&mut self.buffer[self.end..])?;
        self.end += count.min(self.buffer.len() - self.end);
        Ok(count)
    }

    /// One async read (tokio) straight into the buffer, as [`Decoder::read_with`].
    pub async fn read_with_async(
        &mut self,
        source: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> std::io::Result<usize> {
        self.make_room(READ_CHUNK_BYTES / 2);
        let count = tokio::io::AsyncReadExt::read(source, &mut self.buffer[self.end..]).await?;
        self.end += count;
        Ok(count)
    }

    /// Appends received bytes (a copy: for callers that already hold them).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.make_room(bytes.len());
        self.buffer[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Ensures `wanted` free bytes after `end`: moves the unconsumed bytes to
    /// the front when that frees enough, grows (by a whole chunk) otherwise.
    fn make_room(&mut self, wanted: usize) {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if self.buffer.len() - self.end >= wanted {
            return;
        }
        if self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let needed = self.end + wanted;
        if self.buffer.len() < needed {
            // A fresh zeroed allocation, not `resize`: the allocator hands out
            // zeroed pages it need not touch, so an idle connection's window
            // costs no resident memory (`resize` writes every byte: 64 KB per
            // worker in the master).
            let mut grown = vec![0u8; needed.next_multiple_of(READ_CHUNK_BYTES)];
            grown[..self.end].copy_from_slice(&self.buffer[..self.end]);
            self.buffer = grown;
        }
    }

    /// The next complete frame's body, `Ok(None)` if more bytes are needed.
    fn next_body(&mut self) -> Result<Option<&[u8]>, ProtocolError> {
        let pending = &self.buffer[self.start..self.end];
        let Some(header) = pending.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        let length = body_length(header.try_into().expect("slice of HEADER_BYTES"))?;
        if pending.len() < HEADER_BYTES + length {
            return Ok(None);
        }
        let body_start = self.start + HEADER_BYTES;
        self.start = body_start + length;
        Ok(Some(&self.buffer[body_start..self.start]))
    }

    /// The next complete frame as a JSON object (what Ruby's peers see),
    /// `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Object>, ProtocolError> {
        self.next_body()?.map(decode_body).transpose()
    }

    /// The next complete frame as a message, decoded straight from the
    /// buffer ([`Message::decode`]), `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        self.next_body()?.map(Message::decode).transpose()
    }

    /// True when bytes of an unfinished frame are buffered (EOF now = peer died mid-frame).
    pub fn has_partial_frame(&self) -> bool {
        self.start < self.end
    }
}

#[cfg(test)]
mod tests;
