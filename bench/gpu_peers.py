#!/usr/bin/env python3
"""PyTorch peers for bench/vulkan_bench.cpp on the same GPU, printed next to RLX's figures as one table.

    python3 bench/gpu_peers.py --rlx rlx_bench.txt

Measures with CUDA events (best of several runs after warm-up): f32 GEMM 4096^3 with TF32 off and on, a
device-to-device copy, the same 8-op elementwise chain on 256M floats eager and under torch.compile, and the
rlx::models encoder block eager and under torch.compile (wall time per call, synchronized), and a bf16 GEMM 8192^3. Sizes follow vulkan_bench's full sizes.
"""
import argparse
import math
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True, help="vulkan_bench or cuda_bench output")
    ap.add_argument("--label", default="RLX Vulkan", help="the RLX column's title")
    args = ap.parse_args()
    rlx = {}
    for line in open(args.rlx):
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#"):
            rlx[parts[0]] = float(parts[1])
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
