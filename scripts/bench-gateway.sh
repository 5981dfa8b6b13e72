#!/usr/bin/env bash
# Load bench of the idem gateway with wrk: the sample upstream directly, the gateway as a plain
# proxy, and the gateway on the memory, SQLite, Redis and PostgreSQL stores, each with unique
# keys and with replays, at 1 and 64 connections. Prints a markdown table (ratios against the
# plain proxy measured in the same run) on stdout; progress on stderr.
#
#   scripts/bench-gateway.sh [DURATION_SECONDS]     (default 8)
#
# Needs wrk (apt-get install -y wrk), Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432
# (user postgres, database test); a missing store is reported and skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${1:-8}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/test}
LUA=scripts/bench-gateway.lua

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install -y wrk" >&2; exit 1; }
cargo build --release -p idem-gateway >&2
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN="$TARGET_DIR/release/idem"

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a process whose stdout announces "... on http://ADDR" or "... listening on http://ADDR";
# sets ADDR once it is up. Runs in this shell (not a subshell) so PIDS keeps the pid.
start() {
  local name=$1; shift
  "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=($!)
  ADDR=
  for _ in $(seq 1 200); do
    ADDR=$(grep -oE '(idem listening|sample upstream) on http://[0-9.:]+' "$WORK/$name.out" | head -1 | sed 's|.*http://||' || true)
    if [ -n "$ADDR" ]; then return 0; fi
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then cat "$WORK/$name.err" >&2; unset 'PIDS[-1]'; return 1; fi
    sleep 0.05
  done
  echo "$name did not start" >&2; return 1
}

stop_last() {
  local pid=${PIDS[-1]}
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset 'PIDS[-1]'
}

start upstream "$BIN" sample-upstream --listen 127.0.0.1:0
UP=$ADDR
echo "sample upstream on $UP" >&2

RUN_TAG=$(date +%s)
ROWS=()
# run LABEL MODE CONNS URL
run() {
  local label=$1 mode=$2 conns=$3 url=$4 threads=1
  [ "$conns" -gt 1 ] && threads=2
  local tag="$RUN_TAG-$label-$mode-$conns"
  tag=${tag// /_}
  if [ "$mode" = replay ]; then
    curl -s -o /dev/null -X POST "$url/charge" -H "Idempotency-Key: r-$tag" -H 'content-type: application/json' -d '{"amount":100}'
  fi
  local line
  line=$(wrk -t"$threads" -c"$conns" -d"${DURATION}s" -s "$LUA" "$url" -- "$mode" "$tag" | grep '^RESULT')
  read -r _ rps p50 p99 non2xx errs <<<"$line"
  echo "$label | $mode | c=$conns | $rps req/s | p50 ${p50}us | p99 ${p99}us | non-2xx $non2xx | errors $errs" >&2
  ROWS+=("$label|$mode|$conns|$rps|$p50|$p99|$non2xx|$errs")
}

for c in 1 64; do run "upstream direct" none "$c" "http://$UP"; done

gateway() {
  local label=$1 store=$2 extra=$3 idem=$4
  cat >"$WORK/gw.toml" <<EOF
upstream = "http://$UP"
store = "$store"
$extra
[log]
level = "warn"
[defaults]
idempotency = $idem
namespace = "bench"
EOF
  start "gw-$label" "$BIN" serve --config "$WORK/gw.toml" --listen 127.0.0.1:0 || return 1
  GW=$ADDR
  echo "$label gateway on $GW" >&2
}

gateway "plain proxy" "memory:" "" false
for c in 1 64; do run "plain proxy" none "$c" "http://$GW"; done
stop_last

bench_store() {
  local label=$1 store=$2 extra=$3
  if ! gateway "$label" "$store" "$extra" true; then
    echo "SKIPPED: $label store unavailable" >&2
    return 0
  fi
  for mode in unique replay; do
    for c in 1 64; do run "$label" "$mode" "$c" "http://$GW"; done
  done
  stop_last
}

bench_store memory "memory:" ""
bench_store sqlite "sqlite:$WORK/bench.db" ""
bench_store redis "$REDIS_URL" 'store_prefix = "idem-bench:"'
bench_store postgres "$PG_URL" 'store_table = "idem_bench_records"'
psql -h 127.0.0.1 -U postgres -d test -q -c 'DROP TABLE IF EXISTS idem_bench_records' >/dev/null 2>&1 || true

# Markdown table with ratios against the plain proxy at the same concurrency.
printf '%s\n' "${ROWS[@]}" | python3 -c '
import sys
rows = [l.rstrip("\n").split("|") for l in sys.stdin if l.strip()]
plain = {r[2]: float(r[3]) for r in rows if r[0] == "plain proxy"}
print("| setup | keys | conns | req/s | p50 | p99 | vs plain proxy | non-2xx |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for label, mode, conns, rps, p50, p99, non2xx, errs in rows:
    ratio = float(rps) / plain[conns] if plain.get(conns) else float("nan")
    keys = {"none": "no key", "unique": "unique", "replay": "replay"}[mode]
    print(f"| {label} | {keys} | {conns} | {float(rps):,.0f} | {int(p50)/1000:.2f} ms | {int(p99)/1000:.2f} ms | {ratio:.2f}x | {int(non2xx) + int(errs)} |")
'
