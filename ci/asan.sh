#!/usr/bin/env bash
# AddressSanitizer over the CPU backend (and the first wgpu adapter's host side): the CLI
# built with nightly's -Zsanitizer=address (into target/asan), then the CPU conformance suite
# (also at the narrower SIMD tiers), random operator graphs, the Rust API fuzzer and the
# first wgpu adapter's suite, all with exact-size allocations
# (UNIRT_ALLOC_EXACT=1): each tensor is then a host allocation of its own, so a kernel that
# reads or writes past a tensor's end touches ASan's red zone instead of a neighbour.
# Not part of ci/test.sh: it needs a nightly toolchain and its build takes several minutes.
# See docs/RELIABILITY.md ("Exact mode for out-of-bounds accesses").
#
#   ci/asan.sh [FUZZ_SECONDS]      (default 120)
set -uo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "asan.sh: no nightly toolchain (rustup toolchain install nightly); nothing run"
  exit 0
fi
host=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps the sanitizer off build scripts and proc macros.
RUSTFLAGS="-Zsanitizer=address -Cdebug-assertions=on -Coverflow-checks=on -Cforce-frame-pointers=yes" \
  CARGO_TARGET_DIR=target/asan cargo +nightly build --release --target "$host" -p unirt-cli \
  || { echo "asan.sh: build failed" >&2; exit 1; }
bin="target/asan/$host/release/unirt"
# Leaks: driver libraries and deliberately leaked handles are not this script's subject.
# allocator_may_return_null: conformance asks for absurd sizes and expects a typed error.
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:allocator_may_return_null=1
export UNIRT_ALLOC_EXACT=1
failures=0
run() {
  echo "== asan.sh: $*"
  "$@" || { echo "asan.sh: FAILED: $*" >&2; failures=$((failures + 1)); }
}
run "$bin" conformance --device cpu:0
for tier in avx2 none; do
  run env UNIRT_CPU_SIMD=$tier "$bin" conformance --device cpu:0 --filter ops::
done
run env UNIRT_GRAPH_FUZZ_SEEDS=300 "$bin" conformance --device cpu:0 \
  --filter graph::random_graphs_replay_as_eager
run "$bin" fuzz --device cpu --seconds "${1:-120}"
# The wgpu backend's host side (staging copies, mapped buffers, texture uploads) is
# instrumented too; the shaders run in the driver's code, which is not.
if "$bin" devices | grep -q "^  wgpu:0 "; then
  run "$bin" conformance --device wgpu:0
fi
if [ "$failures" -gt 0 ]; then
  echo "asan.sh: $failures failure(s)"
  exit 1
fi
echo "asan.sh: all passed"
