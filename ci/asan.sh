#!/usr/bin/env bash
# AddressSanitizer over the CPU backend (and the first wgpu adapter's host side): the CLI
# built with nightly's -Zsanitizer=address (into target/asan), then the CPU conformance suite
# (also at the narrower SIMD tiers), random operator graphs, the Rust API fuzzer and the
# first wgpu adapter's suite, then libinfinirt.so built the same way under the C programs of
# capi/tests/c (the C ABI fuzzer with one thread and with four), all with exact-size allocations
# (UNIRT_ALLOC_EXACT=1): each tensor is then a host allocation of its own, so a kernel that
# reads or writes past a tensor's end touches ASan's red zone instead of a neighbour.
# Not part of ci/test.sh: it needs a nightly toolchain and its build takes several minutes.
# See docs/RELIABILITY.md ("Exact mode for out-of-bounds accesses").
#
#   ci/asan.sh [FUZZ_SECONDS]      (default 120; the C ABI fuzzer runs as long per thread count)
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
  -p unirt-capi || { echo "asan.sh: build failed" >&2; exit 1; }
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
# The C ABI: the C programs compiled with GCC's -fsanitize=address, whose runtime also serves
# the instrumented Rust library (it resolves every __asan_* symbol the library imports).
lib="target/asan/$host/release"
cdir="target/asan/c"
mkdir -p "$cdir"
if cc -fsanitize=address -x c -o "$cdir/probe" - <<<'int main(void){return 0;}' 2>/dev/null; then
  for t in infinirt_test abi_test sizes_test lifetime_test fuzz_test; do
    if cc -fsanitize=address -fno-omit-frame-pointer -std=c11 -O1 -g -Icapi/include \
      -Icapi/tests/c "capi/tests/c/$t.c" -o "$cdir/$t" -L"$lib" -linfinirt \
      -Wl,-rpath,"$PWD/$lib" -lpthread -ldl; then
      if [ "$t" = fuzz_test ]; then
        for threads in 1 4; do
          # Its per-seed lines are for replaying a crash (the last one names the seed).
          run env UNIRT_CAPI_FUZZ_SECONDS="${1:-120}" UNIRT_CAPI_FUZZ_THREADS=$threads \
            bash -o pipefail -c '"$0" | { grep -v "^fuzz: device " || true; }' "$cdir/$t"
        done
      else
        run "$cdir/$t"
      fi
    else
      echo "asan.sh: FAILED to compile $t" >&2
      failures=$((failures + 1))
    fi
  done
else
  echo "asan.sh: the C compiler has no -fsanitize=address; the C programs not run"
fi
if [ "$failures" -gt 0 ]; then
  echo "asan.sh: $failures failure(s)"
  exit 1
fi
echo "asan.sh: all passed"
