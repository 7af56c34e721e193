#!/usr/bin/env python3
"""Peers of `unirt bench ops` measured the same way: NumPy (OpenBLAS) and onnxruntime (CPU,
MLAS) on the shapes of unirt's report, with the same thread count. Prints one markdown table
with unirt beside the faster peer and the ratio, and writes the peers' rows as JSON.

Usage: bench_peers.py UNIRT_JSON THREADS OUT_JSON [numpy|ort|both]
NumPy is measured in its own process with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset (see
ci/bench-peers.sh), so that OpenBLAS picks its kernel for this CPU itself; threadpoolctl
records which kernel it chose.
"""
import json
import sys
import time

import numpy as np


_first_call = [True]


def median_ms(fn, budget=0.6, min_reps=3, max_reps=50):
    # Warm-up: at least 100 ms of calls, 600 ms for the first workload, as `unirt bench ops`
    # does (a VM's idle vCPUs wake faster once the hypervisor has seen repeated wake-ups).
    warm_for = 0.6 if _first_call[0] else 0.1
    _first_call[0] = False
    warm = time.perf_counter()
    while True:
        t = time.perf_counter()
        fn()
        one = time.perf_counter() - t
        if time.perf_counter() - warm >= warm_for:
            break
    reps = int(max(min_reps, min(max_reps, budget / max(one, 1e-9))))
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def np_dtype(name):
    return {"f32": np.float32, "f16": np.float16}.get(name)


def rows_numpy(rows):
    from threadpoolctl import threadpool_info
    info = [
        {k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
        for i in threadpool_info()
    ]
    out = []
    rng = np.random.default_rng(0)
    for r in rows:
        op, dt, shape = r["op"], r["dtype"], r["shape"]
        if dt != "f32":
            continue
        x = None
        if op == "matmul":
            m, n, k = map(int, shape.split("x"))
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            ms = median_ms(lambda: np.matmul(a, b, out=c))
            out.append(dict(r, peer="numpy", ms=ms, gflops=2 * m * n * k / (ms * 1e6), **gemv_gbps(r, ms)))
            continue
        if op == "matmul_bt":
            # x · Wᵀ with W stored [n, k], as a linear layer keeps it.
            m, n, k = map(int, shape.split("x"))
            a = rng.standard_normal((m, k), dtype=np.float32)
            w = rng.standard_normal((n, k), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            ms = median_ms(lambda: np.matmul(a, w.T, out=c))
            out.append(dict(r, peer="numpy", ms=ms, gflops=2 * m * n * k / (ms * 1e6), **gemv_gbps(r, ms)))
            continue
        if op.startswith("sample_"):
            out.append(dict(r, peer="numpy", ms=median_ms(numpy_sampler(r, rng))))
            continue
        if op == "argmax_rows":
            rows_, cols = map(int, shape.split("x"))
            a = rng.standard_normal((rows_, cols), dtype=np.float32)
            idx = np.empty(rows_, np.int64)
            ms = median_ms(lambda: np.argmax(a, axis=-1, out=idx))
            out.append(dict(r, peer="numpy", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
            continue
        if op in ("add", "mul", "silu", "swiglu", "softmax", "rms_norm"):
            rows_, cols = map(int, shape.split("x"))
            a = rng.standard_normal((rows_, cols), dtype=np.float32)
            b = rng.standard_normal((rows_, cols), dtype=np.float32)
            c = np.empty_like(a)
            w = rng.standard_normal(cols, dtype=np.float32)
            fn = {
                "add": lambda: np.add(a, b, out=c),
                "mul": lambda: np.multiply(a, b, out=c),
                "silu": lambda: np.divide(a, 1 + np.exp(-a), out=c),
                "swiglu": lambda: np.multiply(a * b, 1 / (1 + np.exp(-b)), out=c),
                "softmax": lambda: np.divide(np.exp(a - a.max(-1, keepdims=True)), np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), out=c),
                "rms_norm": lambda: np.multiply(a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6), w, out=c),
            }[op]
            ms = median_ms(fn)
            out.append(dict(r, peer="numpy", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
    return out, info


def numpy_sampler(r, rng):
    """What a Python LLM sampler does for unirt's `sample_top_p…` / `sample_top_k…` rows
    (random 0.37, temperature 0.8, unirt's rule): sort (argpartition first for top-k), f64
    weights, cumulative sums, two searches."""
    n = int(r["shape"].split("x")[1])
    x = rng.uniform(-1, 1, n).astype(np.float32)
    if r["op"].startswith("sample_top_p"):
        k, top_p = n, float(r["op"][len("sample_top_p"):])
    else:
        k, top_p = int(r["op"][len("sample_top_k"):]), 1.0

    def pick():
        if k < n:
            idx = np.argpartition(-x, k - 1)[:k]
            idx = idx[np.argsort(-x[idx], kind="stable")]
        else:
            idx = np.argsort(-x, kind="stable")
        cum = np.cumsum(np.exp((x[idx].astype(np.float64) - x[idx[0]]) / 0.8))
        keep = min(int(np.searchsorted(cum, top_p * cum[-1])) + 1, k)
        at = min(int(np.searchsorted(cum[:keep], 0.37 * cum[keep - 1], side="right")), keep - 1)
        return idx[at]

    return pick


def gemv_gbps(r, ms):
    """A GEMV row's bandwidth (unirt reports one where m is 1) at the peer's time; nothing
    for other products."""
    return {"gbps": r["gbps"] * r["ms"] / ms} if r.get("gbps") else {}


def rows_ort(rows, threads):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    F = TensorProto.FLOAT

    def session(nodes, inputs, outputs, opset=17, ms_domain=False):
        imports = [helper.make_opsetid("", opset)]
        if ms_domain:
            imports.append(helper.make_opsetid("com.microsoft", 1))
        g = helper.make_graph(nodes, "g", inputs, outputs)
        m = helper.make_model(g, opset_imports=imports)
        m.ir_version = 8
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def vi(name, shape):
        return helper.make_tensor_value_info(name, F, shape)

    out = []
    rng = np.random.default_rng(0)
    for r in rows:
        op, dt, shape = r["op"], r["dtype"], r["shape"]
        if dt != "f32":
            continue
        try:
            if op == "matmul":
                m, n, k = map(int, shape.split("x"))
                s = session([helper.make_node("MatMul", ["a", "b"], ["c"])], [vi("a", [m, k]), vi("b", [k, n])], [vi("c", [m, n])])
                feeds = {"a": rng.standard_normal((m, k), dtype=np.float32), "b": rng.standard_normal((k, n), dtype=np.float32)}
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gflops=2 * m * n * k / (ms * 1e6), **gemv_gbps(r, ms)))
                continue
            if op == "matmul_bt":
                # Gemm with transB: the weight stays [n, k], as a linear layer keeps it.
                m, n, k = map(int, shape.split("x"))
                node = helper.make_node("Gemm", ["a", "w"], ["c"], transB=1)
                s = session([node], [vi("a", [m, k]), vi("w", [n, k])], [vi("c", [m, n])])
                feeds = {"a": rng.standard_normal((m, k), dtype=np.float32), "w": rng.standard_normal((n, k), dtype=np.float32)}
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gflops=2 * m * n * k / (ms * 1e6), **gemv_gbps(r, ms)))
                continue
            if op in ("add", "mul", "silu", "gelu", "swiglu", "softmax", "rms_norm"):
                rows_, cols = map(int, shape.split("x"))
                sh = [rows_, cols]
                a = rng.standard_normal(sh, dtype=np.float32)
                b = rng.standard_normal(sh, dtype=np.float32)
                w = rng.standard_normal(cols, dtype=np.float32)
                msd = False
                if op in ("add", "mul"):
                    nodes = [helper.make_node(op.capitalize(), ["a", "b"], ["c"])]
                    ins, feeds = [vi("a", sh), vi("b", sh)], {"a": a, "b": b}
                elif op == "silu":
                    nodes = [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["c"])]
                    ins, feeds = [vi("a", sh)], {"a": a}
                elif op == "gelu":  # the erf form, as unirt's gelu
                    nodes = [helper.make_node("Gelu", ["a"], ["c"], domain="com.microsoft")]
                    ins, feeds, msd = [vi("a", sh)], {"a": a}, True
                elif op == "swiglu":
                    nodes = [helper.make_node("Sigmoid", ["b"], ["s"]), helper.make_node("Mul", ["b", "s"], ["t"]), helper.make_node("Mul", ["a", "t"], ["c"])]
                    ins, feeds = [vi("a", sh), vi("b", sh)], {"a": a, "b": b}
                elif op == "softmax":
                    nodes = [helper.make_node("Softmax", ["a"], ["c"], axis=-1)]
                    ins, feeds = [vi("a", sh)], {"a": a}
                else:  # rms_norm: onnxruntime's SimplifiedLayerNormalization (its RMSNorm kernel)
                    nodes = [helper.make_node("SimplifiedLayerNormalization", ["a", "w"], ["c"], axis=-1, epsilon=1e-6)]
                    ins, feeds = [vi("a", sh), vi("w", [cols])], {"a": a, "w": w}
                s = session(nodes, ins, [vi("c", sh)], ms_domain=msd)
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
            elif op == "argmax_rows":
                rows_, cols = map(int, shape.split("x"))
                node = helper.make_node("ArgMax", ["a"], ["c"], axis=-1, keepdims=0)
                idx = helper.make_tensor_value_info("c", TensorProto.INT64, [rows_])
                s = session([node], [vi("a", [rows_, cols])], [idx])
                feeds = {"a": rng.standard_normal((rows_, cols), dtype=np.float32)}
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
            elif op == "rearrange_transp":
                # unirt copies the transpose of a [cols, rows] tensor into [rows, cols].
                rows_, cols = map(int, shape.split("x"))
                node = helper.make_node("Transpose", ["a"], ["c"], perm=[1, 0])
                s = session([node], [vi("a", [cols, rows_])], [vi("c", [rows_, cols])])
                feeds = {"a": rng.standard_normal((cols, rows_), dtype=np.float32)}
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
            elif op == "rope":
                seq, heads, d = map(int, shape.split("x"))
                # com.microsoft RotaryEmbedding: input [batch, seq, heads*d], positions, caches.
                x = rng.standard_normal((1, seq, heads * d), dtype=np.float32)
                pos = np.arange(seq, dtype=np.int64).reshape(1, seq)
                inv = 10000.0 ** (-np.arange(0, d, 2) / d)
                ang = np.arange(seq)[:, None] * inv[None, :]
                cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
                node = helper.make_node("RotaryEmbedding", ["x", "p", "cos", "sin"], ["y"], domain="com.microsoft", num_heads=heads)
                s = session([node], [vi("x", [1, seq, heads * d]), helper.make_tensor_value_info("p", TensorProto.INT64, [1, seq]), vi("cos", [seq, d // 2]), vi("sin", [seq, d // 2])], [vi("y", [1, seq, heads * d])], ms_domain=True)
                feeds = {"x": x, "p": pos, "cos": cos, "sin": sin}
                ms = median_ms(lambda: s.run(None, feeds))
                out.append(dict(r, peer="onnxruntime", ms=ms, gbps=r["gbps"] * r["ms"] / ms))
        except Exception as e:  # a peer that cannot run a row says so
            out.append(dict(r, peer="onnxruntime", ms=None, error=str(e).splitlines()[0][:120]))
    return out, {"onnxruntime": ort.__version__, "threads": threads}


def main():
    unirt_json, threads, out_json = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    which = sys.argv[4] if len(sys.argv) > 4 else "both"
    rows = json.load(open(unirt_json))["rows"]
    result = {"rows": [], "info": {}}
    if which in ("numpy", "both"):
        r, info = rows_numpy(rows)
        result["rows"] += r
        result["info"]["numpy"] = {"version": np.__version__, "threadpools": info}
    if which in ("ort", "both"):
        r, info = rows_ort(rows, threads)
        result["rows"] += r
        result["info"]["onnxruntime"] = info
    json.dump(result, open(out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
