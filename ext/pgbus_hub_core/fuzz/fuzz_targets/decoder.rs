//! Feeds arbitrary bytes, split at an arbitrary point, to the frame decoder.
//! Invariants: no panic; splitting never changes the outcome; every decoded
//! frame re-encodes to a frame that decodes to the same object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgbus_hub_core::protocol::{encode_object, Decoder, Message};

fn decode(chunks: &[&[u8]]) -> (Vec<pgbus_hub_core::protocol::Object>, bool) {
    let mut decoder = Decoder::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| *b as usize % (data.len() + 1));
    let whole = decode(&[data]);
    let (head, tail) = data.split_at(split);
    assert_eq!(decode(&[head, tail]), whole);
    for frame in whole.0 {
        let again = encode_object(&frame).expect("a decoded frame re-encodes");
        assert_eq!(decode(&[&again]).0, vec![frame.clone()]);
        let _ = Message::from_object(frame);
    }
});
