//! The `idem` gateway: a reverse proxy that gives any HTTP service idempotency-key
//! semantics, with an admin API, Prometheus metrics and a built-in demo upstream.
//!
//! The binary (`src/main.rs`) is a thin CLI over these modules; see `docs/gateway.md`.
//! The public modules are what the binary, the tests, the examples and the fuzz targets build
//! on; the others are the gateway's own.

mod activity;
pub mod admin;
pub mod app;
mod body;
pub mod claims;
pub mod cli;
pub mod config;
pub mod demo;
pub(crate) mod grpc;
mod health;
mod listener;
mod matcher;
pub mod metrics;
pub mod observe;
pub mod openapi;
#[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub mod outbox;
pub mod path;
#[cfg(feature = "planted-bugs")]
mod planted;
mod principal;
mod protect;
mod proxy;
pub mod reconcile;
pub mod relay;
mod reload;
pub mod request;
pub mod server;
mod shared;
mod status;
pub mod store;
#[cfg(test)]
mod test_support;
mod tls;
pub mod tokens;
mod tunnel;
mod ui;
pub mod upstream;
mod webhook;
