//! A node description in any supported form (inventory JSON, inventory YAML, or `topo -m` text),
//! through the detection `weft simulate` and `--topology-file` use.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = weft_topology::inventory::parse_node(text, "fuzz");
    }
});
