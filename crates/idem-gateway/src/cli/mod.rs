//! Command-line clients of the gateway's own APIs.

pub mod admin;
mod visible;
