# Shared by the bench scripts in this directory; source it, do not run it.

# need TOOL PACKAGE: stops with an install hint when TOOL is missing.
need() {
  command -v "$1" >/dev/null || { echo "$1 missing: apt-get install -y $2" >&2; exit 1; }
}

# example_binary NAME: builds idem-http's example NAME (release) from the workspace root, which
# must be the current directory, and prints the path of the built binary.
example_binary() {
  cargo build --release -q -p idem-http --example "$1" >&2 || return 1
  local target
  target=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') || return 1
  echo "$target/release/examples/$1"
}

# inproc_for_valgrind: needs valgrind, builds bench_inproc (its path in $bin), and makes a
# temporary directory ($out) that is removed on exit. Run from the workspace root.
inproc_for_valgrind() {
  need valgrind valgrind
  bin=$(example_binary bench_inproc)
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
}
