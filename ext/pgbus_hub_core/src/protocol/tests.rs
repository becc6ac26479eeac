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

/// Every shape of the planned events' frames (docs/architecture.md, "The
/// frames" and item 3): its exact body, and back.
#[test]
fn move_marker_and_replace_frames_encode_and_decode_both_ways() {
    let token = "move.4242.00000000deadbeef.1";
    let channel = "pgbus_hub.handover.4242.00000000deadbeef";
    let leave = Message::Move(Move::Leave {
        channel: channel.into(),
        token: token.into(),
        to: None,
    });
    let cases = [
        (
            leave.clone(),
            format!(r#"{{"t":"move","c":"{channel}","k":"{token}"}}"#),
        ),
        (
            Message::Move(Move::Leave {
                channel: channel.into(),
                token: token.into(),
                to: Some("/run/hub.sock".into()),
            }),
            format!(r#"{{"t":"move","c":"{channel}","k":"{token}","to":"/run/hub.sock"}}"#),
        ),
        (
            Message::Move(Move::Answer {
                token: token.into(),
            }),
            format!(r#"{{"t":"move","k":"{token}"}}"#),
        ),
        (
            Message::Marker(Marker::Commit {
                channel: channel.into(),
                token: token.into(),
            }),
            format!(r#"{{"t":"marker","c":"{channel}","k":"{token}"}}"#),
        ),
        (
            Message::Marker(Marker::Read {
                token: token.into(),
            }),
            format!(r#"{{"t":"marker","k":"{token}"}}"#),
        ),
        (
            Message::Replace(Replace::Request),
            r#"{"t":"replace"}"#.into(),
        ),
        (
            Message::Replace(Replace::Serving {
                pid: 4242,
                database: "app".into(),
            }),
            r#"{"t":"replace","pid":4242,"database":"app"}"#.into(),
        ),
        (
            Message::Replace(Replace::Refused {
                reason: "stopping".into(),
            }),
            r#"{"t":"replace","reason":"stopping"}"#.into(),
        ),
        (
            Message::Replace(Replace::To("/run/hub.sock".into())),
            r#"{"t":"replace","to":"/run/hub.sock"}"#.into(),
        ),
        (
            Message::Replace(Replace::Yielded {
                moved: 3,
                unmoved: 1,
            }),
            r#"{"t":"replace","moved":3,"unmoved":1}"#.into(),
        ),
    ];
    for (message, body) in cases {
        let frame = message.encode().unwrap();
        assert_eq!(
            std::str::from_utf8(&frame[HEADER_BYTES..]).unwrap(),
            body,
            "{}",
            message.kind()
        );
        assert_eq!(Message::decode(body.as_bytes()).unwrap(), message);
        // What Ruby's encoder makes of the decoded object: the same bytes.
        let object = decode_body(body.as_bytes()).unwrap();
        assert_eq!(encode_object(&object).unwrap(), frame);
    }
    assert_eq!(leave.kind(), "move");
    assert_eq!(
        Message::Marker(Marker::Read { token: "x".into() }).kind(),
        "marker"
    );
    assert_eq!(Message::Replace(Replace::Request).kind(), "replace");
}

#[test]
fn the_planned_events_frames_with_a_missing_or_mistyped_field_are_errors() {
    let bad = [
        (r#"{"t":"move"}"#, "k"),
        (r#"{"t":"move","c":"c"}"#, "k"),
        (r#"{"t":"move","k":1}"#, "k"),
        (r#"{"t":"move","c":1,"k":"k"}"#, "c"),
        (r#"{"t":"move","c":"c","k":"k","to":1}"#, "to"),
        // `to` without `c`: neither the hub's `move` nor the answer.
        (r#"{"t":"move","k":"k","to":"s"}"#, "c"),
        (r#"{"t":"marker","c":"c"}"#, "k"),
        (r#"{"t":"marker","c":null,"k":"k"}"#, "c"),
        (r#"{"t":"replace","pid":"1","database":"d"}"#, "pid"),
        (r#"{"t":"replace","pid":-1,"database":"d"}"#, "pid"),
        (r#"{"t":"replace","pid":4294967296,"database":"d"}"#, "pid"),
        (r#"{"t":"replace","pid":1}"#, "database"),
        (r#"{"t":"replace","reason":false}"#, "reason"),
        (r#"{"t":"replace","to":["s"]}"#, "to"),
        (r#"{"t":"replace","moved":1}"#, "unmoved"),
        (r#"{"t":"replace","moved":1.5,"unmoved":0}"#, "moved"),
    ];
    for (body, field) in bad {
        match Message::decode(body.as_bytes()) {
            Err(ProtocolError::BadField { field: f, .. }) => assert_eq!(f, field, "{body}"),
            other => panic!("{body}: {other:?}"),
        }
    }
    let error = Message::decode(br#"{"t":"replace","pid":"1","database":"d"}"#).unwrap_err();
    assert_eq!(
        error.to_string(),
        r#"malformed frame: "replace" needs an unsigned integer "pid""#
    );
    // Other fields are ignored, as in every kind.
    assert_eq!(
        Message::decode(br#"{"t":"marker","k":"k","x":1}"#).unwrap(),
        Message::Marker(Marker::Read { token: "k".into() })
    );
}
