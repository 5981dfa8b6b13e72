#!/usr/bin/env bash
# idem beside the published `idempotent` crate (0.3.0 and 2.0.0), in memory and on Redis, in
# one harness: builds benches/peers in release and runs it. Markdown tables on stdout (or CSV
# with --csv), progress on stderr.
#
#   scripts/bench-peers.sh [--csv]
#
# Knobs (environment, see benches/peers/src/main.rs): PEERS_SECS (3 s per measurement),
# PEERS_ROUNDS (5), PEERS_TASKS ("1 64"), PEERS_STORES ("memory redis"), PEERS_REDIS_URL (unset:
# the bench starts its own redis-server on a spare loopback port; it needs redis-server on PATH).
#
# The crate is outside the workspace (the root Cargo.toml excludes it) and has its own
# Cargo.lock. `--ignore-rust-version` is needed because idempotent 2.0.0 declares rust-version
# 1.98; it builds on the project's 1.95.
set -euo pipefail
cd "$(dirname "$0")/../benches/peers"
cargo build --release --ignore-rust-version --locked >&2
exec cargo run --release --ignore-rust-version --locked --quiet -- "$@"
