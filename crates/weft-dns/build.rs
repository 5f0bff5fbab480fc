//! Compiles weft's own minimal definition of the etcd v3 KV and Lease APIs with protox (pure Rust:
//! no protoc on the build machine) and tonic-prost-build (client only).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/etcdserverpb/rpc.proto", "proto/mvccpb/kv.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(["etcdserverpb/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(descriptors)?;
    Ok(())
}
