#!/usr/bin/env bash
# Instructions per request (valgrind callgrind; repeatable whatever else the machine runs) of the
# same trivial axum handler without the layer, with it on fresh keys, and with it on a replay.
# Usage: crates/idem-http/bench/instructions.sh [requests-per-round]
#
# bench_inproc drives plain, unique and replay requests through tower's `oneshot` in rounds; its
# ONLY_UNIQUE / ONLY_REPLAY switches and a one- and a two-round run give three totals of the
# `Oneshot::poll` inclusive cost, from which the per-request cost of each kind follows:
#   A = 2n·plain + n·unique (one round, ONLY_UNIQUE)   C = 3n·plain + 2n·unique (two rounds)
#   B = 2n·plain + 2n·replay (one round, ONLY_REPLAY)
set -euo pipefail
n=${1:-5000}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
cd "$here/../../.."
inproc_for_valgrind
total() { # callgrind file -> inclusive instructions of Oneshot::poll
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
    awk '/\?\?\?:<tower::util::oneshot::Oneshot<S,Req> as core::future::future::Future>::poll / {gsub(",", "", $1); print $1; exit}'
}
ONLY_UNIQUE=1 valgrind --tool=callgrind --callgrind-out-file="$out/a" "$bin" "$n" 1 >/dev/null 2>&1
ONLY_UNIQUE=1 valgrind --tool=callgrind --callgrind-out-file="$out/c" "$bin" "$n" 2 >/dev/null 2>&1
ONLY_REPLAY=1 valgrind --tool=callgrind --callgrind-out-file="$out/b" "$bin" "$n" 1 >/dev/null 2>&1
python3 - "$(total "$out/a")" "$(total "$out/b")" "$(total "$out/c")" "$n" <<'PY'
import sys
a, b, c, n = (int(x) for x in sys.argv[1:5])
plain = (a - (c - a)) / n
unique = (c - a) / n - plain
replay = (b / n - 2 * plain) / 2
print(f"plain  {plain:8.0f} instructions/request")
print(f"unique {unique:8.0f} (+{unique - plain:.0f}, {unique / plain:.2f}x plain)")
print(f"replay {replay:8.0f} (+{replay - plain:.0f}, {replay / plain:.2f}x plain)")
PY
