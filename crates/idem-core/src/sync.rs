//! Lock types, swapped for shuttle's under `--cfg shuttle` so schedule exploration can drive
//! the memory store (see `scripts/shuttle.sh`).

#[cfg(shuttle)]
pub(crate) use shuttle::sync::{Mutex, MutexGuard};
#[cfg(not(shuttle))]
pub(crate) use std::sync::{Mutex, MutexGuard};
