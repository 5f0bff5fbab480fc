//! kube-scheduler's `ExtenderArgs` bodies (filter, prioritize), decoded as the extender decodes
//! them: streamed through `JsonStream` by `wire::read_args`. The first byte sets how many bytes
//! each read of the body returns (so every buffer boundary is met) and the node limit; the rest is
//! the body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_extender::stream::{JsonStream, StreamLimits};

fuzz_target!(|data: &[u8]| {
    let Some((&knob, body)) = data.split_first() else { return };
    let chunk = usize::from(knob & 0x3f) + 1;
    let max_nodes = usize::from(knob >> 6) * 4 + 1;
    // Small limits so that the size checks are reached by small inputs.
    let limits = StreamLimits { max_body_bytes: 1 << 16, max_decoded_bytes: 1 << 12 };
    let mut stream = JsonStream::new(weft_fuzz::Chunked::new(body, chunk), limits);
    let _ = weft_extender::wire::read_args(&mut stream, max_nodes);
});
