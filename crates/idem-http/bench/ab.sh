#!/usr/bin/env bash
# A/B of environment variants of the same bench_server (allocator, store capacity, tunables):
# one server per variant runs side by side, and each round measures plain, fresh keys, plain,
# replays on every variant in turn, so machine drift hits all variants alike.
# Usage: crates/idem-http/bench/ab.sh CONNS SECONDS ROUNDS LABEL "ENV=VALUE ..." [LABEL "ENV ..."]...
#   e.g. ab.sh 8 4 3 glibc "X=1" mimalloc "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
# Prints per variant and round: plain and fresh-key requests/s, fresh/plain and replay/plain.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,7p' "$0" >&2; exit 2; }
conns=$1 secs=$2 rounds=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
cd "$here/../../.."
need wrk wrk
server=$(example_binary bench_server)
labels=() ports=() pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
while [ $# -ge 2 ]; do
  port=$((4200 + ${#ports[@]}))
  # shellcheck disable=SC2086 # the variant's assignments are meant to split
  env $2 BENCH_ADDR=127.0.0.1:$port "$server" 2>/dev/null &
  pids+=($!) labels+=("$1") ports+=("$port")
  shift 2
done
for port in "${ports[@]}"; do
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
done
rps() { # path mode port
  BENCH_PATH=$1 KEY_MODE=$2 wrk -t1 -c"$conns" -d"${secs}s" -s "$here/post.lua" "http://127.0.0.1:$3" |
    awk '/Requests\/sec/ {print $2}'
}
for port in "${ports[@]}"; do # complete the replay key over one connection, then warm up
  BENCH_PATH=/idem KEY_MODE=replay wrk -t1 -c1 -d1s -s "$here/post.lua" "http://127.0.0.1:$port" >/dev/null
  rps /plain none "$port" >/dev/null
done
for round in $(seq "$rounds"); do
  for i in "${!ports[@]}"; do
    p=$(rps /plain none "${ports[$i]}") u=$(rps /idem unique "${ports[$i]}")
    p2=$(rps /plain none "${ports[$i]}") r=$(rps /idem replay "${ports[$i]}")
    echo "$round ${labels[$i]} $p $u $p2 $r" |
      awk '{printf "round %s %-12s plain %8.0f fresh %8.0f fresh/plain %.2f replay/plain %.2f\n", $1, $2, $3, $4, $4/$3, $6/$5}'
  done
done
