//! Command-line clients of the gateway's own APIs.

pub mod admin;
pub(crate) mod visible;
