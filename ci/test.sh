#!/usr/bin/env bash
# The README's test command: installs what the tests need on a fresh machine (software drivers
# for every backend, where it can) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/install-drivers.sh

export CARGO_TERM_COLOR=never
export RUST_BACKTRACE=1

# One build for everything below (the test binaries, the CLI and libinfinirt share it); cargo
# prints what it compiles, so a cold run (about 5 minutes on 2 cores) is not a silent one.
echo "== cargo build --workspace --all-targets (one build for every step below)"
cargo build --workspace --all-targets

target="${CARGO_TARGET_DIR:-target}"
echo "== unirt devices"
"$target/debug/unirt" devices

echo "== unirt kernels --compile cuda --arch sm_70,sm_80,sm_90"
# Every CUDA kernel (the HAL's and every op family × dtype) compiled to CUBIN for three
# architectures with the installed NVRTC: the kernel sources are checked without a GPU
# (about 30 s of NVRTC on 2 cores; exits non-zero on any compile error).
if "$target/debug/unirt" kernels --compile cuda --arch sm_70,sm_80,sm_90 --json "$target/cuda-kernels.json" >"$target/cuda-kernels.txt" 2>&1; then
  head -n 1 "$target/cuda-kernels.txt"
  grep -c ' ok ' "$target/cuda-kernels.txt" | sed 's/$/ kernel compilations ok/'
elif grep -q "NVRTC not found" "$target/cuda-kernels.txt"; then
  echo "NVRTC is not installed: CUDA kernels not compiled ($(tail -n 1 "$target/cuda-kernels.txt"))"
else
  cat "$target/cuda-kernels.txt"
  exit 1
fi

# The CUDA backend runs here too, over the fake driver (crate unirt-fakecuda, built above:
# CPU-backed and fault-injecting, see docs/RELIABILITY.md): the whole conformance suite on
# cuda:0 (unirt-conformance test fakecuda_conformance) and the fault matrix (fakecuda_faults).
echo "== cargo test --workspace (CUDA over the fake driver: fakecuda_conformance, fakecuda_faults)"
cargo test --workspace

# The same suite over a fake GPU without memory pools (stream-ordered memory through
# cuMemAlloc) and newer than NVRTC knows (kernels handed over as PTX instead of CUBIN).
echo "== CUDA conformance over the fake driver: no memory pools, PTX kernels (about 15 s)"
UNIRT_FAKECUDA_POOLS=0 UNIRT_FAKECUDA_CC=100 cargo test -p unirt-conformance --test fakecuda_conformance

# The Rust API fuzzer for a bounded time on every device (cargo test --workspace above ran it
# for its default 5 s); a failing or crashing seed is printed, see docs/RELIABILITY.md.
fuzz_seconds="${UNIRT_FUZZ_SECONDS_CI:-40}"
echo "== Rust API fuzzer: ${fuzz_seconds} s over every device (UNIRT_FUZZ_SECONDS_CI)"
UNIRT_FUZZ_FAKECUDA=1 UNIRT_FUZZ_SECONDS="$fuzz_seconds" cargo test -p unirt-conformance --test fuzz

echo "== ci/gpu.sh (GPU runner; on a machine without an NVIDIA GPU it says so and exits 0)"
UNIRT_BIN="$target/debug/unirt" bash ci/gpu.sh "$target/gpu-results"

if [ -f ci/capi-valgrind.sh ]; then
  echo "== C ABI tests under valgrind"
  bash ci/capi-valgrind.sh
fi
