#!/usr/bin/env bash
# Builds @idem/client, runs its tests against the real gateway, and packs it.
# Binaries: IDEM_BIN (default /var/tmp/idem-bins/idem) and IDEM_FAULT_PROXY_BIN
# (default /var/tmp/idem-bins/idem-fault-proxy).
set -euo pipefail
cd "$(dirname "$0")"

export IDEM_BIN="${IDEM_BIN:-/var/tmp/idem-bins/idem}"
export IDEM_FAULT_PROXY_BIN="${IDEM_FAULT_PROXY_BIN:-/var/tmp/idem-bins/idem-fault-proxy}"
for bin in "$IDEM_BIN" "$IDEM_FAULT_PROXY_BIN"; do
  if [[ ! -x "$bin" ]]; then
    echo "error: $bin is not an executable (set IDEM_BIN / IDEM_FAULT_PROXY_BIN)" >&2
    exit 2
  fi
done

echo "== npm ci"
npm ci --no-audit --no-fund
echo "== npm run build"
rm -rf dist
npm run build
echo "== types (test/types.ts against dist/*.d.ts)"
npx tsc -p test/tsconfig.json
echo "== node --test"
node --test test/*.test.mjs
echo "== npm pack"
pack_dir="$(mktemp -d)"
trap 'rm -rf "$pack_dir"' EXIT
npm pack --pack-destination "$pack_dir"
tarball="$(ls "$pack_dir"/*.tgz)"
# The package must hold the compiled code and its types, and nothing from test/ or src/.
listing="$(tar -tzf "$tarball")"
for f in package/dist/index.js package/dist/index.d.ts package/README.md package/package.json; do
  grep -qx "$f" <<<"$listing" || { echo "error: $f missing from the package" >&2; exit 1; }
done
if grep -q '^package/test/' <<<"$listing"; then
  echo "error: tests shipped in the package" >&2
  exit 1
fi
echo "== ok: $(basename "$tarball") built and tested"
