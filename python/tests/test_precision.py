"""Session.compile(precision=...): the precision pass and its report (docs/precision.md)."""
import numpy as np
import pytest

import pyrlx as rlx


def mlp(batch=8, width=16):
    g = rlx.Graph("mlp")
    x = g.input("x", (batch, width))
    w = g.param("w", (width, width))
    b = g.param("b", (width,))
    g.output(rlx.linear(x, w, b).relu(), "y")
    return g


def test_cpu_runs_bf16_only_where_it_is_faster_and_says_why():
    rng = np.random.default_rng()
    params = {"w": rng.standard_normal((16, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    x = rng.standard_normal((8, 16)).astype(np.float32)
    outs, lowered = [], False
    for precision in ("f32", "bf16"):
        c = rlx.Session("cpu").compile(mlp(), precision=precision)
        for k, v in params.items():
            c.set_param(k, v)
        outs.append(c.run({"x": x})[0])
        report = c.precision_report()
        if precision == "f32":
            assert report == []
            continue
        assert [op for _, op, _, _ in report] == ["matmul"]
        (_, _, dtype, why), = report
        # bf16 where the CPU's bf16 GEMM beats its f32 one (AMX, or AMD's vdpbf16ps); otherwise f32, saying why.
        assert dtype == "bf16" or (dtype == "f32" and "backend 'cpu' has no bf16 matmul" in why), (dtype, why)
        lowered = dtype == "bf16"
    if lowered:
        # x and w rounded to bf16 (8 bits of mantissa), the products summed in f32: within bf16's rounding.
        np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=3e-2 * np.abs(outs[0]).max())
        assert not np.array_equal(outs[0], outs[1])
    else:
        np.testing.assert_array_equal(outs[0], outs[1])  # the same graph: never slower, and the same values


def test_an_unknown_precision_is_an_error():
    with pytest.raises(rlx.Error, match="unknown precision 'fp8': expected f32, bf16 or f16"):
        rlx.Session("cpu").compile(mlp(), precision="fp8")


def wide_mlp(batch=256, width=1024):
    g = rlx.Graph("wide")
    x = g.input("x", (batch, width))
    g.output(rlx.linear(rlx.linear(x, g.param("w1", (width, width)), g.param("b1", (width,))).relu(),
                        g.param("w2", (width, 10)), g.param("b2", (10,))), "logits")
    return g


@pytest.mark.parametrize("calibration", ["minmax", "percentile", "mse"])
def test_quantize_graph_runs_the_wide_layer_in_int8_and_stays_close(calibration):
    rng = np.random.default_rng()
    g = wide_mlp()
    g.param_values = {"w1": (rng.standard_normal((1024, 1024)) / 32).astype(np.float32),
                      "b1": np.zeros(1024, np.float32),
                      "w2": (rng.standard_normal((1024, 10)) / 32).astype(np.float32), "b2": np.zeros(10, np.float32)}
    batches = [{"x": rng.standard_normal((256, 1024)).astype(np.float32)} for _ in range(2)]
    q = rlx.quantize_graph(g, batches, calibration=calibration)
    assert [r[1] for r in q.quantize_report] == ["matmul", "matmul"]
    dtypes = [dtype for _, _, dtype, _ in q.quantize_report]
    if dtypes[0] == "f32":  # a CPU without VNNI: nothing to gain, and the report says so
        assert "no int8 matmul" in q.quantize_report[0][3]
        return
    assert dtypes[0] == "i8", q.quantize_report
    # The 10-wide output layer reads the first layer's requantized u8 output: int8 where its total work is
    # enough for the CPU's table, f32 (and why) where it is not.
    if dtypes[1] == "i8":
        assert "requantized to u8 in matmul" in q.quantize_report[1][3], q.quantize_report
    else:
        assert "gains from int8" in q.quantize_report[1][3], q.quantize_report
    assert "w1.int8" in q.param_values and "w1" not in q.param_values
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    want = rlx.Session("cpu").compile(g).run({"x": x})[0]
    got = rlx.Session("cpu").compile(q).run({"x": x})[0]
    assert np.isfinite(got).all()
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 1e-6 < err < 5e-2, err
    assert (got.argmax(1) == want.argmax(1)).mean() > 0.9


def test_quantize_graph_errors():
    g = mlp()
    g.param_values = {"w": np.zeros((16, 16), np.float32), "b": np.zeros(16, np.float32)}
    with pytest.raises(rlx.Error, match="no calibration batch"):
        rlx.quantize_graph(g, [])
    with pytest.raises(rlx.Error, match="expected minmax, percentile or mse"):
        rlx.quantize_graph(g, [{"x": np.zeros((8, 16), np.float32)}], calibration="entropy")
