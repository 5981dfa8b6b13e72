#!/usr/bin/env bash
# Validates docs/openapi.json with a real OpenAPI 3.1 validator (openapi-spec-validator, in a
# virtualenv of its own). The gateway's unit test `the_committed_file_is_current` keeps the
# file equal to what the code generates; this checks the document itself is valid OpenAPI.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TMPDIR:-/tmp}/idem-openapi-venv"
if [ ! -x "$venv/bin/openapi-spec-validator" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'openapi-spec-validator==0.7.2'
fi
"$venv/bin/openapi-spec-validator" docs/openapi.json
