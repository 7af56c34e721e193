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
    unirt = os.path.join(root, "target", "release", "unirt")
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    ratios = {}
    for r in range(rounds):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run(
                [unirt, "bench", "ops", "--device", "cpu:0", "--quick", "--json", f.name],
                check=True, env=env, stdout=subprocess.DEVNULL)
            rows = json.load(open(f.name))["rows"]
        mine = {(u["op"], u["dtype"], u["shape"]): u["ms"] for u in rows}
        peers, _ = bench_peers.rows_ort(rows, threads)
        for p in peers:
            if not p.get("ms"):
                continue
            key = (p["op"], p["dtype"], p["shape"])
            # Same work on both sides: the time ratio is the throughput ratio.
            ratios.setdefault(key, []).append(p["ms"] / mine[key])
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    print(f"unirt ÷ onnxruntime (throughput), {rounds} interleaved rounds, {threads} threads")
    print("| op | dtype | shape | median | range |")
    print("|---|---|---|---:|---:|")
    for (op, dt, shape), v in ratios.items():
        print(f"| {op} | {dt} | {shape} | {statistics.median(v):.2f} | {min(v):.2f}–{max(v):.2f} |")


if __name__ == "__main__":
    main()
