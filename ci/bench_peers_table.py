#!/usr/bin/env python3
"""Joins `unirt bench ops --json` with the peers' rows (bench_peers.py) into a markdown table:
unirt, NumPy, onnxruntime, and unirt ÷ the faster peer (GFLOP/s or GB/s; > 1 is faster)."""
import json
import sys

unirt = json.load(open(sys.argv[1]))
peers = []
info = {}
for p in sys.argv[2:]:
    d = json.load(open(p))
    peers += d["rows"]
    info.update(d["info"])


def rate(r):
    """GFLOP/s or GB/s; the time for rows that have neither (the samplers): higher is
    better for the rates, lower for the times."""
    return r.get("gflops") or r.get("gbps") or r.get("ms")


print(f"device {unirt['device']}, {unirt['threads']} threads; peers: {json.dumps(info)}\n")
print("| op | dtype | shape | unit | unirt | NumPy | onnxruntime | unirt ÷ best peer |")
print("|---|---|---|---|---:|---:|---:|---:|")
for r in unirt["rows"]:
    unit = "GFLOP/s" if "gflops" in r else "GB/s" if "gbps" in r else "ms"
    mine = rate(r)
    cells = {}
    for p in peers:
        if (p["op"], p["dtype"], p["shape"]) == (r["op"], r["dtype"], r["shape"]):
            cells[p["peer"]] = rate(p) if p.get("ms") else None
    np_, ort_ = cells.get("numpy"), cells.get("onnxruntime")
    timed = unit == "ms"
    best = (min if timed else max)([v for v in (np_, ort_) if v], default=None)
    f = lambda v: "-" if v is None else (f"{v:.3f}" if timed else f"{v:.1f}")
    # unirt's speed over the best peer's either way (above 1: unirt is faster).
    ratio = "-" if not best else f"{(best / mine) if timed else (mine / best):.2f}"
    print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {unit} | {f(mine)} | {f(np_)} | {f(ort_)} | {ratio} |")
