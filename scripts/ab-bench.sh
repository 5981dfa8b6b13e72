#!/usr/bin/env bash
# A/B of the crate benches: an earlier commit (A) against the current tree (B), or against a
# second commit, alternated in one run. Each side builds and runs its OWN tree's bench code
# (so API changes between the commits do not matter); rows are matched by name. Prints one
# markdown table on stdout: row, A median, B median, and B/A = the median of the per-round
# ratios with their [min–max]. B/A is always "how much faster B is": B throughput ÷ A
# throughput for the Redis rows (operations/s), A time ÷ B time for the engine rows (divan's
# median time per operation). Above 1: B is faster; below 1: B is slower. Rows that only one
# side has are listed as such. Progress on stderr.
#
#   scripts/ab-bench.sh REV            # A = REV, B = the tree this script is in
#   scripts/ab-bench.sh REV REV_B      # A = REV, B = REV_B (both in worktrees): for bisecting
#
# Benches (AB_BENCHES, default "engine redis"):
#   engine  crates/idem-core/benches/engine.rs (divan; engine + MemoryStore, and baselines)
#           run as `engine --bench --min-time SECS --max-time SECS [AB_ENGINE_FILTER]`, so
#           every function × thread count gets SECS; the median column of divan's table is
#           read. Rows: "engine <function> t=<threads>".
#   redis   crates/idem-redis/benches/store.rs (its own private redis-server) run with
#           IDEM_BENCH_ROUNDS=1 IDEM_BENCH_SECS=SECS; its "Per round" table is read by column
#           name (ratio columns skipped). Rows: "redis c=<concurrency> <column>".
# The same-code rows (engine baseline_* and runtime_block_on_noop, redis raw SET NX PX and
# redis-benchmark) are controls: their B/A shows how far the noise of the run reaches.
#
# Knobs (environment):
#   ROUNDS (5)            rounds; A then B on odd rounds, B then A on even ones
#   SECS (1)              seconds per cell (per divan function and thread count; per Redis row)
#   AB_BENCHES            "engine redis" (default), "engine" or "redis"
#   AB_ENGINE_FILTER      divan filters, e.g. "first_request replay" (default: every function)
#   AB_REDIS_CONCURRENCY  one level for the Redis bench, e.g. 64 (default: its own, 1 and 64)
#   AB_TARGET_A (/var/tmp/idem-target-ab-a), AB_TARGET_B (/var/tmp/idem-target-ab-b, only
#                         with REV_B): cargo target dirs of the worktrees, kept between runs so
#                         the next build is incremental. The current tree builds in its own
#                         target dir (CARGO_TARGET_DIR or the workspace's).
#   AB_RAW=FILE           also write every measurement (round, side, row, unit, value) as TSV
# Needs python3; the redis bench needs redis-server, redis-cli and redis-benchmark on PATH.
# The worktrees live in the system temp dir and are removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

REV=${1:?usage: scripts/ab-bench.sh REV [REV_B]}
REV_B=${2:-}
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-1}
AB_BENCHES=${AB_BENCHES:-engine redis}
AB_ENGINE_FILTER=${AB_ENGINE_FILTER:-}
AB_REDIS_CONCURRENCY=${AB_REDIS_CONCURRENCY:-}
AB_TARGET_A=${AB_TARGET_A:-/var/tmp/idem-target-ab-a}
AB_TARGET_B=${AB_TARGET_B:-/var/tmp/idem-target-ab-b}

for b in $AB_BENCHES; do
  case $b in engine | redis) ;; *) echo "unknown bench '$b' (engine, redis)" >&2; exit 2 ;; esac
done
if [[ " $AB_BENCHES " == *" redis "* ]]; then
  for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (the redis bench needs it)" >&2; exit 1; }
  done
fi

WORK=$(mktemp -d)
cleanup() {
  for tree in "$WORK/tree-a" "$WORK/tree-b"; do
    if [ -d "$tree" ]; then git worktree remove --force "$tree" >/dev/null 2>&1 || true; fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The bench executable cargo builds for BENCH in the tree DIR, with target dir TARGET ("" for
# the tree's default). Each tree's own Cargo.lock is used as it is.
build() {
  local dir=$1 target=$2 bench=$3 pkg
  case $bench in engine) pkg="idem-core --bench engine" ;; redis) pkg="idem-redis --bench store" ;; esac
  # shellcheck disable=SC2086
  (cd "$dir" && if [ -n "$target" ]; then export CARGO_TARGET_DIR=$target; fi &&
    cargo bench -p $pkg --no-run --message-format=json-render-diagnostics) |
    python3 -c '
import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable")
       and "bench" in m["target"]["kind"]]
if not exe:
    sys.exit("no bench executable in cargo output")
print(exe[-1])'
}

describe() { git -C "$1" log -1 --format='%h %s' | cut -c1-90; }

git worktree add --detach "$WORK/tree-a" "$REV" >&2
A_DIR=$WORK/tree-a
A_TARGET=$AB_TARGET_A
if [ -n "$REV_B" ]; then
  git worktree add --detach "$WORK/tree-b" "$REV_B" >&2
  B_DIR=$WORK/tree-b
  B_TARGET=$AB_TARGET_B
else
  B_DIR=$PWD
  B_TARGET=${CARGO_TARGET_DIR:-}
fi

declare -A EXE
for bench in $AB_BENCHES; do
  echo "== building $bench: A ($(describe "$A_DIR"))" >&2
  EXE[a-$bench]=$(build "$A_DIR" "$A_TARGET" "$bench")
  cp "${EXE[a-$bench]}" "$WORK/a-$bench"
  echo "== building $bench: B ($(describe "$B_DIR"))$([ -z "$REV_B" ] && ! git diff --quiet HEAD -- && echo ' + uncommitted changes')" >&2
  EXE[b-$bench]=$(build "$B_DIR" "$B_TARGET" "$bench")
  cp "${EXE[b-$bench]}" "$WORK/b-$bench"
done

# Turns one run's output (stdin) into "row<TAB>unit<TAB>value" lines.
parse() {
  python3 -c '
import re, sys
kind = sys.argv[1]
text = sys.stdin.read()
out = []
if kind == "engine":
    # divan: a tree of names, then fastest | slowest | median | mean | samples | iters.
    scale = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
    time = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ps|ns|µs|us|ms|s)(?=\s|│|$)")
    stack, header = [], False
    for line in text.splitlines():
        if "fastest" in line and "median" in line:
            header = True
            continue
        if not header or not line.strip():
            continue
        m = re.match(r"^([│├╰─ ]*)(\S+)", line)
        if not m or not m.group(1):
            continue
        depth = len(m.group(1)) // 3 - 1
        stack[depth:] = [m.group(2)]
        times = time.findall(line[m.end():])
        if len(times) >= 3:
            v, u = times[2]
            out.append((" ".join(["engine"] + stack), "ns", float(v) * scale[u]))
else:
    # The redis bench: the first markdown table whose header has "concurrency".
    cols = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cols is None:
            if line.startswith("|") and "concurrency" in cells:
                cols = cells
            continue
        if not line.startswith("|"):
            break
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(cols, cells))
        level = row.get("concurrency", "?")
        for name, value in row.items():
            if name in ("concurrency", "round") or name.startswith("ratio"):
                continue
            try:
                out.append((f"redis c={level} {name}", "ops/s", float(value)))
            except ValueError:
                pass
if not out:
    sys.exit(f"no {kind} figures in the output")
for row, unit, value in out:
    print(f"{row}\t{unit}\t{value}")
' "$1"
}

run() {
  local round=$1 side=$2 bench=$3 out="$WORK/$2-$3-$1.out"
  echo "round $round/$ROUNDS: $side $bench" >&2
  case $bench in
    engine)
      # shellcheck disable=SC2086
      "$WORK/$side-engine" --bench --min-time "$SECS" --max-time "$SECS" $AB_ENGINE_FILTER >"$out" 2>"$out.err" ;;
    redis)
      env IDEM_BENCH_ROUNDS=1 IDEM_BENCH_SECS="$SECS" \
        ${AB_REDIS_CONCURRENCY:+IDEM_BENCH_CONCURRENCY=$AB_REDIS_CONCURRENCY} \
        "$WORK/$side-redis" --bench >"$out" 2>"$out.err" ;;
  esac || { echo "$side $bench failed:" >&2; tail -20 "$out.err" >&2; exit 1; }
  parse "$bench" <"$out" | sed "s/^/$round\t$side\t/" >>"$WORK/raw.tsv"
}

: >"$WORK/raw.tsv"
for round in $(seq 1 "$ROUNDS"); do
  order="a b"
  [ $((round % 2)) -eq 0 ] && order="b a"
  for bench in $AB_BENCHES; do
    for side in $order; do run "$round" "$side" "$bench"; done
  done
done
if [ -n "${AB_RAW:-}" ]; then cp "$WORK/raw.tsv" "$AB_RAW"; fi

python3 - "$WORK/raw.tsv" "$(describe "$A_DIR")" "$(describe "$B_DIR")" "$ROUNDS" "$SECS" <<'PY'
import statistics, sys
path, a_name, b_name, rounds, secs = sys.argv[1:]
vals, units, order = {}, {}, []
for line in open(path):
    rnd, side, row, unit, value = line.rstrip("\n").split("\t")
    if row not in units:
        order.append(row)
    units[row] = unit
    vals.setdefault((row, side), {})[rnd] = float(value)

def fmt(v, unit):
    if unit == "ns":
        return f"{v:,.0f} ns" if v >= 100 else f"{v:.1f} ns"
    return f"{v:,.0f}/s"

print(f"A: {a_name}  \nB: {b_name}  \nB/A > 1: B faster (engine rows: A time ÷ B time per operation; "
      f"redis rows: B ops/s ÷ A ops/s); median of {rounds} per-round ratios [min–max], {secs} s per cell")
print()
print("| row | A median | B median | B/A | range |")
print("|---|---:|---:|---:|---:|")
for row in order:
    a, b, unit = vals.get((row, "a"), {}), vals.get((row, "b"), {}), units[row]
    if not a or not b:
        side = "A" if a else "B"
        only = a or b
        cell = fmt(statistics.median(only.values()), unit)
        print(f"| {row} | {cell if a else '—'} | {cell if b else '—'} | only on {side} | |")
        continue
    common = sorted(set(a) & set(b), key=int)
    ratios = [(a[r] / b[r]) if unit == "ns" else (b[r] / a[r]) for r in common]
    print(f"| {row} | {fmt(statistics.median(a.values()), unit)} | {fmt(statistics.median(b.values()), unit)} "
          f"| **{statistics.median(ratios):.2f}** | {min(ratios):.2f}–{max(ratios):.2f} |")
PY
