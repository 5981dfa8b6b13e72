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
# The Python and TypeScript clients against the real gateway and fault proxy (each installs
# its own dependencies: a virtualenv, npm ci). The paths go to those scripts only: `idem`
# reads every IDEM_* variable of its environment as configuration.
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
cargo build -q -p idem-gateway --bin idem -p idem-testkit --bin idem-fault-proxy
bins=(IDEM_BIN="$target/debug/idem" IDEM_FAULT_PROXY_BIN="$target/debug/idem-fault-proxy")
env "${bins[@]}" clients/python/run-tests.sh -q
env "${bins[@]}" clients/typescript/run-tests.sh
# The Debian package: built, installed, its unit's command started and asked, purged.
scripts/test-deb.sh
