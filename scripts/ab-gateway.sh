#!/usr/bin/env bash
# A/B load bench of the gateway: an earlier commit's `idem` (A) against the current tree's
# (B), alternated in one run, on the memory and Redis stores, fresh keys and replays, at 1
# and 64 connections. Prints a markdown table with each row's B/A ratio (the median of the
# per-round ratios, and their range) and each side against the plain proxy of the same
# round; progress on stderr.
#
#   scripts/ab-gateway.sh REV [DURATION_SECONDS]      (default 5)
#   A_BIN=/path/to/idem scripts/ab-gateway.sh - [DURATION_SECONDS]
#
# REV is built in a worktree of its own (in the system temp dir, removed afterwards) with
# `cargo build --release -p idem-gateway`; A_BIN skips that. Both sides share one sample
# upstream (B's) and one plain proxy (B's, the baseline), all running for the whole bench.
# Each round measures every row once, A then B then B then A on alternate rounds, so drift
# hits both sides alike. ROUNDS (default 3) and WARMUP (default 2) as in bench-gateway.sh,
# whose wrk script this uses. Needs wrk and Redis on 127.0.0.1:6379.
set -euo pipefail
cd "$(dirname "$0")/.."

REV=${1:?usage: scripts/ab-gateway.sh REV [DURATION] (or A_BIN=... with REV -)}
DURATION=${2:-5}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
LUA=scripts/bench-gateway.lua

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install -y wrk" >&2; exit 1; }
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -d "$WORK/tree" ]; then git worktree remove --force "$WORK/tree" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

TARGET_DIR=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
if [ -n "${A_BIN:-}" ]; then
  cp "$A_BIN" "$WORK/idem-a"
else
  git worktree add --detach "$WORK/tree" "$REV" >&2
  (cd "$WORK/tree" && cargo build --release -p idem-gateway >&2)
  cp "$TARGET_DIR/release/idem" "$WORK/idem-a"
fi
cargo build --release -p idem-gateway >&2
cp "$TARGET_DIR/release/idem" "$WORK/idem-b"

start() {
  local name=$1; shift
  "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=($!)
  ADDR=
  for _ in $(seq 1 200); do
    ADDR=$(grep -oE '(idem listening|sample upstream) on http://[0-9.:]+' "$WORK/$name.out" | head -1 | sed 's|.*http://||' || true)
    if [ -n "$ADDR" ]; then return 0; fi
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then cat "$WORK/$name.err" >&2; return 1; fi
    sleep 0.05
  done
  echo "$name did not start" >&2; return 1
}

start upstream "$WORK/idem-b" sample-upstream --listen 127.0.0.1:0
UP=$ADDR
declare -A URL
gateway() {
  local side=$1 label=$2 store=$3 extra=$4 idem=$5 name="$1-${2// /_}"
  cat >"$WORK/$name.toml" <<EOF
upstream = "http://$UP"
store = "$store"
$extra
[log]
level = "warn"
[defaults]
idempotency = $idem
namespace = "bench-$side"
principal = { from = "none" }
EOF
  start "gw-$name" "$WORK/idem-$side" serve --config "$WORK/$name.toml" --listen 127.0.0.1:0
  URL["$side|$label"]="http://$ADDR"
  echo "$side $label on $ADDR" >&2
}
gateway b "plain proxy" "memory:" "" false
for side in a b; do
  gateway "$side" memory "memory:" "" true
  gateway "$side" redis "$REDIS_URL" "store_prefix = \"idem-ab-$side:\"" true
done

RUN_TAG=$(date +%s)
ROW=0
ROWS=()
run() {
  local round=$1 side=$2 label=$3 mode=$4 conns=$5 url=$6 threads=1
  [ "$conns" -gt 1 ] && threads=2
  ROW=$((ROW + 1))
  local tag warm
  tag=$(printf '%s-%04d' "$RUN_TAG" "$ROW")
  warm=$(printf '%s-w%03d' "$RUN_TAG" "$ROW")
  if [ "$mode" = replay ]; then
    tag="$RUN_TAG-rkey"
    warm=$tag
    curl -s -o /dev/null -X POST "$url/charge" -H "Idempotency-Key: r-$tag" -H 'content-type: application/json' -d '{"amount":100}'
  fi
  wrk -t"$threads" -c"$conns" -d"${WARMUP}s" -s "$LUA" "$url" -- "$mode" "$warm" >/dev/null
  local line
  line=$(wrk -t"$threads" -c"$conns" -d"${DURATION}s" -s "$LUA" "$url" -- "$mode" "$tag" | grep '^RESULT')
  read -r _ rps p50 p99 non2xx errs <<<"$line"
  echo "round $round | $side | $label | $mode | c=$conns | $rps req/s | p50 ${p50}us | non-2xx $non2xx | errors $errs" >&2
  ROWS+=("$round|$side|$label|$mode|$conns|$rps|$p50|$p99|$((non2xx + errs))")
}

for round in $(seq 1 "$ROUNDS"); do
  order="a b"
  [ $((round % 2)) -eq 0 ] && order="b a"
  for c in 1 64; do
    run "$round" base "plain proxy" none "$c" "${URL[b|plain proxy]}"
    for label in memory redis; do
      for mode in unique replay; do
        for side in $order; do
          run "$round" "$side" "$label" "$mode" "$c" "${URL[$side|$label]}"
        done
      done
    done
  done
done

printf '%s\n' "${ROWS[@]}" | python3 -c '
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in sys.stdin if l.strip()]
plain = {(r[0], r[4]): float(r[5]) for r in rows if r[1] == "base"}
rps = {}
for rnd, side, label, mode, conns, r, p50, p99, bad in rows:
    if side != "base":
        rps[(rnd, side, label, mode, conns)] = (float(r), int(bad))
keys = sorted({(l, m, c) for (_, s, l, m, c) in rps}, key=lambda k: (k[0], k[1], int(k[2])))
rounds = sorted({r for (r, *_) in rps})
print("| store | keys | conns | A req/s | B req/s | B/A | B/A range | A vs plain | B vs plain | non-2xx |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for label, mode, conns in keys:
    a = [rps[(r, "a", label, mode, conns)][0] for r in rounds]
    b = [rps[(r, "b", label, mode, conns)][0] for r in rounds]
    ratio = [y / x for x, y in zip(a, b)]
    base = [plain[(r, conns)] for r in rounds]
    bad = sum(rps[(r, s, label, mode, conns)][1] for r in rounds for s in "ab")
    print(f"| {label} | {mode} | {conns} | {statistics.median(a):,.0f} | {statistics.median(b):,.0f} | {statistics.median(ratio):.2f}x | {min(ratio):.2f}-{max(ratio):.2f} | {statistics.median(x / p for x, p in zip(a, base)):.2f}x | {statistics.median(y / p for y, p in zip(b, base)):.2f}x | {bad} |")
print()
print(f"rounds: {len(rounds)}, {sys.argv[1]} s each")
' "$DURATION"
