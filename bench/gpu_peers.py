#!/usr/bin/env python3
"""PyTorch peers for bench/vulkan_bench.cpp on the same GPU, printed next to RLX's figures as one table.

    python3 bench/gpu_peers.py --rlx rlx_bench.txt

Measures with CUDA events (best of several runs after warm-up): f32 GEMM 4096^3 with TF32 off and on, a
device-to-device copy, the same 8-op elementwise chain on 256M floats eager and under torch.compile, and the
rlx::models encoder block eager and under torch.compile (wall time per call, synchronized), and a bf16 GEMM 8192^3. Sizes follow vulkan_bench's full sizes.

    python3 bench/gpu_peers.py --llm DIR --rlx cuda_llm.txt

GGUF decode instead (cuda_bench decode DIR wrote DIR): a PyTorch eager bf16 Llama (RMSNorm, llama.cpp's rotary
pairs, grouped-query attention over a KV cache, SwiGLU, tied output) on the weights RLX decodes (the Q4_1 model
dequantized, weights.f32 and model.json), greedy decode of as many tokens, tokens/s; and its first logits against
RLX's (the same network in f32 too, which checks the peer's architecture against RLX's).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F


def gpu_seconds(fn, warmup=2, reps=5):
    for _ in range(warmup):
        fn()
    best = math.inf
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    return best


def wall_seconds(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def chain(x):  # the ops of vulkan_bench's chain8, in order
    y = x * 1.5
    y = y + 0.25
    y = y * y
    y = y - 0.5
    y = torch.clamp_min(y, -1.0)
    y = y + x
    y = y * 0.75
    return torch.clamp_max(y, 4.0)


def encoder(x, p, B, S, D, H, eps=1e-5):  # rlx::models::encoder_block: pre-LN, weights [in, out]
    ln = lambda v, n: F.layer_norm(v, (D,), p[n + "_g"], p[n + "_b"], eps)
    proj = lambda v, n: v @ p[n] + p[n + "_bias"]
    heads = lambda v: v.view(B, S, H, D // H).transpose(1, 2)
    h = ln(x, "ln1")
    a = F.scaled_dot_product_attention(heads(proj(h, "wq")), heads(proj(h, "wk")), heads(proj(h, "wv")))
    x1 = x + proj(a.transpose(1, 2).reshape(B, S, D), "wo")
    f = proj(F.gelu(proj(ln(x1, "ln2"), "w1")), "w2")
    return x1 + f


def encoder_params(D, FF, dev):
    p = {}
    for n in ("ln1", "ln2"):
        p[n + "_g"], p[n + "_b"] = torch.ones(D, device=dev), torch.zeros(D, device=dev)
    for n, i, o in (("wq", D, D), ("wk", D, D), ("wv", D, D), ("wo", D, D), ("w1", D, FF), ("w2", FF, D)):
        p[n] = (torch.rand(i, o, device=dev) * 2 - 1) * math.sqrt(3.0 / i)
        p[n + "_bias"] = torch.zeros(o, device=dev)
    return p


class Llama:
    """SmolLM2's architecture as GGUF's Llama holds it, eager, in `dtype`, with a KV cache of `rows` positions."""

    def __init__(self, cfg, weights, dtype, rows, dev):
        self.c, self.w, self.dtype, self.dev = cfg, weights, dtype, dev
        L, H, Hkv = cfg["layers"], cfg["heads"], cfg["kv_heads"]
        self.D = cfg["embd"] // H
        self.k = torch.zeros(L, Hkv, rows, self.D, device=dev, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        # llama.cpp's "normal" rope: pair (2i, 2i+1) rotates by pos * base^(-2i/D).
        self.inv = cfg["rope_base"] ** (-torch.arange(0, self.D, 2, dtype=torch.float64, device=dev) / self.D)

    def norm(self, x, w):  # RMSNorm in f32, as HF's LlamaRMSNorm
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c["eps"])).to(self.dtype) * w

    def rope(self, x, cos, sin):  # x [T, heads, D]; cos, sin [T, D/2]
        T, h, D = x.shape
        p = x.float().view(T, h, D // 2, 2)
        a, b = p[..., 0], p[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.stack((a * c - b * s, a * s + b * c), -1).view(T, h, D).to(self.dtype)

    def forward(self, tokens, pos):
        """The last position's logits after `tokens` at `pos` (the cache holds positions < pos)."""
        c, w, D = self.c, self.w, self.D
        H, Hkv, E = c["heads"], c["kv_heads"], c["embd"]
        T = len(tokens)
        x = w["token_embd.weight"][torch.tensor(tokens, device=self.dev)]
        ang = (pos + torch.arange(T, device=self.dev, dtype=torch.float64))[:, None] * self.inv[None]
        cos, sin = ang.cos().float(), ang.sin().float()
        mask = None
        if T > 1:  # token t sees positions <= pos + t
            mask = torch.arange(pos + T, device=self.dev)[None, :] <= (pos + torch.arange(T, device=self.dev))[:, None]
        for i in range(c["layers"]):
            p = f"blk.{i}."
            h = self.norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).view(T, H, D), cos, sin)
            k = self.rope((h @ w[p + "attn_k.weight"].T).view(T, Hkv, D), cos, sin)
            v = (h @ w[p + "attn_v.weight"].T).view(T, Hkv, D)
            self.k[i, :, pos:pos + T] = k.transpose(0, 1)
            self.v[i, :, pos:pos + T] = v.transpose(0, 1)
            a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], self.k[i, :, :pos + T][None],
                                               self.v[i, :, :pos + T][None], attn_mask=mask, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(T, E) @ w[p + "attn_output.weight"].T
            f = self.norm(x, w[p + "ffn_norm.weight"])
            x = x + (F.silu(f @ w[p + "ffn_gate.weight"].T) * (f @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        h = self.norm(x[-1:], w["output_norm.weight"])
        return (h @ w.get("output.weight", w["token_embd.weight"]).T)[0]


def llm_peer(args, rlx):
    import numpy as np
    cfg = json.load(open(os.path.join(args.llm, "model.json")))
    dev = torch.device("cuda")
    flat = np.fromfile(os.path.join(args.llm, "weights.f32"), dtype=np.float32)
    host = {n: torch.from_numpy(flat[t["offset"]:t["offset"] + int(np.prod(t["shape"]))].reshape(t["shape"]))
            for n, t in cfg["tensors"].items()}
    prompt, n = cfg["prompt"], cfg["decode_tokens"]
    rows = len(prompt) + n + 8
    print(f"# PyTorch {torch.__version__} on {torch.cuda.get_device_name()}: {cfg['layers']} layers, width "
          f"{cfg['embd']}, vocab {cfg['vocab']}, prompt {len(prompt)} tokens, {n} decode tokens")
    with torch.no_grad():
        # The same network in f32 first: its logits against RLX's exact mode check the peer's architecture.
        f32 = Llama(cfg, {k: v.to(dev) for k, v in host.items()}, torch.float32, rows, dev)
        logits32 = f32.forward(prompt, 0).float().cpu()
        del f32
        m = Llama(cfg, {k: v.to(dev, torch.bfloat16) for k, v in host.items()}, torch.bfloat16, rows, dev)
        logits16 = m.forward(prompt, 0).float().cpu()
        pos, nxt = len(prompt), int(logits16.argmax())
        for _ in range(3):  # warm-up, as cuda_bench's
            nxt = int(m.forward([nxt], pos).argmax())
            pos += 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            nxt = int(m.forward([nxt], pos).argmax())
            pos += 1
        torch.cuda.synchronize()
        tok_s = n / (time.perf_counter() - t0)

    def rel(ours, name):
        path = os.path.join(args.llm, name)
        if not os.path.exists(path):
            return float("nan")
        theirs = torch.from_numpy(np.fromfile(path, dtype=np.float32))
        return float((ours - theirs).abs().max() / theirs.abs().max())

    nan = float("nan")
    rows_out = [("decode, Q4_1 weights (tok/s)", f"{rlx.get('llm_q4_1_decode_tok_s', nan):.0f} (q8 activations) / "
                 f"{rlx.get('llm_q4_1_f32act_decode_tok_s', nan):.0f} (f32)", f"eager bf16 {tok_s:.0f}",
                 f"{rlx.get('llm_q4_1_decode_tok_s', nan) / tok_s:.2f}x eager's speed (target >= 1.0)")]
    for t in ("q4_1", "q4_0", "q8_0", "q4_k"):
        key = f"llm_{t}"
        rows_out.append((f"decode {t.upper()} vs the bandwidth roof", f"{rlx.get(key + '_decode_tok_s', nan):.0f} tok/s, "
                         f"{rlx.get(key + '_decode_gbps', nan):.0f} GB/s of {rlx.get(key + '_bytes_per_token_mb', nan):.1f} MB"
                         f"/token; {rlx.get(key + '_decode_gpu_us', nan):.0f} us in kernels, "
                         f"{rlx.get(key + '_host_kernels', nan):.0f} on the host", "",
                         f"{rlx.get(key + '_vs_roof', nan):.3f}x of the copy ({rlx.get('copy_d2d_gbps', nan):.0f} GB/s; "
                         f"roof {rlx.get(key + '_roof_tok_s', nan):.0f} tok/s)"))
    rows_out.append(("first logits, max|d| / max|RLX|", f"exact (f32 activations) vs PyTorch f32: {rel(logits32, 'logits_f32.f32'):.2e}",
                     f"bf16 vs RLX exact {rel(logits16, 'logits_f32.f32'):.2e}, vs RLX q8 {rel(logits16, 'logits_q8.f32'):.2e}", ""))
    head = ("figure", args.label, "PyTorch", "ratio")
    widths = [max(len(r[i]) for r in rows_out + [head]) for i in range(4)]
    for r in [head] + rows_out:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True, help="vulkan_bench or cuda_bench output")
    ap.add_argument("--label", default="RLX Vulkan", help="the RLX column's title")
    ap.add_argument("--llm", help="GGUF decode only: the folder `cuda_bench decode` wrote")
    args = ap.parse_args()
    rlx = {}
    for line in open(args.rlx):
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#"):
            try:
                rlx[parts[0]] = float(parts[1])
            except ValueError:
                pass
    if args.llm:
        return llm_peer(args, rlx)
    dev = torch.device("cuda")
    print(f"# PyTorch {torch.__version__} on {torch.cuda.get_device_name()}")

    n = 4096
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    gemm = {}
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        gemm[tf32] = 2 * n**3 / gpu_seconds(lambda: a @ b) * 1e-12
    torch.backends.cuda.matmul.allow_tf32 = False
    del a, b
    nb = 8192
    a16, b16 = torch.randn(nb, nb, device=dev, dtype=torch.bfloat16), torch.randn(nb, nb, device=dev, dtype=torch.bfloat16)
    gemm_bf16 = 2 * nb**3 / gpu_seconds(lambda: a16 @ b16) * 1e-12
    del a16, b16

    m = 1 << 28
    x = torch.rand(m, device=dev)
    dst = torch.empty_like(x)
    copy = 8 * m / gpu_seconds(lambda: dst.copy_(x)) * 1e-9
    eager = 8 * m / gpu_seconds(lambda: chain(x)) * 1e-9
    compiled = torch.compile(chain)
    fused = 8 * m / gpu_seconds(lambda: compiled(x), warmup=3) * 1e-9
    del x, dst

    torch.backends.cudnn.allow_tf32 = False  # cuDNN's default is on: f32 against f32
    xc, wc = torch.randn(8, 256, 14, 14, device=dev), torch.randn(256, 256, 3, 3, device=dev)
    conv_tflops = 2 * 8 * 256 * 196 * 256 * 9 / gpu_seconds(lambda: torch.nn.functional.conv2d(xc, wc, padding=1)) * 1e-12

    enc, enc_compiled = {}, {}
    for name, (B, S, D, H, FF) in (("encoder", (1, 128, 512, 8, 2048)), ("encoder_large", (8, 512, 1024, 16, 4096))):
        p = encoder_params(D, FF, dev)
        xe = torch.rand(B, S, D, device=dev) * 2 - 1
        with torch.no_grad():
            enc[name] = wall_seconds(lambda: encoder(xe, p, B, S, D, H)) * 1e6
            fn = torch.compile(lambda v: encoder(v, p, B, S, D, H))
            enc_compiled[name] = wall_seconds(lambda: fn(xe), warmup=5) * 1e6

    g = rlx.get(f"gemm_f32_{n}_tflops", float("nan"))
    # The fastest hand-written Vulkan copy (vulkan_bench's bench_copy_*): what any shader moves on this device.
    shader_copy = max((v for k, v in rlx.items() if k.startswith("bench_copy_") and "quarter" not in k), default=float("nan"))
    chain_bw = rlx.get("chain8_gbps", float("nan"))
    rows = [
        ("f32 GEMM 4096^3 (TFLOP/s)", f"{g:.1f}", f"cuBLAS TF32 off {gemm[False]:.1f} / on {gemm[True]:.1f}",
         f"{g / gemm[False]:.2f}x of TF32-off (target >= 0.95)"),
        ("bf16 GEMM 8192^3 (TFLOP/s)", f"{rlx.get('gemm_bf16_8192_tflops', float('nan')):.1f}", f"{gemm_bf16:.1f}",
         f"{rlx.get('gemm_bf16_8192_tflops', float('nan')) / gemm_bf16:.2f}x (target >= 0.9)"),
        ("device-to-device copy (GB/s)", f"{rlx.get('copy_d2d_gbps', float('nan')):.0f} vkCmdCopyBuffer / "
         f"{shader_copy:.0f} copy shader", f"{copy:.0f}", ""),
        ("8-op chain, 256M f32 (GB/s)", f"{chain_bw:.0f}", f"eager {eager:.0f} / torch.compile {fused:.0f}",
         f"{chain_bw / shader_copy:.2f}x of the Vulkan copy shader, {chain_bw / copy:.2f}x of CUDA's copy"),
    ]
    cv = rlx.get("conv2d_8x256x14x14_k3_tflops", float("nan"))
    rows.append(("conv2d 8x256x14x14 3x3 (TFLOP/s)", f"{cv:.1f}", f"cuDNN, TF32 off {conv_tflops:.1f}", f"{cv / conv_tflops:.2f}x"))
    for name, label in (("encoder", "encoder B1 S128 D512 (us)"), ("encoder_large", "encoder B8 S512 D1024 (us)")):
        wall, gpu = rlx.get(name + "_wall_us", float("nan")), rlx.get(name + "_gpu_us", float("nan"))
        resident = rlx.get(name + "_resident_wall_us", float("nan"))
        # PyTorch's tensors stay on the GPU, as RLX's do with the input bound as a handle and the output left there
        # ("resident"); RLX's plain run() also copies the input in and the output out through host memory.
        rows.append((label, f"{resident:.0f} resident / {wall:.0f} with host I/O / {gpu:.0f} GPU",
                     f"eager {enc[name]:.0f} / torch.compile {enc_compiled[name]:.0f}",
                     f"{resident / enc_compiled[name]:.2f}x torch.compile's wall time (target <= 1.0), "
                     f"{enc[name] / resident:.2f}x eager's speed"))
    rows.append(("3-kernel graph, wall per run (us)",
                 f"{rlx.get('overhead_3k_us', float('nan')):.1f} with host I/O / "
                 f"{rlx.get('overhead_3k_resident_us', float('nan')):.1f} resident / "
                 f"{rlx.get('overhead_3k_kernels_us', float('nan')):.1f} in kernels", "", "target <= 10"))
    head = ("figure", args.label, "PyTorch", "ratio")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    for r in [head] + rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
