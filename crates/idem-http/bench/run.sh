#!/usr/bin/env bash
# Requests/s through axum with and without the idem-http layer, one run, memory store.
# Usage: crates/idem-http/bench/run.sh [seconds] [connections]
set -euo pipefail
secs=${1:-10}
conns=${2:-32}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
command -v wrk >/dev/null || { echo "wrk missing: apt-get install -y wrk" >&2; exit 1; }
cd "$root"
cargo build --release -q -p idem-http --example bench_server
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BENCH_ADDR=127.0.0.1:3999 "$target/release/examples/bench_server" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/3999) 2>/dev/null && break; sleep 0.1; done
run() { # name path mode
  local out rps
  out=$(BENCH_PATH=$2 KEY_MODE=$3 wrk -t1 -c"$conns" -d"${secs}s" -s "$here/post.lua" http://127.0.0.1:3999 2>&1)
  if grep -q "Non-2xx" <<<"$out"; then echo "$1: non-2xx responses" >&2; echo "$out" >&2; exit 1; fi
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  echo "$1 $rps"
}
# Warm up, then alternate baseline and layer twice so drift hits both.
BENCH_PATH=/plain KEY_MODE=none wrk -t1 -c"$conns" -d2s -s "$here/post.lua" http://127.0.0.1:3999 >/dev/null
for round in 1 2; do
  run "plain#$round" /plain none
  run "unique#$round" /idem unique
  run "plain-b#$round" /plain none
  run "replay#$round" /idem replay
done
