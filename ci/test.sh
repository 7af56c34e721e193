#!/usr/bin/env bash
# The README's test command: installs what the tests need on a fresh machine (software drivers
# for every backend, where it can) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/install-drivers.sh

export CARGO_TERM_COLOR=never
export RUST_BACKTRACE=1

echo "== unirt devices"
cargo run --quiet -- devices

echo "== cargo test --workspace"
cargo test --workspace

echo "== ci/gpu.sh (GPU runner; on a machine without an NVIDIA GPU it says so and exits 0)"
UNIRT_BIN="${CARGO_TARGET_DIR:-target}/debug/unirt" bash ci/gpu.sh "${CARGO_TARGET_DIR:-target}/gpu-results"

if [ -f ci/capi-valgrind.sh ]; then
  echo "== C ABI tests under valgrind"
  bash ci/capi-valgrind.sh
fi
