"""Every DSL op and composite against numpy on random inputs, across broadcasting cases."""
import math

import numpy as np
import pytest

import pyrlx as rlx

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

F32 = dict(rtol=1e-4, atol=1e-4)


def run(g, inputs, params=None):
    c = rlx.Session("cpu").compile(g)
    for k, v in (params or {}).items():
        c.set_param(k, v)
    return c.run(inputs)


UNARY = {
    "relu": (lambda x: x.relu(), lambda a: np.maximum(a, 0), (-2, 2)),
    "exp": (lambda x: x.exp(), np.exp, (-3, 3)),
    "log": (lambda x: x.log(), np.log, (0.1, 4)),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, (0.1, 4)),
    "rsqrt": (lambda x: x.rsqrt(), lambda a: 1 / np.sqrt(a), (0.1, 4)),
    "tanh": (lambda x: x.tanh(), np.tanh, (-3, 3)),
    "sigmoid": (lambda x: x.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), (-5, 5)),
    "silu": (lambda x: x.silu(), lambda a: a / (1 + np.exp(-a)), (-5, 5)),
    "gelu": (lambda x: x.gelu(), lambda a: 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2))), (-3, 3)),
    "gelu_tanh": (lambda x: x.gelu("tanh"),
                  lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))), (-3, 3)),
    "softplus": (lambda x: x.softplus(), lambda a: np.log1p(np.exp(a)), (-5, 5)),
    "erf": (lambda x: x.erf(), np.vectorize(math.erf), (-2, 2)),
    "sin": (lambda x: x.sin(), np.sin, (-3, 3)),
    "cos": (lambda x: x.cos(), np.cos, (-3, 3)),
    "abs": (lambda x: abs(x), np.abs, (-2, 2)),
    "neg": (lambda x: -x, np.negative, (-2, 2)),
    "floor": (lambda x: x.floor(), np.floor, (-3, 3)),
    "ceil": (lambda x: x.ceil(), np.ceil, (-3, 3)),
    "round": (lambda x: x.round(), np.round, (-3, 3)),
    "sign": (lambda x: x.sign(), np.sign, (-2, 2)),
    "reciprocal": (lambda x: x.reciprocal(), lambda a: 1 / a, (0.5, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, rng):
    build, ref, (lo, hi) = UNARY[name]
    a = rng.uniform(lo, hi, (3, 17)).astype(np.float32)
    g = rlx.Graph()
    g.output(build(g.input("x", a.shape)))
    (y,) = run(g, {"x": a})
    np.testing.assert_allclose(y, ref(a.astype(np.float64)), **F32)


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power),
    "max": (lambda a, b: a.maximum(b), np.maximum),
    "min": (lambda a, b: a.minimum(b), np.minimum),
}
SHAPES = [((4, 5), (4, 5)), ((4, 5), (5,)), ((4, 1), (1, 5)), ((2, 3, 4), (3, 1)), ((3,), ())]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_binary_broadcast(name, shapes, rng):
    build, ref = BINARY[name]
    a = rng.uniform(0.5, 2, shapes[0]).astype(np.float32)
    b = rng.uniform(0.5, 2, shapes[1]).astype(np.float32)
    g = rlx.Graph()
    g.output(build(g.input("a", a.shape), g.input("b", b.shape)))
    (y,) = run(g, {"a": a, "b": b})
    np.testing.assert_allclose(y, ref(a.astype(np.float64), b), **F32)


def test_scalars_and_reflected_operators(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    g.output(2 * x + 1 - x / 4)
    g.output(1 - x)
    g.output(x ** 2)
    ys = run(g, {"x": a})
    np.testing.assert_allclose(ys[0], 2 * a + 1 - a / 4, **F32)
    np.testing.assert_allclose(ys[1], 1 - a, **F32)
    np.testing.assert_allclose(ys[2], a**2, **F32)


def test_comparisons_and_where(rng):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    b = rng.standard_normal((6,)).astype(np.float32)
    g = rlx.Graph()
    x, y = g.input("a", a.shape), g.input("b", b.shape)
    for node in (x < y, x <= y, x > y, x >= y, x == x, x != y):
        g.output(node)
    g.output(rlx.where(x > 0, x, y))
    outs = run(g, {"a": a, "b": b})
    for got, want in zip(outs[:6], [a < b, a <= b, a > b, a >= b, a == a, a != b]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(outs[6], np.where(a > 0, a, b))


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
def test_reductions(axis, keepdims, rng):
    a = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    for m in ("sum", "mean", "max", "min", "prod"):
        g.output(getattr(x, m)(axis=axis, keepdims=keepdims))
    outs = run(g, {"x": a})
    for got, m in zip(outs, ("sum", "mean", "max", "min", "prod")):
        np.testing.assert_allclose(got, getattr(np, m)(a.astype(np.float64), axis=axis, keepdims=keepdims), **F32)


def test_argmax_argmin(rng):
    a = rng.standard_normal((4, 7)).astype(np.float32)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    g.output(x.argmax(1))
    g.output(x.argmin(0, keepdims=True))
    am, ami = run(g, {"x": a})
    np.testing.assert_array_equal(am, a.argmax(1))
    np.testing.assert_array_equal(ami, a.argmin(0)[None])


def test_matmul_batched_broadcast(rng):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5, 6)).astype(np.float32)
    g = rlx.Graph()
    g.output(g.input("a", a.shape) @ g.input("b", b.shape))
    (y,) = run(g, {"a": a, "b": b})
    np.testing.assert_allclose(y, a @ b, **F32)


def test_movement(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    g.output(x.reshape(6, 4))
    g.output(x.T)
    g.output(x.mT)
    g.output(x.permute(2, 0, 1))
    g.output(x.unsqueeze(0).squeeze(0))
    g.output(x.flip(1))
    g.output(x[None, 1, ::2, -3:])
    g.output(x[..., 1])
    g.output(x[:, ::-1])
    g.output(rlx.concat([x, x * 2], axis=1))
    g.output(x.expand(5, 2, 3, 4))
    outs = run(g, {"x": a})
    want = [a.reshape(6, 4), a.T, a.transpose(0, 2, 1), a.transpose(2, 0, 1), a, a[:, ::-1], a[None, 1, ::2, -3:],
            a[..., 1], a[:, ::-1], np.concatenate([a, a * 2], 1), np.broadcast_to(a, (5, 2, 3, 4))]
    for got, w in zip(outs, want):
        np.testing.assert_allclose(got, w, **F32)


def test_index_with_array_and_gather(rng):
    a = rng.standard_normal((5, 4)).astype(np.float32)
    idx = np.array([[0, 3, 1]], dtype=np.int64)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    g.output(x[np.array([4, 0, 2])])
    g.output(g.gather(x, g.input("i", (1, 3), "i64"), axis=1))
    outs = run(g, {"x": a, "i": idx})
    np.testing.assert_allclose(outs[0], a[[4, 0, 2]])
    np.testing.assert_allclose(outs[1], np.take_along_axis(a[:1], idx, 1))


def test_composites(rng):
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    beta = rng.standard_normal(16).astype(np.float32)
    g = rlx.Graph()
    xi = g.input("x", x.shape)
    gm, bt = g.param("g", (16,)), g.param("b", (16,))
    g.output(rlx.softmax(xi, -1))
    g.output(rlx.log_softmax(xi, 1))
    g.output(rlx.layer_norm(xi, gm, bt, eps=1e-5))
    g.output(rlx.rms_norm(xi, gm, eps=1e-6))
    outs = run(g, {"x": x}, {"g": gamma, "b": beta})
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(-1, keepdims=True))
    np.testing.assert_allclose(outs[0], e / e.sum(-1, keepdims=True), **F32)
    ls = xd - xd.max(1, keepdims=True)
    np.testing.assert_allclose(outs[1], ls - np.log(np.exp(ls).sum(1, keepdims=True)), **F32)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    np.testing.assert_allclose(outs[2], (xd - mu) / np.sqrt(var + 1e-5) * gamma + beta, **F32)
    np.testing.assert_allclose(outs[3], xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6) * gamma, **F32)


def test_attention_and_linear(rng):
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
    g = rlx.Graph()
    qi, ki, vi = g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape)
    g.output(rlx.attention(qi, ki, vi, causal=True))
    w, b = rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    g.output(rlx.linear(qi, g.param("w", w.shape), g.param("b", b.shape)))
    att, lin = run(g, {"q": q, "k": k, "v": v}, {"w": w, "b": b})
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / math.sqrt(8)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(att, (p / p.sum(-1, keepdims=True)) @ v, **F32)
    np.testing.assert_allclose(lin, q @ w + b, **F32)


def test_conv_and_pool(rng):
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    g = rlx.Graph()
    xi = g.input("x", x.shape)
    g.output(rlx.conv2d(xi, g.param("w", w.shape), stride=2, padding=1, groups=2))
    g.output(rlx.max_pool2d(xi, 3, 2, 1))
    g.output(rlx.avg_pool2d(xi, 2))
    conv, mp, ap = run(g, {"x": x}, {"w": w})
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 6, 5, 5))
    for o in range(6):
        gi = o // 3
        for i in range(5):
            for j in range(5):
                patch = xp[:, gi * 2:(gi + 1) * 2, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
                want[:, o, i, j] = (patch * w[o]).sum((1, 2, 3))
    np.testing.assert_allclose(conv, want, rtol=1e-4, atol=1e-4)
    xn = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want_mp = np.stack([np.stack([xn[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max((2, 3)) for j in range(5)], -1)
                        for i in range(5)], -2)
    np.testing.assert_allclose(mp, want_mp)
    np.testing.assert_allclose(ap, x.reshape(2, 4, 4, 2, 4, 2)[:, :, :, :, :, :].mean((3, 5)) if False else
                               x[:, :, :8, :8].reshape(2, 4, 4, 2, 4, 2).mean((3, 5)), **F32)


def test_float16_io(rng):
    a = rng.standard_normal((4, 8)).astype(np.float16)
    g = rlx.Graph()
    x = g.input("x", a.shape, "f16")
    g.output((x * 2).relu())
    (y,) = run(g, {"x": a})
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), np.maximum(a.astype(np.float32) * 2, 0), rtol=1e-3)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_bfloat16_io(rng):
    a = rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    g = rlx.Graph()
    x = g.input("x", a.shape, "bf16")
    g.output(x.astype("f32") + 1)
    g.output(x * 2)
    y32, ybf = run(g, {"x": a})
    np.testing.assert_allclose(y32, a.astype(np.float32) + 1, rtol=1e-6)
    assert ybf.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(ybf.astype(np.float32), a.astype(np.float32) * 2)


def test_explicit_builders_of_the_original_pyrlx(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    g = rlx.Graph("orig")
    x = g.input("x", (4, 6))
    wp = g.param("w", (6, 6), "f32")
    h = g.matmul(x, wp)
    h = g.add(h, g.mul(x, x))
    h = g.activation("relu", h)
    h = g.sub(h, g.div(x, g.sqrt(g.exp(g.neg(g.tanh(x))))))
    h = g.where_(g.compare("gt", h, x), h, x)
    s = g.sum(h, [1], True)
    m = g.mean(g.gelu(g.silu(h)), [0], False)
    r = g.reshape(g.transpose(h, [1, 0]), [3, 8])
    n = g.narrow(g.concat([h, h], 0), 0, 2, 4)
    c = g.cast(g.softmax(h, -1), "f64")
    g.set_outputs([s, m, r, n, c, g.reduce("max", h, [0, 1])])
    outs = run(g, {"x": a}, {"w": w})
    hh = a @ w + a * a
    hh = np.maximum(hh, 0) - a / np.sqrt(np.exp(-np.tanh(a)))
    hh = np.where(hh > a, hh, a)
    np.testing.assert_allclose(outs[0], hh.sum(1, keepdims=True), **F32)
    np.testing.assert_allclose(outs[2], hh.T.reshape(3, 8), **F32)
    np.testing.assert_allclose(outs[3], np.concatenate([hh, hh])[2:6], **F32)
    assert outs[4].dtype == np.float64
    np.testing.assert_allclose(outs[5], hh.max(), **F32)
