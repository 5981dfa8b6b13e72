//! Lock types, swapped for shuttle's under the `shuttle` feature so schedule exploration
//! can drive the memory store.

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{Mutex, MutexGuard};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{Mutex, MutexGuard};
