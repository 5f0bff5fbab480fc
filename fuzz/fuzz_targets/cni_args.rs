//! `CNI_ARGS`, as the runtime sets it in weft-cni's environment (`CniArgs::parse`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // An environment variable reaches the plugin through `std::env::var`, which refuses
    // invalid UTF-8 before the parser sees it.
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = weft_cni::env::CniArgs::parse(text);
    }
});
