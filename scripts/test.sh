#!/usr/bin/env bash
# Runs every test: starts the services the suite needs, then the whole workspace's tests
# (unit, integration, doc), then the shuttle schedule exploration.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/ensure-services
# The dashboard test drives headless Chromium through chromedriver (Debian packages).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver for the dashboard test"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc --no-fail-fast
# The OTLP export test needs the gateway built with its optional `otlp` feature.
cargo test -p idem-gateway --features otlp --test otlp
if [ -x scripts/shuttle.sh ]; then scripts/shuttle.sh; fi
# The OpenAPI description is valid OpenAPI 3.1 (a real validator, in a virtualenv).
scripts/check-openapi.sh
