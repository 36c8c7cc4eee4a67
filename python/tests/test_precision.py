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


def test_cpu_keeps_f32_where_bf16_is_not_faster_and_says_why():
    rng = np.random.default_rng()
    params = {"w": rng.standard_normal((16, 16)).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    x = rng.standard_normal((8, 16)).astype(np.float32)
    outs = []
    for precision in ("f32", "bf16"):
        c = rlx.Session("cpu").compile(mlp(), precision=precision)
        for k, v in params.items():
            c.set_param(k, v)
        outs.append(c.run({"x": x})[0])
        report = c.precision_report()
        if precision == "f32":
            assert report == []
        else:
            assert [op for _, op, _, _ in report] == ["matmul"]
            assert all(dtype == "f32" and "backend 'cpu' has no bf16 matmul" in why for _, _, dtype, why in report)
    np.testing.assert_array_equal(outs[0], outs[1])  # the same graph: never slower, and the same values


def test_an_unknown_precision_is_an_error():
    with pytest.raises(rlx.Error, match="unknown precision 'fp8': expected f32, bf16 or f16"):
        rlx.Session("cpu").compile(mlp(), precision="fp8")
