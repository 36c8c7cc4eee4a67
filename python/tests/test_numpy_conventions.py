"""The DSL follows numpy's conventions (issue 13): special values, dtype promotion, indexing, axis
checks, and the functions a numpy user reaches for, each against numpy on cpu and on vulkan."""
import numpy as np
import pytest

import pyrlx as rlx

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
