//! Compiles weft's own definition of the kubelet device plugin and PodResources APIs with protox (pure Rust: no
//! protoc on the build machine) and tonic-prost-build (client and server).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/deviceplugin_v1beta1.proto", "proto/podresources_v1.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
