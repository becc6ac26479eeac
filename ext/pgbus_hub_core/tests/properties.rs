//! Property tests: round trips for arbitrary strings, and chunking independence.

use pgbus_hub_core::protocol::{decode_body, Decoder, Message, Object};
use proptest::prelude::*;

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        any::<String>().prop_map(Message::Sub),
        any::<String>().prop_map(Message::Unsub),
        any::<String>().prop_map(Message::Ack),
        (any::<String>(), proptest::option::of(any::<String>()))
            .prop_map(|(queue, payload)| Message::Wake { queue, payload }),
        any::<bool>().prop_map(|healthy| Message::Status { healthy }),
        (any::<String>(), any::<String>())
            .prop_map(|(queue, reason)| Message::Nack { queue, reason }),
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
}
