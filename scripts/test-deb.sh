#!/usr/bin/env bash
# Builds the gateway's Debian package, installs it (`dpkg -i`), checks what it installed,
# starts the unit's own command as the unit's user against its shipped configuration and
# sends it a request, then purges the package. Needs root and dpkg: under CI their absence
# fails; elsewhere it is said and skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ] || ! command -v dpkg >/dev/null; then
  if [ -n "${CI:-}" ]; then echo "test-deb: needs root and dpkg under CI" >&2; exit 1; fi
  echo "!!! SKIPPING test-deb: needs root and dpkg"; exit 0
fi
if dpkg -s idem >/dev/null 2>&1; then
  echo "test-deb: a package named idem is already installed; not touching it" >&2; exit 1
fi
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
cargo build -q -p idem-gateway --bin idem
work=$(mktemp -d)
gateway=""; upstream=""
cleanup() {
  [ -n "$gateway" ] && kill "$gateway" 2>/dev/null || true
  [ -n "$upstream" ] && kill "$upstream" 2>/dev/null || true
  dpkg --purge idem >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
deb=$(packaging/build-deb.sh "$target/debug/idem" "$work")
dpkg -i "$deb" >/dev/null
fail() { echo "test-deb: $*" >&2; exit 1; }
for f in /usr/bin/idem /lib/systemd/system/idem.service /etc/idem/idem.toml /usr/share/doc/idem/gateway.md /usr/share/doc/idem/openapi.json; do
  [ -e "$f" ] || fail "$f was not installed"
done
getent passwd idem >/dev/null || fail "no idem user"
[ "$(stat -c %U /var/lib/idem)" = idem ] || fail "/var/lib/idem is not the idem user's"
grep -qx '/etc/idem/idem.toml' /var/lib/dpkg/info/idem.conffiles || fail "the config is not a conffile"
/usr/bin/idem check-config --config /etc/idem/idem.toml | grep -q '^ok: configuration is valid' || fail "the shipped config is invalid"
# The unit's command, as the unit's user, from the unit's working directory.
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/idem.service)
user=$(sed -n 's/^User=//p' /lib/systemd/system/idem.service)
/usr/bin/idem sample-upstream --listen 127.0.0.1:3000 >"$work/upstream.log" 2>&1 & upstream=$!
(cd /var/lib/idem && exec runuser -u "$user" -- $exec_start) >"$work/gateway.log" 2>&1 & gateway=$!
for _ in $(seq 1 100); do
  curl -s -o /dev/null http://127.0.0.1:8080/ && break
  sleep 0.1
done
first=$(curl -s -i -X POST http://127.0.0.1:8080/charge -H 'x-api-key: deb-test' -H 'Idempotency-Key: deb-1' \
  -H 'content-type: application/json' -d '{"amount":100}')
again=$(curl -s -i -X POST http://127.0.0.1:8080/charge -H 'x-api-key: deb-test' -H 'Idempotency-Key: deb-1' \
  -H 'content-type: application/json' -d '{"amount":100}')
echo "$first" | head -1 | grep -q ' 201' || { cat "$work/gateway.log"; fail "first request: $first"; }
echo "$again" | grep -qi '^idempotent-replayed: true' || fail "the retry was not a replay: $again"
[ -f /var/lib/idem/idem.db ] || fail "the store is not in the state directory"
echo "test-deb: installed, started as $user with the shipped config, answered and replayed; purged"
