//! Generates the NRI messages (rust-protobuf 3) and the async ttrpc services from
//! `proto/nri.proto` into `OUT_DIR`; pure Rust, no `protoc`.
//!
//! The generated files start with inner attributes (`#![allow(...)]`, among them
//! `allow(unsafe_code)`, which the workspace's `forbid(unsafe_code)` rejects) and inner doc
//! comments; both are invalid in an `include!`d module body, so they are stripped here and the
//! lints are allowed on the including modules in `src/lib.rs` instead. The generated code
//! itself uses no `unsafe`.

use std::path::Path;

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    println!("cargo:rerun-if-changed=proto/nri.proto");
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    Codegen::new()
        .out_dir(&out)
        .inputs(["proto/nri.proto"])
        .include("proto")
        .rust_protobuf()
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .customize(Customize { async_all: true, ..Default::default() })
        .run()
        .expect("NRI protocol code generation failed");
    for file in ["nri.rs", "nri_ttrpc.rs"] {
        let path = Path::new(&out).join(file);
        let text = std::fs::read_to_string(&path).expect("generated file is readable");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                !l.starts_with("#![") && !l.starts_with("//!")
            })
            .collect();
        assert!(
            !kept.iter().any(|l| l.contains("unsafe ") || l.contains("unsafe{")),
            "{file}: generated code uses unsafe"
        );
        std::fs::write(&path, kept.join("\n")).expect("generated file is writable");
    }
}
