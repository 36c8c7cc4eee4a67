#!/usr/bin/env python3
"""Test vectors for tests/gguf/test_quants.cpp: inputs drawn with numpy, and the references' outputs.

    quant_vectors.py --type Q4_K --what dequantize|quantize --seed N --out DIR [--ggml-ref EXE]

Inputs come from a fixed seed (the same every run) and from --seed (the test's fresh RLX_TEST_SEED),
back to back. Writes into DIR:

  dequantize: dq_in.bin (blocks: random bytes with sane or edge-case scales), and the references'
              dequantized f32: dq_gguf.f32 (gguf.quants.dequantize), dq_numpy.f32 (for Q8_1 and Q8_K,
              which gguf lacks: d * q written out here), dq_ggml.f32 (llama.cpp's dequantize_row_*)
  quantize:   q_in.f32 and the references' blocks: q_gguf.bin (gguf.quants.quantize, where gguf
              implements the type), q_ggml.bin (llama.cpp's quantize_row_*_ref)
  meta.txt:   "key value" lines: which references ran, and why one did not

The C++ test compares RLX with every reference present, bit for bit.
"""

import argparse
import os
import subprocess
import sys

import numpy as np

try:
    import gguf
    import gguf.quants
except ImportError as e:  # the test reports this as a failure: scripts/bootstrap.sh installs gguf
    print(f"quant_vectors.py: the gguf package is missing ({e}); scripts/bootstrap.sh installs it", file=sys.stderr)
    sys.exit(3)

FIXED_SEED = 20240914
QK_K = 256

# type: (block elements, block bytes, byte offsets of its f16 scales). Q8_1 is ggml's 36-byte block.
LAYOUT = {
    "F32": (1, 4, []),
    "F16": (1, 2, []),
    "BF16": (1, 2, []),
    "Q4_0": (32, 18, [0]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]),
    "Q8_0": (32, 34, [0]),
    "Q8_1": (32, 36, [0, 2]),
    "Q2_K": (256, 84, [80, 82]),
    "Q3_K": (256, 110, [108]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
    "Q8_K": (256, 292, []),  # an f32 scale at offset 0
}
GGML_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"}
GGML_DEQUANT = GGML_TYPES - {"Q8_1"}  # ggml has no dequantize_row_q8_1


def qtype(name):
    return getattr(gguf.GGMLQuantizationType, name)


# ---- dequantize inputs ----

EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00]


def sane_f16(rng, n):
    """Finite f16 scales: mostly 1e-4..10 of either sign, with zeros, subnormals and the extremes mixed in."""
    mag = 10.0 ** rng.uniform(-4, 1, n)
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16).view(np.uint16)
    pick = rng.random(n)
    v = np.where(pick < 0.05, rng.choice(EDGE_F16, n), v)
    v = np.where((pick >= 0.05) & (pick < 0.10), rng.integers(1, 0x400, n) | rng.choice([0, 0x8000], n), v)
    return v.astype(np.uint16)


def dequant_blocks(name, rng, nblocks):
    elems, size, scales = LAYOUT[name]
    if name == "F16":  # every bit pattern, NaNs and infinities included, then random ones
        return np.concatenate([np.arange(65536, dtype=np.uint16), rng.integers(0, 65536, nblocks, dtype=np.uint16)]).view(np.uint8)
    if name == "BF16":
        return np.concatenate([np.arange(65536, dtype=np.uint16), rng.integers(0, 65536, nblocks, dtype=np.uint16)]).view(np.uint8)
    if name == "F32":
        return rng.integers(0, 2**32, nblocks * 64, dtype=np.uint32).view(np.uint8)
    b = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    for off in scales:
        b[:, off:off + 2] = sane_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    if name == "Q8_K":
        d = (10.0 ** rng.uniform(-6, 2, nblocks) * rng.choice([-1.0, 1.0], nblocks)).astype(np.float32)
        d[: min(4, nblocks)] = np.array([0.0, -0.0, 1e-40, 3e38], np.float32)[: min(4, nblocks)]
        b[:, 0:4] = d.view(np.uint8).reshape(nblocks, 4)
    # A few blocks with infinite and NaN scales: these must propagate, not be errors.
    if scales and nblocks >= 8:
        for k, bits in enumerate([0x7C00, 0xFC00, 0x7E00, 0xFE01]):
            b[-1 - k, scales[0]:scales[0] + 2] = np.array([bits], np.uint16).view(np.uint8)
    return b.reshape(-1)


def numpy_dequant(name, data):
    """Q8_1 and Q8_K, which gguf does not implement: x = d * q, written out independently."""
    elems, size, _ = LAYOUT[name]
    b = data.reshape(-1, size)
    if name == "Q8_1":
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = b[:, 4:36].view(np.int8).astype(np.float32)
    else:
        d = b[:, 0:4].copy().view(np.float32)
        q = b[:, 4:260].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1).astype(np.float32)


# ---- quantize inputs ----


def quant_input(name, rng, nblocks):
    elems, _, _ = LAYOUT[name]
    if name in ("F32", "F16", "BF16"):
        return float_cases(name, rng)
    k_quant = elems == QK_K
    blocks = []
    kinds = ["normal", "uniform", "scaled", "heavy", "positive", "negative", "outlier", "sparse", "ints", "halves"]
    for i in range(nblocks):
        kind = kinds[i % len(kinds)]
        if kind == "normal":
            x = rng.standard_normal(elems)
        elif kind == "uniform":
            x = rng.uniform(-1, 1, elems)
        elif kind == "scaled":  # one magnitude per block, 1e-6 .. 1e3 (1e5 for the 32-element types)
            x = rng.standard_normal(elems) * 10.0 ** rng.uniform(-6, 3 if k_quant else 5)
        elif kind == "heavy":
            x = rng.standard_t(2, elems)
        elif kind == "positive":
            x = np.abs(rng.standard_normal(elems)) + rng.uniform(0, 2)
        elif kind == "negative":
            x = -np.abs(rng.standard_normal(elems)) - rng.uniform(0, 2)
        elif kind == "outlier":
            x = rng.standard_normal(elems) * 0.01
            x[rng.integers(0, elems)] = rng.choice([-1, 1]) * rng.uniform(1, 50)
        elif kind == "sparse":
            x = np.where(rng.random(elems) < 0.9, 0.0, rng.standard_normal(elems))
        elif kind == "ints":  # exact quant grid points: d comes out a power of two or simple
            x = rng.integers(-8, 8, elems).astype(np.float64)
            x[0] = -8
        else:  # halves: rounding ties for round/trunc/nearest_int
            x = rng.integers(-16, 16, elems) + 0.5
            x[0] = 127.0 if name in ("Q8_0", "Q8_1", "Q8_K") else x[0]
        blocks.append(x)
    # Fixed edge blocks: zeros, a constant, one nonzero, tiny values, max-magnitude ties of both signs.
    z = np.zeros(elems)
    one = z.copy()
    one[elems // 3] = -0.75
    tie = np.linspace(-1, 1, elems)
    tie[0], tie[-1] = -1.0, 1.0
    blocks += [z, np.full(elems, 0.3), np.full(elems, -2.5), one, rng.standard_normal(elems) * 1e-30, tie]
    return np.concatenate(blocks).astype(np.float32)


def float_cases(name, rng):
    """f32 values that exercise rounding to f16/bf16: every midpoint between neighbours and its
    neighbouring floats, the overflow and underflow edges, and random bit patterns of every class."""
    if name == "F16":
        h = np.arange(0, 0x7C00, dtype=np.uint32)  # every finite positive f16
        lo = h.astype(np.uint16).view(np.float16).astype(np.float64)
        hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float64)  # 0x7C00 is inf: the overflow edge
        hi = np.where(np.isinf(hi), 65536.0, hi)
        mid = ((lo + hi) / 2).astype(np.float32)
    else:
        h = rng.integers(0, 0x7F80, 200000, dtype=np.uint32)
        mid = ((h << 16) | 0x8000).view(np.float32)
    mb = mid.view(np.uint32)
    vals = np.concatenate([mb, mb - 1, mb + 1])
    vals = np.concatenate([vals, vals | 0x80000000, rng.integers(0, 2**32, 200000, dtype=np.uint32)])
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000, 0x7F801FFF,
                         0x7F802000, 0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x33000000,
                         0x33000001, 0x477FF000, 0x477FEFFF, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32)
    return np.concatenate([vals, specials]).view(np.float32)


def run_ggml(exe, mode, name, src, dst):
    r = subprocess.run([exe, mode, name, src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{exe} {mode} {name} failed ({r.returncode}): {r.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", required=True, choices=sorted(LAYOUT))
    ap.add_argument("--what", required=True, choices=["dequantize", "quantize"])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ggml-ref", default="")
    ap.add_argument("--ggml-absent", default="", help="why there is no --ggml-ref (recorded in meta.txt)")
    a = ap.parse_args()
    name = a.type
    os.makedirs(a.out, exist_ok=True)
    path = lambda f: os.path.join(a.out, f)
    meta = {"type": name, "what": a.what, "seed": a.seed, "fixed_seed": FIXED_SEED,
            "numpy": np.__version__, "gguf": getattr(gguf, "__version__", "?")}
    for f in os.listdir(a.out):
        os.remove(path(f))
    elems = LAYOUT[name][0]
    nblocks = 640 if elems == QK_K else 2000
    parts = [np.random.default_rng(FIXED_SEED + sorted(LAYOUT).index(name)), np.random.default_rng(a.seed)]
    ggml_ok = bool(a.ggml_ref) and name in GGML_TYPES
    if name not in GGML_TYPES:
        meta["ggml"] = "absent: not a ggml block type the driver covers"
    elif not a.ggml_ref:
        meta["ggml"] = "absent: " + (a.ggml_absent or "no driver given")

    if a.what == "dequantize":
        data = np.concatenate([dequant_blocks(name, rng, nblocks) for rng in parts])
        data.tofile(path("dq_in.bin"))
        meta["elements"] = data.size // LAYOUT[name][1] * elems
        if name in ("Q8_1", "Q8_K"):
            with np.errstate(all="ignore"):
                numpy_dequant(name, data).tofile(path("dq_numpy.f32"))
            meta["numpy_ref"] = "yes"
        try:
            with np.errstate(all="ignore"):
                y = gguf.quants.dequantize(data, qtype(name))
            np.asarray(y, dtype=np.float32).reshape(-1).tofile(path("dq_gguf.f32"))
            meta["gguf"] = "yes"
        except NotImplementedError:
            meta["gguf"] = "absent: gguf.quants does not dequantize " + name
        if ggml_ok and name in GGML_DEQUANT:
            run_ggml(a.ggml_ref, "dequantize", name, path("dq_in.bin"), path("dq_ggml.f32"))
            meta["ggml"] = "yes"
        elif ggml_ok:
            meta["ggml"] = "absent: ggml has no dequantize_row for " + name
    else:
        x = np.concatenate([quant_input(name, rng, nblocks) for rng in parts])
        x.tofile(path("q_in.f32"))
        meta["elements"] = x.size
        try:
            with np.errstate(all="ignore"):
                q = gguf.quants.quantize(x, qtype(name))
            np.ascontiguousarray(q).view(np.uint8).reshape(-1).tofile(path("q_gguf.bin"))
            meta["gguf"] = "yes"
        except NotImplementedError:
            meta["gguf"] = "absent: gguf.quants does not quantize " + name
        if ggml_ok:
            run_ggml(a.ggml_ref, "quantize", name, path("q_in.f32"), path("q_ggml.bin"))
            meta["ggml"] = "yes"
    with open(path("meta.txt"), "w") as f:
        for k, v in meta.items():
            f.write(f"{k} {v}\n")


if __name__ == "__main__":
    main()
