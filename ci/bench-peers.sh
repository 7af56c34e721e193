#!/usr/bin/env bash
# Runs `unirt bench ops` and its peers — NumPy/OpenBLAS and onnxruntime's CPU build, both from
# pip, with the same thread count — in one go, and prints the side-by-side table that
# docs/BENCHMARKS.md records.
#
#   ci/bench-peers.sh [THREADS]      (default: every core)
#
# The peers live in a virtual environment (UNIRT_PEERS_VENV, default target/peers-venv),
# created on first use. NumPy runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset so that
# OpenBLAS picks its own kernel for this CPU; threadpoolctl records which one ran.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
venv="${UNIRT_PEERS_VENV:-target/peers-venv}"
out="${UNIRT_BENCH_OUT:-target/bench-ops}"
mkdir -p "$out"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import numpy, onnxruntime, onnx, threadpoolctl" 2>/dev/null; then
  "$venv/bin/pip" install -q numpy onnxruntime onnx threadpoolctl
fi
cargo build --release -q -p unirt-cli
export RAYON_NUM_THREADS="$threads"
./target/release/unirt bench ops --device cpu:0 --json "$out/unirt.json"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" \
  "$venv/bin/python" ci/bench_peers.py "$out/unirt.json" "$threads" "$out/numpy.json" numpy
OMP_NUM_THREADS="$threads" "$venv/bin/python" ci/bench_peers.py "$out/unirt.json" "$threads" "$out/ort.json" ort
"$venv/bin/python" ci/bench_peers_table.py "$out/unirt.json" "$out/numpy.json" "$out/ort.json"
