//! Compiles `tandem/v1/*.proto` and KEDA's vendored `keda/externalscaler.proto` with
//! protox, a pure-Rust protobuf compiler, so that a fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "tandem/v1/common.proto",
        "tandem/v1/jobs.proto",
        "tandem/v1/nodes.proto",
        "tandem/v1/accounting.proto",
        "tandem/v1/worker.proto",
        "tandem/v1/bridge.proto",
        // Package `externalscaler`, served by the controller's KEDA scaler listener.
        "keda/externalscaler.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
