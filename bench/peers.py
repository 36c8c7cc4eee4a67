#!/usr/bin/env python3
"""Peers of bench_e2e: NumPy for the row norms, ONNX Runtime for conv2d, the MLP and the encoder block.

Prints the same JSON-lines records as the C++ benchmarks ({"workload", "impl", "samples_s", "iters"}).

  peers.py versions
  peers.py numpy  --reps N
  peers.py ort    --dump DIR --reps N    DIR written by `bench_e2e --dump-params DIR`
  peers.py verify --dump DIR             max |RLX - ORT| per graph, on the dumped inputs
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

ROWS = COLS = 4096
MIN_SAMPLE_S = 0.02


def measure(fn, reps):
    """Warm-up, then `reps` samples; short calls are repeated so a sample spans MIN_SAMPLE_S (as in common.hpp)."""
    t0 = time.perf_counter()
    fn()
    iters = max(1, math.ceil(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-9)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    return samples, iters


def emit(workload, impl, samples, iters):
    print(json.dumps({"workload": workload, "impl": impl, "samples_s": samples, "iters": iters}), flush=True)
    print(f"  {workload:<28}  {impl} {sorted(samples)[len(samples) // 2] * 1e3:.3f} ms", file=sys.stderr)


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


def run_numpy(reps):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (ROWS, COLS)).astype(np.float32)
    g = rng.uniform(0.9, 1.1, COLS).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, COLS).astype(np.float32)
    out = np.empty_like(x)
    for workload, fn in [("softmax_4096x4096", lambda: np_softmax(x, out)),
                         ("layer_norm_4096x4096", lambda: np_layer_norm(x, g, b, out)),
                         ("rms_norm_4096x4096", lambda: np_rms_norm(x, g, out))]:
        emit(workload, "numpy", *measure(fn, reps))


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


BUILDERS = {"conv2d_8x256x14x14_k3": onnx_conv, "mlp_b64_w1024_l2": onnx_mlp, "encoder_s128_d512_h8": onnx_encoder}


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


def bound_runner(sess, m):
    """Inputs and the output bound once (like run_into), so a timed call is run_with_iobinding alone."""
    import onnxruntime as ort
    binding = sess.io_binding()
    keep = []
    for name, v in m["inputs"].items():
        keep.append(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)))
        binding.bind_ortvalue_input(name, keep[-1])
    (out,) = m["outputs"].values()
    keep.append(ort.OrtValue.ortvalue_from_numpy(np.empty_like(out)))
    binding.bind_ortvalue_output(sess.get_outputs()[0].name, keep[-1])
    return lambda: sess.run_with_iobinding(binding), keep[-1]


def run_ort(directory, reps):
    models = load_dump(directory)
    encoder = "encoder_s128_d512_h8"
    model_bytes = {w: onnx_model(m, w) for w, m in models.items()}
    # Session creation is ORT's compile step: cold is the first in this process (timed before any other).
    t0 = time.perf_counter()
    ort_session(model_bytes[encoder])
    emit("compile_encoder_cold", "onnxruntime", [time.perf_counter() - t0], 1)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ort_session(model_bytes[encoder])
        samples.append(time.perf_counter() - t0)
    emit("compile_encoder_cached", "onnxruntime", samples, 1)
    for w, m in models.items():
        run, _ = bound_runner(ort_session(model_bytes[w]), m)
        emit(w, "onnxruntime", *measure(run, reps))


def verify(directory):
    checks = {}
    for w, m in load_dump(directory).items():
        run, out = bound_runner(ort_session(onnx_model(m, w)), m)
        run()
        (expected,) = m["outputs"].values()
        checks[w] = float(np.max(np.abs(out.numpy() - expected)))
        print(f"  check {w:<24} max |rlx - onnxruntime| = {checks[w]:.3g}", file=sys.stderr)
    print(json.dumps({"checks": checks}), flush=True)


def versions():
    import onnxruntime
    print(json.dumps({"versions": {"numpy": np.__version__, "onnxruntime": onnxruntime.__version__}}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["versions", "numpy", "ort", "verify"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dump", help="directory written by bench_e2e --dump-params")
    a = p.parse_args()
    if a.mode in ("ort", "verify") and not a.dump:
        p.error(f"{a.mode} needs --dump DIR")
    {"versions": versions, "numpy": lambda: run_numpy(a.reps), "ort": lambda: run_ort(a.dump, a.reps),
     "verify": lambda: verify(a.dump)}[a.mode]()


if __name__ == "__main__":
    main()
