//! The `idem` gateway: a reverse proxy that gives any HTTP service idempotency-key
//! semantics, with an admin API, Prometheus metrics and a built-in demo upstream.
//!
//! The binary (`src/main.rs`) is a thin CLI over these modules; see `docs/gateway.md`.

mod activity;
pub mod admin;
pub mod app;
pub mod body;
pub mod claims;
pub mod cli;
pub mod config;
pub mod demo;
pub mod grpc;
pub mod health;
pub mod listener;
pub mod matcher;
pub mod metrics;
pub mod observe;
pub mod path;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod principal;
pub mod protect;
pub mod proxy;
pub mod reconcile;
pub mod relay;
pub mod reload;
pub mod request;
pub mod server;
mod shared;
pub mod status;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod tokens;
mod tunnel;
pub mod ui;
pub mod upstream;
pub mod webhook;
