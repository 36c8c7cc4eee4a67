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
# A storage-only type (float8) where the op computes: the error names the node, the op and the dtype.
save(model([helper.make_node("Exp", ["a"], ["c"], name="exp8")], [vi("a", [4], TensorProto.FLOAT8E4M3FN)],
           [vi("c", [4], TensorProto.FLOAT8E4M3FN)], opset=21), BAD, "float8_exp.onnx")
# int4 packs two to a byte: five elements need three bytes of raw data, not five.
int4 = TensorProto(name="w4", data_type=TensorProto.INT4, dims=[5], raw_data=b"\x01\x02\x03\x04\x05")
save(model([helper.make_node("Cast", ["w4"], ["c"], to=TensorProto.FLOAT, name="cast4")], [], [vi("c", [5])], [int4],
           opset=21), BAD, "int4_packed_size.onnx")
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
def save_checked(m, stem, feeds, outs=None):
    """`outs` for a model ONNX's reference evaluator cannot run (it is then checked against ONNX Runtime)."""
    save(m, GOOD, stem + ".onnx")
    if outs is None:
        outs = ReferenceEvaluator(m).run(None, feeds)
    else:
        import onnxruntime
        got = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b in zip(got, outs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
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
save(model([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, name="dq")],
           [vi("x", [2, 3], TensorProto.INT8)], [vi("y", [2, 3])],
           [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "s")], opset=13),
     BAD, "dequantize_scale_extent.onnx")


# ---- control flow on run-time values: If -> RLX's if, Loop -> while, Scan -> scan ----
def graph(nodes, inputs, outputs, name, inits=()):
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))


def scalar(name, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, [])


# If on an input: the then branch reads a value of the enclosing graph computed at run time (b) and an
# initializer; the else branch only x.
if_then = graph([helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Mul", ["s", "w"], ["t_out"])],
                [], [vi("t_out", [3])], "then_g")
if_else = graph([helper.make_node("Neg", ["x"], ["e_out"])], [], [vi("e_out", [3])], "else_g")
if_rt = model(
    [helper.make_node("Relu", ["x"], ["b"], name="relu"),
     helper.make_node("If", ["c"], ["y"], then_branch=if_then, else_branch=if_else, name="branch")],
    [scalar("c", TensorProto.BOOL), vi("x", [3])], [vi("y", [3])],
    [numpy_helper.from_array(np.array([2.0, -1.0, 0.5], np.float32), "w")])
xs3 = np.array([1.5, -2.0, 3.0], np.float32)
save_checked(if_rt, "if_runtime", {"c": np.array(True), "x": xs3})
save_checked(if_rt, "if_runtime_else", {"c": np.array(False), "x": xs3})
os.remove(os.path.join(GOOD, "if_runtime_else.onnx"))  # the same model

# Loop with a run-time trip count and a condition the body computes from a carried value and an input of the
# enclosing graph (limit); the body holds an If on a run-time condition too.
inner_then = graph([helper.make_node("Add", ["v_in", "one_f"], ["a_out"])], [], [vi("a_out", [2])], "inner_then")
inner_else = graph([helper.make_node("Mul", ["v_in", "two_f"], ["m_out"])], [], [vi("m_out", [2])], "inner_else")
loop_body = graph(
    [helper.make_node("ReduceSum", ["v_in"], ["tot"], keepdims=0),
     helper.make_node("Greater", ["tot", "ten"], ["big"]),
     helper.make_node("If", ["big"], ["stepped"], then_branch=inner_then, else_branch=inner_else),
     helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
     helper.make_node("Add", ["stepped", "i_f"], ["v_out"]),
     helper.make_node("ReduceSum", ["v_out"], ["tot_out"], keepdims=0),
     helper.make_node("Less", ["tot_out", "limit"], ["cond_out"])],
    [scalar("i", TensorProto.INT64), scalar("cond_in", TensorProto.BOOL), vi("v_in", [2])],
    [scalar("cond_out", TensorProto.BOOL), vi("v_out", [2])], "loop_body",
    [numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
     numpy_helper.from_array(np.array(2.0, np.float32), "two_f"),
     numpy_helper.from_array(np.array(10.0, np.float32), "ten")])
loop_rt = model(
    [helper.make_node("Loop", ["m", "go", "v0"], ["v_final"], body=loop_body, name="loop"),
     helper.make_node("Loop", ["m_known", "go", "v0"], ["v_known"], body=loop_body, name="loop_known_trips")],
    [scalar("m", TensorProto.INT64), vi("v0", [2]), scalar("limit")], [vi("v_final", [2]), vi("v_known", [2])],
    [numpy_helper.from_array(np.array(6, np.int64), "m_known"), numpy_helper.from_array(np.array(True), "go")])
save_checked(loop_rt, "loop_runtime", {"m": np.array(20, np.int64), "v0": np.array([0.5, 1.0], np.float32),
                                       "limit": np.array(200.0, np.float32)})
save_checked(loop_rt, "loop_runtime_trips", {"m": np.array(3, np.int64), "v0": np.array([0.5, 1.0], np.float32),
                                             "limit": np.array(200.0, np.float32)})
os.remove(os.path.join(GOOD, "loop_runtime_trips.onnx"))

# Scan along axis 1 in reverse, its output stacked along axis 1 and reversed, the body reading a weight of the
# enclosing graph too large to be a constant (a param passed in as an operand).
sw = (rng.standard_normal((40, 40)) * 0.2).astype(np.float32)
scan_body = graph([helper.make_node("MatMul", ["s_in", "sw"], ["sm"]), helper.make_node("Add", ["sm", "x_t"], ["sa"]),
                   helper.make_node("Tanh", ["sa"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
                  [vi("s_in", [40]), vi("x_t", [40])], [vi("s_out", [40]), vi("y_t", [40])], "scan_body")
scan_rt = model(
    [helper.make_node("Scan", ["s0", "xseq"], ["s_final", "ys"], body=scan_body, num_scan_inputs=1,
                      scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1],
                      scan_output_directions=[1], name="scan")],
    [vi("s0", [40]), vi("xseq", [40, 3])], [vi("s_final", [40]), vi("ys", [40, 3])],
    [numpy_helper.from_array(sw, "sw")], opset=16)
s0 = rng.standard_normal(40).astype(np.float32)
xseq = rng.standard_normal((40, 3)).astype(np.float32)
s_np, ys_np = s0.copy(), np.zeros((40, 3), np.float32)
for t in (2, 1, 0):  # the input scanned in reverse; the output prepended, so ys[:, t] is step t's
    s_np = np.tanh(s_np @ sw + xseq[:, t])
    ys_np[:, t] = s_np * xseq[:, t]
save_checked(scan_rt, "scan_axes", {"s0": s0, "xseq": xseq}, [s_np, ys_np])

# Errors: scan outputs of a loop with a run-time trip count; branches of different shapes; a carried value
# that changes its shape.
scan_out_body = graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                       helper.make_node("Identity", ["v_in"], ["v_out"]),
                       helper.make_node("Identity", ["v_in"], ["v_scan"])],
                      [scalar("i", TensorProto.INT64), scalar("c_in", TensorProto.BOOL), vi("v_in", [2])],
                      [scalar("c_out", TensorProto.BOOL), vi("v_out", [2]), vi("v_scan", [2])], "body")
save(model([helper.make_node("Loop", ["m", "", "v0"], ["v", "vs"], body=scan_out_body, name="loop")],
           [scalar("m", TensorProto.INT64), vi("v0", [2])], [vi("v", [2]), vi("vs", [None, 2])]),
     BAD, "loop_runtime_scan_outputs.onnx")
save(model([helper.make_node("If", ["c"], ["y"], name="branch",
                             then_branch=graph([helper.make_node("Identity", ["x"], ["t"])], [], [vi("t", [2])], "t"),
                             else_branch=graph([helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], [],
                                               [vi("e", [4])], "e"))],
           [scalar("c", TensorProto.BOOL), vi("x", [2])], [vi("y", [None])]),
     BAD, "if_branch_shapes.onnx")
grow_body = graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                   helper.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0)],
                  [scalar("i", TensorProto.INT64), scalar("c_in", TensorProto.BOOL), vi("v_in", [None])],
                  [scalar("c_out", TensorProto.BOOL), vi("v_out", [None])], "body")
save(model([helper.make_node("Loop", ["m", "", "v0"], ["v"], body=grow_body, name="loop")],
           [scalar("m", TensorProto.INT64), vi("v0", [2])], [vi("v", [None])]),
     BAD, "loop_carried_shape.onnx")


# Einsum with ellipses of different ranks, an implicit output, a trace and a batched diagonal; scatters with
# the mul/max/min reductions over repeated indices (int32 and float); MaxPool's argmax indices with padding.
misc = model(
    [
        helper.make_node("Einsum", ["ea", "eb"], ["e_mm"], equation="...ij,...jk->...ik", name="ellipsis"),
        helper.make_node("Einsum", ["ea", "ec"], ["e_implicit"], equation="bij,jk", name="implicit"),
        helper.make_node("Einsum", ["sq"], ["e_trace"], equation="ii", name="trace"),
        helper.make_node("Einsum", ["bsq"], ["e_diag"], equation="...ii->...i", name="diagonal"),
        helper.make_node("ScatterElements", ["sd", "si", "su"], ["s_max"], axis=0, reduction="max", name="smax"),
        helper.make_node("ScatterElements", ["sd", "si", "su"], ["s_min"], axis=0, reduction="min", name="smin"),
        helper.make_node("ScatterElements", ["fd", "fi", "fu"], ["s_mul"], axis=1, reduction="mul", name="smul"),
        helper.make_node("MaxPool", ["px"], ["p_y", "p_i"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0],
                         name="pool"),
    ],
    [vi("ea", [2, 3, 4]), vi("eb", [4, 5]), vi("ec", [4, 5]), vi("sq", [3, 3]), vi("bsq", [2, 3, 3]),
     vi("sd", [3, 4], TensorProto.INT32), vi("su", [2, 4], TensorProto.INT32), vi("fd", [2, 3]), vi("fu", [2, 4]),
     vi("px", [1, 2, 3, 3])],
    [vi("e_mm", [2, 3, 5]), vi("e_implicit", [2, 3, 5]), vi("e_trace", []), vi("e_diag", [2, 3]),
     vi("s_max", [3, 4], TensorProto.INT32), vi("s_min", [3, 4], TensorProto.INT32), vi("s_mul", [2, 3]),
     vi("p_y", [1, 2, 2, 2]), vi("p_i", [1, 2, 2, 2], TensorProto.INT64)],
    [numpy_helper.from_array(np.array([[0, 1, 0, 2], [0, 1, 1, 2]], np.int64), "si"),
     numpy_helper.from_array(np.array([[2, 0, 2, 1], [1, 1, 2, 0]], np.int64), "fi")],
    opset=18,
)
px = np.array([1, 5, 5, 2, 0, 3, 4, 4, 1, 9, 8, 9, 7, 7, 6, 9, 2, 2], np.float32).reshape(1, 2, 3, 3)
save_checked(misc, "misc_ops", {
    "ea": rng.standard_normal((2, 3, 4)).astype(np.float32), "eb": rng.standard_normal((4, 5)).astype(np.float32),
    "ec": rng.standard_normal((4, 5)).astype(np.float32), "sq": rng.standard_normal((3, 3)).astype(np.float32),
    "bsq": rng.standard_normal((2, 3, 3)).astype(np.float32),
    "sd": rng.integers(-50, 50, (3, 4)).astype(np.int32), "su": rng.integers(-50, 50, (2, 4)).astype(np.int32),
    "fd": rng.standard_normal((2, 3)).astype(np.float32), "fu": rng.standard_normal((2, 4)).astype(np.float32),
    "px": px})

# A loop whose trip count and conditions are known at import, but too long to unroll: a while of 5000 trips.
count_body = graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                    helper.make_node("Add", ["v_in", "step"], ["v_out"])],
                   [scalar("i", TensorProto.INT64), scalar("c_in", TensorProto.BOOL), vi("v_in", [2])],
                   [scalar("c_out", TensorProto.BOOL), vi("v_out", [2])], "count_body")
loop_long = model([helper.make_node("Loop", ["m_long", "", "v0"], ["v"], body=count_body, name="long_loop")],
                  [vi("v0", [2])], [vi("v", [2])],
                  [numpy_helper.from_array(np.array(5000, np.int64), "m_long"),
                   numpy_helper.from_array(np.array([0.5, -1.0], np.float32), "step")])
save_checked(loop_long, "loop_long", {"v0": np.array([1.0, 2.0], np.float32)},
             [np.array([2501.0, -4998.0], np.float32)])


# ---- symbolic dims: dynamic_shapes.onnx (tests/onnx/test_onnx_import.cpp imports it once and compiles it at
# several bindings). x is [batch, seq, 4]; the shape subgraph exercises Shape, Gather, Unsqueeze, Mul, Concat,
# Slice, Squeeze, Range, ConstantOfShape, Expand and Reshape with 0 and -1 on symbolic dims.
def i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


dyn = model(
    [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0, name="batch"),
        helper.make_node("Gather", ["s", "i1"], ["sq"], axis=0, name="seq"),
        helper.make_node("Unsqueeze", ["b", "a0"], ["b1"], name="b1"),
        helper.make_node("Mul", ["b1", "sq"], ["bs"], name="bs"),
        helper.make_node("Concat", ["bs", "c4"], ["t1"], axis=0, name="t1"),
        helper.make_node("Reshape", ["x", "t1"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "w"], ["h"], name="mm"),
        helper.make_node("Slice", ["s", "z1", "two"], ["lead"], name="lead"),
        helper.make_node("Concat", ["lead", "m1"], ["t2"], axis=0, name="t2"),
        helper.make_node("Reshape", ["h", "t2"], ["h3"], name="unflatten"),
        helper.make_node("Squeeze", ["sq", "a0"], ["n"], name="n"),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"], name="arange"),
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT, name="posf"),
        helper.make_node("Unsqueeze", ["posf", "a1"], ["pos2"], name="pos2"),
        helper.make_node("Add", ["h3", "pos2"], ["y0"], name="add_pos"),
        helper.make_node("ConstantOfShape", ["lead"], ["halves"], name="halves",
                         value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Unsqueeze", ["halves", "a2"], ["halves3"], name="halves3"),
        helper.make_node("Mul", ["y0", "halves3"], ["y1"], name="scale"),
        helper.make_node("Concat", ["lead", "c3"], ["t3"], axis=0, name="t3"),
        helper.make_node("Expand", ["bias", "t3"], ["bias3"], name="expand_bias"),
        helper.make_node("Add", ["y1", "bias3"], ["y2"], name="add_bias"),
        helper.make_node("Concat", ["z1", "m1"], ["t4"], axis=0, name="t4"),
        helper.make_node("Reshape", ["y2", "t4"], ["y3"], name="rows"),
        helper.make_node("Softmax", ["y3"], ["y"], axis=-1, name="softmax"),
    ],
    [vi("x", ["batch", "seq", 4])],
    [vi("y", ["batch", None])],
    [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
     numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "bias"),
     i64("i0", 0), i64("i1", [1]), i64("a0", [0]), i64("a1", [1]), i64("a2", [2]), i64("c4", [4]), i64("c3", [3]),
     i64("z1", [0]), i64("two", [2]), i64("m1", [-1]), i64("zero", 0), i64("one", 1)],
)
save(dyn, GOOD, "dynamic_shapes.onnx")
