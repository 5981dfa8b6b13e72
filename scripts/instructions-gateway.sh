#!/usr/bin/env bash
# Instructions per request of the gateway (valgrind callgrind: repeatable whatever else the
# machine runs), for one or two `idem` binaries: fresh keys and replays through the memory
# store, in front of the sample upstream.
#
#   scripts/instructions-gateway.sh BIN [BIN ...]     (N=1200 M=200 by default)
#
# Each binary serves two runs per kind, of N and of M sequential POSTs through one keep-alive
# connection; the per-request figure is (total(N) - total(M)) / (N - M), so start-up and
# shutdown cancel. Counts every thread of the gateway process. Prints a markdown table.
set -euo pipefail
N=${N:-1200}
M=${M:-200}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install -y valgrind" >&2; exit 1; }
[ "$#" -ge 1 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 2; }
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 600); do
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on $1" >&2; return 1
}

UP=$(free_port)
"$1" sample-upstream --listen "127.0.0.1:$UP" >"$WORK/up.log" 2>&1 &
PIDS+=($!)
wait_port "$UP"

# Sends COUNT POSTs of /charge to PORT: a fresh key each (KIND=fresh) or one key (replay).
cat >"$WORK/load.py" <<'PY'
import http.client, sys, uuid
port, count, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
key = "replay-" + uuid.uuid4().hex
for i in range(count):
    k = uuid.uuid4().hex if kind == "fresh" else key
    conn.request("POST", "/charge", body='{"amount":42}',
                 headers={"Idempotency-Key": k, "Content-Type": "application/json"})
    r = conn.getresponse(); r.read()
    if r.status >= 300:
        sys.exit(f"status {r.status}")
PY

# Total instructions of one callgrind run of BIN serving COUNT requests of KIND.
total() {
  local bin=$1 count=$2 kind=$3 port out
  port=$(free_port)
  out="$WORK/cg.$RANDOM"
  cat >"$WORK/idem.toml" <<EOF
listen = "127.0.0.1:$port"
upstream = "http://127.0.0.1:$UP"
store = "memory:"
[log]
level = "warn"
[defaults]
principal = { from = "none" }
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
EOF
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" serve --config "$WORK/idem.toml" >"$WORK/gw.log" 2>&1 &
  local pid=$!
  wait_port "$port"
  python3 "$WORK/load.py" "$port" "$count" "$kind"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  grep -h '^summary:' "$out"* | awk '{s += $2} END {print s}'
  rm -f "$out"*
}

echo "| binary | fresh key, instructions/request | replay, instructions/request |"
echo "|---|---:|---:|"
for bin in "$@"; do
  row="| $(basename "$bin") |"
  for kind in fresh replay; do
    big=$(total "$bin" "$N" "$kind")
    small=$(total "$bin" "$M" "$kind")
    row="$row $(( (big - small) / (N - M) )) |"
  done
  echo "$row"
done
