#!/usr/bin/env python3
"""Writes the small ONNX files the importer's tests read (checked in; rerun after changing this file):

  tests/onnx/models/*.onnx       well-formed models, with the expected outputs computed by numpy
  tests/malformed/onnx/*.onnx    one file per error the importer must report as an rlx::Error

  make_models.py [ROOT]
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
GOOD = os.path.join(ROOT, "tests", "onnx", "models")
BAD = os.path.join(ROOT, "tests", "malformed", "onnx")
rng = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits=(), opset=17, name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="rlx-tests")
    m.ir_version = 8
    return m


def save(m, folder, name):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(m.SerializeToString())


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


# An MLP with a symbolic batch: MatMul + Add + Gelu + LayerNormalization, and a shape subgraph
# (Shape -> Gather -> Concat -> Reshape) that folds once the batch is bound.
w1 = rng.standard_normal((8, 16)).astype(np.float32)
b1 = rng.standard_normal(16).astype(np.float32)
gamma = rng.standard_normal(16).astype(np.float32)
mlp = model(
    [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
        helper.make_node("Gelu", ["hb"], ["act"], domain="", name="gelu"),
        helper.make_node("LayerNormalization", ["act", "gamma"], ["ln"], axis=-1, epsilon=1e-5, name="ln"),
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Gather", ["xs", "zero"], ["b"], axis=0, name="batch"),
        helper.make_node("Concat", ["b", "m1"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["ln", "target"], ["y"], name="flat"),
    ],
    [vi("x", ["batch", 8])],
    [vi("y", ["batch", 16])],
    [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(gamma, "gamma"),
     numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([-1], np.int64), "m1")],
    opset=20,
)
save(mlp, GOOD, "mlp.onnx")

# The same MatMul with its weight in an external data file.
ext = model([helper.make_node("MatMul", ["x", "w1"], ["y"], name="mm")], [vi("x", [2, 8])], [vi("y", [2, 16])],
            [numpy_helper.from_array(w1, "w1")])
onnx.external_data_helper.convert_model_to_external_data(ext, all_tensors_to_one_file=True, location="mm_weights.bin",
                                                         size_threshold=0)
if os.path.exists(os.path.join(GOOD, "mm_weights.bin")):
    os.remove(os.path.join(GOOD, "mm_weights.bin"))  # save_model appends to an existing data file
onnx.save_model(ext, os.path.join(GOOD, "external.onnx"))

# ---- malformed ----
good_add = model([helper.make_node("Add", ["a", "b"], ["c"], name="add")], [vi("a", [2, 3]), vi("b", [2, 3])],
                 [vi("c", [2, 3])])
data = good_add.SerializeToString()
with open(os.path.join(BAD, "truncated.onnx"), "wb") as f:
    f.write(data[: len(data) * 2 // 3])
save(model([helper.make_node("MatMul", ["x", "w_missing"], ["y"], name="mm")], [vi("x", [2, 8])], [vi("y", [2, 16])]),
     BAD, "missing_initializer.onnx")
save(model([helper.make_node("Add", ["x", "q"], ["p"], name="p_node"), helper.make_node("Relu", ["p"], ["q"], name="q_node")],
           [vi("x", [2])], [vi("q", [2])]), BAD, "cycle.onnx")
save(model([helper.make_node("Add", ["a", "b"], ["c"], name="add")], [vi("a", [2, 3]), vi("b", [4, 5])], [vi("c", [2, 3])]),
     BAD, "mismatched_shapes.onnx")
save(model([helper.make_node("Relu", ["a"], ["c"], name="relu")], [vi("a", [2, 3])], [vi("c", [2, 3])], opset=99),
     BAD, "unknown_opset.onnx")
save(model([helper.make_node("NonMaxSuppression", ["a", "b"], ["c"], name="nms")], [vi("a", [1, 2, 4]), vi("b", [1, 1, 2])],
           [vi("c", [1, 3], TensorProto.INT64)]), BAD, "unsupported_op.onnx")
save(model([helper.make_node("Relu", ["a"], ["c"], name="relu")], [vi("a", [2, 3])], [vi("c", [3, 2])]),
     BAD, "declared_shape.onnx")
bad_ext = onnx.load(os.path.join(GOOD, "external.onnx"), load_external_data=False)
for e in bad_ext.graph.initializer[0].external_data:
    if e.key == "offset":
        e.value = "4096"
save(bad_ext, GOOD, "external_bad_offset.onnx")

# Inputs and the outputs ONNX's own reference evaluator computes, for the well-formed models.
from onnx.reference import ReferenceEvaluator  # noqa: E402

x = rng.standard_normal((3, 8)).astype(np.float32)
(y,) = ReferenceEvaluator(mlp).run(None, {"x": x})
for name, arr in (("mlp_x.pb", x), ("mlp_y.pb", y)):
    with open(os.path.join(GOOD, name), "wb") as f:
        f.write(numpy_helper.from_array(arr, name[4]).SerializeToString())
x2 = rng.standard_normal((2, 8)).astype(np.float32)
for name, arr in (("external_x.pb", x2), ("external_y.pb", x2 @ w1)):
    with open(os.path.join(GOOD, name), "wb") as f:
        f.write(numpy_helper.from_array(arr, name[9]).SerializeToString())
np.save(os.path.join(GOOD, "mlp_x.npy"), x)  # `rlx run`'s input in tests/onnx/check_cli.sh


# ---- models checked against ONNX's reference evaluator: <stem>.onnx, <stem>_in_<i>.pb, <stem>_out_<i>.pb ----
def save_checked(m, stem, feeds):
    save(m, GOOD, stem + ".onnx")
    outs = ReferenceEvaluator(m).run(None, feeds)
    for i, (name, arr) in enumerate(feeds.items()):
        with open(os.path.join(GOOD, f"{stem}_in_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(arr), name).SerializeToString())
    for i, (o, arr) in enumerate(zip(m.graph.output, outs)):
        with open(os.path.join(GOOD, f"{stem}_out_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(arr), o.name).SerializeToString())


# Q/DQ: int8 per axis (ties round to even, saturation at both ends), uint8 blocked (opset 21's block_size, a short
# last block), and the dequantized values.
qx = np.array([[-300.0, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 300.0],
               [0.25, 0.75, 1.25, 1.75, -0.25, -0.75, 100.0, -100.0]], np.float32)
qdq = model(
    [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=0, name="q_axis"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["dq"], axis=0, name="dq_axis"),
        helper.make_node("QuantizeLinear", ["x", "bs", "bzp"], ["qb"], axis=1, block_size=3, name="q_blocked"),
        helper.make_node("DequantizeLinear", ["qb", "bs", "bzp"], ["dqb"], axis=1, block_size=3, name="dq_blocked"),
    ],
    [vi("x", [2, 8])],
    [vi("q", [2, 8], TensorProto.INT8), vi("dq", [2, 8]), vi("qb", [2, 8], TensorProto.UINT8), vi("dqb", [2, 8])],
    [numpy_helper.from_array(np.array([1.0, 0.5], np.float32), "s"),
     numpy_helper.from_array(np.array([3, -2], np.int8), "zp"),
     numpy_helper.from_array(np.array([[1.0, 0.5, 2.0], [0.25, 1.0, 4.0]], np.float32), "bs"),
     numpy_helper.from_array(np.array([[128, 100, 7], [0, 255, 128]], np.uint8), "bzp")],
    opset=21,
)
save_checked(qdq, "qdq", {"x": qx})
save(model([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, name="dq")], [vi("x", [2, 3], TensorProto.INT8)],
           [vi("y", [2, 3])], [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "s")], opset=13),
     BAD, "dequantize_scale_extent.onnx")
