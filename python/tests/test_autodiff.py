"""rlx.grad / value_and_grad / jvp against numpy derivatives."""
import numpy as np
import pytest

import pyrlx as rlx


def mse_graph(n=8, d=5):
    g = rlx.Graph("mse")
    x = g.input("x", (n, d))
    w = g.param("w", (d, 1))
    t = g.input("t", (n, 1))
    err = x @ w - t
    g.output((err * err).mean(), "loss")
    return g


def test_grad_and_value_and_grad(rng):
    x = rng.standard_normal((8, 5)).astype(np.float32)
    w = rng.standard_normal((5, 1)).astype(np.float32)
    t = rng.standard_normal((8, 1)).astype(np.float32)
    g = mse_graph()
    vg = rlx.value_and_grad(g, wrt=["w", "x"])
    c = rlx.Session("cpu").compile(vg)
    c.set_param("w", w)
    loss, gw, gx = c.run({"x": x, "t": t})
    err = x @ w - t
    np.testing.assert_allclose(loss, (err**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(gw, 2 * x.T @ err / err.size, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, 2 * err @ w.T / err.size, rtol=1e-4, atol=1e-5)
    c2 = rlx.Session("cpu").compile(rlx.grad(g, wrt=["w"]))
    c2.set_param("w", w)
    (gw2,) = c2.run({"x": x, "t": t})
    np.testing.assert_allclose(gw2, gw, rtol=1e-5, atol=1e-6)


def test_jvp(rng):
    g = rlx.Graph()
    x = g.input("x", (4,))
    g.output((x * x).sin(), "y")
    jg = rlx.jvp(g, wrt=["x"])
    a = rng.standard_normal(4).astype(np.float32)
    v = rng.standard_normal(4).astype(np.float32)
    y, ty = rlx.Session("cpu").compile(jg).run({"x": a, "tangent_x": v})
    np.testing.assert_allclose(y, np.sin(a * a), rtol=1e-5)
    np.testing.assert_allclose(ty, np.cos(a * a) * 2 * a * v, rtol=1e-4, atol=1e-6)


def test_autodiff_errors():
    g = rlx.Graph()
    x = g.input("x", (4,))
    g.output(x.argmax().astype("f32"))
    with pytest.raises(rlx.Error, match="argmax"):
        rlx.grad(g, wrt=["x"])
    with pytest.raises(rlx.Error, match="nope"):
        rlx.grad(mse_graph(), wrt=["nope"])
