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

echo "== examples/llama_block: 4 tokens eager and replayed on every device with kernels (bitwise eager = replay)"
"$target/debug/examples/llama_block" 4

# The CUDA backend runs here too, over the fake driver (crate unirt-fakecuda, built above:
# CPU-backed and fault-injecting, see docs/RELIABILITY.md): the whole conformance suite on
# cuda:0 (unirt-conformance test fakecuda_conformance) and the fault matrix (fakecuda_faults).
# It also compiles every CUDA kernel (the HAL's, every op family × dtype) to CUBIN for sm_70,
# sm_80 and sm_90 with NVRTC through `unirt kernels --compile cuda` (cli/tests/cuda_kernels.rs,
# about 30 s of NVRTC on 2 cores), and runs matmul through a fake cuBLAS (fakecuda_blas).
echo "== cargo test --workspace (CUDA over the fake driver: fakecuda_conformance, fakecuda_faults)"
cargo test --workspace

# The same suite over a fake GPU without memory pools (stream-ordered memory through
# cuMemAlloc) and newer than NVRTC knows (kernels handed over as PTX instead of CUBIN).
echo "== CUDA conformance over the fake driver: no memory pools, PTX kernels (about 15 s)"
UNIRT_FAKECUDA_POOLS=0 UNIRT_FAKECUDA_CC=100 cargo test -p unirt-conformance --test fakecuda_conformance

# The wgpu operator kernels' GPU forms on the Mesa adapters: there the software adapters take
# barrier-free host forms (vendors/wgpu/mod.rs), so without this run the forms a real GPU
# takes would go unchecked on CI.
echo "== wgpu operator conformance with the GPU kernel forms on the Mesa adapters (UNIRT_WGPU_GPU_FORMS=1)"
UNIRT_WGPU_GPU_FORMS=1 UNIRT_CONFORMANCE_DEVICES=wgpu cargo test -p unirt-conformance --test conformance -- ops::
UNIRT_WGPU_GPU_FORMS=1 UNIRT_CONFORMANCE_DEVICES=wgpu cargo test -p unirt-conformance --test conformance -- graph::random_graphs

# The cooperative-matrix GEMM (vendors/wgpu/kernels/matmul_coop.rs) with its matrix operations
# emulated in plain WGSL: no adapter here has matrix units, so this checks its tiling, strides,
# edges, subgroup assignment and epilogue (about 40 s on lavapipe; the first wgpu adapter only:
# on llvmpipe's GL the emulation's longer dispatches would hold the GL context past wgpu's 6 s).
echo "== wgpu matmul conformance through the cooperative-matrix kernel, emulated (UNIRT_WGPU_COOP=emulate)"
UNIRT_WGPU_COOP=emulate UNIRT_CONFORMANCE_DEVICES=wgpu:0 cargo test -p unirt-conformance --test conformance -- matmul

# Random operator graphs, more of them than the suite's 10: each recorded, planned fused and
# unfused, replayed and checked bitwise against eager execution. On a 2-vCPU VM, 200
# programs per device took 6 minutes before the software adapters read reductions and
# attention through textures, and 100 took 80 s after (with a build beside them).
graph_seeds="${UNIRT_GRAPH_FUZZ_SEEDS_CI:-200}"
echo "== random operator graphs: ${graph_seeds} programs per device, replay bitwise = eager (UNIRT_GRAPH_FUZZ_SEEDS_CI)"
UNIRT_GRAPH_FUZZ_SEEDS="$graph_seeds" cargo test -p unirt-conformance --test conformance -- graph::random_graphs

# The Rust API fuzzer for a bounded time on every device (cargo test --workspace above ran it
# for its default 5 s); a failing or crashing seed is printed, see docs/RELIABILITY.md.
fuzz_seconds="${UNIRT_FUZZ_SECONDS_CI:-40}"
echo "== Rust API fuzzer: ${fuzz_seconds} s over every device (UNIRT_FUZZ_SECONDS_CI)"
UNIRT_FUZZ_FAKECUDA=1 UNIRT_FUZZ_SECONDS="$fuzz_seconds" cargo test -p unirt-conformance --test fuzz

# The C ABI fuzzer (capi/tests/c/fuzz_test.c, built by the test run above) for a bounded time
# on every device, the CUDA backend over the fake driver included (a call it records as
# driver misuse fails the seed), single-threaded and with four threads sharing the objects.
capi_fuzz="$target/tmp/fuzz_test"
capi_fuzz_seconds="${UNIRT_CAPI_FUZZ_SECONDS_CI:-20}"
if [ -x "$capi_fuzz" ]; then
  fake_cuda="$(cd "$target/debug" && pwd)/libunirt_fakecuda.so"
  for threads in 1 4; do
    backends=cpu,cuda,wgpu
    echo "== C ABI fuzzer: ${capi_fuzz_seconds} s over $backends, ${threads} thread(s) (UNIRT_CAPI_FUZZ_SECONDS_CI)"
    log="$target/capi-fuzz-$threads.log"
    rc=0
    UNIRT_BACKENDS="$backends" UNIRT_CUDA_LIBRARY="$fake_cuda" UNIRT_CAPI_FUZZ_THREADS="$threads" \
      UNIRT_CAPI_FUZZ_SECONDS="$capi_fuzz_seconds" "$capi_fuzz" >"$log" 2>&1 || rc=$?
    grep -v '^fuzz: device ' "$log" || true
    if [ "$rc" != 0 ]; then
      echo "C ABI fuzzer FAILED (exit $rc); the last seed it began:" >&2
      grep '^fuzz: device ' "$log" | tail -n 1 >&2
      echo "replay: see docs/RELIABILITY.md (UNIRT_CAPI_FUZZ_SEED)" >&2
      exit 1
    fi
  done
fi

echo "== ci/gpu.sh (GPU runner; on a machine without an NVIDIA GPU it says so and exits 0)"
UNIRT_BIN="$target/debug/unirt" bash ci/gpu.sh "$target/gpu-results"

if [ -f ci/capi-valgrind.sh ]; then
  echo "== C ABI tests under valgrind"
  bash ci/capi-valgrind.sh
fi
