"""rlx.register_op: Python-defined ops through a numpy CPU kernel and through a lowering."""
import numpy as np
import pytest

import pyrlx as rlx


def test_cpu_kernel_op(rng):
    rlx.register_op("py_softsign", infer_shape=lambda shapes, dtypes, attrs: shapes[0],
                    cpu_kernel=lambda x, scale: scale * x / (1 + np.abs(x)), num_inputs=1, attrs={"scale": float})
    assert rlx.is_op_registered("py_softsign")
    g = rlx.Graph()
    x = g.input("x", (3, 5))
    g.output(g.custom_op("py_softsign", x * 2, scale=0.5).relu())
    a = rng.standard_normal((3, 5)).astype(np.float32)
    (y,) = rlx.Session("cpu").compile(g).run({"x": a})
    np.testing.assert_allclose(y, np.maximum(0.5 * 2 * a / (1 + np.abs(2 * a)), 0), rtol=1e-6)
    (ref,) = rlx.reference_run(g, {"x": a})
    np.testing.assert_allclose(ref, y, rtol=1e-6)


def test_lowered_op_fuses(rng):
    rlx.register_op("py_swish", infer_shape=lambda shapes, dtypes, attrs: shapes[0],
                    lower=lambda g, x, beta: x * (x * beta).sigmoid(), num_inputs=1, attrs={"beta": float})
    g = rlx.Graph()
    x = g.input("x", (4, 8))
    g.output(g.custom_op("py_swish", x + 1.0, beta=1.5) * 3.0)
    c = rlx.Session("cpu").compile(g)
    assert "custom:py_swish" in c.ir("lir")
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = a + 1
    np.testing.assert_allclose(c.run({"x": a})[0], 3 * b / (1 + np.exp(-1.5 * b)), rtol=1e-5, atol=1e-6)


def test_custom_op_errors(rng):
    with pytest.raises(rlx.Error, match="cpu_kernel, a lower"):
        rlx.register_op("py_nothing", infer_shape=lambda s, d, a: s[0])
    g = rlx.Graph()
    x = g.input("x", (2,))
    with pytest.raises(rlx.Error, match="not registered"):
        g.custom_op("py_unknown", x)
    rlx.register_op("py_bad_kernel", infer_shape=lambda s, d, a: s[0], cpu_kernel=lambda x: x[:1], num_inputs=1)
    g.output(g.custom_op("py_bad_kernel", x))
    c = rlx.Session("cpu").compile(g)
    with pytest.raises(rlx.Error, match="shape"):
        c.run({"x": np.zeros(2, np.float32)})
    rlx.register_op("py_raises", infer_shape=lambda s, d, a: s[0], cpu_kernel=lambda x: 1 / 0, num_inputs=1)
    g2 = rlx.Graph()
    g2.output(g2.custom_op("py_raises", g2.input("x", (2,))))
    with pytest.raises(rlx.Error, match="ZeroDivisionError"):
        rlx.Session("cpu").compile(g2).run({"x": np.zeros(2, np.float32)})


def test_seed_call_form_takes_attrs_then_inputs(rng):
    # The seed's graph.custom_op("my_op", attrs, inputs) beside the keyword form; both build the same node.
    rlx.register_op("py_seed_scale", infer_shape=lambda shapes, dtypes, attrs: shapes[0],
                    lower=lambda g, x, k: x * k, num_inputs=1, attrs={"k": float})
    g = rlx.Graph()
    x = g.input("x", (2, 3))
    a = g.custom_op("py_seed_scale", {"k": 2.0}, [x])
    b = g.custom_op("py_seed_scale", [("k", 2.0)], [x])
    c = g.custom_op("py_seed_scale", x, k=2.0)
    g.output(a + b + c)
    v = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(rlx.Session("cpu").compile(g).run({"x": v})[0], 6 * v, rtol=1e-6)
    with pytest.raises(rlx.Error, match="inputs must be Nodes"):
        g.custom_op("py_seed_scale", {"k": 2.0}, x)


def test_set_param_while_a_python_kernel_runs_does_not_deadlock():
    # A run holds the graph's lock and needs the GIL for its Python kernel; set_param from another
    # thread waits for that lock, so it must not hold the GIL while it waits.
    import threading
    import time

    def slow(x):
        time.sleep(0.005)
        return x / (1 + np.abs(x))

    rlx.register_op("py_slow_softsign", infer_shape=lambda s, d, a: s[0], cpu_kernel=slow, num_inputs=1)
    g = rlx.Graph()
    x = g.input("x", (3, 5))
    w = g.param("w", (5,))
    g.output(g.custom_op("py_slow_softsign", x * w))
    c = rlx.Session("cpu").compile(g)
    c.set_param("w", np.ones(5, np.float32))
    a = np.ones((3, 5), np.float32)
    stop = threading.Event()

    def setter():
        while not stop.is_set():
            c.set_param("w", np.ones(5, np.float32))
            c.kernel_times()

    runner = threading.Thread(target=lambda: [c.run({"x": a}) for _ in range(30)], daemon=True)
    t = threading.Thread(target=setter, daemon=True)
    runner.start()
    t.start()
    runner.join(timeout=30)
    stop.set()
    t.join(timeout=30)
    assert not runner.is_alive() and not t.is_alive(), "run and set_param deadlocked"
    np.testing.assert_allclose(c.run({"x": a})[0], np.full((3, 5), 0.5, np.float32))
