"""rlx.vmap and gradient checkpointing against numpy."""
import numpy as np
import pytest

import pyrlx as rlx


def mlp_loss(hidden=None):
    """One example's loss: x (4,) -> tanh(x @ w1) @ w2 -> squared error against t (2,).
    `hidden`, a list, receives the tanh node."""
    g = rlx.Graph("one_example")
    x = g.input("x", (4,), "f64")
    t = g.input("t", (2,), "f64")
    w1 = g.param("w1", (4, 5), "f64")
    w2 = g.param("w2", (5, 2), "f64")
    h = (x.reshape(1, 4) @ w1).tanh()
    if hidden is not None:
        hidden.append(h)
    y = h @ w2
    err = y.reshape(2) - t
    g.output((err * err).sum(), "loss")
    return g


def test_vmap_matches_a_loop_over_examples(rng):
    g = rlx.Graph()
    x = g.input("x", (3,), "f64")
    w = g.param("w", (3, 2), "f64")
    g.output((x.reshape(1, 3) @ w).sin().reshape(2), "y")
    vg = rlx.vmap(g, size=5)
    xs = rng.standard_normal((5, 3))
    w_val = rng.standard_normal((3, 2))
    c = rlx.Session("cpu").compile(vg)
    c.set_param("w", w_val)
    (ys,) = c.run({"x": xs})
    np.testing.assert_allclose(ys, np.sin(xs @ w_val), rtol=1e-12)


def test_vmap_symbolic_size_and_axes(rng):
    g = rlx.Graph()
    x = g.input("x", (2, 3), "f64")
    g.output(x.sum(1), "s")
    vg = rlx.vmap(g, axis=1)  # a symbolic "batch" dim, bound when compiling
    xs = rng.standard_normal((2, 7, 3))
    (s,) = rlx.Session("cpu").compile(vg, bind={"batch": 7}).run({"x": xs})
    np.testing.assert_allclose(s, xs.sum(2), rtol=1e-12)  # batch axis at 1 in and out: (2, 7)


def test_per_example_gradients(rng):
    g = mlp_loss()
    per_example = rlx.vmap(rlx.grad(g, wrt=["w1", "w2"]), batched=["x", "t"], size=6)
    w1, w2 = rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    xs, ts = rng.standard_normal((6, 4)), rng.standard_normal((6, 2))
    c = rlx.Session("cpu").compile(per_example)
    c.set_param("w1", w1)
    c.set_param("w2", w2)
    g1, g2 = c.run({"x": xs, "t": ts})
    assert g1.shape == (6, 4, 5) and g2.shape == (6, 5, 2)
    for i in range(6):
        h = np.tanh(xs[i] @ w1)
        err = h @ w2 - ts[i]
        np.testing.assert_allclose(g2[i], 2 * np.outer(h, err), rtol=1e-10)
        np.testing.assert_allclose(g1[i], np.outer(xs[i], (2 * err @ w2.T) * (1 - h * h)), rtol=1e-10)


def test_checkpointed_gradients_are_the_same(rng):
    hidden = []
    g = mlp_loss(hidden)
    x, t = rng.standard_normal(4), rng.standard_normal(2)
    w1, w2 = rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    results = []
    for checkpoint in (None, 1, 2, hidden):
        c = rlx.Session("cpu").compile(rlx.value_and_grad(g, wrt=["w1", "w2"], checkpoint=checkpoint))
        c.set_param("w1", w1)
        c.set_param("w2", w2)
        results.append(c.run({"x": x, "t": t}))
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_vmap_errors():
    g = mlp_loss()
    with pytest.raises(rlx.Error, match="nope"):
        rlx.vmap(g, batched=["nope"])
    with pytest.raises(rlx.Error, match="in_axis"):
        rlx.vmap(g, axis=5, size=2)
    with pytest.raises(rlx.Error, match="at least 1 op"):
        rlx.grad(g, wrt=["w1"], checkpoint=0)
