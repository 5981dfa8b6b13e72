//! An orders service on PostgreSQL behind the idem gateway, showing the three lines of
//! defence end to end: the gateway's claim, the service's state machine, and the service's
//! fenced write refusing the late effect of a request the gateway re-executed.
//!
//! [`service`] is the orders service; [`gateway`] serves the gateway's data plane in this
//! process, on the PostgreSQL store; [`demo`] runs the scenarios that `main` prints and the
//! example's tests check.

pub mod demo;
pub mod gateway;
pub mod service;
