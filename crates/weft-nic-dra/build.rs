//! Compiles weft's own definitions of the kubelet's DRA plugin API (v1) and plugin registration
//! API with protox (pure Rust: no protoc on the build machine) and tonic-prost-build (client and
//! server: the driver serves both, the test kubelet calls them).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/dra_v1.proto", "proto/pluginregistration_v1.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
