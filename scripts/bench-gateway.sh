#!/usr/bin/env bash
# Load bench of the idem gateway with wrk: the sample upstream directly, the gateway as a plain
# proxy, and the gateway on the memory, SQLite, Redis and PostgreSQL stores, each with unique
# keys and with replays, at 1 and 64 connections. Prints a markdown table (ratios against the
# plain proxy measured in the same round) on stdout; progress on stderr.
#
#   scripts/bench-gateway.sh [DURATION_SECONDS]     (default 8)
#
# Fairness: every gateway (and the upstream) runs for the whole bench, and the rows are
# measured in ROUNDS rounds (default 3), each round measuring every row once, so machine
# drift hits the baseline and the stores alike; each row is the median over the rounds and
# its ratio the median of the per-round ratios (the range is shown too). Every measured run
# is preceded by an unmeasured warm-up of WARMUP seconds (default 2) with the same settings.
# Every request carries the same bytes apart from the key header (see bench-gateway.lua).
#
# Needs wrk (apt-get install -y wrk), Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432
# (user postgres, database test); a missing store is reported and skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${1:-8}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2}
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

start upstream "$BIN" sample-upstream --listen 127.0.0.1:0
UP=$ADDR
echo "sample upstream on $UP" >&2

# Every gateway serves for the whole bench. TARGETS holds "label|url" in measuring order.
TARGETS=("upstream direct|http://$UP")
gateway() {
  local label=$1 store=$2 extra=$3 idem=$4 name=${1// /_}
  cat >"$WORK/$name.toml" <<EOF
upstream = "http://$UP"
store = "$store"
$extra
[log]
level = "warn"
[defaults]
idempotency = $idem
namespace = "bench"
principal = { from = "none" }
EOF
  if ! start "gw-$name" "$BIN" serve --config "$WORK/$name.toml" --listen 127.0.0.1:0; then
    echo "SKIPPED: $label store unavailable" >&2
    return 0
  fi
  echo "$label gateway on $ADDR" >&2
  TARGETS+=("$label|http://$ADDR")
}
gateway "plain proxy" "memory:" "" false
gateway memory "memory:" "" true
gateway sqlite "sqlite:$WORK/bench.db" "" true
gateway redis "$REDIS_URL" 'store_prefix = "idem-bench:"' true
gateway postgres "$PG_URL" 'store_table = "idem_bench_records"' true

# Tags have a fixed length, so every row sends requests of the same size.
RUN_TAG=$(date +%s)
ROW=0
ROWS=()
# run ROUND LABEL MODE CONNS URL
run() {
  local round=$1 label=$2 mode=$3 conns=$4 url=$5 threads=1
  [ "$conns" -gt 1 ] && threads=2
  ROW=$((ROW + 1))
  local tag warm
  tag=$(printf '%s-%04d' "$RUN_TAG" "$ROW")
  warm=$(printf '%s-w%03d' "$RUN_TAG" "$ROW")
  if [ "$mode" = replay ]; then
    # One completed key (per store), shared by the warm-ups and the measured runs.
    tag="$RUN_TAG-rkey"
    warm=$tag
    curl -s -o /dev/null -X POST "$url/charge" -H "Idempotency-Key: r-$tag" -H 'content-type: application/json' -d '{"amount":100}'
  fi
  wrk -t"$threads" -c"$conns" -d"${WARMUP}s" -s "$LUA" "$url" -- "$mode" "$warm" >/dev/null
  local line
  line=$(wrk -t"$threads" -c"$conns" -d"${DURATION}s" -s "$LUA" "$url" -- "$mode" "$tag" | grep '^RESULT')
  read -r _ rps p50 p99 non2xx errs <<<"$line"
  echo "round $round | $label | $mode | c=$conns | $rps req/s | p50 ${p50}us | p99 ${p99}us | non-2xx $non2xx | errors $errs | load $(cut -d' ' -f1 /proc/loadavg)" >&2
  ROWS+=("$round|$label|$mode|$conns|$rps|$p50|$p99|$non2xx|$errs")
}

for round in $(seq 1 "$ROUNDS"); do
  for c in 1 64; do
    for t in "${TARGETS[@]}"; do
      label=${t%%|*} url=${t#*|}
      case $label in
        "upstream direct"|"plain proxy") run "$round" "$label" none "$c" "$url" ;;
        *) for mode in unique replay; do run "$round" "$label" "$mode" "$c" "$url"; done ;;
      esac
    done
  done
done
psql -h 127.0.0.1 -U postgres -d test -q -c 'DROP TABLE IF EXISTS idem_bench_records' >/dev/null 2>&1 || true

# Markdown table: per row the median over the rounds; the ratio is the median of the
# per-round ratios against the plain proxy at the same concurrency, with their range.
printf '%s\n' "${ROWS[@]}" | python3 -c '
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in sys.stdin if l.strip()]
plain = {(r[0], r[3]): float(r[4]) for r in rows if r[1] == "plain proxy"}
order, groups = [], {}
for rnd, label, mode, conns, rps, p50, p99, non2xx, errs in rows:
    key = (label, mode, conns)
    if key not in groups:
        order.append(key)
        groups[key] = []
    base = plain.get((rnd, conns))
    groups[key].append((float(rps), int(p50), int(p99), int(non2xx) + int(errs), float(rps) / base if base else float("nan")))
labels = list(dict.fromkeys(k[0] for k in order))
modes = ["none", "unique", "replay"]
order.sort(key=lambda k: (labels.index(k[0]), modes.index(k[1]), int(k[2])))
print("| setup | keys | conns | req/s | p50 | p99 | vs plain proxy | ratio range | non-2xx |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for label, mode, conns in order:
    g = groups[(label, mode, conns)]
    med = lambda i: statistics.median(x[i] for x in g)
    ratios = [x[4] for x in g]
    keys = {"none": "no key", "unique": "unique", "replay": "replay"}[mode]
    print(f"| {label} | {keys} | {conns} | {med(0):,.0f} | {med(1)/1000:.2f} ms | {med(2)/1000:.2f} ms | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | {sum(x[3] for x in g)} |")
print()
print(f"rounds: {len(next(iter(groups.values())))}")
'
