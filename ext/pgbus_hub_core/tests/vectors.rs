//! Every case of pgbus 0.13.1's protocol vectors (tests/fixtures/vectors.json,
//! a verbatim copy of the shared file) must hold for our encoder and decoder.

use pgbus_hub_core::protocol::{
    self, Decoder, Message, Object, ProtocolError, Wake, MAX_FRAME_BYTES,
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
