#!/usr/bin/env bash
# Requests/s through axum with and without the idem-http layer, one run, memory store.
# Usage: [ROUNDS=n] crates/idem-http/bench/run.sh [seconds] [connections]
# Each round runs plain then a layer case, four times: idem on fresh keys (unique), idem on one
# replayed key, and the bench-only floor layer of examples/bench_server/floor.rs (the least any
# idempotency layer does, on fresh keys) with raw-body and canonical-JSON fingerprints. Each
# case is compared with the plain run just before it; the last lines give the median of those
# ratios and their range.
set -euo pipefail
secs=${1:-10}
conns=${2:-32}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
cd "$here/../../.."
need wrk wrk
server_bin=$(example_binary bench_server)
BENCH_ADDR=127.0.0.1:3999 "$server_bin" 2>/dev/null &
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
# The replay key is completed once, over a single connection (so with post.lua's exact
# request), before any measurement: otherwise the first burst of concurrent requests on it
# would (rightly) get 409 while its first request is in flight.
BENCH_PATH=/idem KEY_MODE=replay wrk -t1 -c1 -d1s -s "$here/post.lua" http://127.0.0.1:3999 >/dev/null
# Warm up, then alternate baseline and layer so drift hits both.
BENCH_PATH=/plain KEY_MODE=none wrk -t1 -c"$conns" -d2s -s "$here/post.lua" http://127.0.0.1:3999 >/dev/null
results=()
for round in $(seq "${ROUNDS:-2}"); do
  results+=("$(run "plain#$round" /plain none)")
  results+=("$(run "unique#$round" /idem unique)")
  results+=("$(run "plain-b#$round" /plain none)")
  results+=("$(run "replay#$round" /idem replay)")
  results+=("$(run "plain-c#$round" /plain none)")
  results+=("$(run "floor#$round" /floor unique)")
  results+=("$(run "plain-d#$round" /plain none)")
  results+=("$(run "floor-json#$round" /floor-json unique)")
  printf '%s\n' "${results[@]: -8}"
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
ratios = {"unique": [], "replay": [], "floor": [], "floor-json": []}
for (_, base), (name, rps) in zip(rows[0::2], rows[1::2]):
    ratios[name.split("#")[0]].append(float(rps) / float(base))
for name, r in ratios.items():
    print(f"{name}/plain: median {statistics.median(r):.2f} (range {min(r):.2f}-{max(r):.2f}, {len(r)} rounds, c='"$conns"')")
'
