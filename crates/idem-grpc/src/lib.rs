//! idem's gRPC carrier.
