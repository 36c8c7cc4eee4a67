#!/usr/bin/env python3
"""An independent float64 forward pass of a GGUF Llama model, for checking RLX.

Written from the architecture's definition over numpy and the `gguf` package's
reader and dequantizers; it shares no code with RLX.

  llama_reference.py MODEL.gguf OUT.f64 ID [ID ...]

writes the logits of every position, [len(ids), vocab] float64 row-major.
bench/llm_accuracy.py imports Reference to run it many times on one load.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return v.tolist()[0] if hasattr(v, "tolist") and len(v) == 1 else v


class Reference:
    """The model's weights, dequantized to float64 once; forward(ids) gives every position's logits."""

    def __init__(self, path):
        r = GGUFReader(path)
        arch = bytes(field(r, "general.architecture")).decode()
        assert arch == "llama", arch
        self.n_layer = field(r, "llama.block_count")
        self.n_head = field(r, "llama.attention.head_count")
        self.n_kv = field(r, "llama.attention.head_count_kv")
        self.base = float(field(r, "llama.rope.freq_base"))
        self.eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
        # numpy's row-major view: the reverse of ggml's dims
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(d) for d in reversed(t.shape)])
                  for t in r.tensors}
        self.out_w = self.w["output.weight"] if "output.weight" in self.w else self.w["token_embd.weight"]

    def forward(self, ids):
        w, eps, n_head, n_kv = self.w, self.eps, self.n_head, self.n_kv
        embd = w["token_embd.weight"]
        dim = embd.shape[1]
        hd = dim // n_head

        def rms(x, g):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        inv = self.base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = pos[:, None] * inv[None, :]  # [n, hd/2]
        cos, sin = np.cos(ang), np.sin(ang)

        def rope(x):  # x [n, heads, hd]; rotates adjacent pairs (llama.cpp's "normal" mode for GGUF Llama)
            x0, x1 = x[..., 0::2], x[..., 1::2]
            c, s = cos[:, None, :], sin[:, None, :]
            y = np.empty_like(x)
            y[..., 0::2] = x0 * c - x1 * s
            y[..., 1::2] = x0 * s + x1 * c
            return y

        x = embd[ids]
        causal = np.tril(np.ones((n, n), dtype=bool))
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, hd))
            k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd))
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
            rep = n_head // n_kv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
            s = np.where(causal[None], s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            a = np.einsum("hqk,khd->qhd", s, v).reshape(n, dim)
            x = x + a @ w[p + "attn_output.weight"].T
            f = rms(x, w[p + "ffn_norm.weight"])
            g = f @ w[p + "ffn_gate.weight"].T
            u = f @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        return rms(x, w["output_norm.weight"]) @ self.out_w.T


def main():
    path, out, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
    Reference(path).forward(ids).astype(np.float64).tofile(out)


if __name__ == "__main__":
    main()
