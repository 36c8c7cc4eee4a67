"""Errors, lifetimes, threads, introspection."""
import gc
import re
import threading

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


def test_error_is_runtime_error():
    assert issubclass(rlx.Error, RuntimeError)


def test_wrong_input_name_shape_dtype():
    c = rlx.Session("cpu").compile(mlp())
    c.set_param("w", np.zeros((16, 16), np.float32))
    c.set_param("b", np.zeros(16, np.float32))
    x = np.zeros((8, 16), np.float32)
    with pytest.raises(rlx.Error, match="no input named 'nope'"):
        c.run({"nope": x})
    with pytest.raises(rlx.Error, match=r"expects f32\[8,16\], got f32\[4,16\]"):
        c.run({"x": np.zeros((4, 16), np.float32)})
    with pytest.raises(rlx.Error, match=r"expects f32\[8,16\], got f64\[8,16\]"):
        c.run({"x": x.astype(np.float64)})
    with pytest.raises(rlx.Error, match="missing"):
        c.run({})


def test_run_before_param_set():
    c = rlx.Session("cpu").compile(mlp())
    with pytest.raises(rlx.Error, match="param 'w' has not been set"):
        c.run({"x": np.zeros((8, 16), np.float32)})
    with pytest.raises(rlx.Error, match="no param named 'q'"):
        c.set_param("q", np.zeros(3, np.float32))


def test_unknown_op_and_bad_text():
    g = rlx.Graph()
    x = g.input("x", (2,))
    with pytest.raises(rlx.Error, match="unknown op 'frobnicate'"):
        g._op("frobnicate", [x])
    with pytest.raises(rlx.Error, match="line 2"):
        rlx.parse("graph g {\n  %0 = bogus_op : f32[2]\n}")
    with pytest.raises(rlx.Error):
        rlx.Session("not-a-device")


def test_shape_error_names_op_and_shapes():
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match=r"matmul.*f32\[2,3\].*f32\[4,5\]"):
        g.input("a", (2, 3)) @ g.input("b", (4, 5))


def test_text_round_trip_and_introspection(tmp_path):
    g = mlp()
    text = g.to_text()
    assert rlx.parse(text).to_text() == text
    c = rlx.Session("cpu").compile(g)
    assert "matmul" in c.ir("mir")
    assert "memory: arena" in c.ir("lir")
    plan = c.memory_plan()
    assert plan["arena_bytes"] <= plan["naive_bytes"]
    report = c.dispatch_report()
    assert any(op == "linear" for _, op, _, _ in report)
    assert "->" in c.summary() or "HIR" in c.summary()


def test_kernel_times_after_a_profiled_run():
    c = rlx.Session("cpu").compile(mlp())
    c.set_param("w", np.eye(16, dtype=np.float32))
    c.set_param("b", np.zeros(16, np.float32))
    x = np.ones((8, 16), np.float32)
    c.run({"x": x})
    assert c.kernel_times() == []  # profiling is off by default on the CPU
    c.set_profiling(True)
    c.run({"x": x})
    times = c.kernel_times()
    kernels = [line.strip() for line in c.ir("lir").splitlines() if re.match(r"  k\d+_", line)]
    assert [k for k, _, _ in times] == kernels and kernels
    assert all(us >= 0 and not host for _, us, host in times)


def test_deleting_graph_keeps_compiled_alive():
    g = mlp()
    c = rlx.Session("cpu").compile(g)
    del g
    gc.collect()
    c.set_param("w", np.eye(16, dtype=np.float32))
    c.set_param("b", np.zeros(16, np.float32))
    x = np.arange(128, dtype=np.float32).reshape(8, 16) - 60
    (y,) = c.run({"x": x})
    np.testing.assert_allclose(y, np.maximum(x, 0))


def test_two_threads_run_clones(rng):
    c = rlx.Session("cpu").compile(mlp(64, 128))
    w = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    c.set_param("w", w)
    c.set_param("b", b)
    xs = [rng.standard_normal((64, 128)).astype(np.float32) for _ in range(2)]
    results, errors = {}, []

    def work(i, compiled):
        try:
            for _ in range(20):
                (y,) = compiled.run({"x": xs[i]})
            results[i] = y
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, c if i == 0 else c.clone())) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(2):
        np.testing.assert_allclose(results[i], np.maximum(xs[i] @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_eight_threads_run_one_compiled_graph(rng):
    # run releases the GIL and nothing in Python serialises the calls: the
    # compiled graph itself must (it once corrupted the heap here). Each
    # thread's outputs must equal, bit for bit, what a serial run gives.
    c = rlx.Session("cpu").compile(mlp(64, 128))
    w = rng.standard_normal((128, 128)).astype(np.float32)
    c.set_param("w", w)
    c.set_param("b", rng.standard_normal(128).astype(np.float32))
    xs = [rng.standard_normal((64, 128)).astype(np.float32) for _ in range(8)]
    want = [c.run({"x": x})[0] for x in xs]
    mismatches, errors = [], []
    start = threading.Barrier(8)

    def work(i):
        try:
            start.wait()
            for _ in range(50):
                (y,) = c.run({"x": xs[i]})
                if not np.array_equal(y, want[i]):
                    mismatches.append(i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not mismatches
    (y,) = c.run({"x": xs[0]})
    np.testing.assert_array_equal(y, want[0])


def test_devices():
    assert "cpu" in rlx.available_devices()
    assert rlx.is_available("cpu")
    assert rlx.parse_device("nvidia") == "cuda"
    with pytest.raises(rlx.Error, match="unknown device"):
        rlx.parse_device("abacus")


def test_svg(tmp_path):
    import shutil
    if shutil.which("dot") is None:
        pytest.skip("graphviz (dot) is not installed")
    path = tmp_path / "g.svg"
    mlp().to_svg(path)
    assert path.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_reference_run_matches(rng):
    g = mlp()
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    (ref,) = rlx.reference_run(g, {"x": x}, {"w": w, "b": b})
    c = rlx.Session("cpu").compile(g)
    c.set_param("w", w)
    c.set_param("b", b)
    np.testing.assert_allclose(c.run({"x": x})[0], ref, rtol=1e-5, atol=1e-5)


def test_symbolic_dims_bound_at_compile(rng):
    g = rlx.Graph()
    x = g.input("x", ("B", 8))
    g.output(x.relu().sum(axis=1))
    with pytest.raises(rlx.Error, match="B"):
        rlx.Session("cpu").compile(g)
    c = rlx.Session("cpu").compile(g, bind={"B": 3})
    a = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(c.run({"x": a})[0], np.maximum(a, 0).sum(1), rtol=1e-5, atol=1e-5)


def test_active_extent_runs_the_bound_graph_at_a_smaller_extent(rng):
    g = rlx.Graph()
    x = g.input("x", ("S", 8))
    w = g.param("w", (8, 4))
    y = x @ w
    g.output(y.softmax(axis=0))  # over the symbolic axis: padding to the bound would change it
    c = rlx.Session("cpu").compile(g, bind={"S": 6})
    wv = rng.standard_normal((8, 4)).astype(np.float32)
    c.set_param("w", wv)

    def want(a):
        z = (a.astype(np.float64) @ wv)
        e = np.exp(z - z.max(0))
        return e / e.sum(0)

    for n in (6, 2, 1, None):
        c.set_active_extent(n)
        rows = n or 6
        assert c.active_extent() == rows
        assert [s[2] for s in c.input_specs] == [[rows, 8]]
        a = rng.standard_normal((rows, 8)).astype(np.float32)
        np.testing.assert_allclose(c.run({"x": a})[0], want(a), rtol=1e-5, atol=1e-6)
    with pytest.raises(rlx.Error, match=r"\[1, 6\], got 7"):
        c.set_active_extent(7)
    with pytest.raises(rlx.Error, match="binds no symbol 'T'"):
        c.set_active_extent(2, symbol="T")
    with pytest.raises(rlx.Error, match="expects f32\\[6,8\\]"):
        c.run({"x": np.zeros((2, 8), np.float32)})
