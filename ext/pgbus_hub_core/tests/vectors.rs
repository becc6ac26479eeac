//! Every case of pgbus 0.13.1's protocol vectors (tests/fixtures/vectors.json,
//! a verbatim copy of the shared file) must hold for our encoder and decoder.

use pgbus_hub_core::protocol::{
    self, Decoder, Marker, Message, Move, Object, ProtocolError, Replace, Wake, MAX_FRAME_BYTES,
};
use serde_json::Value;

fn vectors() -> Value {
    let text = include_str!("fixtures/vectors.json");
    serde_json::from_str(text).expect("vectors.json parses")
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Decodes a whole byte stream the way a reader does at EOF: frames, then
/// either a clean end, an end mid-frame (EOF), or an error.
fn read_all(bytes: &[u8]) -> (Vec<Object>, Result<(), ProtocolError>) {
    let mut decoder = Decoder::new();
    decoder.feed(bytes);
    let mut frames = Vec::new();
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, Ok(())),
            Err(e) => return (frames, Err(e)),
        }
    }
}

#[test]
fn every_vector_case_holds() {
    let vectors = vectors();
    assert_eq!(
        vectors["max_frame_bytes"].as_u64(),
        Some(MAX_FRAME_BYTES as u64)
    );
    let cases = vectors["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 25, "the shared file has 25 cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        match case["kind"].as_str().unwrap() {
            "valid" => {
                let object = case["message"].as_object().unwrap().clone();
                let bytes = hex(case["bytes_hex"].as_str().unwrap());
                assert_eq!(
                    protocol::encode_object(&object).unwrap(),
                    bytes,
                    "{name}: encode_object"
                );
                let message = Message::from_object(object.clone()).unwrap();
                assert_eq!(message.encode().unwrap(), bytes, "{name}: typed encode");
                let (frames, end) = read_all(&bytes);
                assert_eq!((frames, end), (vec![object], Ok(())), "{name}: decode");
            }
            "read" => {
                let (frames, end) = read_all(&hex(case["bytes_hex"].as_str().unwrap()));
                assert!(frames.is_empty(), "{name}: no frame");
                match case["reference_outcome"].as_str().unwrap() {
                    "eof" => assert_eq!(end, Ok(()), "{name}: EOF, not an error"),
                    "protocol_error" => assert!(end.is_err(), "{name}: protocol error"),
                    other => panic!("{name}: unknown outcome {other}"),
                }
            }
            "encode" => {
                let payload = "x".repeat(4 * 1024 * 1024);
                let message = Message::Wake(Wake::new("big", Some(payload)));
                assert!(
                    matches!(message.encode(), Err(ProtocolError::FrameTooLarge(_))),
                    "{name}"
                );
            }
            "stream" => {
                let expected: Vec<Object> = case["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_object().unwrap().clone())
                    .collect();
                let (frames, end) = read_all(&hex(case["bytes_hex"].as_str().unwrap()));
                assert_eq!((frames, end), (expected, Ok(())), "{name}");
            }
            other => panic!("{name}: unknown kind {other}"),
        }
    }
}

#[test]
fn error_messages_use_the_reference_wording() {
    let too_large = protocol::body_length([0xff; 4]).unwrap_err();
    assert_eq!(
        too_large.to_string(),
        "frame too large: 4294967295 bytes (max 4194304)"
    );
    let array = protocol::decode_body(b"[1,2,3]").unwrap_err();
    assert_eq!(
        array.to_string(),
        "malformed frame: expected a JSON object, got Array"
    );
    let utf8 = protocol::decode_body(b"{\"q\":\"\xff\"}").unwrap_err();
    assert_eq!(utf8.to_string(), "malformed frame: invalid UTF-8");
    assert!(protocol::decode_body(b"")
        .unwrap_err()
        .to_string()
        .starts_with("malformed frame: "));
}

/// The kinds pgbus-hub decoded before issue 56's frames: an older pgbus-hub
/// worker or hub decodes any other "t" as [`Message::Unknown`] (logged, ignored).
const OLDER_PGBUS_HUB_KINDS: [&str; 10] = [
    "sub", "unsub", "ack", "wake", "status", "nack", "stats", "listen", "unlisten", "notify",
];

/// Issue 56's frames (`move`, `marker`, `replace`), as pgbus's Ruby peers
/// read them: a whole JSON object (the reader is the reference's), of a kind
/// none of the vectors' messages has, so it is handled as the `unknown_type`
/// case is (logged, ignored; the connection kept); and a kind older
/// pgbus-hub peers did not know either. Ruby's encoder makes the same bytes
/// of that object, so a peer that relays it relays it unchanged.
#[test]
fn the_planned_events_frames_are_unknown_kinds_to_pgbus_and_older_peers() {
    let vectors = vectors();
    let pgbus_kinds: Vec<&str> = vectors["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|case| case["kind"] == "valid" && case["name"] != "unknown_type")
        .map(|case| case["message"]["t"].as_str().unwrap())
        .collect();
    assert!(pgbus_kinds.contains(&"wake") && pgbus_kinds.contains(&"sub"));
    let (channel, token) = ("pgbus_hub.handover.1.00000000000000ff", "move.1.ff.1");
    let frames = [
        Message::Move(Move::Leave {
            channel: channel.into(),
            token: token.into(),
            to: Some("/tmp/s.sock".into()),
        }),
        Message::Move(Move::Answer {
            token: token.into(),
        }),
        Message::Marker(Marker::Commit {
            channel: channel.into(),
            token: token.into(),
        }),
        Message::Marker(Marker::Read {
            token: token.into(),
        }),
        Message::Replace(Replace::Request),
        Message::Replace(Replace::Serving {
            pid: 7,
            database: "d".into(),
        }),
        Message::Replace(Replace::Refused {
            reason: "stopping".into(),
        }),
        Message::Replace(Replace::To("/tmp/s.sock".into())),
        Message::Replace(Replace::Yielded {
            moved: 2,
            unmoved: 0,
        }),
    ];
    for message in frames {
        let bytes = message.encode().unwrap();
        let (objects, end) = read_all(&bytes);
        assert_eq!(end, Ok(()), "{message:?}");
        let [object] = objects.as_slice() else {
            panic!("{message:?}: one frame");
        };
        let kind = object["t"].as_str().unwrap();
        assert_eq!(kind, message.kind());
        assert!(!pgbus_kinds.contains(&kind), "{kind}: pgbus knows it");
        assert!(
            !OLDER_PGBUS_HUB_KINDS.contains(&kind),
            "{kind}: older pgbus-hub knows it"
        );
        assert_eq!(protocol::encode_object(object).unwrap(), bytes, "{kind}");
    }
    // And the existing unknown kind stays unknown.
    let bogus = protocol::decode_body(br#"{"t":"bogus","q":"x"}"#).unwrap();
    assert!(matches!(
        Message::from_object(bogus),
        Ok(Message::Unknown(_))
    ));
}
