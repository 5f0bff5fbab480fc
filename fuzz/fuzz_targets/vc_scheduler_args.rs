//! vc-scheduler's extender bodies: `PredicateRequest` and `PrioritizeRequest` streamed through
//! `JsonStream` (`volcano::read_predicate`, `volcano::read_prioritize`), and the
//! `EventHandlerRequest` of AllocateFunc/DeallocateFunc (decoded whole, then `volcano::event_pod`).
//! The task's pod goes through `volcano::task_pod`. The first byte picks the verb and how many
//! bytes each read returns; the rest is the body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_extender::stream::{JsonStream, StreamLimits};
use weft_extender::volcano;

fuzz_target!(|data: &[u8]| {
    let Some((&knob, body)) = data.split_first() else { return };
    let chunk = usize::from(knob >> 2) + 1;
    let limits = StreamLimits { max_body_bytes: 1 << 16, max_decoded_bytes: 1 << 12 };
    let mut stream = JsonStream::new(weft_fuzz::Chunked::new(body, chunk), limits);
    match knob & 3 {
        0 => {
            if let Ok(req) = volcano::read_predicate(&mut stream) {
                let _ = volcano::task_pod(req.task);
            }
        }
        1 => {
            if let Ok(req) = volcano::read_prioritize(&mut stream, 8) {
                let _ = volcano::task_pod(req.task);
            }
        }
        _ => {
            if let Ok(req) = serde_json::from_slice::<volcano::EventHandlerRequest>(body) {
                let _ = volcano::event_pod(req.task);
            }
        }
    }
});
