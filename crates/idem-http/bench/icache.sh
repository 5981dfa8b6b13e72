#!/usr/bin/env bash
# Cold-cache cost per fresh-key request, simulated (valgrind callgrind --cache-sim=yes), so it
# is repeatable whatever else the machine runs: instructions, L1 instruction-cache misses and L1
# data-cache misses per request of the plain route, of idem's layer, and of the bench-only floor
# layer (examples/bench_server/floor.rs) with raw-byte and canonical-JSON fingerprints. Each
# request starts with caches cold: THRASH bytes are written in between, as the kernel and the
# network stack do in a real server.
# Usage: crates/idem-http/bench/icache.sh [requests-per-round] [thrash-bytes]
# Per request follows as in instructions.sh: one round (2n plain + n layer) and two rounds
# (3n plain + 2n layer) of bench_inproc with ONLY_UNIQUE.
set -euo pipefail
n=${1:-2000}
thrash=${2:-1048576}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
cd "$here/../../.."
inproc_for_valgrind
events() { # callgrind file -> "Ir I1mr D1mr D1mw" inclusive in Oneshot::poll
  callgrind_annotate --inclusive=yes "$1" 2>/dev/null |
    awk '/\?\?\?:<tower::util::oneshot::Oneshot<S,Req> as core::future::future::Future>::poll / {
      gsub(/\([^)]*\)/, ""); gsub(",", ""); print $1, $4, $5, $6; exit }'
}
for path in /idem /floor /floor-json; do
  for rounds in 1 2; do
    THRASH=$thrash UNIQUE_PATH=$path ONLY_UNIQUE=1 valgrind --tool=callgrind --cache-sim=yes \
      --callgrind-out-file="$out/$rounds" "$bin" "$n" "$rounds" >/dev/null 2>&1
  done
  python3 - "$path" "$n" "$(events "$out/1")" "$(events "$out/2")" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
a = [int(x) for x in sys.argv[3].split()]
c = [int(x) for x in sys.argv[4].split()]
plain = [(x - (y - x)) / n for x, y in zip(a, c)]
layer = [(y - x) / n - p for x, y, p in zip(a, c, plain)]
def row(name, v):
    print(f"{name:<19} Ir {v[0]:7.0f}  I1 misses {v[1]:6.0f}  D1 misses {v[2] + v[3]:6.0f}")
if path == "/idem":
    row("plain", plain)
row(path.strip("/") + " (fresh)", layer)
PY
done
