#!/usr/bin/env python3
"""Fast-mode accuracy against llama.cpp on the same GGUF file (issue 14), in one run.

For each prompt, the float64 reference (tests/llm/llama_reference.py: numpy over gguf's
dequantizers, sharing no code with RLX) generates 32 greedy tokens. Then RLX's fast mode
(rlx.LLM(path).logits), its exact mode, and llama.cpp (bench/llama_logits.cpp over libllama)
each give the logits of every position of prompt + those tokens, and are compared with the
reference's:
  - RMS and max |delta| over every position of every prompt;
  - teacher forcing: how often each one's top-1 at the 32 positions is the reference's token.

  llm_accuracy.py MODEL.gguf LLAMA_LOGITS_EXE [--out FILE.json] [--steps 32]
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "llm"))
from llama_reference import Reference  # noqa: E402

import pyrlx as rlx  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
]


def llama_cpp_logits(exe, model, ids, vocab):
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "logits.f32"
        subprocess.run([exe, model, str(out)] + [str(i) for i in ids], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return np.fromfile(out, dtype=np.float32).reshape(len(ids), vocab).astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("llama_logits")
    ap.add_argument("--out", default="")
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args()

    ref = Reference(a.model)
    fast = rlx.LLM(a.model, exact=False, context=256)
    exact = rlx.LLM(a.model, exact=True, context=256)
    vocab = fast.vocab_size
    deltas = {"rlx_fast": [], "rlx_exact": [], "llama.cpp": []}
    agree = {k: 0 for k in deltas}
    steps = 0
    for prompt in PROMPTS:
        seq = fast.tokenize(prompt)
        start = len(seq)
        for _ in range(a.steps):  # the reference's greedy continuation
            seq.append(int(np.argmax(ref.forward(seq)[-1])))
        want = ref.forward(seq)
        got = {
            "rlx_fast": fast.logits(seq).astype(np.float64),
            "rlx_exact": exact.logits(seq).astype(np.float64),
            "llama.cpp": llama_cpp_logits(a.llama_logits, a.model, seq, vocab),
        }
        for k, g in got.items():
            deltas[k].append((g - want).ravel())
            # position p predicts token p + 1: the 32 generated tokens
            agree[k] += int(sum(np.argmax(g[p]) == seq[p + 1] for p in range(start - 1, len(seq) - 1)))
        steps += a.steps
    rows = []
    for k, ds in deltas.items():
        d = np.concatenate(ds)
        rows.append({"impl": k, "rms": float(np.sqrt(np.mean(d * d))), "max_abs": float(np.max(np.abs(d))),
                     "top1_agree": agree[k], "steps": steps})
    print(f"{'impl':<10} {'RMS':>9} {'max|d|':>9} {'top-1':>9}   vs the float64 reference, "
          f"{len(PROMPTS)} prompts + {a.steps} greedy tokens each")
    for r in rows:
        print(f"{r['impl']:<10} {r['rms']:9.4f} {r['max_abs']:9.4f} {r['top1_agree']:>4}/{r['steps']:<4}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps({"model": pathlib.Path(a.model).name, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
