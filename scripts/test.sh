#!/usr/bin/env bash
# Runs every test: starts the services the suite needs, then the whole workspace's tests
# (unit, integration, doc), then the shuttle schedule exploration.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/ensure-services
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc --no-fail-fast
if [ -x scripts/shuttle.sh ]; then scripts/shuttle.sh; fi
