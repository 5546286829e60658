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
        .compile_fds(fds.clone())?;
    listing_server(fds)?;
    Ok(())
}

/// The controller's `Jobs` server once more, with every message taken from `crate::v1` but
/// `ListJobsResponse`, which it answers as bytes encoded beforehand
/// (`crate::listing::EncodedListJobs`): the listing threads encode a squeue reply, not the
/// async workers that answer submits. Clients keep the decoded type; the wire is the same.
fn listing_server(
    mut fds: prost_types::FileDescriptorSet,
) -> Result<(), Box<dyn std::error::Error>> {
    for f in &mut fds.file {
        if f.name() != "tandem/v1/jobs.proto" {
            f.service.clear();
        }
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("listing");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .extern_path(".tandem.v1", "crate::v1")
        .extern_path(
            ".tandem.v1.ListJobsResponse",
            "crate::listing::EncodedListJobs",
        )
        .out_dir(out)
        .compile_fds(fds)?;
    Ok(())
}
