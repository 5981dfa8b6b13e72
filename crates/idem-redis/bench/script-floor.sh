#!/usr/bin/env bash
# The floor of "one Lua script per store operation" on this Redis: how fast can the *smallest
# possible* claim and completion scripts go, against a raw SET NX PX, measured by
# redis-benchmark (the baseline the issue allows) against one private redis-server in one run.
#
#   crates/idem-redis/bench/script-floor.sh [requests]      (default 200000 at c=64)
#
# A first request is a claim script and a completion script, and each must at least write the
# record, so its throughput can be no better than half that of a script holding nothing but
# one SET. This prints that ceiling as a ratio to raw SET NX PX. A replay is one claim script
# that must at least read the record: its ceiling is a script holding one GET.
set -euo pipefail
n64=${1:-200000}
n1=$((n64 / 5))
command -v redis-server >/dev/null || { echo "redis-server missing" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$port" "$@"; }
set_sha=$(cli SCRIPT LOAD "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])")
get_sha=$(cli SCRIPT LOAD "return redis.call('GET', KEYS[1])")
cli SET floor:present v >/dev/null
# rate CONNS REQUESTS COMMAND... -> requests/s
rate() {
  local c=$1 n=$2; shift 2
  redis-benchmark -p "$port" -c "$c" -n "$n" -P 1 -r 100000000 --csv "$@" | tail -1 | cut -d, -f2 | tr -d '"'
}
printf '| conns | round | SET NX PX /s | script{SET} /s | first-request ceiling | GET /s | script{GET} /s | replay ceiling (vs SET) |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for c in 1 64; do
  n=$n64; [ "$c" = 1 ] && n=$n1
  for round in 1 2 3; do
    set_r=$(rate "$c" "$n" SET floor:s:__rand_int__ v NX PX 60000)
    sset_r=$(rate "$c" "$n" EVALSHA "$set_sha" 1 floor:e:__rand_int__ v 60000)
    get_r=$(rate "$c" "$n" GET floor:present)
    sget_r=$(rate "$c" "$n" EVALSHA "$get_sha" 1 floor:present)
    cli FLUSHALL >/dev/null; cli SET floor:present v >/dev/null
    python3 - "$c" "$round" "$set_r" "$sset_r" "$get_r" "$sget_r" <<'PY'
import sys
c, rnd, s, ss, g, sg = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
print(f"| {c} | {rnd} | {s:,.0f} | {ss:,.0f} | {ss / (2 * s):.2f} | {g:,.0f} | {sg:,.0f} | {sg / s:.2f} |")
PY
  done
done
