#!/usr/bin/env python3
"""The PyTorch peer of `unirt bench ops --device cuda:N`: the same GPU workloads (shapes,
dtypes, byte and FLOP counts) timed the same way (launches back to back on one stream, one
synchronize per sample, median of samples), printed in the same table and written as JSON.
ci/gpu.sh runs both in one job so the two tables come from the same machine and run.

    python3 ci/bench_ops_torch.py [--device cuda:0] [--json FILE] [--quick] [--tf32]
    python3 ci/bench_ops_torch.py --attention 512,2048,4096   # beside `unirt bench attention`

PyTorch exists only on the GPU machine; without it (or without a GPU) this prints why and
exits 2. TF32 is off unless --tf32 (unirt's f32 GEMM computes in f32).
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--attention", help="only the attention rows: prefill over these lengths")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_ops_torch: PyTorch is not installed ({e})")
        return 2
    if not torch.cuda.is_available():
        print("bench_ops_torch: PyTorch sees no CUDA device")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device(args.device)
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    size = {"f32": 4, "f16": 2, "bf16": 2}
    rows = []
    gen = torch.Generator(device=dev).manual_seed(1)

    def rand(shape, dt):
        return torch.rand(shape, generator=gen, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(dtypes[dt])

    def time_ms(fn, inner=1):
        torch.cuda.synchronize(dev)

        def sample():
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            torch.cuda.synchronize(dev)
            return (time.perf_counter() - t) * 1e3 / inner

        first = sample()
        reps = max(3, min(50, int(600 / max(first * inner, 1e-3))))
        return statistics.median(sample() for _ in range(reps))

    def decode(h=32, d=128, kv=4096):
        q, k, v = rand((1, h, 1, d), "bf16"), rand((1, h, kv, d), "bf16"), rand((1, h, kv, d), "bf16")
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        bw("attention_decode", "bf16", f"1x{h}x{kv}x{d}", ms, 2 * h * kv * d * 2)

    def prefill(seq, h=32, d=128):
        q, k, v = (rand((1, h, seq, d), "bf16") for _ in range(3))
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        rows.append(dict(op="attention_prefill", dtype="bf16", shape=f"{seq}x{h}x{seq}x{d}", ms=ms,
                         gflops=2 * h * seq * seq * d / (ms * 1e6)))

    def gemm(dt, m, n, k):
        a, b = rand((m, k), dt), rand((k, n), dt)
        ms = time_ms(lambda: torch.matmul(a, b))
        rows.append(dict(op="matmul", dtype=dt, shape=f"{m}x{n}x{k}", ms=ms, gflops=2 * m * n * k / (ms * 1e6)))

    def gemm_bt(dt, m, n, k):
        # B as the transpose of a weight stored [n, k] (x @ W^T, a linear layer's layout).
        a, w = rand((m, k), dt), rand((n, k), dt)
        b = w.t()
        ms = time_ms(lambda: torch.matmul(a, b))
        rows.append(dict(op="matmul_bt", dtype=dt, shape=f"{m}x{n}x{k}", ms=ms, gflops=2 * m * n * k / (ms * 1e6)))

    def bw(op, dt, shape, ms, nbytes):
        rows.append(dict(op=op, dtype=dt, shape=shape, ms=ms, gbps=nbytes / (ms * 1e6)))

    def memory(dt, mib):
        n = mib * (1 << 20) // size[dt]
        width = 4096
        shape = (n // width, width)
        s = f"{shape[0]}x{shape[1]}"
        a, b = rand(shape, dt), rand(shape, dt)
        nbytes = n * size[dt]
        bw("add", dt, s, time_ms(lambda: torch.add(a, b)), 3 * nbytes)
        bw("mul", dt, s, time_ms(lambda: torch.mul(a, b)), 3 * nbytes)
        bw("sum_all", dt, s, time_ms(lambda: torch.sum(a)), nbytes)
        bw("argmax_rows", dt, s, time_ms(lambda: torch.argmax(a, dim=-1)), nbytes)
        bw("silu", dt, s, time_ms(lambda: F.silu(a)), 2 * nbytes)
        bw("swiglu", dt, s, time_ms(lambda: a * F.silu(b)), 3 * nbytes)
        w = rand((width,), dt)
        if hasattr(F, "rms_norm"):
            rms = lambda: F.rms_norm(a, (width,), w, 1e-6)
        else:
            rms = lambda: a * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(a.dtype) * w
        bw("rms_norm", dt, s, time_ms(rms), 2 * nbytes)
        bw("softmax", dt, s, time_ms(lambda: torch.softmax(a, -1)), 2 * nbytes)
        # rope (half rotation, Llama) on [seq, 32, 128] with a cos/sin table per position.
        seq = n // (32 * 128)
        x = rand((seq, 32, 128), dt)
        inv = 10000.0 ** (-torch.arange(0, 64, device=dev, dtype=torch.float32) * 2 / 128)
        ang = torch.arange(seq, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)

        def rope():
            x0, x1 = x[..., :64], x[..., 64:]
            return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1)

        bw("rope", dt, f"{seq}x32x128", time_ms(rope), 2 * nbytes)

    big = 1024 if args.quick else 4096
    if args.attention:
        decode()
        for seq in args.attention.split(","):
            prefill(int(seq))
        return finish(args, torch, dev, rows)
    for dt in ("f32", "f16", "bf16"):
        gemm(dt, big, big, big)
    if not args.quick:
        for m, n, k in ((1, 4096, 4096), (64, 11008, 4096), (2048, 4096, 4096)):
            gemm("bf16", m, n, k)
        gemm_bt("bf16", 4096, 4096, 4096)
    mib = 16 if args.quick else 256
    memory("f32", mib)
    memory("bf16", mib)
    src = rand((mib << 18,), "f32")
    bw("cast", "f32", str(mib << 18), time_ms(lambda: src.to(torch.bfloat16)), 6 * (mib << 18))
    t = rand((mib << 16, 4), "f32").t()
    bw("rearrange", "f32", f"4x{mib << 16}", time_ms(lambda: t.contiguous()), 8 * (mib << 18))
    decode()
    prefill(256 if args.quick else 2048)
    a, b = rand((16,), "f32"), rand((16,), "f32")
    # Sampling one token from 32 000 logits (temperature 0.8, random 0.37, unirt's rule):
    # sort (topk for top-k), softmax weights, cumulative sums, two searches, on the GPU.
    logits = rand((1, 32000), "f32")

    def sample(top_k, top_p):
        if top_k:
            vals, idx = torch.topk(logits, top_k, dim=-1)
        else:
            vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(torch.exp((vals.double() - vals[:, :1]) / 0.8), -1)
        keep = torch.clamp(torch.searchsorted(cum, top_p * cum[:, -1:]) + 1, max=cum.shape[-1])
        kept = torch.gather(cum, -1, keep - 1)
        at = torch.clamp(torch.searchsorted(cum, 0.37 * kept, right=True), max=keep - 1)
        return torch.gather(idx, -1, at)

    for top_k, top_p, name in ((0, 0.9, "sample_top_p0.9"), (50, 1.0, "sample_top_k50")):
        try:  # untried on a GPU when written: a failure leaves the rest of the table
            rows.append(dict(op=name, dtype="f32", shape="1x32000", ms=time_ms(lambda: sample(top_k, top_p))))
        except Exception as e:  # noqa: BLE001
            print(f"{name}: not run ({e})")
    bw("add_tiny_per_launch", "f32", "16", time_ms(lambda: torch.add(a, b), inner=2000), 3 * 16 * 4)

    return finish(args, torch, dev, rows)


def finish(args, torch, dev, rows):
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(dev)} (TF32 {'on' if args.tf32 else 'off'})")
    print(f"{'op':<20} {'dtype':<5} {'shape':>16} {'ms':>10} {'GFLOP/s':>10} {'GB/s':>10}")
    for r in rows:
        f = lambda key: f"{r[key]:.1f}" if key in r else "-"
        print(f"{r['op']:<20} {r['dtype']:<5} {r['shape']:>16} {r['ms']:>10.4f} {f('gflops'):>10} {f('gbps'):>10}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=args.device, torch=torch.__version__, tf32=args.tf32, rows=rows), fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
