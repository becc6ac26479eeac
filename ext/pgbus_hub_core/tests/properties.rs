//! Property tests: round trips for arbitrary strings, and chunking independence.

use pgbus_hub_core::protocol::{
    decode_body, Decoder, Marker, Message, Move, Object, Replace, Wake,
};
use proptest::prelude::*;

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        any::<String>().prop_map(Message::Sub),
        any::<String>().prop_map(Message::Unsub),
        any::<String>().prop_map(Message::Ack),
        (any::<String>(), proptest::option::of(any::<String>()))
            // A raw channel's wake always carries its payload (see protocol::channel_key).
            .prop_filter("raw wakes carry a payload", |(queue, payload)| {
                !queue.starts_with('\0') || payload.is_some()
            })
            .prop_map(|(queue, payload)| Message::Wake(Wake::new(queue, payload))),
        any::<bool>().prop_map(|healthy| Message::Status { healthy }),
        (any::<String>(), any::<String>())
            .prop_map(|(queue, reason)| Message::Nack { queue, reason }),
        (
            any::<String>(),
            any::<String>(),
            proptest::option::of(any::<String>())
        )
            .prop_map(|(channel, token, to)| Message::Move(Move::Leave {
                channel,
                token,
                to
            })),
        any::<String>().prop_map(|token| Message::Move(Move::Answer { token })),
        (any::<String>(), any::<String>())
            .prop_map(|(channel, token)| Message::Marker(Marker::Commit { channel, token })),
        any::<String>().prop_map(|token| Message::Marker(Marker::Read { token })),
        Just(Message::Replace(Replace::Request)),
        (any::<u32>(), any::<String>())
            .prop_map(|(pid, database)| Message::Replace(Replace::Serving { pid, database })),
        any::<String>().prop_map(|reason| Message::Replace(Replace::Refused { reason })),
        any::<String>().prop_map(|to| Message::Replace(Replace::To(to))),
        (any::<u64>(), any::<u64>())
            .prop_map(|(moved, unmoved)| Message::Replace(Replace::Yielded { moved, unmoved })),
    ]
}

fn drain(decoder: &mut Decoder, into: &mut Vec<Object>) {
    while let Some(frame) = decoder.next_frame().expect("valid stream") {
        into.push(frame);
    }
}

proptest! {
    #[test]
    fn encode_then_decode_is_identity(message in message()) {
        let frame = message.encode().unwrap();
        let object = decode_body(&frame[4..]).unwrap();
        prop_assert_eq!(Message::from_object(object).unwrap(), message);
    }

    #[test]
    fn any_chunking_yields_the_same_frames(
        messages in proptest::collection::vec(message(), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let stream: Vec<u8> = messages.iter().flat_map(|m| m.encode().unwrap()).collect();
        let mut whole = Vec::new();
        let mut decoder = Decoder::new();
        decoder.feed(&stream);
        drain(&mut decoder, &mut whole);

        let mut offsets: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        offsets.extend([0, stream.len()]);
        offsets.sort_unstable();
        let mut chunked = Vec::new();
        let mut decoder = Decoder::new();
        for pair in offsets.windows(2) {
            decoder.feed(&stream[pair[0]..pair[1]]);
            drain(&mut decoder, &mut chunked);
        }
        prop_assert!(!decoder.has_partial_frame());
        prop_assert_eq!(whole.len(), messages.len());
        prop_assert_eq!(chunked, whole);
    }

    /// The wake fast path (typed, straight from the buffer) and the general
    /// path (JSON object) accept and refuse the same bodies, alike.
    #[test]
    fn wake_fast_path_agrees_with_the_general_decoder(
        kind in prop_oneof![Just("wake".to_owned()), Just("sub".to_owned()), Just("nack".to_owned()), any::<String>()],
        queue in proptest::option::of(any::<String>()),
        payload in proptest::option::of(proptest::option::of(any::<String>())),
        extra in proptest::option::of(any::<bool>()),
        duplicate_queue in any::<bool>(),
    ) {
        let mut body = format!("{{\"t\":{}", serde_json::to_string(&kind).unwrap());
        if let Some(queue) = &queue {
            body += &format!(",\"q\":{}", serde_json::to_string(queue).unwrap());
            if duplicate_queue {
                body += ",\"q\":\"again\"";
            }
        }
        if let Some(payload) = &payload {
            body += &format!(",\"p\":{}", serde_json::to_string(payload).unwrap());
        }
        if let Some(extra) = extra {
            body += &format!(",\"x\":{extra}");
        }
        body.push('}');
        let general = decode_body(body.as_bytes()).and_then(Message::from_object);
        prop_assert_eq!(Message::decode(body.as_bytes()), general);
    }

    /// Reading straight into the decoder's buffer, any chunk sizes, yields the frames `feed` does.
    #[test]
    fn reads_into_the_buffer_yield_the_same_messages(
        messages in proptest::collection::vec(message(), 1..8),
        chunk in 1usize..70_000,
    ) {
        let stream: Vec<u8> = messages.iter().flat_map(|m| m.encode().unwrap()).collect();
        let mut decoder = Decoder::new();
        let mut read = 0;
        let mut got = Vec::new();
        while read < stream.len() {
            let count = decoder
                .read_with(|free| -> Result<usize, ()> {
                    let n = chunk.min(free.len()).min(stream.len() - read);
                    free[..n].copy_from_slice(&stream[read..read + n]);
                    Ok(n)
                })
                .unwrap();
            read += count;
            while let Some(message) = decoder.next_message().expect("valid stream") {
                got.push(message);
            }
        }
        prop_assert!(!decoder.has_partial_frame());
        prop_assert_eq!(got, messages);
    }
}
