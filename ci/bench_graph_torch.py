#!/usr/bin/env python3
"""PyTorch peer of `unirt bench graph`'s decode_step: the same tiny Llama-style decode step
(hidden 256, 2 layers, 8 query / 2 key-value heads of 32, ffn 512, vocab 512, a fixed-length
KV cache written under a one-hot position mask, attention masking positions not written
yet, argmax of the logits), eager and replayed from a CUDA graph, on one GPU.

Usage: bench_graph_torch.py [OUT_JSON] [--device cuda:0]
Prints and writes {"device", "rows": [{"workload": "decode_step", "eager_ms",
"cuda_graph_ms"}]} — medians over 200 steps, each ending with a synchronize. The host part of
a step (reading the token back) is outside both timings, as the replay side times only the
device work: compare with unirt's decode_step_device row on the same GPU (the same device
work; unirt's decode_step row also includes its host step, on both sides).
"""
import json
import sys
import time

import torch

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, MAX_SEQ = 512, 256, 2, 8, 2, 512, 64
D = HIDDEN // HEADS


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta=10000.0):
    # x [1, heads, d]; half rotation (Llama)
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) * 2 / x.shape[-1])
    ang = pos.to(torch.float32)[:, None] * inv[None, :]  # [1, half]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Model:
    def __init__(self, device):
        g = torch.Generator(device="cpu").manual_seed(42)

        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=g) / fan_in ** 0.5).to(device)

        qkv = (HEADS + 2 * KV_HEADS) * D
        self.embed = w(VOCAB, HIDDEN, fan_in=1)
        self.layers = [
            dict(n1=torch.ones(HIDDEN, device=device), wqkv=w(HIDDEN, qkv, fan_in=HIDDEN),
                 wo=w(HEADS * D, HIDDEN, fan_in=HIDDEN), n2=torch.ones(HIDDEN, device=device),
                 wgu=w(HIDDEN, 2 * FFN, fan_in=HIDDEN), wd=w(FFN, HIDDEN, fan_in=FFN))
            for _ in range(LAYERS)
        ]
        self.norm = torch.ones(HIDDEN, device=device)
        self.lm = w(HIDDEN, VOCAB, fan_in=HIDDEN)
        self.k = [torch.zeros(KV_HEADS, MAX_SEQ, D, device=device) for _ in range(LAYERS)]
        self.v = [torch.zeros(KV_HEADS, MAX_SEQ, D, device=device) for _ in range(LAYERS)]
        self.token = torch.ones(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.hide = torch.zeros(MAX_SEQ, dtype=torch.bool, device=device)
        self.write = torch.zeros(1, MAX_SEQ, 1, dtype=torch.bool, device=device)
        self.hide[1:] = True
        self.write[0, 0, 0] = True

    def step(self):
        x = self.embed[self.token]  # [1, hidden]
        for l, L in enumerate(self.layers):
            qkv = rms_norm(x, L["n1"]) @ L["wqkv"]
            q = rope(qkv[:, : HEADS * D].reshape(1, HEADS, D), self.pos)
            k = rope(qkv[:, HEADS * D:(HEADS + KV_HEADS) * D].reshape(1, KV_HEADS, D), self.pos)
            v = qkv[:, (HEADS + KV_HEADS) * D:].reshape(1, KV_HEADS, D)
            self.k[l].copy_(torch.where(self.write, k.transpose(0, 1), self.k[l]))
            self.v[l].copy_(torch.where(self.write, v.transpose(0, 1), self.v[l]))
            qg = q.reshape(KV_HEADS, HEADS // KV_HEADS, D)
            s = (qg @ self.k[l].transpose(1, 2)) * (1.0 / D ** 0.5)
            s = s.masked_fill(self.hide, -1e9)
            a = (s.softmax(-1) @ self.v[l]).reshape(1, HEADS * D)
            x = x + a @ L["wo"]
            gu = rms_norm(x, L["n2"]) @ L["wgu"]
            gate, up = gu[:, :FFN], gu[:, FFN:]
            x = x + (up * torch.nn.functional.silu(gate)) @ L["wd"]
        logits = rms_norm(x, self.norm) @ self.lm
        return logits.argmax(-1)


def median_ms(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def main():
    out = next((a for a in sys.argv[1:] if not a.startswith("--")), None)
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda:0"
    torch.backends.cuda.matmul.allow_tf32 = False
    m = Model(device)
    with torch.no_grad():
        eager = median_ms(m.step)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            m.step()
        replay = median_ms(graph.replay)
    report = {"device": device, "rows": [
        {"workload": "decode_step", "eager_ms": eager, "cuda_graph_ms": replay}]}
    print(json.dumps(report, indent=2))
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
