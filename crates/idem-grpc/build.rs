//! Compiles the status service's proto (and the test service's) with protox: no `protoc`
//! needed. The generated code lands in `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/idem/status/v1/status.proto",
        "proto/idem/test/v1/payments.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
