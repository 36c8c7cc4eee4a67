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
