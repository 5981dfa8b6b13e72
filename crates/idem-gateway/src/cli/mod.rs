//! Command-line clients of the gateway's own APIs, and the configuration as the commands
//! run it.

pub mod admin;
pub mod config;
pub(crate) mod visible;
