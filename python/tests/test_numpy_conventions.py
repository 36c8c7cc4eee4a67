"""The DSL follows numpy's conventions (issue 13): special values, dtype promotion, indexing, axis
checks, and the functions a numpy user reaches for, each against numpy on cpu and on vulkan."""
import numpy as np
import pytest

import pyrlx as rlx

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

DEVICES = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
    not rlx.is_available("vulkan"), reason="no Vulkan device here (no driver, or RLX_DEVICES excludes it)"))]
F32 = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def run(device, g, inputs=None, params=None):
    c = rlx.Session(device).compile(g)
    for k, v in (params or {}).items():
        c.set_param(k, v)
    return c.run(inputs or {})


def assert_same(got, want, **tol):
    """Values (NaN where numpy has NaN), dtype and shape as numpy's."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, equal_nan=True, **(tol or F32))
    else:
        np.testing.assert_array_equal(got, want)


# ---- pow's special values ----
SPECIALS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, np.inf, -np.inf, np.nan, 1e-3, 7.25]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pow_special_values(device, dtype, rng):
    # Every pair of specials (0^-1 = inf, NaN^2 = NaN, (-0)^-3 = -inf, (-inf)^0.5 = inf, (-1)^inf = 1, ...)
    # and random bases and exponents, signed zeros and infinities included.
    a, b = (v.ravel() for v in np.meshgrid(np.array(SPECIALS, dtype), np.array(SPECIALS, dtype), indexing="ij"))
    a = np.concatenate([a, rng.uniform(-4, 4, 64).astype(dtype)])
    b = np.concatenate([b, rng.integers(-4, 5, 64).astype(dtype)])
    g = rlx.Graph()
    name = np.dtype(dtype).name.replace("float", "f")
    g.output(g.input("a", a.shape, name) ** g.input("b", b.shape, name))
    (got,) = run(device, g, {"a": a, "b": b})
    with np.errstate(all="ignore"):
        want = np.power(a, b)
    tol = dict(rtol=2e-3, atol=0) if dtype == np.float16 else dict(rtol=1e-5, atol=0)
    assert_same(got, want, **tol)
    real = ~np.isnan(want)  # a NaN's sign is not defined
    np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]))


def build(device, fn, inputs, params=None):
    """Runs fn(*input nodes) (a Node or a list of Nodes) on device; returns the outputs."""
    g = rlx.Graph()
    nodes = [g.input(f"in{i}", a.shape, a.dtype) for i, a in enumerate(inputs)]
    outs = fn(*nodes)
    for o in outs if isinstance(outs, (list, tuple)) else [outs]:
        g.output(o)
    return run(device, g, {f"in{i}": a for i, a in enumerate(inputs)}, params)


def as_f32(want):
    """numpy's result with the float64 that integers promote to in numpy as RLX's f32 (docs/python-dsl.md)."""
    want = np.asarray(want)
    return want.astype(np.float32) if want.dtype == np.float64 else want


def ints(rng, shape, dtype=np.int32, lo=-9, hi=10):
    return rng.integers(lo, hi, shape).astype(dtype)


# ---- promotion: Python scalars, numpy scalars, mixed tensors ----
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8, np.bool_])
def test_python_float_with_an_int_tensor_is_float(device, dtype, rng):
    # Was: the float truncated to an int constant (x >= 2.5 as x >= 2, x * 0.5 + 0.25 all zeros).
    a = rng.integers(0, 5, (4, 6)).astype(dtype)
    ops = [lambda x: x >= 2.5, lambda x: x == 2.5, lambda x: x != 2.0, lambda x: x < 0.5, lambda x: x * 0.5 + 0.25,
           lambda x: 2.5 - x, lambda x: x ** 0.5, lambda x: 1.5 / (x + 1.0)]
    outs = build(device, lambda x: [op(x) for op in ops], [a])
    for got, op in zip(outs, ops):
        assert_same(got, as_f32(op(a)))


def test_python_int_with_a_tensor_keeps_its_dtype(device, rng):
    a8, af = ints(rng, (3, 5), np.int8), rng.standard_normal((3, 5)).astype(np.float16)
    mask = rng.random((3, 5)) < 0.5
    outs = build(device, lambda x, f, m: [x * 3 - 1, 7 - x, f * 3, f + 1, m + 2, m == 1], [a8, af, mask])
    for got, want in zip(outs, [a8 * 3 - 1, 7 - a8, af * 3, af + 1, mask + 2, mask == 1]):
        assert_same(got, want, rtol=1e-3, atol=1e-3)  # f16
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match="out of range for i8"):
        g.input("x", (3,), "i8") + 300  # numpy 2: OverflowError


def test_numpy_scalars_are_weak(device, rng):
    # A numpy scalar takes the tensor's dtype as a Python scalar does: x * np.sqrt(2) stays f32.
    a, ai = rng.standard_normal((2, 3)).astype(np.float32), ints(rng, (2, 3))
    outs = build(device, lambda x, i: [x * np.sqrt(2.0), i * np.float32(0.5), i + np.int64(2)], [a, ai])
    assert_same(outs[0], a * np.float32(np.sqrt(2.0)))
    assert_same(outs[1], (ai * 0.5).astype(np.float32))
    assert_same(outs[2], ai + 2)


# (lhs, rhs, RLX's result dtype): numpy's promote_types, but an int beside a float takes the float's dtype
# (numpy: f64 for i32/i64); integers promote as numpy's do (i8 with u8 gives i16, u32 with i32 gives i64).
MIXED = [("f16", "f32", "f32"), ("f32", "f16", "f32"), ("f32", "f64", "f64"), ("f16", "f64", "f64"),
         ("bf16", "f16", "f32"), ("bf16", "f32", "f32"), ("i32", "f32", "f32"), ("i64", "f16", "f16"),
         ("u8", "f32", "f32"), ("i8", "u8", "i16"), ("i32", "i64", "i64"), ("u8", "i32", "i32"), ("bool", "i32", "i32"),
         ("bool", "f16", "f16"), ("u8", "u16", "u16"), ("u16", "i16", "i32"), ("u32", "i32", "i64"),
         ("u32", "u64", "u64")]


@pytest.mark.parametrize("lhs,rhs,result", MIXED, ids=["-".join(m) for m in MIXED])
def test_mixed_tensor_dtypes_promote(device, lhs, rhs, result, rng):
    np_of = lambda d: np.dtype(ml_dtypes.bfloat16) if d == "bf16" else np.dtype({"f16": np.float16, "f32": np.float32,
        "f64": np.float64, "i8": np.int8, "u8": np.uint8, "i32": np.int32, "i64": np.int64, "bool": np.bool_,
        "i16": np.int16, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64}[d])
    if "bf16" in (lhs, rhs) and ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    a = rng.integers(0, 4, (3, 4)).astype(np_of(lhs))
    b = rng.integers(1, 4, (4,)).astype(np_of(rhs))
    got_add, got_mul, got_lt = build(device, lambda x, y: [x + y, y * x, x < y], [a, b])
    wide = np.float64 if result in ("f16", "f32", "f64") else np.int64  # small values: exact in both
    for got, want in [(got_add, a.astype(wide) + b.astype(wide)), (got_mul, b.astype(wide) * a.astype(wide))]:
        assert got.dtype == np_of(result)
        np.testing.assert_allclose(got.astype(np.float64), want)  # small integers: exact in every dtype
    assert_same(got_lt, a.astype(wide) < b.astype(wide))


def test_where_and_concat_promote(device, rng):
    c = rng.random((3, 4)) < 0.5
    ai, af = ints(rng, (3, 4)), rng.standard_normal((3, 4)).astype(np.float16)
    outs = build(device, lambda m, i, f: [rlx.where(m, i, 0.5), rlx.where(m, 1, 2), rlx.where(m, f, i),
                                          rlx.concat([i, f], axis=0)], [c, ai, af])
    assert_same(outs[0], np.where(c, ai, 0.5).astype(np.float32))
    assert_same(outs[1], np.where(c, 1, 2))
    assert_same(outs[2], np.where(c, af, ai.astype(np.float16)), rtol=1e-3, atol=1e-3)
    assert_same(outs[3], np.concatenate([ai.astype(np.float16), af]), rtol=1e-3, atol=1e-3)


# ---- division, floor division, remainders, xor ----
def test_true_division_of_ints_is_float(device, rng):
    a, b = ints(rng, (5, 7)), ints(rng, (5, 7))
    b[0, :3] = 0  # x / 0: inf, -inf, or NaN for 0 / 0, as numpy
    a[0, 0] = 0
    outs = build(device, lambda x, y: [x / y, x / 2, 3 / y, x.astype("i64") / y], [a, b])
    with np.errstate(all="ignore"):
        wants = [a / b, a / 2, 3 / b, a.astype(np.int64) / b]
    for got, want in zip(outs, wants):
        assert_same(got, as_f32(want))


def test_floor_division_and_remainder_of_ints(device, rng):
    a, b = ints(rng, (6, 9)), ints(rng, (6, 9), lo=-4, hi=5)
    b[0, :4] = 0  # numpy: x // 0 and x % 0 are 0 for integers
    outs = build(device, lambda x, y: [x // y, y // 3, -7 // y, x % y, 7 % y, 7 // x], [a, b])
    with np.errstate(all="ignore"):
        wants = [a // b, b // 3, -7 // b, a % b, 7 % b, 7 // a]
    for got, want in zip(outs, wants):
        assert_same(got, want)


def test_floor_division_of_floats(device, rng):
    # numpy's floor_divide on the quotient of the exact remainder (1 // 0.1 is 9, floor(1 / 0.1) would be 10),
    # poisoned with zeros, NaNs and infinities in both operands.
    a = rng.uniform(-10, 10, 96).astype(np.float32)
    b = rng.uniform(-3, 3, 96).astype(np.float32)
    a[:8] = [1, np.nan, np.inf, -np.inf, 0, -1, 5, np.inf]
    b[:8] = [0.1, 2, 3, 3, 0, 0, np.nan, np.inf]
    b[8:16] = [np.inf, -np.inf, np.inf, -np.inf, 0, 0, 0, 0]
    a[8:16] = [1, 1, -1, -1, 0, 3, -3, np.nan]
    outs = build(device, lambda x, y: [x // y, 7.5 // y, x // 2.5], [a, b])
    with np.errstate(all="ignore"):
        wants = [a // b, np.float32(7.5) // b, a // np.float32(2.5)]
    for got, want in zip(outs, wants):
        assert_same(got, want)


def test_remainder_of_floats_reflected(device, rng):
    a = rng.uniform(-10, 10, (4, 8)).astype(np.float32)
    a[0, :3] = [0, np.nan, -0.5]
    outs = build(device, lambda x: [x % 3.0, 7.0 % x, 2 % x], [a])
    with np.errstate(all="ignore"):
        for got, want in zip(outs, [a % np.float32(3), np.float32(7) % a, np.float32(2) % a]):
            assert_same(got, want)


def test_remainder_by_an_infinite_divisor(device):
    # fmod(a, +-inf) is a; numpy's sign rule then gives a or +-inf (the quotient form would give NaN).
    for dtype in (np.float32, np.float64):
        a = np.array([5, -5, 0, -0.0, 2.5, -2.5, np.inf, np.nan], dtype)
        for b in (np.inf, -np.inf):
            bb = np.full_like(a, b)
            (got,) = build(device, lambda x, y: [x % y], [a, bb])
            with np.errstate(all="ignore"):
                assert_same(got, a % bb)


def test_xor_and_reflected_logic_on_bool(device, rng):
    p, q = rng.random((3, 5)) < 0.5, rng.random((3, 5)) < 0.5
    outs = build(device, lambda x, y: [x ^ y, x ^ True, False ^ y, True & x, False | y], [p, q])
    for got, want in zip(outs, [p ^ q, p ^ True, False ^ q, True & p, False | q]):
        assert_same(got, want)
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match="xor"):
        g.input("i", (3,), "i32") ^ g.input("j", (3,), "i32")


# ---- indexing ----
def test_advanced_indexing_pairs_the_index_arrays(device, rng):
    # Was: x[rows, cols] an outer product (one index_select per axis); numpy pairs them.
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    keys = [([0, 2], [1, 3]), ([0, 2], slice(None), [1, -1]), (1, slice(None), [0, 2]), (slice(None), 1, [0, 2]),
            (np.array([[0], [2]]), np.array([1, 3])), (None, [0, 1], [1, 2]), ([0, 1], None, [0, 1]),
            (Ellipsis, [4, -1]), (slice(None, None, -1), [3, 0], slice(1, 4)), ([-1, 0, 1], [[2], [0]], 4)]
    idx = np.array([[2, -1], [0, 1]], dtype=np.int64)  # an index Node, negative entries included
    outs = build(device, lambda x, i: [x[k] for k in keys] + [x[i, :, i], x[1:, i], x[i, 2], x[[0, 1], i]], [a, idx])
    for got, k in zip(outs, keys):
        assert_same(got, a[k])
    for got, want in zip(outs[len(keys):], [a[idx, :, idx], a[1:][:, idx], a[idx, 2], a[[0, 1], idx]]):
        assert_same(got, want)


def test_bool_masks(device, rng):
    # A numpy mask is a constant: its True count, known when building, fixes the shape (x[mask] gathers).
    a = rng.standard_normal((4, 5, 3)).astype(np.float32)
    m2, m1 = rng.random((4, 5)) < 0.5, np.array([True, False, True, True])
    outs = build(device, lambda x: [x[m2], x[m1], x[:, [True, False, False, True, True], 1], x[m2, 2]], [a])
    for got, want in zip(outs, [a[m2], a[m1], a[:, [True, False, False, True, True], 1], a[m2, 2]]):
        assert_same(got, want)
    g = rlx.Graph()
    x = g.input("x", (4, 5))
    with pytest.raises(rlx.Error, match="depend on its values"):
        x[x > 0]  # a mask Node: a data-dependent shape
    with pytest.raises(IndexError, match="does not match"):
        x[np.ones(5, bool)]
    with pytest.raises(rlx.Error, match="bool scalar"):
        x[True]


def test_index_errors_are_rlx_and_index_errors():
    g = rlx.Graph()
    x = g.input("x", (3, 4))
    for key, match in [((3,), "out of bounds for axis 0 with size 3"), ((0, [4]), "out of bounds for axis 1"),
                       (([0, 1], [0, 1, 2]), "could not be broadcast"), ((0, 0, 0), "too many indices"),
                       ((np.array([0.5]),), "integer or bool"), ((Ellipsis, Ellipsis), "single Ellipsis"),
                       (("a",), "unsupported index")]:
        with pytest.raises(rlx.Error, match=match) as info:
            x[key]
        assert isinstance(info.value, IndexError)


def test_unpacking_iterates_axis_0(device, rng):
    a = rng.standard_normal((3, 2, 4)).astype(np.float32)
    g = rlx.Graph()
    x = g.input("x", a.shape)
    q, k, v = x
    for n in (q, k, v):
        g.output(n)
    assert len(x) == 3 and len(list(x)) == 3
    with pytest.raises(IndexError):
        x[3]
    with pytest.raises(ValueError, match="too many values"):
        a0, b0 = x
    with pytest.raises(rlx.Error, match="rank-0"):
        iter(x.sum())
    for got, want in zip(run(device, g, {"x": a}), a):
        assert_same(got, want)


# ---- axes: out of range is an error, never wrapped ----
def _perm_with(ax):
    """The identity permutation of rank 3 with ax in the place of the axis it names (or would, wrapped)."""
    return [ax if p == ax % 3 else p for p in range(3)]


AXIS_OPS = {
    "argmax": lambda x, ax: x.argmax(ax), "argmin": lambda x, ax: x.argmin(ax), "softmax": lambda x, ax: x.softmax(ax),
    "log_softmax": lambda x, ax: rlx.log_softmax(x, ax), "layer_norm": lambda x, ax: rlx.layer_norm(x, axis=ax),
    "concat": lambda x, ax: rlx.concat([x, x], ax), "stack": lambda x, ax: rlx.stack([x, x], ax),
    "split": lambda x, ax: rlx.split(x, 1, ax)[0], "transpose": lambda x, ax: x.transpose(*_perm_with(ax)),
    "permute": lambda x, ax: x.permute(_perm_with(ax)), "unsqueeze": lambda x, ax: x.unsqueeze(ax),
    "squeeze": lambda x, ax: x[:1, :1, :1].squeeze(ax), "flip": lambda x, ax: x.flip(ax),
    "sum": lambda x, ax: x.sum(ax), "mean": lambda x, ax: x.mean(ax), "var": lambda x, ax: x.var(ax),
    "cumsum": lambda x, ax: x.cumsum(ax), "any": lambda x, ax: x.any(ax), "gather": lambda x, ax: x.graph.gather(
        x, x.graph.constant(np.zeros((2, 3, 4), np.int64)), ax),
}


@pytest.mark.parametrize("name", sorted(AXIS_OPS))
def test_out_of_range_axes_are_refused(name):
    # On a rank-3 node axes -3..2 are valid (-4..3 for unsqueeze and stack, which add one); the next ones
    # out on either side raise, where they used to wrap around (softmax(x, 7) ran as axis 1).
    op, extra = AXIS_OPS[name], 1 if name in ("unsqueeze", "stack") else 0
    g = rlx.Graph()
    x = g.input("x", (2, 3, 4))
    for ax in (2 + extra, -3 - extra):
        assert isinstance(op(x, ax), rlx.Node)
    for ax in (3 + extra, -4 - extra, 7):
        with pytest.raises(rlx.Error, match=f"axis {ax} is out of range"):
            op(x, ax)


# ---- divergences from numpy, now numpy's ----
def test_T_reverses_every_axis_and_mT_swaps_the_last_two(device, rng):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]]
    outs = build(device, lambda *xs: [x.T for x in xs] + [x.mT for x in xs[2:]], arrays)
    for got, want in zip(outs, [a.T for a in arrays] + [np.swapaxes(a, -1, -2) for a in arrays[2:]]):
        assert_same(got, want)
    g = rlx.Graph()
    v = g.input("v", (5,))
    assert v.T is v  # a no-op, as numpy's (it was a bare IndexError)
    with pytest.raises(rlx.Error, match="mT needs rank >= 2"):
        v.mT


def test_argmax_without_an_axis_flattens(device, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    b = a.copy()
    b[1, 2, 3] = b[2, 0, 0] = np.nan  # numpy: the first NaN wins
    outs = build(device, lambda x, y: [x.argmax(), x.argmin(), y.argmax(), x.argmax(keepdims=True), x.argmax(1),
                                       (x > 0).argmax(-1)], [a, b])
    wants = [a.argmax(), a.argmin(), b.argmax(), a.argmax(keepdims=True), a.argmax(1), (a > 0).argmax(-1)]
    for got, want in zip(outs, wants):
        assert_same(got, want)


SHAPES_1D = [((5,), (5, 3)), ((4, 5), (5,)), ((5,), (5,)), ((2, 3, 4, 5), (5,)), ((5,), (2, 5, 3)),
             ((2, 1, 4, 5), (3, 5, 2))]


@pytest.mark.parametrize("shapes", SHAPES_1D, ids=str)
def test_matmul_with_1d_operands(device, shapes, rng):
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    outs = build(device, lambda x, y: [x @ y, rlx.matmul(x, y), a @ y], [a, b])  # a @ y: numpy defers to Node
    for got in outs:
        assert_same(got, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_refuses_scalars():
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match="scalar"):
        g.input("x", (3,)) @ g.input("s", ())


# ---- missing functions, now numpy's ----
def test_reduction_dtypes_follow_numpy(device, rng):
    ai, mask = ints(rng, (3, 4, 5)), rng.random((3, 4, 5)) < 0.5
    outs = build(device, lambda i, m: [i.mean(), i.mean(1), m.sum(), m.sum((0, 2)), m.mean(-1), i.sum(0),
                                       (i.astype("i8") + 100).sum(), i.prod(2), m.max(1), m.min(), i.astype("u8").sum()],
                 [ai, mask])
    wants = [ai.mean(), ai.mean(1), mask.sum(), mask.sum((0, 2)), mask.mean(-1), ai.sum(0),
             (ai.astype(np.int8) + 100).sum(), ai.prod(2), mask.max(1), mask.min(), ai.astype(np.uint8).sum()]
    for got, want in zip(outs, wants):
        assert_same(got, as_f32(want))  # numpy's u8 sum is u64, which RLX has


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (-1, True), ((0, 2), False), (None, True)])
def test_any_all(device, axis, keepdims, rng):
    a = rng.choice(np.array([0.0, 1.5, -2.0, np.nan], np.float32), (3, 4, 5), p=[0.7, 0.1, 0.1, 0.1])
    ai, mask = ints(rng, (3, 4, 5), lo=0, hi=2), rng.random((3, 4, 5)) < 0.8
    outs = build(device, lambda x, i, m: [v.any(axis, keepdims) for v in (x, i, m)] + [v.all(axis, keepdims) for v in (x, i, m)]
                 + [rlx.any(m, axis), rlx.all(m, axis)], [a, ai, mask])
    wants = [v.any(axis, keepdims=keepdims) for v in (a, ai, mask)] + [v.all(axis, keepdims=keepdims) for v in (a, ai, mask)]
    for got, want in zip(outs, wants + [mask.any(axis), mask.all(axis)]):
        assert_same(got, np.asarray(want))


def test_any_all_of_empty_axes(device):
    e = np.zeros((3, 0), np.float32)
    outs = build(device, lambda x: [x.any(1), x.all(1), x.any()], [e])
    for got, want in zip(outs, [e.any(1), e.all(1), np.asarray(e.any())]):
        assert_same(got, want)


@pytest.mark.parametrize("axis,ddof,keepdims", [(None, 0, False), (0, 1, False), (-1, 0, True), ((0, 2), 2, False),
                                                (1, 4, False), (1, 9, True)])
def test_var_std(device, axis, ddof, keepdims, rng):
    # ddof = N gives 0/0 (NaN) and ddof > N a division by zero, as numpy (which warns).
    a = rng.standard_normal((3, 4, 5)).astype(np.float32) * 3 + 1
    a[0, 0, 0] = np.nan  # poisons what it reduces into
    ai = ints(rng, (3, 4, 5))
    outs = build(device, lambda x, i: [x.var(axis, ddof=ddof, keepdims=keepdims), x.std(axis, ddof=ddof, keepdims=keepdims),
                                       rlx.var(i, axis, ddof=ddof), rlx.std(i, axis, ddof=ddof)], [a, ai])
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if ddof >= 4 else _no_warning():
        wants = [a.var(axis, ddof=ddof, keepdims=keepdims), a.std(axis, ddof=ddof, keepdims=keepdims),
                 ai.var(axis, ddof=ddof), ai.std(axis, ddof=ddof)]
    for got, want in zip(outs, wants):
        assert_same(got, as_f32(want), rtol=1e-4, atol=1e-5)


class _no_warning:
    def __enter__(self): return self
    def __exit__(self, *exc): return False


@pytest.mark.parametrize("n", [1, 2, 5, 64, 1000])
def test_cumsum(device, n, rng):
    # Every extent, powers of two and not; integers exact and promoted to i64 as numpy; NaN and inf poison.
    a = rng.standard_normal((3, n)).astype(np.float32)
    a[1, n // 2] = np.nan
    a[2, n // 3] = np.inf
    ai, mask = ints(rng, (n, 3), lo=-100, hi=100), rng.random((2, n)) < 0.5
    outs = build(device, lambda x, i, m: [x.cumsum(1), rlx.cumsum(x, -1), i.cumsum(0), m.cumsum(-1), i.cumsum(),
                                          i.cumsum(0, dtype="f32")], [a, ai, mask])
    wants = [a.cumsum(1), a.cumsum(-1), ai.cumsum(0), mask.cumsum(-1), ai.cumsum(), ai.cumsum(0, dtype=np.float32)]
    for got, want in zip(outs, wants):
        assert_same(got, want, rtol=1e-4, atol=1e-3 * np.sqrt(n))


@pytest.mark.parametrize("width,values", [(1, 0), ((2, 1), 1.5), (((1, 2), (0, 3)), -1),
                                          (((1, 2), (2, 1)), ((1, 2), (3, 4))), (((0, 1),), (7,))])
def test_pad(device, width, values, rng):
    # Per-axis constant values as numpy's: a corner takes the first axis' value.
    a, ai = rng.standard_normal((3, 4)).astype(np.float32), ints(rng, (3, 4))
    outs = build(device, lambda x, i: [rlx.pad(x, width, constant_values=values), rlx.pad(i, width, constant_values=values)],
                 [a, ai])
    assert_same(outs[0], np.pad(a, width, constant_values=values))
    assert_same(outs[1], np.pad(ai, width, constant_values=values))  # 1.5 stored in an int: 1, as numpy


def test_pad_refuses():
    g = rlx.Graph()
    x = g.input("x", (3, 4))
    for kwargs, match in [(dict(pad_width=-1), ">= 0"), (dict(pad_width=1, mode="reflect"), "not supported"),
                          (dict(pad_width=((1, 1),) * 3), "do not fit rank 2"), (dict(pad_width=1.5), "integers")]:
        with pytest.raises(rlx.Error, match=match):
            rlx.pad(x, **kwargs)


@pytest.mark.parametrize("sections,axis", [(3, 0), ([1, 4], 1), ([2, -1, 10], -1), (1, 1), ([], 0), ([4, 2], 1)])
def test_split(device, sections, axis, rng):
    a = rng.standard_normal((6, 5)).astype(np.float32)
    outs = build(device, lambda x: rlx.split(x, sections, axis), [a])
    wants = np.split(a, sections, axis)
    assert len(outs) == len(wants)
    for got, want in zip(outs, wants):
        assert_same(got, want)
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match="do not divide"):
        rlx.split(g.input("x", (6, 5)), 4)


@pytest.mark.parametrize("axis", [0, 1, -1, 2, -3])
def test_stack(device, axis, rng):
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float16)
    (got,) = build(device, lambda x, y: rlx.stack([x, y, x], axis), [a, b])
    assert_same(got, np.stack([a, b, a], axis))  # f16 with f32: f32
    g = rlx.Graph()
    with pytest.raises(rlx.Error, match="same shape"):
        rlx.stack([g.input("x", (2, 3)), g.input("y", (3, 2))])
