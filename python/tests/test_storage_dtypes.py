"""The wider integers and the storage-only types (float8, float4, int4, int2) from Python: casts against
ml_dtypes' own conversions, storage-typed arrays in and out, and numpy's promotion of the wider integers."""
import numpy as np
import pytest

import pyrlx as rlx

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the bootstrap installs it)")

DEVICES = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
    not rlx.is_available("vulkan"), reason="no Vulkan device here (no driver, or RLX_DEVICES excludes it)"))]

# RLX's name, ml_dtypes' type, and the range of values inside it (a cast saturates there, as ONNX's does; past
# the largest finite value ml_dtypes' astype overflows instead, so the comparison stays inside).
FLOATS = [("f8e4m3fn", "float8_e4m3fn", 448), ("f8e4m3fnuz", "float8_e4m3fnuz", 240),
          ("f8e5m2", "float8_e5m2", 57344), ("f8e5m2fnuz", "float8_e5m2fnuz", 57344),
          ("f4e2m1", "float4_e2m1fn", 6)]
INTS = [("i4", "int4"), ("u4", "uint4"), ("i2", "int2"), ("u2", "uint2")]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def cast_round_trip(device, x, name):
    g = rlx.Graph()
    q = g.input("x", x.shape, "f32").astype(name)
    g.output(q.astype("f32"))
    g.output(q)
    return rlx.Session(device).compile(g).run({"x": x})


@pytest.mark.parametrize("name,ml,top", FLOATS, ids=[f[0] for f in FLOATS])
def test_float_casts_match_ml_dtypes(device, name, ml, top, rng):
    t = getattr(ml_dtypes, ml, None)
    if t is None:
        pytest.skip(f"this ml_dtypes has no {ml}")
    x = np.concatenate([rng.uniform(-top, top, 200), rng.uniform(-1, 1, 100) * 2.0 ** rng.integers(-12, 0, 100),
                        [0.0, -0.0, top, -top]]).astype(np.float32)
    back, stored = cast_round_trip(device, x, name)
    want = x.astype(t)
    np.testing.assert_array_equal(back, want.astype(np.float32))
    assert stored.dtype == np.dtype(t)  # a storage-typed output comes back as ml_dtypes' type
    np.testing.assert_array_equal(stored.view(np.uint8) & (0x0F if name == "f4e2m1" else 0xFF),
                                  want.view(np.uint8) & (0x0F if name == "f4e2m1" else 0xFF))


@pytest.mark.parametrize("name,ml", INTS, ids=[i[0] for i in INTS])
def test_small_int_casts_match_ml_dtypes(device, name, ml, rng):
    t = getattr(ml_dtypes, ml, None)
    if t is None:
        pytest.skip(f"this ml_dtypes has no {ml}")
    # Floats past the range give 0 in both (ml_dtypes'; ONNX's reference follows it).
    x = np.concatenate([rng.uniform(-20, 20, 100), np.arange(-9, 17)]).astype(np.float32)
    back, _ = cast_round_trip(device, x, name)
    with np.errstate(invalid="ignore"):  # numpy warns of the out-of-range casts it makes 0
        want = x.astype(t).astype(np.float32)
    np.testing.assert_array_equal(back, want)


def test_saturation_and_overflow():
    g = rlx.Graph()
    x = g.input("x", (3,), "f32")
    g.output(x.astype("f8e4m3fn").astype("f32"))
    (got,) = rlx.Session("cpu").compile(g).run({"x": np.array([1e6, -np.inf, np.nan], np.float32)})
    np.testing.assert_array_equal(got[:2], [448, -448])  # ONNX's Cast saturates by default
    assert np.isnan(got[2])


def test_storage_typed_input(device):
    x = np.array([0.5, -3.0, 448.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    g = rlx.Graph()
    g.output(g.input("x", (3,), "f8e4m3fn").astype("f32") * 2)
    (got,) = rlx.Session(device).compile(g).run({"x": x})
    np.testing.assert_array_equal(got, [1.0, -6.0, 896.0])


def test_storage_types_do_not_compute():
    g = rlx.Graph()
    x = g.input("x", (3,), "i4")
    with pytest.raises(rlx.Error, match="storage-only"):
        x + x


@pytest.mark.parametrize("name,np_type", [("i16", np.int16), ("u16", np.uint16), ("u32", np.uint32),
                                          ("u64", np.uint64)])
def test_wide_integers(device, name, np_type, rng):
    info = np.iinfo(np_type)
    a = rng.integers(max(info.min, -1000), min(info.max, 60000), (4, 5)).astype(np_type)
    b = rng.integers(1, 100, (5,)).astype(np_type)
    g = rlx.Graph()
    x, y = g.input("a", a.shape, name), g.input("b", b.shape, name)
    for o in (x + y, x * y, x // y, x % y, x.maximum(y), x < y):
        g.output(o)
    outs = rlx.Session(device).compile(g).run({"a": a, "b": b})
    for got, want in zip(outs, [a + b, a * b, a // b, a % b, np.maximum(a, b), a < b]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_u64_past_2_63():
    # i64 would misorder and divide these wrongly; u64 computes in its own type.
    a = np.array([2**64 - 1, 2**63 + 5, 7], np.uint64)
    b = np.array([2**63, 3, 2**63 + 1], np.uint64)
    g = rlx.Graph()
    x, y = g.input("a", (3,), "u64"), g.input("b", (3,), "u64")
    g.output(x // y)
    g.output(x < y)
    g.output(x % y)
    div, lt, mod = rlx.Session("cpu").compile(g).run({"a": a, "b": b})
    np.testing.assert_array_equal(div, a // b)
    np.testing.assert_array_equal(lt, a < b)
    np.testing.assert_array_equal(mod, a % b)
