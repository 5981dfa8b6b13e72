//! Compiles the gRPC service the gateway's tests put behind it (tests/proto) with protox: no
//! `protoc` needed. The generated code lands in `OUT_DIR` and only the tests include it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "tests/proto/idem/gwtest/v1/ledger.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["tests/proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
