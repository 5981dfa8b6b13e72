//! With the `grpc` feature, compiles the status service's proto with protox (no `protoc`
//! needed); the generated code lands in `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "grpc")]
    {
        let file = "proto/idem/status/v1/status.proto";
        println!("cargo:rerun-if-changed={file}");
        let descriptors = protox::compile([file], ["proto"])?;
        tonic_prost_build::configure()
            .build_transport(false)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
