//! Compiles the gRPC contracts in `proto/` with protox (pure Rust, no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/drover/v1/gateway.proto", "proto/drover/v1/cluster.proto", "proto/zeebe/gateway.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // The contracts as data too: tests walk every RPC the client port serves.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure().bytes(".drover.cluster.v1").compile_fds(descriptors)?;
    Ok(())
}
