#!/usr/bin/env python3
"""Peers of bench_e2e: NumPy for the row norms, ONNX Runtime for conv2d, the MLP and the encoder block.

Prints the same JSON-lines records as the C++ benchmarks ({"workload", "impl", "samples_s", "iters", ...}).

  peers.py versions
  peers.py interleave --exe BENCH_E2E --dump DIR --reps N   RLX (`bench_e2e --serve`) and its peer, rep by rep
  peers.py compile --dump DIR --reps N                      ORT session creation for the encoder, cold and cached
  peers.py verify --dump DIR                                max |RLX - ORT| per graph, on the dumped inputs

DIR is written by `bench_e2e --dump-params DIR`: the params, inputs and RLX outputs of the ORT-peered graphs.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np

ROWS = COLS = 4096
MIN_SAMPLE_S = 0.05
SETTLE_S = 0.1  # pause after every sample: ORT's workers spin ~40 ms after a run (see common.hpp)


def calibrate(seconds):
    """Calls per sample so that a sample spans MIN_SAMPLE_S (the rule of bench/common.hpp)."""
    return max(1, math.ceil(MIN_SAMPLE_S / max(seconds, 1e-9)))


def timed(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def emit(workload, impl, samples, iters, work=None):
    print(json.dumps({**(work or {}), "workload": workload, "impl": impl, "samples_s": samples, "iters": iters}),
          flush=True)


# ---- NumPy: the usual row-wise formulations, writing into a preallocated output ----

def np_softmax(x, out):
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)


def np_layer_norm(x, g, b, out, eps=1e-5):
    np.subtract(x, x.mean(axis=-1, keepdims=True), out=out)
    out *= 1.0 / np.sqrt(np.mean(np.square(out), axis=-1, keepdims=True) + eps)
    out *= g
    out += b


def np_rms_norm(x, g, out, eps=1e-6):
    np.multiply(x, 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps), out=out)
    out *= g


def numpy_peers():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (ROWS, COLS)).astype(np.float32)
    g = rng.uniform(0.9, 1.1, COLS).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, COLS).astype(np.float32)
    out = np.empty_like(x)
    return {"softmax_4096x4096": lambda: np_softmax(x, out),
            "layer_norm_4096x4096": lambda: np_layer_norm(x, g, b, out),
            "rms_norm_4096x4096": lambda: np_rms_norm(x, g, out)}


# ---- ONNX: the same graphs as rlx::models (src/models/demo_models.cpp) ----

def load_dump(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)

    def tensors(entry):
        return {name: np.fromfile(os.path.join(directory, e["file"]), dtype=np.float32).reshape(e["shape"])
                for name, e in entry.items()}

    return {w: {"config": m["config"], "params": tensors(m["params"]), "inputs": tensors(m["inputs"]),
                "outputs": tensors(m["outputs"])} for w, m in manifest.items()}


class OnnxBuilder:
    """Thin wrapper over onnx.helper that names intermediate values and collects nodes."""

    def __init__(self, params):
        from onnx import helper, numpy_helper
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.count = [], 0
        self.initializers = [numpy_helper.from_array(v, name) for name, v in params.items()]

    def op(self, op_type, *inputs, **attrs):
        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=np.float32):
        self.count += 1
        name = f"const_{self.count}"
        self.initializers.append(self.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def model(self, inputs, output, out_shape):
        from onnx import TensorProto
        h = self.helper
        graph = h.make_graph(
            self.nodes, "rlx_peer",
            [h.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in inputs.items()],
            [h.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], self.initializers)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def onnx_conv(m):
    b = OnnxBuilder(m["params"])
    p = m["config"]["padding"]
    y = b.op("Conv", "x", "w", pads=[p, p, p, p])
    return b, y


def onnx_bottleneck(m):
    b = OnnxBuilder(m["params"])
    h = b.op("Relu", b.op("Conv", "x", "w1", "b1"))
    h = b.op("Relu", b.op("Conv", h, "w2", "b2", pads=[1, 1, 1, 1]))
    return b, b.op("Relu", b.op("Add", b.op("Conv", h, "w3", "b3"), "x"))


def onnx_mlp(m):
    b = OnnxBuilder(m["params"])
    h = "x"
    layers = m["config"]["layers"]
    for i in range(layers):
        h = b.op("Add", b.op("MatMul", h, f"w{i}"), f"b{i}")
        if i + 1 < layers:
            h = b.op("Relu", h)
    return b, h


def onnx_encoder(m):
    c = m["config"]
    B, S, D, H = c["batch"], c["seq"], c["d_model"], c["heads"]
    Dh = D // H
    b = OnnxBuilder(m["params"])
    ln = lambda v, n: b.op("LayerNormalization", v, f"{n}_g", f"{n}_b", axis=-1, epsilon=c["eps"])
    proj = lambda v, n: b.op("Add", b.op("MatMul", v, n), f"{n}_bias")
    heads = lambda v: b.op("Transpose", b.op("Reshape", v, b.const([B, S, H, Dh], np.int64)), perm=[0, 2, 1, 3])
    h = ln("x", "ln1")
    q, k, v = (heads(proj(h, n)) for n in ("wq", "wk", "wv"))
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), b.const(1.0 / math.sqrt(Dh)))
    a = b.op("MatMul", b.op("Softmax", scores, axis=-1), v)
    a = b.op("Reshape", b.op("Transpose", a, perm=[0, 2, 1, 3]), b.const([B, S, D], np.int64))
    x1 = b.op("Add", "x", proj(a, "wo"))
    f = proj(ln(x1, "ln2"), "w1")
    gelu = b.op("Mul", b.op("Mul", f, b.const(0.5)),
                b.op("Add", b.const(1.0), b.op("Erf", b.op("Mul", f, b.const(1.0 / math.sqrt(2.0))))))
    return b, b.op("Add", x1, proj(gelu, "w2"))


BUILDERS = {"conv2d_8x256x14x14_k3": onnx_conv, "conv2d_1x256x14x14_k3": onnx_conv,
            "conv2d_1x256x14x14_o1024_k1": onnx_conv, "resnet_bottleneck_1x1024x14x14": onnx_bottleneck,
            "mlp_b64_w1024_l2": onnx_mlp, "encoder_s128_d512_h8": onnx_encoder}


def onnx_model(m, workload):
    builder, out = BUILDERS[workload](m)
    (out_shape,) = [v.shape for v in m["outputs"].values()]
    return builder.model(m["inputs"], out, list(out_shape)).SerializeToString()


def ort_session(model_bytes):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


class BoundRun:
    """Inputs and the output bound once (like run_into), so a timed call is run_with_iobinding alone.
    Holds the OrtValues (and through them the NumPy buffers) the binding points at."""

    def __init__(self, sess, m):
        import onnxruntime as ort
        self.sess, self.binding = sess, sess.io_binding()
        self.inputs = {n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for n, v in m["inputs"].items()}
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        (out,) = m["outputs"].values()
        self.output = ort.OrtValue.ortvalue_from_numpy(np.empty_like(out))
        self.binding.bind_ortvalue_output(sess.get_outputs()[0].name, self.output)

    def __call__(self):
        self.sess.run_with_iobinding(self.binding)


def compile_time(directory, reps):
    """Session creation is ORT's compile step: cold is the first in this process (timed before any other)."""
    workload = "encoder_s128_d512_h8"
    model = onnx_model(load_dump(directory)[workload], workload)
    t0 = time.perf_counter()
    ort_session(model)
    emit("compile_encoder_cold", "onnxruntime", [time.perf_counter() - t0], 1)
    emit("compile_encoder_cached", "onnxruntime", [timed(lambda: ort_session(model), 1) for _ in range(reps)], 1)


class RlxServer:
    """`bench_e2e --serve`: RLX runs timed inside that process, on request (protocol in bench_e2e.cpp)."""

    def __init__(self, exe, args=()):
        self.proc = subprocess.Popen([exe, "--serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise SystemExit(f"peers.py: bench_e2e --serve exited ({self.proc.wait()}) on '{line}'")
        return reply.strip()

    def workloads(self):
        self.proc.stdin.write("list\n")
        self.proc.stdin.flush()
        return [json.loads(line) for line in iter(self.proc.stdout.readline, "end\n")]

    def run(self, workload, iters):
        return float(self.ask(f"run {workload} {iters}"))

    def close(self):
        self.proc.stdin.close()
        if self.proc.wait():
            raise SystemExit(f"peers.py: bench_e2e --serve failed ({self.proc.returncode})")


def interleave(exe, directory, reps, only=None):
    """For each workload (those matching the regex `only`, when given): warm up both, then `reps` rounds of one
    RLX sample and one peer sample, the order flipping each round; RLX is blocked on its pipe while the peer
    runs, and the other way round."""
    peers = {w: ("numpy", fn) for w, fn in numpy_peers().items()}
    for w, m in load_dump(directory).items():
        peers[w] = ("onnxruntime", BoundRun(ort_session(onnx_model(m, w)), m))
    rlx = RlxServer(exe)
    for work in rlx.workloads():
        w = work.pop("workload")
        if only and not re.search(only, w):
            continue
        impl, peer = peers[w]
        rlx_iters = calibrate(rlx.run(w, 1))
        rlx.run(w, rlx_iters)  # warm-up as in common.hpp: one call, then one untimed sample
        time.sleep(SETTLE_S)
        peer_iters = calibrate(timed(peer, 1))
        timed(peer, peer_iters)
        time.sleep(SETTLE_S)
        samples = {"rlx": [], impl: []}
        sample = {"rlx": lambda: rlx.run(w, rlx_iters), impl: lambda: timed(peer, peer_iters)}
        for r in range(reps):
            for name in (("rlx", impl) if r % 2 == 0 else (impl, "rlx")):
                samples[name].append(sample[name]())
                time.sleep(SETTLE_S)
        emit(w, "rlx", samples["rlx"], rlx_iters, work)
        emit(w, impl, samples[impl], peer_iters, work)
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in samples.items()}
        print(f"  {w:<28}  rlx {med['rlx']:.3f} ms  {impl} {med[impl]:.3f} ms", file=sys.stderr)
    rlx.close()


def verify(directory):
    checks = {}
    for w, m in load_dump(directory).items():
        run = BoundRun(ort_session(onnx_model(m, w)), m)
        run()
        (expected,) = m["outputs"].values()
        checks[w] = float(np.max(np.abs(run.output.numpy() - expected)))
        print(f"  check {w:<24} max |rlx - onnxruntime| = {checks[w]:.3g}", file=sys.stderr)
    print(json.dumps({"checks": checks}), flush=True)


def versions():
    import onnxruntime
    print(json.dumps({"versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__}}), flush=True)


def llama_bench(exe, model, prompt, gen, reps, label, threads):
    """llama.cpp's llama-bench on the same file: pp<prompt> and tg<gen>, as seconds per token."""
    out = subprocess.run([exe, "-m", model, "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", str(reps),
                          "-o", "jsonl"], check=True, capture_output=True, text=True).stdout
    weight_bytes = None
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        samples = [1.0 / ts for ts in r.get("samples_ts", [r["avg_ts"]])]
        if weight_bytes is None:
            weight_bytes = float(r.get("model_size", 0)) or None
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            emit(f"llm_pp{prompt}_{label}", "llama.cpp", samples, 1)
        elif r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            emit(f"llm_tg{gen}_{label}", "llama.cpp", samples, 1, {"bytes": weight_bytes} if weight_bytes else None)
    print(json.dumps({"versions": {"llama.cpp": r.get("build_commit", "?")}}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["versions", "interleave", "compile", "verify", "llama"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dump", help="directory written by bench_e2e --dump-params")
    p.add_argument("--exe", help="the bench_e2e executable (interleave)")
    p.add_argument("--only", help="a regex: interleave only the workloads it matches")
    p.add_argument("--model", help="a GGUF file (llama)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--label", default="model")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.mode == "llama":
        return llama_bench(a.exe, a.model, a.prompt, a.gen, a.reps, a.label, a.threads)
    if a.mode != "versions" and not a.dump:
        p.error(f"{a.mode} needs --dump DIR")
    if a.mode == "interleave" and not a.exe:
        p.error("interleave needs --exe BENCH_E2E")
    {"versions": versions, "interleave": lambda: interleave(a.exe, a.dump, a.reps, a.only),
     "compile": lambda: compile_time(a.dump, a.reps), "verify": lambda: verify(a.dump)}[a.mode]()


if __name__ == "__main__":
    main()
