#!/usr/bin/env bash
# Runs every test: starts the services the suite needs, then the whole workspace's tests
# (unit, integration, doc), then the shuttle schedule exploration.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/ensure-services
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc --no-fail-fast
# The OTLP export test needs the gateway built with its optional `otlp` feature.
cargo test -p idem-gateway --features otlp --test otlp
if [ -x scripts/shuttle.sh ]; then scripts/shuttle.sh; fi
