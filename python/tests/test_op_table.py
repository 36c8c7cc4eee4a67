"""pyrlx's builders generated from the op table: an op added in C++ alone is callable from Python, with the
table's defaults and checks, on every device."""
import numpy as np
import pytest

import pyrlx as rlx

DEVICES = [d for d in ("cpu", "vulkan") if rlx.is_available(d)]


def _run(g, device, **inputs):
    return rlx.Session(device).compile(g).run(inputs)


def _mish(x):
    return x * np.tanh(np.logaddexp(0.0, x))


@pytest.mark.parametrize("device", DEVICES)
def test_mish_as_method_graph_method_and_function(device):
    x = np.random.default_rng().uniform(-30, 30, (4, 33)).astype(np.float32)
    g = rlx.Graph("mish")
    n = g.input("x", x.shape)
    g.output(n.mish())
    g.output(g.mish(n))
    g.output(rlx.mish(n))
    for got in _run(g, device, x=x):
        np.testing.assert_allclose(got, _mish(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


def test_every_unary_op_of_the_table_has_a_method():
    for entry in rlx._C.op_table():
        if entry["class"] == "unary":
            assert callable(getattr(rlx.Node, entry["name"], None)), entry["name"]
            assert entry["doc"]


def test_the_table_lists_operands_attributes_and_defaults():
    table = {e["name"]: e for e in rlx._C.op_table()}
    assert table["layer_norm"]["operands"] == ["x", "gamma?", "beta?"]
    assert table["mish"]["formula"] and not table["exp"]["formula"]
    keys = [a["key"] for a in table["conv2d"]["attrs"]]
    assert keys == ["stride", "padding", "dilation", "groups"]


def _group_norm(x, groups, gamma=None, beta=None, eps=1e-5):
    n, c = x.shape[:2]
    xr = x.reshape(n, groups, -1).astype(np.float64)
    y = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)).reshape(x.shape)
    bshape = (c,) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * gamma.reshape(bshape)
    if beta is not None:
        y = y + beta.reshape(bshape)
    return y


@pytest.mark.parametrize("device", DEVICES)
def test_group_norm_generated_from_the_table(device):
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    gamma, beta = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    g = rlx.Graph("gn")
    xn, gn, bn = g.input("x", x.shape), g.input("gamma", (6,)), g.input("beta", (6,))
    g.output(rlx.group_norm(xn, gn, bn, num_groups=3))
    g.output(g.group_norm(xn, num_groups=2, eps=0.5))
    got = _run(g, device, x=x, gamma=gamma, beta=beta)
    np.testing.assert_allclose(got[0], _group_norm(x, 3, gamma, beta), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], _group_norm(x, 2, eps=0.5), rtol=1e-4, atol=1e-5)


def test_group_norm_errors_come_from_the_table():
    g = rlx.Graph("gn")
    x, beta = g.input("x", (2, 6, 5)), g.input("beta", (6,))
    with pytest.raises(rlx.Error, match="num_groups 4 does not divide the 6 channels"):
        rlx.group_norm(x, num_groups=4)
    with pytest.raises(rlx.Error, match="missing attribute 'num_groups'"):
        rlx.group_norm(x)
    with pytest.raises(rlx.Error, match="operand 'gamma' is None but a later one is given"):
        rlx.group_norm(x, None, beta, num_groups=3)
    with pytest.raises(rlx.Error, match="has no attribute 'groups'"):
        rlx.group_norm(x, groups=3)


def test_norm_defaults_come_from_the_table():
    x = np.random.default_rng().standard_normal((3, 8)).astype(np.float32)
    g = rlx.Graph("norms")
    n = g.input("x", x.shape)
    g.output(rlx.layer_norm(n))
    g.output(rlx.rms_norm(n))
    ln, rms = _run(g, "cpu", x=x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(ln, (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rms, x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6), rtol=1e-4, atol=1e-5)
    with pytest.raises(rlx.Error, match="beta needs gamma"):
        rlx.layer_norm(n, None, g.input("beta", (8,)))
