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
    let message = Message::Wake(Wake::durable("q"));
    let mut decoder = Decoder::new();
    decoder.feed(&message.encode().unwrap());
    let object = decoder.next_frame().unwrap().unwrap();
    assert_eq!(Message::from_object(object).unwrap(), message);
    assert!(!decoder.has_partial_frame());
}

#[test]
fn stats_request_and_answer_are_typed() {
    let request = Message::Stats(None).encode().unwrap();
    assert_eq!(&request[4..], br#"{"t":"stats"}"#);
    let mut stats = Object::new();
    stats.insert("workers".into(), 4.into());
    let answer = Message::Stats(Some(stats));
    let mut decoder = Decoder::new();
    decoder.feed(&request);
    decoder.feed(&answer.encode().unwrap());
    let decoded: Vec<Message> = std::iter::from_fn(|| decoder.next_frame().unwrap())
        .map(|object| Message::from_object(object).unwrap())
        .collect();
    assert_eq!(decoded, [Message::Stats(None), answer]);
    let mut bad = Object::new();
    bad.insert("t".into(), "stats".into());
    bad.insert("stats".into(), "not an object".into());
    assert!(Message::from_object(bad).is_err());
}

#[test]
fn raw_channel_frames_use_c_and_decode_to_channel_keys() {
    let key = channel_key("room");
    let cases = [
        (Message::Sub(key.clone()), r#"{"t":"listen","c":"room"}"#),
        (
            Message::Unsub(key.clone()),
            r#"{"t":"unlisten","c":"room"}"#,
        ),
        (Message::Ack(key.clone()), r#"{"t":"ack","c":"room"}"#),
        (
            Message::Nack {
                queue: key.clone(),
                reason: "no".into(),
            },
            r#"{"t":"nack","c":"room","reason":"no"}"#,
        ),
        (
            Message::Wake(Wake::new(key.as_str(), Some(""))),
            r#"{"t":"notify","c":"room","p":""}"#,
        ),
    ];
    for (message, body) in cases {
        let frame = message.encode().unwrap();
        assert_eq!(&frame[HEADER_BYTES..], body.as_bytes());
        assert_eq!(Message::decode(body.as_bytes()).unwrap(), message);
    }
    assert_eq!(key_channel(&key), Some("room"));
    assert_eq!(key_channel("room"), None);
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
