//! Compiles the test service's proto (for the tests and benches) with protox: no `protoc`
//! needed. The generated code lands in `OUT_DIR`. The status service's proto is idem-wire's.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/idem/test/v1/payments.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
