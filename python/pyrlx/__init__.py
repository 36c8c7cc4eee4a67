"""pyrlx: Python bindings for RLX, an ML graph compiler and runtime.

    import pyrlx as rlx
    with rlx.graph("mlp") as g:
        x = g.input("x", (64, 1024))
        w = g.param("w", (1024, 1024))
        g.output((x @ w).relu())
    compiled = rlx.Session("cpu").compile(g)
    compiled.set_param("w", w_array)
    (y,) = compiled.run({"x": x_array})
"""
from __future__ import annotations

import atexit
import contextlib
import numbers
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _pyrlx as _C

__all__ = [
    "Error", "Graph", "Node", "Session", "CompiledGraph", "graph", "parse", "available_devices", "is_available",
    "parse_device", "softmax", "log_softmax", "layer_norm", "rms_norm", "attention", "conv1d", "conv2d",
    "max_pool2d", "avg_pool2d", "linear", "embedding", "where", "concat", "stack", "split", "pad", "var", "std",
    "cumsum", "matmul", "IndexingError", "grad", "value_and_grad", "jvp",
    "vmap", "register_op", "is_op_registered", "scan", "cond", "while_loop",
    # backend selection (docs/backend-selection.md)
    "DevicePolicy", "DeviceCandidate", "DeviceReport", "DeviceBenchResult", "GraphDevices", "FlexibleSession",
    "DeviceRouter", "device_report", "fastest_device_for", "resolve_device", "devices_for", "advisory_capabilities",
    "backends_manifest",
    # GGUF models (docs/gguf.md, docs/llm.md)
    "load_gguf", "GgufFile", "LLM", "quantize", "convert_to_gguf",
    # ONNX import (docs/onnx.md)
    "import_onnx", "onnx_supported_ops",
]

Error = _C.Error
load_gguf = _C.load_gguf
quantize = _C.quantize
GgufFile = _C.GgufFile
onnx_supported_ops = _C.onnx_supported_ops

try:  # bf16 arrays are ml_dtypes.bfloat16 when installed, else a uint16 view of the raw bits
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_NP_TO_RLX = {
    np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64",
    np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
    np.dtype(np.int16): "i16", np.dtype(np.uint16): "u16", np.dtype(np.uint32): "u32", np.dtype(np.uint64): "u64",
    np.dtype(np.bool_): "bool",
}
_RLX_TO_NP = {v: k for k, v in _NP_TO_RLX.items()}
_RLX_TO_NP["bf16"] = _BF16 if _BF16 is not None else np.dtype(np.uint16)
if _BF16 is not None:
    _NP_TO_RLX[_BF16] = "bf16"
# The storage-only types (float8, float4, int4, int2): one byte an element, as ml_dtypes' types, else the
# raw bytes as uint8 (which only they produce, so a uint8 array given for one of them is its bytes).
_STORAGE = {"f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2",
            "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0": "float8_e8m0fnu", "f4e2m1": "float4_e2m1fn",
            "i4": "int4", "u4": "uint4", "i2": "int2", "u2": "uint2"}
for _name, _ml in _STORAGE.items():
    _np = getattr(_ml_dtypes, _ml, None) if _BF16 is not None else None
    _RLX_TO_NP[_name] = np.dtype(_np) if _np is not None else np.dtype(np.uint8)
    if _np is not None:
        _NP_TO_RLX[np.dtype(_np)] = _name

ShapeLike = Sequence[Union[int, str]]
DTypeLike = Union[str, np.dtype, type]


def _dtype_name(dtype: DTypeLike) -> str:
    if isinstance(dtype, str) and dtype in _RLX_TO_NP:
        return dtype
    try:
        return _NP_TO_RLX[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise Error(f"unsupported dtype {dtype!r} (expected one of {sorted(_RLX_TO_NP)})") from None


def _to_device_array(value: Any, dtype: Optional[str] = None) -> tuple[np.ndarray, str]:
    """Returns a C-contiguous array (no copy when the layout allows it) and its RLX dtype."""
    arr = np.asarray(value)
    name = dtype or _NP_TO_RLX.get(arr.dtype)
    if name is None:
        raise Error(f"unsupported numpy dtype {arr.dtype}")
    raw = (dtype == "bf16" and arr.dtype == np.uint16) or (dtype in _STORAGE and arr.dtype == np.uint8)
    if dtype is not None and arr.dtype != _RLX_TO_NP[dtype] and not raw:
        raise Error(f"expected a {dtype} array, got {arr.dtype}")
    arr = np.require(arr, requirements="C")  # ascontiguousarray would turn rank 0 into rank 1
    if name == "bf16" and arr.dtype != np.uint16:
        arr = arr.view(np.uint16)
    if name in _STORAGE and arr.dtype != np.uint8:
        arr = arr.view(np.uint8)
    return arr, name


def _from_device_array(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16" and _BF16 is not None:
        return arr.view(_BF16)
    if dtype in _STORAGE and _RLX_TO_NP[dtype] != np.uint8:
        return arr.view(_RLX_TO_NP[dtype])
    return arr


# ---- numpy's dtype promotion over RLX's dtypes (docs/python-dsl.md, "Dtypes") ----
_FLOATS = ("f16", "bf16", "f32", "f64")
_DEFAULT_FLOAT = "f32"  # where numpy makes float64 out of integers, RLX makes its default float


def _promote_types(a: str, b: str) -> str:
    """numpy's promote_types for two tensors, except that an integer beside a float tensor takes the float's
    dtype (numpy widens i32 and i64 to f64), and u64 beside a signed integer takes RLX's default float where numpy
    makes float64."""
    if a == b:
        return a
    if a == "bool" or b == "bool":
        return b if a == "bool" else a
    fa, fb = a in _FLOATS, b in _FLOATS
    if fa and fb:
        return "f64" if "f64" in (a, b) else "f32"  # f16 and bf16 meet at f32
    if fa or fb:
        return a if fa else b
    if a in _STORAGE or b in _STORAGE:
        raise Error(f"{a} and {b}: a storage-only type computes nothing; cast it first (astype)")
    both = np.promote_types(_RLX_TO_NP[a], _RLX_TO_NP[b])  # i8 with u8 gives i16, u32 with i32 gives i64
    return _NP_TO_RLX.get(both, _DEFAULT_FLOAT)


def _weak_dtype(v: Any, beside: Optional[str]) -> str:
    """The dtype a Python or numpy scalar takes beside a tensor (numpy's rule for Python scalars, NEP 50): the
    tensor's, unless the scalar is of a higher kind. Alone (beside=None): numpy's defaults, with f32 for f64."""
    if isinstance(v, (bool, np.bool_)):
        return beside or "bool"
    if isinstance(v, numbers.Integral):
        return "i64" if beside in (None, "bool") else beside
    if isinstance(v, numbers.Real):
        return beside if beside in _FLOATS else _DEFAULT_FLOAT
    raise Error(f"unsupported scalar operand {v!r} ({type(v).__name__})")


def _is_scalar(v: Any) -> bool:
    """A Python or numpy scalar: weak in promotion (numpy 2 makes numpy scalars strong; RLX keeps them weak,
    so that `x * np.sqrt(d)` stays f32)."""
    return isinstance(v, (numbers.Number, np.generic))


def _scalar(g: "Graph", v: Any, dtype: str) -> "Node":
    if dtype == "bf16" and _BF16 is None:  # the uint16 stand-in would take the value, not its bits
        return _scalar(g, v, "f32").astype("bf16")
    try:
        value = np.array(v, dtype=_RLX_TO_NP[dtype])
    except OverflowError:
        raise Error(f"the Python integer {v} is out of range for {dtype}") from None
    return g.constant(value, dtype)


def _common(nodes: Sequence["Node"]) -> list:
    """The nodes cast to one dtype, as numpy's promotion of several arrays."""
    dtype = nodes[0].dtype
    for n in nodes[1:]:
        dtype = _promote_types(dtype, n.dtype)
    return [n._as(dtype) for n in nodes]


class IndexingError(Error, IndexError):
    """An index out of range or of an unsupported kind: an rlx.Error, and an IndexError as numpy raises (so
    iteration and unpacking stop where they should)."""


class Node:
    """A value in a graph. Operators and methods add nodes to the same graph."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # numpy defers to Node's reflected operators

    def __init__(self, graph: "Graph", id: int):
        self.graph = graph
        self.id = id

    # ---- introspection ----
    @property
    def shape(self) -> tuple:
        return self.graph._g.shape(self.id)

    @property
    def dtype(self) -> str:
        return self.graph._g.dtype(self.id)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def op(self) -> str:
        return self.graph._g.op_name(self.id)

    def __repr__(self) -> str:
        return f"Node(%{self.id} {self.op}: {self.dtype}{list(self.shape)})"

    def __hash__(self) -> int:
        return hash((id(self.graph), self.id))

    def __bool__(self) -> bool:
        raise Error("a Node has no truth value; use rlx.where or .any()-style reductions in the graph")

    # ---- operand coercion ----
    __array_ufunc__ = None  # numpy's operators return NotImplemented, so Python calls Node's reflected ones

    def __array__(self, *args, **kwargs):
        raise Error("a Node is symbolic: it has values only when the compiled graph runs")

    def _lift(self, other: Any) -> "Node":
        """other as a node: a node (of this graph or one enclosing it) as is, a scalar as a constant of the
        dtype it takes beside this node, an array as a constant of its own dtype."""
        if isinstance(other, Node):
            if other.graph is not self.graph and not _nested(self.graph, other.graph):
                raise Error("nodes belong to different graphs")
            return other  # a node of an enclosing graph is captured when the op is added
        if _is_scalar(other):
            return _scalar(self.graph, other, _weak_dtype(other, self.dtype))
        return self.graph.constant(np.asarray(other))

    def _as(self, dtype: str) -> "Node":
        return self if self.dtype == dtype else self.astype(dtype)

    def _operands(self, other: Any, reverse: bool = False) -> tuple:
        """(self, other) as two nodes of one dtype, promoted as numpy does; swapped when reverse."""
        a, b = _common([self, self._lift(other)])
        return (b, a) if reverse else (a, b)

    def _bin(self, op: str, other: Any, reverse: bool = False) -> "Node":
        a, b = self._operands(other, reverse)
        return self.graph._op(op, [a, b])

    def _truediv(self, other: Any, reverse: bool = False) -> "Node":
        a, b = self._operands(other, reverse)
        if a.dtype not in _FLOATS:  # true division: integers divide as floats (numpy: f64; RLX: f32)
            a, b = a.astype(_DEFAULT_FLOAT), b.astype(_DEFAULT_FLOAT)
        return self.graph._op("div", [a, b])

    def _floordiv(self, other: Any, reverse: bool = False) -> "Node":
        a, b = self._operands(other, reverse)
        if a.dtype in _FLOATS:
            # numpy's floor_divide: the quotient of the exact remainder (a % b), an integer up to rounding, so
            # 1 // 0.1 is 9 as in numpy (floor(1 / 0.1) would be 10); x // 0 is x / 0 (inf or NaN).
            q = where(b == 0, a / b, ((a - a % b) / b).round())
            # An infinite divisor leaves a as the remainder: -1 where the signs differ, else a signed zero.
            return where(abs(b) == np.inf, where((a * b < 0) & (abs(a) < np.inf), -1, a / b), q)
        # Integers: the truncating division, one less where a remainder is left and the signs differ.
        q = self.graph._op("div", [a, b])
        return q - ((a % b != 0) & ((a < 0) != (b < 0))).astype(q.dtype)

    def _xor(self, other: Any) -> "Node":
        a, b = self._operands(other)
        if a.dtype != "bool":
            raise Error(f"^ is the logical xor of bool operands (RLX has no bitwise integer ops), got {a.dtype}")
        return a != b

    def _matmul(self, other: Any, reverse: bool = False) -> "Node":
        """numpy's matmul: a 1-D operand is a row (on the left) or a column (on the right), dropped after."""
        a, b = self._operands(other, reverse)
        if a.ndim == 0 or b.ndim == 0:
            raise Error(f"matmul: operands of shapes {list(a.shape)} and {list(b.shape)}; a scalar is not a "
                        "matrix (use * to scale)")
        out = self.graph._op("matmul", [a.unsqueeze(0) if a.ndim == 1 else a, b.unsqueeze(-1) if b.ndim == 1 else b])
        drop = ([-2] if a.ndim == 1 else []) + ([-1] if b.ndim == 1 else [])
        return out.squeeze(drop) if drop else out

    __add__ = lambda s, o: s._bin("add", o)
    __radd__ = lambda s, o: s._bin("add", o, True)
    __sub__ = lambda s, o: s._bin("sub", o)
    __rsub__ = lambda s, o: s._bin("sub", o, True)
    __mul__ = lambda s, o: s._bin("mul", o)
    __rmul__ = lambda s, o: s._bin("mul", o, True)
    __truediv__ = lambda s, o: s._truediv(o)
    __rtruediv__ = lambda s, o: s._truediv(o, True)
    __floordiv__ = lambda s, o: s._floordiv(o)
    __rfloordiv__ = lambda s, o: s._floordiv(o, True)
    __pow__ = lambda s, o: s._bin("pow", o)
    __rpow__ = lambda s, o: s._bin("pow", o, True)
    __mod__ = lambda s, o: s._bin("mod", o)
    __rmod__ = lambda s, o: s._bin("mod", o, True)
    __matmul__ = lambda s, o: s._matmul(o)
    __rmatmul__ = lambda s, o: s._matmul(o, True)
    __lt__ = lambda s, o: s._bin("lt", o)
    __le__ = lambda s, o: s._bin("le", o)
    __gt__ = lambda s, o: s._bin("gt", o)
    __ge__ = lambda s, o: s._bin("ge", o)
    __eq__ = lambda s, o: s._bin("eq", o)  # type: ignore[assignment]
    __ne__ = lambda s, o: s._bin("ne", o)  # type: ignore[assignment]
    __and__ = lambda s, o: s._bin("and", o)
    __rand__ = lambda s, o: s._bin("and", o, True)
    __or__ = lambda s, o: s._bin("or", o)
    __ror__ = lambda s, o: s._bin("or", o, True)
    __xor__ = lambda s, o: s._xor(o)
    __rxor__ = lambda s, o: s._xor(o)
    __neg__ = lambda s: s.graph._op("neg", [s])
    __abs__ = lambda s: s.graph._op("abs", [s])
    __invert__ = lambda s: s.graph._op("not", [s])

    # ---- elementwise methods ----
    def _un(self, op: str) -> "Node":
        return self.graph._op(op, [self])

    def relu(self): return self._un("relu")
    def gelu(self, approximate: str = "none"): return self._un("gelu_tanh" if approximate == "tanh" else "gelu")
    def silu(self): return self._un("silu")
    def sigmoid(self): return self._un("sigmoid")
    def tanh(self): return self._un("tanh")
    def exp(self): return self._un("exp")
    def log(self): return self._un("log")
    def sqrt(self): return self._un("sqrt")
    def rsqrt(self): return self._un("rsqrt")
    def reciprocal(self): return self._un("reciprocal")
    def softplus(self): return self._un("softplus")
    def erf(self): return self._un("erf")
    def sin(self): return self._un("sin")
    def cos(self): return self._un("cos")
    def floor(self): return self._un("floor")
    def ceil(self): return self._un("ceil")
    def round(self): return self._un("round")
    def sign(self): return self._un("sign")
    def abs(self): return self._un("abs")
    def neg(self): return self._un("neg")
    def logical_not(self): return self._un("not")
    def maximum(self, o): return self._bin("max", o)
    def minimum(self, o): return self._bin("min", o)
    def clamp(self, min: float = float("-inf"), max: float = float("inf")):
        return self.graph._op("clamp", [self], {"min": float(min), "max": float(max)})
    def astype(self, dtype: DTypeLike): return self.graph._op("cast", [self], {"to": _dtype_name(dtype)})
    cast = astype

    # ---- reductions ----
    def _axes(self, axis) -> list:
        if axis is None:
            return list(range(self.ndim))
        return [int(a) for a in axis] if isinstance(axis, (list, tuple)) else [int(axis)]

    def _reduce(self, op: str, axis, keepdims: bool) -> "Node":
        return Node(self.graph, self.graph._g.reduce(op, self.id, self._axes(axis), keepdims))

    def _accumulator(self) -> "Node":
        """numpy's sum, prod and cumsum accumulate bool and integers narrower than 64 bits in int64."""
        if self.dtype in ("u8", "u16", "u32"):  # numpy accumulates unsigned integers in uint64
            return self._as("u64")
        return self._as("i64") if self.dtype in ("bool", "i8", "i16", "i32") else self

    def _floating(self) -> "Node":
        """numpy's mean, var and std of integers are float64; RLX's default float here."""
        return self if self.dtype in _FLOATS else self.astype(_DEFAULT_FLOAT)

    def _extremum(self, op: str, axis, keepdims: bool) -> "Node":
        if self.dtype == "bool":  # max is any, min is all: the reduction takes u8
            return self.astype("u8")._reduce(op, axis, keepdims).astype("bool")
        return self._reduce(op, axis, keepdims)

    def sum(self, axis=None, keepdims: bool = False): return self._accumulator()._reduce("reduce_sum", axis, keepdims)
    def prod(self, axis=None, keepdims: bool = False): return self._accumulator()._reduce("reduce_prod", axis, keepdims)
    def mean(self, axis=None, keepdims: bool = False): return self._floating()._reduce("reduce_mean", axis, keepdims)
    def max(self, axis=None, keepdims: bool = False): return self._extremum("reduce_max", axis, keepdims)
    def min(self, axis=None, keepdims: bool = False): return self._extremum("reduce_min", axis, keepdims)
    def any(self, axis=None, keepdims: bool = False): return (self if self.dtype == "bool" else self != 0).max(axis, keepdims)
    def all(self, axis=None, keepdims: bool = False): return (self if self.dtype == "bool" else self != 0).min(axis, keepdims)

    def var(self, axis=None, dtype: Optional[DTypeLike] = None, *, ddof: int = 0, keepdims: bool = False) -> "Node":
        """numpy's var: the mean squared deviation, divided by N - ddof (N - ddof <= 0 gives inf or NaN)."""
        x = self.astype(dtype) if dtype is not None else self._floating()
        mu = x.mean(axis, keepdims=True)  # checks the axes
        n = 1
        for a in self._axes(axis):
            extent = x.shape[_C._normalize_axis(a, x.ndim)] if x.ndim else 1
            if not isinstance(extent, int):
                raise Error(f"var/std over the symbolic axis {a} ('{extent}') is not supported")
            n *= extent
        d = x - mu
        # Times 1 / (N - ddof), inf where N - ddof <= 0: the result is then inf or NaN (0 * inf), as numpy's.
        # (A division by a constant 0 would not do: Vulkan shader compilers fold x / 0.0 to 0.)
        return (d * d).sum(axis, keepdims) * (1 / (n - ddof) if n > ddof else np.inf)

    def std(self, axis=None, dtype: Optional[DTypeLike] = None, *, ddof: int = 0, keepdims: bool = False) -> "Node":
        return self.var(axis, dtype, ddof=ddof, keepdims=keepdims).sqrt()

    def cumsum(self, axis: Optional[int] = None, dtype: Optional[DTypeLike] = None) -> "Node":
        """numpy's cumsum (axis=None: of the flattened node), as ceil(log2 n) shifted adds (Hillis-Steele):
        n log n work in log n elementwise kernels, exact for integers, for any extent."""
        x = self.reshape(-1) if axis is None else self
        x = x.astype(dtype) if dtype is not None else x._accumulator()
        ax = _C._normalize_axis(0 if axis is None else int(axis), x.ndim)
        if x.ndim == 0:
            raise Error(f"cumsum: axis {axis} of a rank-0 node (use axis=None)")
        n = x.shape[ax]
        if not isinstance(n, int):
            raise Error(f"cumsum along the symbolic axis {ax} ('{n}') is not supported")
        shift = 1
        while shift < n:  # x[i] += x[i - shift]: the slice shifted right by padding zeros in front
            pads = [0] * (2 * x.ndim)
            pads[ax] = shift
            head = Node(x.graph, x.graph._g.slice(x.id, [ax], [0], [n - shift], [1]))
            x = x + Node(x.graph, x.graph._g.pad(head.id, pads, 0.0))
            shift *= 2
        return x

    def _arg(self, builder: str, axis, keepdims: bool) -> "Node":
        x = self.astype("u8") if self.dtype == "bool" else self
        if axis is not None:
            return Node(x.graph, getattr(x.graph._g, builder)(x.id, int(axis), keepdims))
        flat = x if x.ndim == 1 else x.reshape(-1)  # numpy: the index into the flattened node
        out = Node(flat.graph, getattr(flat.graph._g, builder)(flat.id, 0, False))
        return out.reshape([1] * self.ndim) if keepdims else out

    def argmax(self, axis: Optional[int] = None, keepdims: bool = False): return self._arg("argmax", axis, keepdims)
    def argmin(self, axis: Optional[int] = None, keepdims: bool = False): return self._arg("argmin", axis, keepdims)
    def softmax(self, axis: int = -1): return softmax(self, axis)
    def log_softmax(self, axis: int = -1): return log_softmax(self, axis)

    # ---- movement ----
    def reshape(self, *shape) -> "Node":
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = tuple(shape[0])
        return Node(self.graph, self.graph._g.reshape(self.id, [int(s) for s in shape]))

    def permute(self, *perm) -> "Node":
        if len(perm) == 1 and isinstance(perm[0], (list, tuple)):
            perm = tuple(perm[0])
        return Node(self.graph, self.graph._g.permute(self.id, [int(p) for p in perm]))

    def transpose(self, *axes) -> "Node":
        """numpy's transpose: the axes reversed, or permuted as given (x.transpose(1, 0) or ((1, 0)))."""
        if not axes or (len(axes) == 1 and axes[0] is None):
            return self.T
        return self.permute(*axes)

    @property
    def T(self) -> "Node":
        """All axes reversed, as numpy's .T (a no-op on rank 0 and 1); .mT swaps the last two."""
        return self if self.ndim < 2 else self.permute(list(reversed(range(self.ndim))))

    @property
    def mT(self) -> "Node":
        """The last two axes swapped (a stack of matrices transposed)."""
        if self.ndim < 2:
            raise Error(f"mT needs rank >= 2 (a matrix), got shape {list(self.shape)}")
        perm = list(range(self.ndim))
        perm[-2:] = perm[-1], perm[-2]
        return self.permute(perm)

    def expand(self, *shape) -> "Node":
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = tuple(shape[0])
        return self.graph._op("expand", [self], dtype=self.dtype, shape=list(shape))

    def squeeze(self, axis=None) -> "Node":
        axes = [i for i, d in enumerate(self.shape) if d == 1] if axis is None else self._axes(axis)
        return Node(self.graph, self.graph._g.squeeze(self.id, axes))

    def unsqueeze(self, axis) -> "Node":
        return Node(self.graph, self.graph._g.unsqueeze(self.id, self._axes(axis)))

    def flip(self, axis=None) -> "Node":
        return Node(self.graph, self.graph._g.flip(self.id, self._axes(axis)))

    def __getitem__(self, key) -> "Node":
        return _index(self, key)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise Error("len() of a rank-0 node")
        n = self.shape[0]
        if not isinstance(n, int):
            raise Error(f"len() of a node whose axis 0 is symbolic ('{n}')")
        return n

    def __iter__(self) -> Iterator["Node"]:
        """Along axis 0, as numpy: `q, k, v = x` unpacks x[0], x[1], x[2]."""
        return (self[i] for i in range(len(self)))


_INT_DTYPES = ("i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64")


def _index_items(x: Node, key) -> list:
    """The key as one (kind, value, axis of x) per axis of x, plus ("new", None, None) for None: Ellipsis
    expanded, trailing axes taken whole, and a constant bool mask turned into the int arrays of its nonzeros
    (its True count, known when building, fixes the result's shape)."""
    key = list(key) if isinstance(key, tuple) else [key]
    parsed = []  # (kind, value, number of axes of x it indexes)
    for k in key:
        if k is None:
            parsed.append(("new", None, 0))
        elif k is Ellipsis:
            parsed.append(("ellipsis", None, 0))
        elif isinstance(k, (bool, np.bool_)):
            raise IndexingError("a bool scalar as an index is not supported (None adds an axis)")
        elif isinstance(k, (int, np.integer)):
            parsed.append(("int", int(k), 1))
        elif isinstance(k, slice):
            parsed.append(("slice", k, 1))
        elif isinstance(k, Node):
            if k.dtype == "bool":
                raise IndexingError("a bool Node as a mask: the result's shape would depend on its values, which "
                                    "a graph cannot express; use rlx.where(mask, x, fill), or a numpy mask")
            if k.dtype not in _INT_DTYPES:
                raise IndexingError(f"an index Node needs an integer dtype, got {k.dtype}")
            parsed.append(("array", k, 1))
        elif isinstance(k, (list, np.ndarray)):
            arr = np.asarray(k)
            if arr.dtype == np.bool_:
                if arr.ndim == 0:
                    raise IndexingError("a bool scalar as an index is not supported (None adds an axis)")
                parsed.append(("mask", arr, arr.ndim))
            elif arr.dtype.kind in "iu" or arr.size == 0:  # [] is an empty integer index, as in numpy
                parsed.append(("array", arr.astype(np.int64), 1))
            else:
                raise IndexingError(f"arrays used as indices must be of integer or bool type, got {arr.dtype}")
        else:
            raise IndexingError(f"unsupported index {k!r}: ints, slices, None, Ellipsis, integer arrays or "
                                "Nodes, and bool numpy masks index a Node")
    if sum(1 for kind, _, _ in parsed if kind == "ellipsis") > 1:
        raise IndexingError("an index can only have a single Ellipsis")
    used = sum(n for _, _, n in parsed)
    if used > x.ndim:
        raise IndexingError(f"too many indices: {used} for a node of rank {x.ndim}")
    if not any(kind == "ellipsis" for kind, _, _ in parsed):
        parsed.append(("ellipsis", None, 0))
    items, axis = [], 0
    for kind, value, n in parsed:
        if kind == "ellipsis":
            for _ in range(x.ndim - used):
                items.append(("slice", slice(None), axis))
                axis += 1
        elif kind == "mask":
            extents = tuple(x.shape[axis:axis + n])
            if extents != value.shape:
                raise IndexingError(f"the bool mask of shape {value.shape} does not match axes {axis}..{axis + n - 1} "
                                    f"of the node, of extents {extents}")
            for i, nonzero in enumerate(np.nonzero(value)):
                items.append(("array", nonzero.astype(np.int64), axis + i))
            axis += n
        else:
            items.append((kind, value, None if kind == "new" else axis))
            axis += n
    return items


def _static(extent, what: str) -> int:
    if not isinstance(extent, int):
        raise IndexingError(f"{what} on the symbolic dim '{extent}' is not supported")
    return extent


def _index(x: Node, key) -> Node:
    """numpy's indexing. Basic: ints, slices (any step), None, Ellipsis. Advanced, as soon as one index is an
    integer array, list or Node (or a bool numpy mask): the index arrays, ints among them, broadcast together
    and pick elements pairwise, `x[rows, cols]` being x[rows[i], cols[i]]; their dims replace the indexed axes
    where those are adjacent, else come first."""
    items = _index_items(x, key)
    new_axes = [i for i, (kind, _, _) in enumerate(items) if kind == "new"]
    if new_axes:  # None: an axis of extent 1, then indexed whole
        x = x.unsqueeze(new_axes)
        items = [("slice", slice(None), None) if kind == "new" else (kind, v, a) for kind, v, a in items]
    advanced = any(kind == "array" for kind, _, _ in items)
    out, drop = x, []
    for i, (kind, k, axis) in enumerate(items):
        if kind == "slice" and k != slice(None):
            dim = _static(x.shape[i], "slicing")
            start, stop, step = k.indices(dim)
            if step < 0:  # reverse, then take the mirrored forward slice
                out = out.flip(i)
                start, stop, step = dim - 1 - start, dim - 1 - stop, -step
            out = Node(out.graph, out.graph._g.slice(out.id, [i], [start], [max(stop, start)], [step]))
        elif kind == "int":
            dim = _static(x.shape[i], "an int index")
            if not -dim <= k < dim:
                raise IndexingError(f"index {k} is out of bounds for axis {axis} with size {dim}")
            if not advanced:
                out = Node(out.graph, out.graph._g.slice(out.id, [i], [k % dim], [k % dim + 1], [1]))
                drop.append(i)
    if not advanced:
        return out.squeeze(drop) if drop else out
    return _gather_advanced(out, items)


def _gather_advanced(x: Node, items: list) -> Node:
    positions = [i for i, (kind, _, _) in enumerate(items) if kind in ("int", "array")]
    indices = []
    for i in positions:
        kind, k, axis = items[i]
        dim = _static(x.shape[i], "an index array")
        if isinstance(k, Node):  # negative indices count from the end, as numpy's
            k = k._as("i64")
            indices.append(where(k < 0, k + dim, k))
            continue
        k = np.asarray(k, dtype=np.int64)
        bad = (k < -dim) | (k >= dim)
        if bad.any():
            raise IndexingError(f"index {int(k[bad].flat[0])} is out of bounds for axis {axis} with size {dim}")
        indices.append(np.where(k < 0, k + dim, k))
    shapes = [tuple(k.shape) for k in indices]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexingError("shape mismatch: the index arrays could not be broadcast together with shapes "
                            + " ".join(str(list(s)) for s in shapes)) from None
    if len(positions) == 1:  # one index array: index_select along its axis, in place
        idx = x._lift(indices[0])
        return x.graph._typed([x, idx], lambda g, ids: g.index_select(ids[0], ids[1], positions[0]))
    # Several: the indexed axes first, flattened into one, and the index arrays combined into one linear index.
    rest = [i for i in range(x.ndim) if i not in positions]
    dims = [x.shape[i] for i in positions]
    moved = x.permute(positions + rest) if positions + rest != list(range(x.ndim)) else x
    flat = moved.reshape([int(np.prod(dims))] + [_static(x.shape[i], "advanced indexing") for i in rest])
    strides = [int(np.prod(dims[j + 1:])) for j in range(len(dims))]
    if all(isinstance(k, np.ndarray) for k in indices):
        linear = x._lift(sum(k * s for k, s in zip(indices, strides)))
    else:
        linear = None
        for k, s in zip(indices, strides):
            term = x._lift(k) * s
            linear = term if linear is None else linear + term
    out = flat.graph._typed([flat, linear], lambda g, ids: g.index_select(ids[0], ids[1], 0))
    nb = linear.ndim
    if positions == list(range(positions[0], positions[0] + len(positions))) and positions[0] > 0:
        p = positions[0]  # adjacent: the broadcast dims go where the indexed axes were
        out = out.permute(list(range(nb, nb + p)) + list(range(nb)) + list(range(nb + p, out.ndim)))
    return out


class Graph:
    """A graph under construction. Use `rlx.graph(name)` as a context manager or construct directly."""

    def __init__(self, name: str = "graph", _native: Optional[Any] = None):
        self._g = _native if _native is not None else _C._Graph(name)
        # Values for params that came with the graph (rlx.import_onnx's weights), by name; compile sets them.
        self.param_values: dict = {}
        # Control-flow bodies being traced (rlx.scan, cond, while_loop): the enclosing
        # graph, and the outer nodes this body uses, by (graph, id), with their body inputs.
        self._parent: Optional[Graph] = None
        self._captures: dict = {}
        self._capture_src: list = []

    @property
    def name(self) -> str:
        return self._g.name

    def __len__(self) -> int:
        return len(self._g)

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _typed(self, inputs: Sequence[Node], build) -> Node:
        """The node build(native graph, input ids) adds, in the innermost graph among the operands' (a body
        being traced takes outer nodes in)."""
        g = self
        for i in inputs:
            if isinstance(i, Node) and i.graph is not g and _encloses(g, i.graph):
                g = i.graph
        return Node(g, build(g._g, [g._node(i).id for i in inputs]))

    def _op(self, op: str, inputs: Sequence[Node], attrs: Optional[dict] = None, dtype=None, shape=None) -> Node:
        return self._typed(inputs, lambda g, ids: g.op(op, ids, attrs or {}, dtype, shape))

    def _node(self, x: Any) -> Node:
        if isinstance(x, Node):
            if x.graph is self:
                return x
            if _encloses(x.graph, self):
                return self._capture(x)
            raise Error("node belongs to a different graph")
        raise Error(f"expected a Node, got {type(x).__name__}")

    def _capture(self, x: Node) -> Node:
        """A node of an enclosing graph, used inside this body: becomes one more body input
        (after the body's own), fed with the outer node as a const of the control-flow op."""
        key = (id(x.graph), x.id)
        if key not in self._captures:
            outer = x if x.graph is self._parent else self._parent._capture(x)
            self._captures[key] = self.input(f"capture{len(self._capture_src)}", outer.shape, outer.dtype)
            self._capture_src.append(outer)
        return self._captures[key]

    # ---- leaves and outputs ----
    def input(self, name: str, shape: ShapeLike, dtype: DTypeLike = "f32") -> Node:
        return Node(self, self._g.input(name, shape, _dtype_name(dtype)))

    def param(self, name: str, shape: ShapeLike, dtype: DTypeLike = "f32") -> Node:
        return Node(self, self._g.param(name, shape, _dtype_name(dtype)))

    def constant(self, value: Any, dtype: Optional[DTypeLike] = None) -> Node:
        arr, name = _to_device_array(value if dtype is None else np.asarray(value, dtype=_RLX_TO_NP[_dtype_name(dtype)]))
        return Node(self, self._g.constant(arr, name))

    def output(self, node: Node, name: str = "") -> Node:
        self._g.add_output(self._node(node).id, name)
        return node

    def set_outputs(self, nodes: Iterable[Node]) -> None:
        self._g.set_outputs([self._node(n).id for n in nodes])

    def outputs(self) -> list:
        return [Node(self, i) for i in self._g.outputs()]

    # ---- the original pyrlx's explicit builders ----
    def matmul(self, a: Node, b: Node) -> Node: return a @ b
    def add(self, a: Node, b: Any) -> Node: return a + b
    def sub(self, a: Node, b: Any) -> Node: return a - b
    def mul(self, a: Node, b: Any) -> Node: return a * b
    def div(self, a: Node, b: Any) -> Node: return a / b
    def binary(self, op: str, a: Node, b: Any) -> Node: return a._bin(op, b)
    def activation(self, kind: str, x: Node) -> Node:
        return x.gelu("tanh") if kind in ("gelu_tanh", "gelu_new") else x._un(kind)
    def gelu(self, x: Node) -> Node: return x.gelu()
    def silu(self, x: Node) -> Node: return x.silu()
    def relu(self, x: Node) -> Node: return x.relu()
    def exp(self, x: Node) -> Node: return x.exp()
    def sqrt(self, x: Node) -> Node: return x.sqrt()
    def neg(self, x: Node) -> Node: return -x
    def tanh(self, x: Node) -> Node: return x.tanh()
    def compare(self, op: str, a: Node, b: Any) -> Node: return a._bin(op, b)
    def where_(self, cond: Node, a: Any, b: Any) -> Node: return where(cond, a, b)
    def reduce(self, op: str, x: Node, axes, keep_dim: bool = False) -> Node:
        return x._reduce(op if op.startswith("reduce_") else "reduce_" + op, axes, keep_dim)
    def sum(self, x: Node, axes, keep_dim: bool = False) -> Node: return x.sum(axes, keep_dim)
    def mean(self, x: Node, axes, keep_dim: bool = False) -> Node: return x.mean(axes, keep_dim)
    def softmax(self, x: Node, axis: int = -1) -> Node: return softmax(x, axis)
    def reshape(self, x: Node, shape) -> Node: return x.reshape(shape)
    def transpose(self, x: Node, perm) -> Node: return x.permute(perm)
    def narrow(self, x: Node, axis: int, start: int, length: int) -> Node:
        return Node(self, self._g.slice(x.id, [axis], [start], [start + length], [1]))
    def concat(self, xs: Sequence[Node], axis: int = 0) -> Node: return concat(xs, axis)
    def gather(self, x: Node, idx: Node, axis: int = 0) -> Node:
        return self._typed([x, idx], lambda g, ids: g.gather(ids[0], ids[1], int(axis)))
    def cast(self, x: Node, dtype: DTypeLike) -> Node: return x.astype(dtype)
    def layer_norm(self, x: Node, gamma=None, beta=None, eps: Optional[float] = None) -> Node:
        return layer_norm(x, gamma, beta, eps)
    def rms_norm(self, x: Node, gamma=None, eps: Optional[float] = None) -> Node: return rms_norm(x, gamma, eps)
    def attention(self, q: Node, k: Node, v: Node, mask=None, causal: bool = False, scale: float = 0.0) -> Node:
        return attention(q, k, v, mask, causal, scale)

    # ---- introspection ----
    def custom_op(self, name: str, *inputs, **attrs) -> Node:
        """A node of an op added with rlx.register_op (or a C++ OpExtension).

        Two call forms: `g.custom_op(name, x, y, alpha=1.5)`, and the seed's
        `g.custom_op(name, attrs, inputs)` with attrs a dict (or a list of
        (key, value) pairs) and inputs a list of Nodes."""
        if len(inputs) == 2 and not attrs and isinstance(inputs[0], (dict, list, tuple)) \
                and isinstance(inputs[1], (list, tuple)) and all(isinstance(n, Node) for n in inputs[1]) \
                and not any(isinstance(n, Node) for n in inputs[0]):
            attrs = dict(inputs[0])
            inputs = tuple(inputs[1])
        for n in inputs:
            if not isinstance(n, Node):
                raise Error(f"custom_op('{name}'): inputs must be Nodes, got {type(n).__name__}; "
                            "call it as custom_op(name, *inputs, **attrs) or custom_op(name, attrs, [inputs])")
        return self._op("custom", list(inputs), {"op": name, **attrs})

    def to_text(self) -> str: return self._g.to_text()
    def to_dot(self) -> str: return self._g.to_dot()
    def to_svg(self, path: str) -> None: self._g.write_svg(str(path))
    def verify(self) -> None: self._g.verify()
    def input_names(self) -> list: return self._g.input_names()
    def param_names(self) -> list: return self._g.param_names()
    def __repr__(self) -> str: return f"Graph({self.name!r}, {len(self)} nodes)"


@contextlib.contextmanager
def graph(name: str = "graph") -> Iterator[Graph]:
    """`with rlx.graph("name") as g:` builds a graph."""
    yield Graph(name)


def parse(text: str) -> Graph:
    """Parses RLX IR text (as printed by Graph.to_text)."""
    return Graph(_native=_C.parse(text))


# ---- module functions: composites and helpers ----
def _g(x: Node) -> Graph:
    if not isinstance(x, Node):
        raise Error(f"expected a Node, got {type(x).__name__}")
    return x.graph


def _opt(xs: Sequence[Optional[Node]]) -> list:
    out = []
    for x in xs:
        if x is None:
            break
        out.append(x)
    return out


def softmax(x: Node, axis: int = -1) -> Node: return Node(_g(x), x.graph._g.softmax(x.id, int(axis)))
def log_softmax(x: Node, axis: int = -1) -> Node: return Node(_g(x), x.graph._g.log_softmax(x.id, int(axis)))
def layer_norm(x: Node, gamma: Optional[Node] = None, beta: Optional[Node] = None, eps: Optional[float] = None,
               axis: int = -1) -> Node:
    """eps=None takes the op table's default, as every builder's None does."""
    def build(g, ids):  # ids: x, then gamma and beta where given (the builder refuses beta without gamma)
        rest = iter(ids[1:])
        return g.layer_norm(ids[0], None if gamma is None else next(rest), None if beta is None else next(rest),
                            None if eps is None else float(eps), int(axis))
    return _g(x)._typed([x] + [n for n in (gamma, beta) if n is not None], build)
def rms_norm(x: Node, gamma: Optional[Node] = None, eps: Optional[float] = None) -> Node:
    return _g(x)._op("rms_norm", [x] + _opt([gamma]), {} if eps is None else {"eps": float(eps)})
def linear(x: Node, w: Node, b: Optional[Node] = None) -> Node: return _g(x)._op("linear", [x, w] + _opt([b]))
def embedding(table: Node, ids: Node) -> Node: return _g(table)._op("embedding", [table, ids])
def matmul(a: Node, b: Node) -> Node: return a @ b


def _nodes(xs: Sequence[Node], what: str) -> list:
    xs = list(xs)
    if not xs:
        raise Error(f"{what} needs at least one node")
    for x in xs:
        _g(x)
    return _common(xs)


def concat(xs: Sequence[Node], axis: int = 0) -> Node:
    xs = _nodes(xs, "concat")
    return xs[0].graph._typed(xs, lambda g, ids: g.concat(ids, int(axis)))


def stack(arrays: Sequence[Node], axis: int = 0) -> Node:
    """numpy's stack: nodes of one shape joined along a new axis."""
    xs = _nodes(arrays, "stack")
    if any(x.shape != xs[0].shape for x in xs):
        raise Error("stack: all nodes must have the same shape, got " + ", ".join(str(list(x.shape)) for x in xs))
    return concat([x.unsqueeze(axis) for x in xs], axis)


def split(x: Node, indices_or_sections, axis: int = 0) -> list:
    """numpy's split: into N equal parts (N an int), or at the given indices along the axis."""
    g = _g(x)
    if x.ndim == 0:
        raise Error("split: a rank-0 node has no axis to split")
    ax = _C._normalize_axis(int(axis), x.ndim)
    n = _static(x.shape[ax], "split")
    if isinstance(indices_or_sections, numbers.Integral):
        sections = int(indices_or_sections)
        if sections <= 0 or n % sections:
            raise Error(f"split: {sections} sections do not divide axis {ax} of extent {n} equally")
        bounds = [i * (n // sections) for i in range(1, sections)]
    else:
        bounds = [int(i) for i in indices_or_sections]
    parts = []
    for lo, hi in zip([0] + bounds, bounds + [n]):  # Python's slice rules: negative from the end, clipped
        start, stop, _ = slice(lo, hi).indices(n)
        parts.append(Node(g, g._g.slice(x.id, [ax], [start], [max(start, stop)], [1])))
    return parts


def pad(x: Node, pad_width, mode: str = "constant", constant_values=0) -> Node:
    """numpy's pad, mode "constant": pad_width is an int, (before, after) or one pair per axis, and so is
    constant_values."""
    g = _g(x)
    if mode != "constant":
        raise Error(f"pad: mode {mode!r} is not supported (only 'constant'; build others from slices and concat)")
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise Error(f"pad: pad_width must be integers, got {pad_width!r}")
    values = np.asarray(constant_values)
    try:
        widths = np.broadcast_to(widths, (x.ndim, 2))
        values = np.broadcast_to(values, (x.ndim, 2)) if values.ndim else values
    except ValueError:
        raise Error(f"pad: pad_width {pad_width!r} or constant_values {constant_values!r} do not fit rank "
                    f"{x.ndim} (one (before, after) pair per axis)") from None
    if (widths < 0).any():
        raise Error(f"pad: pad_width must be >= 0, got {pad_width!r}")
    as_dtype = lambda v: float(np.asarray(v).astype(_RLX_TO_NP[x.dtype]))  # the value stored, as numpy casts it
    if values.ndim == 0:
        return Node(g, g._g.pad(x.id, [int(w) for w in widths[:, 0]] + [int(w) for w in widths[:, 1]],
                                as_dtype(values)))
    out = x
    for axis in range(x.ndim):  # axis by axis, as numpy: a corner takes the value of the last axis padded there
        for side in (0, 1):
            if widths[axis, side]:
                pads = [0] * (2 * x.ndim)
                pads[axis + side * x.ndim] = int(widths[axis, side])
                out = Node(g, g._g.pad(out.id, pads, as_dtype(values[axis, side])))
    return out


def _node(x: Any) -> Node:
    _g(x)
    return x


def var(x: Node, axis=None, dtype: Optional[DTypeLike] = None, *, ddof: int = 0, keepdims: bool = False) -> Node:
    return _node(x).var(axis, dtype, ddof=ddof, keepdims=keepdims)
def std(x: Node, axis=None, dtype: Optional[DTypeLike] = None, *, ddof: int = 0, keepdims: bool = False) -> Node:
    return _node(x).std(axis, dtype, ddof=ddof, keepdims=keepdims)
def cumsum(x: Node, axis: Optional[int] = None, dtype: Optional[DTypeLike] = None) -> Node:
    return _node(x).cumsum(axis, dtype)


def _any(x: Node, axis=None, keepdims: bool = False) -> Node:
    """numpy's any: whether an element is nonzero (NaN counts), over the axes."""
    return _node(x).any(axis, keepdims)


def _all(x: Node, axis=None, keepdims: bool = False) -> Node:
    """numpy's all: whether every element is nonzero (NaN counts), over the axes."""
    return _node(x).all(axis, keepdims)


_any.__name__, _all.__name__ = "any", "all"
# rlx.any and rlx.all, as numpy's, through the module's __getattr__ (PEP 562): defined as globals they would
# shadow the builtins any() and all() for all the code of this module.
_MODULE_FUNCTIONS = {"any": _any, "all": _all}


def __getattr__(name: str):
    try:
        return _MODULE_FUNCTIONS[name]
    except KeyError:
        raise AttributeError(f"module 'pyrlx' has no attribute {name!r}") from None


def where(cond: Node, a: Any, b: Any) -> Node:
    """numpy's where: a where cond holds, else b; a and b promoted to one dtype as numpy does."""
    g = _g(cond)
    if isinstance(a, Node):
        a, b = a._operands(b)
    elif isinstance(b, Node):
        b, a = b._operands(a)
    else:
        lift = lambda v: _scalar(g, v, _weak_dtype(v, None)) if _is_scalar(v) else g.constant(np.asarray(v))
        a, b = _common([lift(a), lift(b)])
    return g._op("where", [cond, a, b])
def attention(q: Node, k: Node, v: Node, mask: Optional[Node] = None, causal: bool = False,
              scale: float = 0.0) -> Node:
    return _g(q)._op("attention", [q, k, v] + _opt([mask]), {"causal": causal, "scale": float(scale)})


def _pair(v) -> list:
    return [int(v), int(v)] if isinstance(v, numbers.Integral) else [int(i) for i in v]


def conv2d(x: Node, w: Node, bias: Optional[Node] = None, stride=1, padding=0, dilation=1, groups: int = 1) -> Node:
    return _g(x)._op("conv2d", [x, w] + _opt([bias]),
                     {"stride": _pair(stride), "padding": _pair(padding), "dilation": _pair(dilation), "groups": groups})
def conv1d(x: Node, w: Node, bias: Optional[Node] = None, stride: int = 1, padding: int = 0, dilation: int = 1,
           groups: int = 1) -> Node:
    return _g(x)._op("conv1d", [x, w] + _opt([bias]),
                     {"stride": [stride], "padding": [padding], "dilation": [dilation], "groups": groups})
def max_pool2d(x: Node, kernel, stride=None, padding=0) -> Node:
    return _g(x)._op("max_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(kernel if stride is None else stride), "padding": _pair(padding)})
def avg_pool2d(x: Node, kernel, stride=None, padding=0) -> Node:
    return _g(x)._op("avg_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(kernel if stride is None else stride), "padding": _pair(padding)})


# ---- compile and run ----
class CompiledGraph:
    """A graph compiled for one device: set params, then run with numpy arrays."""

    def __init__(self, native: Any):
        self._c = native
        self._read_io()

    def _read_io(self) -> None:
        ins, params, outs = self._c.io()
        self._inputs = {n: d for n, d, _ in ins}
        self._params = {n: d for n, d, _ in params}
        self._out_dtypes = [d for _, d, _ in outs]
        # Outputs numpy has no dtype for come back as raw bits and are viewed as ml_dtypes' types.
        self._bf16_outputs = any(d == "bf16" or d in _STORAGE for d in self._out_dtypes)
        self.input_specs, self.param_specs, self.output_specs = ins, params, outs

    def set_param(self, name: str, value: Any) -> None:
        if name not in self._params:
            raise Error(f"set_param: the graph has no param named '{name}' (params: {', '.join(self._params) or 'none'})")
        arr, dtype = _to_device_array(value)
        self._c.set_param(name, arr, dtype)

    def run(self, inputs: dict) -> list:
        """Runs with {name: array}; returns the outputs as numpy arrays. The GIL is released while it runs."""
        items = []
        for name, value in inputs.items():
            # Fast path: a C-contiguous array of a plain dtype goes straight to C++, no copy.
            dtype = _NP_TO_RLX.get(value.dtype) if type(value) is np.ndarray and value.flags.c_contiguous else None
            if dtype is None or dtype == "bf16" or dtype in _STORAGE:
                value, dtype = _to_device_array(value)
            items.append((name, value, dtype))
        outs = self._c.run(items)
        if self._bf16_outputs:
            outs = [_from_device_array(o, d) for o, d in zip(outs, self._out_dtypes)]
        return outs

    __call__ = run

    def clone(self) -> "CompiledGraph":
        """A clone sharing the weights, for running from another thread."""
        return CompiledGraph(self._c.clone())

    def set_active_extent(self, extent: Optional[int], symbol: str = "") -> None:
        """Later runs use `extent` (1 up to its bound) for a symbol bound at compile time (`bind`); None restores the
        bound. Inputs and outputs take that extent's shapes (input_specs, output_specs). Each extent is compiled once,
        on first use, and every extent reads the same params. `symbol` may be left out when the graph binds one."""
        if extent is not None and (isinstance(extent, bool) or not isinstance(extent, (int, np.integer))):
            raise Error(f"set_active_extent: the extent must be an int or None, got {extent!r}")
        self._c.set_active_extent(symbol, None if extent is None else int(extent))
        self._read_io()

    def active_extent(self, symbol: str = "") -> int:
        """The extent runs use for `symbol` (left out: the one bound symbol)."""
        return self._c.active_extent(symbol)

    def ir(self, level: str = "mir") -> str: return self._c.ir(level)
    def summary(self) -> str: return self._c.summary()
    def memory_plan(self) -> dict: return self._c.memory_plan()
    def dispatch_report(self) -> list: return self._c.dispatch_report()

    def precision_report(self) -> list:
        """(node, op, dtype it runs in, reason) for each op the precision pass considered."""
        return self._c.precision_report()

    def cancel(self) -> None:
        """Stops the run in flight (from another thread) at its next loop step; it raises rlx.Error."""
        self._c.cancel()

    def set_timeout(self, seconds: Optional[float]) -> None:
        """Every later run raises rlx.Error once it has run `seconds` (checked at each loop step); None: no limit."""
        self._c.set_run_timeout(seconds)

    def set_profiling(self, on: bool = True) -> None:
        """Record each kernel's time in later runs (CPU: off by default, two clock reads per kernel)."""
        self._c.set_profiling(on)

    def kernel_times(self) -> list:
        """The last run's [(kernel, microseconds, ran_on_host)], in kernel order; empty before a profiled run."""
        return self._c.kernel_times()


class Session:
    """Compiles graphs for one device: `rlx.Session("cpu").compile(g)`."""

    def __init__(self, device: str = "cpu"):
        self._s = _C._Session(device)

    @property
    def device(self) -> str:
        return self._s.device

    def compile(self, g: Graph, optimize: bool = True, fusion: bool = True, num_threads: int = 0,
                dump: str = "", bind: Optional[dict] = None, precision: str = "f32",
                tf32: bool = False) -> CompiledGraph:
        """Compiles for this session's device. `bind` gives symbolic dims their extents: {"B": 64}.
        `precision` "bf16" or "f16" runs matmuls in that type where the device has faster kernels for it
        (precision_report() says what was lowered and why); `tf32` lets f32 matmuls use TF32 tensor cores."""
        if not isinstance(g, Graph):
            raise Error(f"compile expects an rlx.Graph, got {type(g).__name__}")
        for sym, extent in (bind or {}).items():
            if isinstance(extent, bool) or not isinstance(extent, (int, np.integer)) or not -2**63 <= extent < 2**63:
                raise Error(f"bind: symbol '{sym}' must be bound to an int extent that fits in int64, got {extent!r}")
        compiled = CompiledGraph(self._s.compile(g._g, optimize, fusion, num_threads, dump, bind or {}, precision,
                                                 tf32))
        for name, value in g.param_values.items():
            compiled.set_param(name, value)
        return compiled


# ---- autodiff: graph transforms; the result compiles like any other graph ----
def _stop_ids(stop_gradient) -> list:
    return [n.id for n in (stop_gradient or [])]


Checkpoint = Union[None, int, Sequence[Node]]


def _checkpoint_args(checkpoint: Checkpoint) -> tuple:
    if checkpoint is None:
        return 0, []
    if isinstance(checkpoint, numbers.Integral):
        if checkpoint < 1:
            raise Error(f"checkpoint: a segment needs at least 1 op, got {checkpoint}")
        return int(checkpoint), []
    return 0, [n.id for n in checkpoint]


def grad(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None,
         checkpoint: Checkpoint = None) -> Graph:
    """For a graph whose first output is a scalar loss: a graph whose outputs are the gradients
    with respect to the named inputs or params, in the order given.

    `checkpoint` recomputes forward values in the backward pass instead of keeping them: an int N
    cuts the forward pass into segments of N ops, a list of nodes ends a segment at each of them."""
    return Graph(_native=_C._grad(g._g, list(wrt), _stop_ids(stop_gradient), *_checkpoint_args(checkpoint)))


def value_and_grad(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None,
                   checkpoint: Checkpoint = None) -> Graph:
    """Like grad, with the loss as the first output."""
    return Graph(_native=_C._value_and_grad(g._g, list(wrt), _stop_ids(stop_gradient),
                                            *_checkpoint_args(checkpoint)))


def jvp(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None) -> Graph:
    """Forward mode: adds an input `tangent_<name>` per name; outputs the primal outputs, then their tangents."""
    return Graph(_native=_C._jvp(g._g, list(wrt), _stop_ids(stop_gradient)))


def vmap(g: Graph, axis: int = 0, size: Union[int, str] = "batch", batched: Optional[Sequence[str]] = None,
         in_axis: Optional[int] = None, out_axis: Optional[int] = None) -> Graph:
    """The graph mapped over a batch axis: each batched input (all inputs unless `batched` names
    inputs or params) gets a batch axis of `size` at `axis`, and so does every output; example i of
    the outputs is g applied to example i of the batched inputs. A string `size` is a symbolic dim,
    bound when compiling (`compile(..., bind={"batch": 8})`). `in_axis`/`out_axis` override `axis`."""
    return Graph(_native=_C._vmap(g._g, list(batched or []), size, axis if in_axis is None else in_axis,
                                  axis if out_axis is None else out_axis))


# ---- control flow: bodies traced from Python functions (docs/autodiff.md, "Control flow") ----
def _encloses(outer: "Graph", inner: "Graph") -> bool:
    g = inner._parent
    while g is not None:
        if g is outer:
            return True
        g = g._parent
    return False


def _nested(a: "Graph", b: "Graph") -> bool:
    return _encloses(a, b) or _encloses(b, a)


def _flatten(tree, what: str) -> tuple:
    """A Node, a tuple/list of Nodes, or None, as a flat list plus what rebuilds it."""
    if tree is None:
        return [], None
    if isinstance(tree, Node):
        return [tree], Node
    if isinstance(tree, (tuple, list)) and all(isinstance(x, Node) for x in tree):
        return list(tree), (type(tree), len(tree))
    raise Error(f"{what} must be a Node, a tuple or list of Nodes, or None; got {tree!r}")


def _unflatten(shape, nodes: list):
    if shape is None:
        return None
    if shape is Node:
        return nodes[0]
    return shape[0](nodes)


def _innermost(nodes: Sequence[Node]) -> "Graph":
    g = nodes[0].graph
    for n in nodes[1:]:
        if n.graph is not g:
            if _encloses(g, n.graph):
                g = n.graph
            elif not _encloses(n.graph, g):
                raise Error("nodes belong to different graphs")
    return g


def _trace(name: str, parent: "Graph", inputs: Sequence[tuple], fn, args_of, pre_capture=()) -> tuple:
    """Traces fn on fresh body inputs ((shape, dtype) each); returns (body, result)."""
    body = Graph(name)
    body._parent = parent
    ins = [body.input(f"in{i}", shape, dtype) for i, (shape, dtype) in enumerate(inputs)]
    for node in pre_capture:  # the other branch's captures first, so both bodies take them in one order
        body._capture(node)
    return body, fn(*args_of(ins))


def _outputs(body: "Graph", values: list) -> None:
    body.set_outputs([body._node(v) if isinstance(v, Node) else body.constant(np.asarray(v)) for v in values])


def scan(f, init, xs=None, length: Optional[int] = None, reverse: bool = False, consts: Sequence[Node] = ()):
    """Loops like jax.lax.scan: `carry, y = f(carry, x)` for each x along xs' axis 0, and returns
    (final carry, ys stacked along a new axis 0). init and xs are a Node, a tuple/list of Nodes,
    or None; f may use nodes of the enclosing graph (weights), which become the scan's consts.
    `f` may also be an rlx.Graph: inputs (carries..., x slices..., consts...) -> (new carries..., ys...).
    With reverse=True the steps run from the last x to the first (ys keep their positions).
    Short scans are unrolled when compiled; long ones run as a host loop (CompileOptions)."""
    carries, c_shape = _flatten(init, "scan's init")
    xs_list, x_shape = _flatten(xs, "scan's xs")
    consts = list(consts)
    if not carries and not xs_list:
        raise Error("rlx.scan needs a carry or xs")
    outer = _innermost(carries + xs_list + consts)
    if length is None:
        if not xs_list:
            raise Error("rlx.scan without xs needs length=")
        length = xs_list[0].shape[0]
    if isinstance(f, Graph):
        body, y_count = f, len(f.outputs()) - len(carries)
        y_shape = Node if y_count == 1 else (tuple, y_count)
    else:
        body, out = _trace(getattr(f, "__name__", "scan") + "_body", outer,
                           [(c.shape, c.dtype) for c in carries] + [(x.shape[1:], x.dtype) for x in xs_list],
                           f, lambda ins: (_unflatten(c_shape, ins[:len(carries)]),
                                           _unflatten(x_shape, ins[len(carries):])))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Error("the scan body must return (new_carry, y)")
        new_carries, new_shape = _flatten(out[0], "the body's new carry")
        ys, y_shape = _flatten(out[1], "the body's y")
        if new_shape != c_shape:
            raise Error(f"the scan body returns a carry of another structure than init ({len(new_carries)} "
                        f"values for {len(carries)})")
        _outputs(body, new_carries + ys)
        consts += body._capture_src
    ids = _C._scan(outer._g, body._g, [outer._node(n).id for n in carries], [outer._node(n).id for n in xs_list],
                   int(length), reverse, [outer._node(n).id for n in consts])
    results = [Node(outer, i) for i in ids]
    return _unflatten(c_shape, results[:len(carries)]), _unflatten(y_shape, results[len(carries):])


def cond(pred: Node, true_fn, false_fn, *operands: Node):
    """true_fn(*operands) if the bool scalar pred holds, else false_fn(*operands); both return a
    Node or a tuple/list of Nodes of equal types. Only the taken branch runs (a constant pred is
    resolved when compiling); both may use nodes of the enclosing graph."""
    outer = _innermost([pred, *operands])
    types = [(o.shape, o.dtype) for o in operands]
    tb, t_out = _trace(getattr(true_fn, "__name__", "then"), outer, types, true_fn, lambda ins: ins)
    t_list, t_shape = _flatten(t_out, "cond's true_fn result")
    _outputs(tb, t_list)
    eb, e_out = _trace(getattr(false_fn, "__name__", "else"), outer, types, false_fn, lambda ins: ins,
                       tb._capture_src)
    e_list, e_shape = _flatten(e_out, "cond's false_fn result")
    if t_shape != e_shape:
        raise Error("cond's branches return different structures")
    _outputs(eb, e_list)
    for node in eb._capture_src[len(tb._capture_src):]:
        tb._capture(node)
    ops = [outer._node(n).id for n in list(operands) + eb._capture_src]
    ids = _C._if(outer._g, outer._node(pred).id, tb._g, eb._g, ops)
    return _unflatten(t_shape, [Node(outer, i) for i in ids])


def _trip_count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise Error(f"while_loop: max_trip_count must be an int >= 0 or None (unbounded), got {n!r}")
    return int(n)


def while_loop(cond_fn, body_fn, init, max_trip_count: Optional[int] = None):
    """carry = body_fn(carry) while cond_fn(carry) (a bool scalar) holds, at most max_trip_count
    times when given; init is a Node or a tuple/list of Nodes. Reverse-mode autodiff needs
    max_trip_count; forward mode does not."""
    carries, c_shape = _flatten(init, "while_loop's init")
    if not carries:
        raise Error("rlx.while_loop needs a carry")
    outer = _innermost(carries)
    types = [(c.shape, c.dtype) for c in carries]
    args = lambda ins: (_unflatten(c_shape, ins),)
    cb, c_out = _trace(getattr(cond_fn, "__name__", "cond"), outer, types, cond_fn, args)
    _outputs(cb, [c_out])
    bb, b_out = _trace(getattr(body_fn, "__name__", "body"), outer, types, body_fn, args, cb._capture_src)
    new_carries, new_shape = _flatten(b_out, "while_loop's body result")
    if new_shape != c_shape:
        raise Error("while_loop's body returns a carry of another structure than init")
    _outputs(bb, new_carries)
    for node in bb._capture_src[len(cb._capture_src):]:
        cb._capture(node)
    ids = _C._while(outer._g, cb._g, bb._g, [outer._node(n).id for n in carries],
                    [outer._node(n).id for n in bb._capture_src], -1 if max_trip_count is None else _trip_count(max_trip_count))
    return _unflatten(c_shape, [Node(outer, i) for i in ids])


# ---- custom ops ----
_ATTR_TYPES = {int: "int", float: "float", bool: "bool", str: "str", list: "ints", "dtype": "dtype"}


def _wrap_lower(lower, native_graph, input_ids, attrs):
    g = Graph(_native=native_graph)
    out = lower(g, *[Node(g, i) for i in input_ids], **attrs)
    if not isinstance(out, Node):
        raise Error(f"lower must return a Node, got {type(out).__name__}")
    if out.graph is not g:
        raise Error("lower returned a Node of another graph; build the result in the graph it is given")
    return out.id


def _call_kernel(kernel, inputs, out_shape, out_dtype, attrs):
    arrays = [np.frombuffer(data, dtype=_RLX_TO_NP[dt] if dt != "bf16" else np.uint16).reshape(shape)
              for data, dt, shape in inputs]
    result = np.asarray(kernel(*arrays, **attrs))
    if result.shape != tuple(out_shape):
        raise Error(f"cpu_kernel returned shape {result.shape}, the op's infer_shape says {tuple(out_shape)}")
    return np.ascontiguousarray(result.astype(_RLX_TO_NP[out_dtype], copy=False)).tobytes()


_release_hooked = False


def register_op(name: str, infer_shape, cpu_kernel=None, lower=None, num_inputs: int = -1,
                attrs: Optional[dict] = None) -> None:
    """Adds an op that graphs build with `g.custom_op(name, *inputs, **attrs)`.

    infer_shape(shapes, dtypes, attrs) returns the output shape (dtype of the first input) or (shape, dtype).
    cpu_kernel(*arrays, **attrs) returns a numpy array: the op then runs on the CPU (and is the reference).
    lower(g, *nodes, **attrs) returns a Node built from existing ops: the op then runs and fuses everywhere.
    attrs declares the op's attributes: {"alpha": float, "axes": list, "to": "dtype"}.
    """
    if cpu_kernel is None and lower is None:
        raise Error(f"register_op('{name}'): give a cpu_kernel, a lower, or both")
    schema = []
    for key, typ in (attrs or {}).items():
        if typ not in _ATTR_TYPES:
            raise Error(f"register_op('{name}'): attribute '{key}' has unsupported type {typ!r}")
        schema.append((key, _ATTR_TYPES[typ]))
    _C._register_op(name, num_inputs, schema, infer_shape, lower, cpu_kernel, _wrap_lower, _call_kernel)
    global _release_hooked
    if not _release_hooked:
        atexit.register(_C._release_python_ops)
        _release_hooked = True


def is_op_registered(name: str) -> bool: return _C.is_op_registered(name)


def available_devices() -> list: return _C.available_devices()
def is_available(name: str) -> bool: return _C.is_available(name)
def parse_device(name: str) -> str: return _C.parse_device(name)


def reference_run(g: Graph, inputs: dict, params: Optional[dict] = None) -> list:
    """Runs a graph on the float64 reference interpreter (the test oracle)."""
    conv = lambda d: [(n,) + _to_device_array(v) for n, v in (d or {}).items()]
    return _C.reference_run(g._g, conv(inputs), conv(params))


def quantize_graph(g: Graph, calibration_batches: Sequence[dict], params: Optional[dict] = None,
                   device: str = "cpu", calibration: str = "minmax", percentile: float = 99.99) -> Graph:
    """Post-training int8 quantization (docs/precision.md): the activations feeding each matmul are calibrated
    over `calibration_batches` (dicts of the graph's inputs), and a matmul becomes int8 (u8 activations per
    tensor, s8 weights per output channel) only where `device` has an int8 matmul that beats its f32 one for
    that size. `params` defaults to g.param_values. The result carries its params (the int8 weights made);
    `result.quantize_report` lists each matmul: (node, op, dtype it runs in, reason)."""
    values = dict(g.param_values if params is None else params)
    conv = lambda d: [(n,) + _to_device_array(v) for n, v in d.items()]
    native, qvalues, report = _C.quantize_graph(g._g, conv(values), [conv(b) for b in calibration_batches],
                                                device, calibration, percentile)
    out = Graph(_native=native)
    out.param_values = dict(qvalues)
    out.quantize_report = list(report)
    return out


# ---- backend selection: pyrlx/devices.py ----
from .llm import LLM  # noqa: E402


# ---- ONNX import (docs/onnx.md) ----
def import_onnx(path, dims: Optional[dict] = None, input_shapes: Optional[dict] = None,
                max_constant_elements: int = 1024) -> Graph:
    """Imports an ONNX model as an rlx.Graph that compiles like any other; its weights are in
    `graph.param_values`, which `Session.compile` sets. Symbolic dims (ONNX's dim_params) stay symbolic and are
    bound when compiling: `Session.compile(g, bind={"batch": 8, "sequence": 128})`, so one import serves every
    size. `dims={"batch": 1, "sequence": 128}` (by name) or `input_shapes={"input_ids": (1, 128)}` (per input)
    bind them here instead. Values known at import fold, shape subgraphs on symbolic dims to dim expressions;
    `graph.onnx_report` lists each node as (name, op, "mapped"|"folded", detail)."""
    native, params, report, opsets = _C._import_onnx(
        str(path), {str(k): int(v) for k, v in (dims or {}).items()},
        {str(k): [int(d) for d in v] for k, v in (input_shapes or {}).items()}, int(max_constant_elements))
    g = Graph(_native=native)
    g.param_values = dict(params)
    g.onnx_report = list(report)
    g.onnx_opsets = dict(opsets)
    return g
from .convert import convert_to_gguf  # noqa: E402
from . import distributed  # noqa: E402  (rlx.distributed.init(), rank(), world_size(): docs/distributed.md)
from .devices import (  # noqa: E402  (it imports the names above)
    DeviceBenchResult, DeviceCandidate, DevicePolicy, DeviceReport, DeviceRouter, FlexibleSession, GraphDevices,
    advisory_capabilities, backends_manifest, device_report, devices_for, fastest_device_for, resolve_device)


# ---- builders generated from the op table ----------------------------------------------------------------------
# An op with no hand-written binding above still gets one, from its entry in the op table (src/ops/): a unary op
# becomes a Node method, a Graph method and a module function; a composite a Graph method and a module function
# taking its operands (an optional one may be None) and its attributes as keywords. Defaults and every check come
# from the C++ table, so an op added there needs no Python.
def _table_builder(entry: dict):
    name, operands = entry["name"], entry["operands"]
    required = [o for o in operands if not o.endswith("?")]
    keys = {a["key"] for a in entry["attrs"]}

    def build(*args: Optional[Node], **attrs: Any) -> Node:
        if not required or len(args) < len(required) or len(args) > len(operands):
            raise Error(f"{name} takes operands ({', '.join(operands)}), got {len(args)}")
        given = list(args)
        while given and given[-1] is None:
            given.pop()
        gaps = [i for i, a in enumerate(given) if a is None]  # `is`: Node's == builds a comparison node
        if gaps:
            missing = operands[gaps[0]].rstrip("?")
            raise Error(f"{name}: operand '{missing}' is None but a later one is given; pass every optional "
                        f"operand before the last one")
        unknown = sorted(set(attrs) - keys)
        if unknown:
            raise Error(f"{name} has no attribute {unknown[0]!r} (it takes: {', '.join(sorted(keys)) or 'none'})")
        return _g(given[0])._op(name, given, {k: v for k, v in attrs.items() if v is not None})

    build.__name__ = name
    build.__doc__ = f"{entry['doc']}. Operands ({', '.join(operands)}); attributes " + (
        ", ".join(a["key"] + (f"={a['default']}" if a["default"] is not None else "") for a in entry["attrs"])
        or "none") + " (generated from the op table)."
    return build


def _define_table_ops() -> None:
    for entry in _C.op_table():
        name = entry["name"]
        if entry["class"] == "unary":
            method = lambda self, _op=name: self._un(_op)
            method.__doc__ = entry["doc"]
            if not hasattr(Node, name):
                setattr(Node, name, method)
            if not hasattr(Graph, name):
                setattr(Graph, name, lambda self, x, _op=name: x._un(_op))
            if name not in globals() and name not in _MODULE_FUNCTIONS:
                _MODULE_FUNCTIONS[name] = lambda x, _op=name: x._un(_op)
        elif entry["class"] == "composite" and name not in globals():
            build = _table_builder(entry)
            _MODULE_FUNCTIONS[name] = build
            if not hasattr(Graph, name):
                setattr(Graph, name, lambda self, *args, _build=build, **attrs: _build(*args, **attrs))


_define_table_ops()
