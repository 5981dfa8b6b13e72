//! Placeholder; the example is filled in below.

fn main() {}
