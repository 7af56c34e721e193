#!/usr/bin/env python3
"""unirt beside onnxruntime, interleaved: `unirt bench ops --quick` and onnxruntime on the same
rows, alternated for several rounds in one go, so that both sides see the machine in the same
state. On a small VM the two sides of a one-shot comparison (ci/bench-peers.sh, which runs
unirt's whole table, then NumPy's, then onnxruntime's) can be minutes apart, and the machine's
speed drifts by 10-20 % over minutes: more than the difference at stake on memory-bound rows.

Prints, per row onnxruntime also runs, unirt ÷ onnxruntime by throughput: the median over the
rounds and the range.

Usage (from the peers' virtual environment that ci/bench-peers.sh creates):
    target/peers-venv/bin/python ci/bench_peers_interleaved.py [ROUNDS] [THREADS]
with target/release/unirt built. Defaults: 5 rounds, every core.

To compare builds, name their binaries in UNIRT_BINS (comma-separated, e.g. a copy of the
previous build and target/release/unirt): each round then runs every binary, then
onnxruntime once, and each binary gets its own column of ratios against the same peer runs.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402  (rows_ort: the same graphs as the one-shot table)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bins = os.environ.get("UNIRT_BINS")
    bins = bins.split(",") if bins else [os.path.join(root, "target", "release", "unirt")]
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    ratios = {}  # (op, dtype, shape) -> one list of ratios per binary
    for r in range(rounds):
        mine = []
        for unirt in bins:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run(
                    [unirt, "bench", "ops", "--device", "cpu:0", "--quick", "--json", f.name],
                    check=True, env=env, stdout=subprocess.DEVNULL)
                rows = json.load(open(f.name))["rows"]
            mine.append({(u["op"], u["dtype"], u["shape"]): u["ms"] for u in rows})
        peers, _ = bench_peers.rows_ort(rows, threads)
        for p in peers:
            if not p.get("ms"):
                continue
            key = (p["op"], p["dtype"], p["shape"])
            # Same work on both sides: the time ratio is the throughput ratio.
            per_bin = ratios.setdefault(key, [[] for _ in bins])
            for b, m in enumerate(mine):
                per_bin[b].append(p["ms"] / m[key])
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    print(f"unirt ÷ onnxruntime (throughput), {rounds} interleaved rounds, {threads} threads")
    if len(bins) > 1:
        for b, path in enumerate(bins):
            print(f"binary {b + 1}: {path}")
    cols = "".join(f" median{'' if len(bins) == 1 else f' ({b + 1})'} | range |" for b in range(len(bins)))
    print(f"| op | dtype | shape |{cols}")
    print("|---|---|---|" + "---:|---:|" * len(bins))
    for (op, dt, shape), per_bin in ratios.items():
        cells = "".join(
            f" {statistics.median(v):.2f} | {min(v):.2f}–{max(v):.2f} |" for v in per_bin)
        print(f"| {op} | {dt} | {shape} |{cells}")


if __name__ == "__main__":
    main()
