"""rlx.scan / rlx.cond / rlx.while_loop: bodies traced from Python functions, against numpy loops."""
import numpy as np
import pytest

import pyrlx as rlx


def compile_run(g, inputs, params=None, **options):
    c = rlx.Session("cpu").compile(g, **options)
    for name, value in (params or {}).items():
        c.set_param(name, value)
    return c, c.run(inputs)


def scan_rows(reverse):
    g = rlx.Graph("cumsum")
    xs = g.input("xs", (6, 3))
    total, ys = rlx.scan(lambda c, x: (c + x, c * x), g.constant(np.zeros(3, np.float32)), xs, reverse=reverse)
    g.output(total, "total")
    g.output(ys, "ys")
    return g


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_a_numpy_loop(rng, reverse):
    xs = rng.standard_normal((6, 3)).astype(np.float32)
    c, ys = np.zeros(3, np.float32), np.zeros_like(xs)
    for t in (reversed(range(6)) if reverse else range(6)):
        ys[t] = c * xs[t]
        c = c + xs[t]
    g = scan_rows(reverse)
    _, (total, got_ys) = compile_run(g, {"xs": xs})
    np.testing.assert_allclose(total, c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ys, ys, rtol=1e-5, atol=1e-6)
    ref = rlx.reference_run(g, {"xs": xs})
    np.testing.assert_allclose(ref[1], ys, rtol=1e-5, atol=1e-6)


def rnn_graph(length, dtype="f32"):
    g = rlx.Graph("rnn")
    h0 = g.input("h0", (2, 4), dtype)
    xs = g.input("xs", (length, 2, 4), dtype)
    w = g.param("w", (4, 4), dtype)  # used inside the body: captured as a const of the scan

    def cell(h, x):
        h = (h @ w + x).tanh()
        return h, h.sum(axis=1)

    h, ys = rlx.scan(cell, h0, xs)
    g.output(h, "h")
    g.output(ys, "ys")
    return g


def numpy_rnn(h, xs, w):
    ys = []
    for x in xs:
        h = np.tanh(h @ w + x)
        ys.append(h.sum(axis=1))
    return h, np.stack(ys)


@pytest.mark.parametrize("length", [5, 3000])
def test_scan_captures_outer_weights_unrolled_or_host_loop(rng, length):
    h0 = rng.standard_normal((2, 4)).astype(np.float32)
    xs = rng.standard_normal((length, 2, 4)).astype(np.float32)
    w = (0.5 * rng.standard_normal((4, 4))).astype(np.float32)
    c, (h, ys) = compile_run(rnn_graph(length), {"h0": h0, "xs": xs}, {"w": w})
    want_h, want_ys = numpy_rnn(h0, xs, w)
    np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ys, want_ys, rtol=1e-4, atol=1e-4)
    rows = [row for row in c.dispatch_report() if row[1] == "scan"]
    assert len(rows) == 2  # one per result node: h and ys
    for _, _, tier, reason in rows:
        assert reason.startswith("unrolled" if length <= 64 else "host loop"), reason
        assert tier == ("decomposed" if length <= 64 else "native")


def test_scan_gradient_matches_finite_differences(rng):
    loss_g = rlx.Graph("loss")
    h0 = loss_g.input("h0", (2, 4), "f64")
    xs = loss_g.input("xs", (4, 2, 4), "f64")
    w = loss_g.param("w", (4, 4), "f64")
    h, ys = rlx.scan(lambda h, x: ((h @ w + x).tanh(), ((h @ w + x).tanh()).sum(axis=1)), h0, xs)
    loss_g.output(ys.sum() + (h * h).sum(), "loss")
    grad = rlx.grad(loss_g, wrt=["w", "h0"])
    vals = {"h0": rng.standard_normal((2, 4)), "xs": rng.standard_normal((4, 2, 4))}
    wv = 0.5 * rng.standard_normal((4, 4))
    _, (gw, gh0) = compile_run(grad, vals, {"w": wv})

    def loss(wm, h):
        hf, y = numpy_rnn(h, vals["xs"], wm)
        return y.sum() + (hf * hf).sum()

    eps = 1e-6
    for idx in [(0, 0), (1, 2), (3, 3)]:
        d = np.zeros_like(wv)
        d[idx] = eps
        fd = (loss(wv + d, vals["h0"]) - loss(wv - d, vals["h0"])) / (2 * eps)
        assert abs(gw[idx] - fd) <= 1e-6 * max(1.0, abs(fd)), (idx, gw[idx], fd)
    d = np.zeros_like(vals["h0"])
    d[1, 1] = eps
    fd = (loss(wv, vals["h0"] + d) - loss(wv, vals["h0"] - d)) / (2 * eps)
    assert abs(gh0[1, 1] - fd) <= 1e-6 * max(1.0, abs(fd))


def test_scan_with_a_graph_body_and_explicit_consts(rng):
    body = rlx.Graph("axpy")
    c = body.input("c", (3,))
    x = body.input("x", (3,))
    a = body.input("a", ())
    body.set_outputs([c * a + x, c])
    g = rlx.Graph("g")
    xs = g.input("xs", (4, 3))
    a_outer = g.input("a", ())
    final, prev = rlx.scan(body, g.input("c0", (3,)), xs, consts=[a_outer])
    g.output(final)
    g.output(prev)
    c0 = rng.standard_normal(3).astype(np.float32)
    xv = rng.standard_normal((4, 3)).astype(np.float32)
    _, (got, got_prev) = compile_run(g, {"xs": xv, "a": np.float32(0.5), "c0": c0})
    cur, seen = c0, []
    for x_t in xv:
        seen.append(cur)
        cur = cur * 0.5 + x_t
    np.testing.assert_allclose(got, cur, rtol=1e-5)
    np.testing.assert_allclose(got_prev, np.stack(seen), rtol=1e-5)


def test_nested_scans_capture_through_both_levels(rng):
    g = rlx.Graph("nested")
    scale = g.input("scale", ())
    xs = g.input("xs", (3, 5))

    def row(c, x):
        inner, _ = rlx.scan(lambda acc, e: (acc + e * scale, None), g.constant(np.float32(0)), x)
        return c + inner, inner

    total, per_row = rlx.scan(row, g.constant(np.float32(0)), xs)
    g.output(total)
    g.output(per_row)
    xv = rng.standard_normal((3, 5)).astype(np.float32)
    _, (t, r) = compile_run(g, {"scale": np.float32(2), "xs": xv})
    np.testing.assert_allclose(r, 2 * xv.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t, 2 * xv.sum(), rtol=1e-5, atol=1e-5)


def test_cond_runs_the_taken_branch(rng):
    g = rlx.Graph("cond")
    x = g.input("x", (4,))
    bias = g.input("bias", (4,))
    y = rlx.cond(x.sum() > 0, lambda v: (v.exp(), v + bias), lambda v: (-v, v * 2), x)
    g.output(y[0])
    g.output(y[1])
    c = rlx.Session("cpu").compile(g)
    b = rng.standard_normal(4).astype(np.float32)
    for sign in (1, -1):
        xv = sign * np.abs(rng.standard_normal(4)).astype(np.float32)
        a, s = c.run({"x": xv, "bias": b})
        if sign > 0:
            np.testing.assert_allclose(a, np.exp(xv), rtol=1e-5)
            np.testing.assert_allclose(s, xv + b, rtol=1e-5)
        else:
            np.testing.assert_allclose(a, -xv, rtol=1e-5)
            np.testing.assert_allclose(s, 2 * xv, rtol=1e-5)


def test_while_loop_and_its_derivatives():
    def graph(max_trips):
        g = rlx.Graph("grow")
        v0 = g.input("v0", (), "f64")
        a = g.input("a", (), "f64")
        i, v = rlx.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * a), (g.constant(np.int32(0)), v0),
                              max_trip_count=max_trips)
        g.output(v * v, "loss")
        g.output(i, "trips")
        return g

    g = graph(None)
    _, (loss, trips) = compile_run(g, {"v0": np.float64(1.5), "a": np.float64(1.1)})
    assert trips == 5
    np.testing.assert_allclose(loss, (1.5 * 1.1**5) ** 2)
    with pytest.raises(rlx.Error, match="max_trip_count"):
        rlx.grad(g, wrt=["a"])
    (ga,) = compile_run(rlx.grad(graph(8), wrt=["a"]), {"v0": np.float64(1.5), "a": np.float64(1.1)})[1]
    np.testing.assert_allclose(ga, 2 * 1.5**2 * 5 * 1.1**9, rtol=1e-12)  # d/da (v0 a^5)^2
    jv = rlx.jvp(g, wrt=["a"])  # forward mode needs no bound
    _, outs = compile_run(jv, {"v0": np.float64(1.5), "a": np.float64(1.1), "tangent_a": np.float64(1.0)})
    np.testing.assert_allclose(outs[2], 2 * 1.5**2 * 5 * 1.1**9, rtol=1e-12)


def test_mistyped_carry_is_an_error_naming_it():
    g = rlx.Graph("bad")
    xs = g.input("xs", (4, 3))
    with pytest.raises(rlx.Error, match=r"carry 0: the scan body returns f32\[\] for it, but the carry is f32\[3\]"):
        rlx.scan(lambda c, x: (c.sum(), x), g.input("c0", (3,)), xs)
    with pytest.raises(rlx.Error, match="another structure"):
        rlx.scan(lambda c, x: ((c, c), x), g.input("c1", (3,)), xs)


def test_scan_text_round_trips():
    g = scan_rows(False)
    text = g.to_text()
    assert "body @b0 = graph" in text
    assert rlx.parse(text).to_text() == text


def test_endless_while_loop_ends_by_timeout_or_cancel():
    import threading
    import time

    g = rlx.Graph()
    x = g.input("x", ())
    step = g.input("step", ())
    g.output(rlx.while_loop(lambda c: c < 1.0, lambda c: c + step, x))
    c = rlx.Session("cpu").compile(g)
    feed = {"x": np.float32(0), "step": np.float32(0)}  # step 0: the condition never turns false
    c.set_timeout(0.1)
    with pytest.raises(rlx.Error, match="passed its timeout"):
        c.run(feed)
    c.set_timeout(None)
    done = threading.Event()

    def canceller():
        while not done.is_set():
            time.sleep(0.02)
            c.cancel()

    t = threading.Thread(target=canceller)
    t.start()
    try:
        with pytest.raises(rlx.Error, match="the run was cancelled"):
            c.run(feed)
    finally:
        done.set()
        t.join()
    assert float(c.run({"x": np.float32(0), "step": np.float32(0.5)})[0]) == 1.0
    with pytest.raises(rlx.Error, match="seconds must be > 0"):
        c.set_timeout(-1)
