#!/usr/bin/env bash
# Builds every cargo-fuzz target in fuzz/ and runs each for a short, bounded time
# (FUZZ_SECONDS, default 10), so the targets keep compiling against the crates they test and
# a shallow crash or broken round trip is caught on every CI run. Not a fuzzing campaign: run
# `cargo fuzz run <target>` for longer when a parser changes.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-10}
# cargo-fuzz passes nightly-only rustc flags (the sanitizer, coverage instrumentation); the
# stable compiler accepts them with RUSTC_BOOTSTRAP=1, so no nightly toolchain is fetched.
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --version 0.13.2 --locked
fi
cd fuzz
start=$(date +%s)
cargo fuzz build
ran=0
for target in $(cargo fuzz list); do
  # New inputs go to the first corpus (kept out of git); seeds/ holds committed valid
  # inputs that get a structured parser past its first checks.
  mkdir -p "corpus/$target"
  corpora=("corpus/$target")
  if [ -d "seeds/$target" ]; then corpora+=("seeds/$target"); fi
  echo "fuzzing $target for ${seconds}s"
  # libFuzzer's progress goes to a log (artifacts/ is kept out of git); a crash prints it.
  mkdir -p artifacts
  log="artifacts/$target.log"
  if ! cargo fuzz run "$target" "${corpora[@]}" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    echo "fuzz target $target failed (its crashing input is under fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
  ran=$((ran + 1))
done
echo "fuzz smoke: every target built and ran (${seconds}s each) in $(( $(date +%s) - start ))s"
# The summary in the form CI reads as a closing test line (a crash exited above).
echo "fuzz: $ran passed, 0 failed"
