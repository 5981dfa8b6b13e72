#!/usr/bin/env bash
# Installs idem-client and its test dependencies in a venv (reused when present), runs the
# tests against the real gateway and fault proxy, and builds the sdist and wheel.
#
#   IDEM_BIN             the gateway binary      (default /var/tmp/idem-bins/idem)
#   IDEM_FAULT_PROXY_BIN the fault proxy binary  (default /var/tmp/idem-bins/idem-fault-proxy)
#   PYTHON               the interpreter for the venv (default python3)
#   extra arguments go to pytest
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TMPDIR:-/tmp}/idem-py-venv"
export IDEM_BIN="${IDEM_BIN:-/var/tmp/idem-bins/idem}"
export IDEM_FAULT_PROXY_BIN="${IDEM_FAULT_PROXY_BIN:-/var/tmp/idem-bins/idem-fault-proxy}"

for bin in "$IDEM_BIN" "$IDEM_FAULT_PROXY_BIN"; do
    if [[ ! -x "$bin" ]]; then
        echo "error: $bin is not an executable (set IDEM_BIN / IDEM_FAULT_PROXY_BIN)" >&2
        exit 2
    fi
done

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating venv $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "$here[test]"

cd "$here"
"$py" -m pytest -p no:cacheprovider "$@"

out="$(mktemp -d "${TMPDIR:-/tmp}/idem-py-dist.XXXXXX")"
trap 'rm -rf "$out"' EXIT
"$py" -m build --outdir "$out" "$here"
ls -l "$out"
