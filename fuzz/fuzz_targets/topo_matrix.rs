//! `nvidia-smi topo -m` text, as the agent reads it from the tool and `weft simulate` from files.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Production reads the text into a String first (invalid UTF-8 fails there).
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = weft_topology::smi::parse_topo_matrix(text, "fuzz");
    }
});
