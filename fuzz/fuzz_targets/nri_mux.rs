//! The NRI trunk as the runtime writes it: frames (8-byte header, payload) for the plugin's two
//! sub-connections and for ids nobody opened, read by `weft_nri::mux::Mux` over an in-memory
//! stream. The payloads delivered on connections 1 and 2 must be exactly those of the frames the
//! input holds for them, up to the first frame the reader refuses or cuts short. The first byte
//! sets the reader's frame limit (small limits reach the oversize path); the rest is the trunk.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_nri::mux::{self, Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// What a reader with frame limit `limit` must hand each open connection.
fn expected(mut trunk: &[u8], limit: usize) -> (Vec<u8>, Vec<u8>) {
    let (mut one, mut two) = (Vec::new(), Vec::new());
    while trunk.len() >= mux::HEADER_LEN {
        let mut h = [0u8; mux::HEADER_LEN];
        h.copy_from_slice(&trunk[..mux::HEADER_LEN]);
        let (id, len) = mux::decode_header(&h);
        let len = len as usize;
        if len > limit || trunk.len() - mux::HEADER_LEN < len {
            break;
        }
        let payload = &trunk[mux::HEADER_LEN..mux::HEADER_LEN + len];
        match id {
            PLUGIN_SERVICE_CONN => one.extend_from_slice(payload),
            RUNTIME_SERVICE_CONN => two.extend_from_slice(payload),
            _ => {}
        }
        trunk = &trunk[mux::HEADER_LEN + len..];
    }
    (one, two)
}

fuzz_target!(|data: &[u8]| {
    let Some((&knob, trunk)) = data.split_first() else { return };
    let limit = if knob & 0x80 == 0 { mux::MAX_PAYLOAD } else { usize::from(knob & 0x7f) * 8 };
    let want = expected(trunk, limit);
    weft_fuzz::runtime().block_on(async {
        let (ours, mut runtime_end) = tokio::io::duplex(64 * 1024);
        let m = Mux::with_read_limit(ours, limit);
        let mut one = m.open(PLUGIN_SERVICE_CONN).expect("open connection 1");
        let mut two = m.open(RUNTIME_SERVICE_CONN).expect("open connection 2");
        m.start();
        let writer = async move {
            // The reader stops at a refused frame and drops its end; a failed write is fine then.
            let _ = runtime_end.write_all(trunk).await;
            let _ = runtime_end.shutdown().await;
            runtime_end
        };
        let read_one = async {
            let mut got = Vec::new();
            let _ = one.read_to_end(&mut got).await;
            got
        };
        let read_two = async {
            let mut got = Vec::new();
            let _ = two.read_to_end(&mut got).await;
            got
        };
        let (_end, got_one, got_two) = tokio::join!(writer, read_one, read_two);
        assert!(m.is_closed(), "the mux is closed once the trunk ended");
        assert_eq!(got_one, want.0, "connection 1 got other bytes than its frames carried");
        assert_eq!(got_two, want.1, "connection 2 got other bytes than its frames carried");
    });
});
