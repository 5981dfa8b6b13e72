#!/usr/bin/env bash
# Instructions per engine operation (valgrind callgrind: repeatable whatever else the machine
# runs), for an earlier commit against the current tree: first requests and replays through
# `Engine::run` on the memory store (crates/idem-core/benches/instructions.rs).
#
#   scripts/instructions-engine.sh REV         (N=4000 M=1000 by default)
#
# REV is built in a worktree, with this tree's driver copied in when REV has none: it uses only
# `Engine::new` and `Engine::run`, adjusted to REV's forms where they differed (the answer was
# called `Outcome`, and `Engine::new` returned a `Result`). Each side runs N and M operations of
# each kind; the per-operation figure is (total(N) - total(M)) / (N - M), so start-up cancels.
# Prints a markdown table; B/A above 1 means the current tree runs more instructions.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-4000}
M=${M:-1000}
REV=${1:?usage: $0 REV}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install -y valgrind" >&2; exit 1; }
WORK=$(mktemp -d)
TREE_A="$WORK/a"
TARGET_A=${AB_TARGET_A:-/var/tmp/idem-target-ab-a}
cleanup() {
  git worktree remove --force "$TREE_A" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

git worktree add --detach -q "$TREE_A" "$REV"
DRIVER=crates/idem-core/benches/instructions.rs
if [ ! -f "$TREE_A/$DRIVER" ]; then
  cp "$DRIVER" "$TREE_A/$DRIVER"
  printf '\n[[bench]]\nname = "instructions"\nharness = false\n' >>"$TREE_A/crates/idem-core/Cargo.toml"
fi
# Before the carriers' typed outcome, `Engine::run` answered with `Outcome` (same variants).
if ! grep -qw Answer "$TREE_A/crates/idem-core/src/lib.rs"; then
  sed -i 's/\bAnswer\b/Outcome/g' "$TREE_A/$DRIVER"
fi
if grep -q 'pub fn new(store: S, policy: Policy) -> Result<Self' "$TREE_A/crates/idem-core/src/engine/mod.rs"; then
  sed -i 's/Engine::new(store, Policy::default());/Engine::new(store, Policy::default()).expect("engine");/' "$TREE_A/$DRIVER"
fi

# Builds the driver in tree $1 with target dir $2 and prints the binary's path.
build() {
  (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench -p idem-core --bench instructions --no-run \
    --message-format json 2>/dev/null) |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "instructions" and m.get("executable"):
        print(m["executable"])'
}
echo "building $REV" >&2
BIN_A=$(build "$TREE_A" "$TARGET_A")
echo "building the current tree" >&2
BIN_B=$(build . "${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')}")
[ -x "$BIN_A" ] && [ -x "$BIN_B" ] || { echo "a build failed" >&2; exit 1; }

# Total instructions of BIN running COUNT operations of KIND.
total() {
  local out="$WORK/cg.$RANDOM"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$1" "$3" "$2" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$out"
}
per_op() { echo $(( ($(total "$1" "$N" "$2") - $(total "$1" "$M" "$2")) / (N - M) )); }

echo "| operation | $REV | current tree | B/A |"
echo "|---|---:|---:|---:|"
for kind in fresh replay; do
  a=$(per_op "$BIN_A" "$kind")
  b=$(per_op "$BIN_B" "$kind")
  echo "| $kind | $a | $b | $(python3 -c "print(f'{$b/$a:.3f}')") |"
done
