#!/usr/bin/env python3
"""MLX through RLX (Device::Mlx) against RLX's CPU backend and against MLX's own Python API, on the MLP
(mlp_b64_w1024_l2) and the encoder block (encoder_s128_d512_h8) of bench_e2e.

  mlx_bench.py --exe BENCH_E2E [--dump DIR] [--reps N]

Three implementations of each workload, with the same weights and inputs (bench_e2e's deterministic ones, read
from DIR, written by `bench_e2e --dump-params DIR`; made here when --dump is left out):

  rlx_mlx  `bench_e2e --serve --device mlx`: RLX's graph compiled for the MLX backend (mx::compile'd segments)
  rlx_cpu  `bench_e2e --serve`: the same graph on RLX's CPU backend
  mlx      the model written directly in MLX's Python API (mx.fast.layer_norm, mx.fast.scaled_dot_product_attention),
           mx.compile'd, NumPy in and out as bench_e2e's runs are host memory in and out

They alternate sample by sample (the order rotating every round), as peers.py interleaves RLX and its peer.
MLX's CPU matmuls call the BLAS found first: in bench_e2e that is OpenBLAS (librlx links it before libmlx.so),
where Python's `import mlx.core` alone would get the reference BLAS the mlx-cpu wheel bundles, many times slower.
So that both run the same MLX, this script re-executes itself once with bench_e2e's OpenBLAS in LD_PRELOAD
(the library goes into the versions record; --bundled-blas keeps the wheel's).
Before timing, the outputs of rlx_mlx and mlx are checked against rlx_cpu's; a difference beyond the tolerance
ends the run. Records go to stdout as JSON lines (workloads mlx_<workload>), in the format bench/report.py reads.
Exits with status 2 and a reason when MLX is not available (no mlx.core, or RLX built without the mlx backend).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from peers import SETTLE_S, RlxServer, calibrate, emit, load_dump, timed  # noqa: E402

WORKLOADS = ("mlp_b64_w1024_l2", "encoder_s128_d512_h8")
ONLY = "^(" + "|".join(WORKLOADS) + ")$"
# max |a - b| / max(1, max |b|): f32 on both sides, different summation orders and fusions.
TOLERANCE = 1e-3
REEXEC = "RLX_MLX_BENCH_PRELOADED"  # set on the re-executed process: the OpenBLAS in its LD_PRELOAD


def unavailable(why):
    print(f"mlx_bench.py: skipped: {why}", file=sys.stderr)
    sys.exit(2)


def mlx_mlp(mx, m):
    layers = m["config"]["layers"]

    def f(x, *p):
        h = x
        for i in range(layers):
            h = h @ p[2 * i] + p[2 * i + 1]
            if i + 1 < layers:
                h = mx.maximum(h, 0)
        return h

    return f, [m["params"][f"{k}{i}"] for i in range(layers) for k in ("w", "b")]


def mlx_encoder(mx, m):
    c = m["config"]
    B, S, D, H = c["batch"], c["seq"], c["d_model"], c["heads"]
    Dh, eps = D // H, c["eps"]
    names = ["ln1_g", "ln1_b", "wq", "wq_bias", "wk", "wk_bias", "wv", "wv_bias", "wo", "wo_bias", "ln2_g", "ln2_b",
             "w1", "w1_bias", "w2", "w2_bias"]

    def f(x, *p):
        p = dict(zip(names, p))
        heads = lambda v: v.reshape(B, S, H, Dh).transpose(0, 2, 1, 3)
        h = mx.fast.layer_norm(x, p["ln1_g"], p["ln1_b"], eps)
        q, k, v = (heads(h @ p[n] + p[n + "_bias"]) for n in ("wq", "wk", "wv"))
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(Dh))
        x1 = x + a.transpose(0, 2, 1, 3).reshape(B, S, D) @ p["wo"] + p["wo_bias"]
        g = mx.fast.layer_norm(x1, p["ln2_g"], p["ln2_b"], eps) @ p["w1"] + p["w1_bias"]
        g = g * 0.5 * (1 + mx.erf(g * (1 / math.sqrt(2))))  # exact GELU, as RLX's gelu
        return x1 + g @ p["w2"] + p["w2_bias"]

    return f, [m["params"][n] for n in names]


def mlx_peer(mx, workload, m):
    """A call from NumPy input to NumPy output, and the output of one call."""
    build = {"mlp_b64_w1024_l2": mlx_mlp, "encoder_s128_d512_h8": mlx_encoder}[workload]
    f, params = build(mx, m)
    fn = mx.compile(f)
    params = [mx.array(p) for p in params]
    (x,) = m["inputs"].values()

    def call():
        out = fn(mx.array(x), *params)
        mx.eval(out)
        return np.array(out)

    return call, call()


def rel_diff(a, b):
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def openblas_of(exe):
    """The OpenBLAS library `exe` loads (ldd), or None."""
    r = subprocess.run(["ldd", exe], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0].startswith("libopenblas") and parts[1] == "=>" and os.path.isfile(parts[2]):
            return parts[2]
    return None


def with_blas_of(exe):
    """Re-executes this script with `exe`'s OpenBLAS preloaded, once; returns the BLAS MLX's matmuls call here."""
    if REEXEC in os.environ:
        return os.environ[REEXEC]
    blas = openblas_of(exe)
    if not blas:
        return "the mlx-cpu wheel's bundled BLAS (bench_e2e loads no OpenBLAS)"
    env = dict(os.environ, **{REEXEC: blas}, LD_PRELOAD=":".join(filter(None, [blas, os.environ.get("LD_PRELOAD")])))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def dump(exe, directory, device=None):
    cmd = [exe, "--dump-params", directory, "--only", ONLY] + (["--device", device] if device else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        msg = r.stderr.strip()
        if device and "unavailable" in msg:
            unavailable(msg)
        raise SystemExit(f"mlx_bench.py: {' '.join(cmd)} failed: {msg}")
    return load_dump(directory)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exe", required=True, help="the bench_e2e executable")
    p.add_argument("--dump", help="directory written by bench_e2e --dump-params (made here when absent)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--bundled-blas", action="store_true",
                   help="MLX's Python API keeps the wheel's bundled BLAS (not bench_e2e's OpenBLAS)")
    a = p.parse_args()
    blas = "the mlx-cpu wheel's bundled BLAS (--bundled-blas)" if a.bundled_blas else with_blas_of(a.exe)
    try:
        import mlx.core as mx
    except ImportError as e:
        unavailable(f"MLX's Python API is not installed ({e}; scripts/bootstrap.sh installs mlx[cpu])")

    with tempfile.TemporaryDirectory() as tmp:
        cpu = load_dump(a.dump) if a.dump else dump(a.exe, os.path.join(tmp, "cpu"))
        via_mlx = dump(a.exe, os.path.join(tmp, "mlx"), "mlx")
    blas_name = f"{os.path.basename(blas)} (LD_PRELOAD)" if os.path.isabs(blas) else "bundled"
    print(json.dumps({"versions": {"mlx": mx.__version__, "mlx_python_blas": blas_name}}), flush=True)
    print(f"  MLX's Python API calls {blas}", file=sys.stderr)
    device = str(mx.default_device())

    peers, checks = {}, {}
    for w in WORKLOADS:
        (ref,) = cpu[w]["outputs"].values()
        (got,) = via_mlx[w]["outputs"].values()
        peers[w], out = mlx_peer(mx, w, cpu[w])
        checks[f"mlx_{w}: max |rlx_mlx - rlx_cpu| / max(1, max |rlx_cpu|)"] = rel_diff(got, ref)
        checks[f"mlx_{w}: max |mlx - rlx_cpu| / max(1, max |rlx_cpu|)"] = rel_diff(out, ref)
    print(json.dumps({"checks": checks}), flush=True)
    for k, d in checks.items():
        print(f"  check {k} = {d:.3g}", file=sys.stderr)
        if not d <= TOLERANCE:
            raise SystemExit(f"mlx_bench.py: {k} = {d:.3g}, beyond {TOLERANCE}")

    servers = {"rlx_mlx": RlxServer(a.exe, ["--device", "mlx", "--only", ONLY]),
               "rlx_cpu": RlxServer(a.exe, ["--only", ONLY])}
    works = {x.pop("workload"): x for x in servers["rlx_cpu"].workloads()}
    servers["rlx_mlx"].workloads()
    for w in WORKLOADS:
        sample = {name: (lambda s: lambda n: s.run(w, n))(s) for name, s in servers.items()}
        sample["mlx"] = lambda n, fn=peers[w]: timed(fn, n)
        iters = {}
        for name, fn in sample.items():  # warm-up as peers.py: one call to size a sample, then one untimed sample
            iters[name] = calibrate(fn(1))
            fn(iters[name])
            time.sleep(SETTLE_S)
        names = list(sample)
        samples = {name: [] for name in names}
        for r in range(a.reps):
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[name].append(sample[name](iters[name]))
                time.sleep(SETTLE_S)
        med = {}
        for name in names:
            emit(f"mlx_{w}", name, samples[name], iters[name], works[w])
            med[name] = sorted(samples[name])[len(samples[name]) // 2] * 1e3
        print(f"  mlx_{w:<26} " + "  ".join(f"{n} {med[n]:.3f} ms" for n in names) + f"  (MLX device {device})",
              file=sys.stderr)
    for s in servers.values():
        s.close()


if __name__ == "__main__":
    main()
