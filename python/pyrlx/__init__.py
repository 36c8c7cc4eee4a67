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

import contextlib
import numbers
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _pyrlx as _C

__all__ = [
    "Error", "Graph", "Node", "Session", "CompiledGraph", "graph", "parse", "available_devices", "is_available",
    "parse_device", "softmax", "log_softmax", "layer_norm", "rms_norm", "attention", "conv1d", "conv2d",
    "max_pool2d", "avg_pool2d", "linear", "embedding", "where", "concat", "matmul", "grad", "value_and_grad", "jvp",
    "register_op", "is_op_registered",
]

Error = _C.Error

try:  # bf16 arrays are ml_dtypes.bfloat16 when installed, else a uint16 view of the raw bits
    import ml_dtypes as _ml_dtypes

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BF16 = None

_NP_TO_RLX = {
    np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64",
    np.dtype(np.int8): "i8", np.dtype(np.uint8): "u8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
    np.dtype(np.bool_): "bool",
}
_RLX_TO_NP = {v: k for k, v in _NP_TO_RLX.items()}
_RLX_TO_NP["bf16"] = _BF16 if _BF16 is not None else np.dtype(np.uint16)
if _BF16 is not None:
    _NP_TO_RLX[_BF16] = "bf16"

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
    if dtype is not None and arr.dtype != _RLX_TO_NP[dtype] and not (dtype == "bf16" and arr.dtype == np.uint16):
        raise Error(f"expected a {dtype} array, got {arr.dtype}")
    arr = np.require(arr, requirements="C")  # ascontiguousarray would turn rank 0 into rank 1
    if name == "bf16" and arr.dtype != np.uint16:
        arr = arr.view(np.uint16)
    return arr, name


def _from_device_array(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16" and _BF16 is not None:
        return arr.view(_BF16)
    return arr


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
    def _lift(self, other: Any) -> "Node":
        if isinstance(other, Node):
            if other.graph is not self.graph:
                raise Error("nodes belong to different graphs")
            return other
        if isinstance(other, (numbers.Number, np.generic)):
            return self.graph.constant(np.array(other, dtype=_RLX_TO_NP[self.dtype]), self.dtype)
        return self.graph.constant(np.asarray(other))

    def _bin(self, op: str, other: Any, reverse: bool = False) -> "Node":
        o = self._lift(other)
        a, b = (o, self) if reverse else (self, o)
        return self.graph._op(op, [a, b])

    __add__ = lambda s, o: s._bin("add", o)
    __radd__ = lambda s, o: s._bin("add", o, True)
    __sub__ = lambda s, o: s._bin("sub", o)
    __rsub__ = lambda s, o: s._bin("sub", o, True)
    __mul__ = lambda s, o: s._bin("mul", o)
    __rmul__ = lambda s, o: s._bin("mul", o, True)
    __truediv__ = lambda s, o: s._bin("div", o)
    __rtruediv__ = lambda s, o: s._bin("div", o, True)
    __pow__ = lambda s, o: s._bin("pow", o)
    __rpow__ = lambda s, o: s._bin("pow", o, True)
    __mod__ = lambda s, o: s._bin("mod", o)
    __matmul__ = lambda s, o: s._bin("matmul", o)
    __rmatmul__ = lambda s, o: s._bin("matmul", o, True)
    __lt__ = lambda s, o: s._bin("lt", o)
    __le__ = lambda s, o: s._bin("le", o)
    __gt__ = lambda s, o: s._bin("gt", o)
    __ge__ = lambda s, o: s._bin("ge", o)
    __eq__ = lambda s, o: s._bin("eq", o)  # type: ignore[assignment]
    __ne__ = lambda s, o: s._bin("ne", o)  # type: ignore[assignment]
    __and__ = lambda s, o: s._bin("and", o)
    __or__ = lambda s, o: s._bin("or", o)
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

    def sum(self, axis=None, keepdims: bool = False): return self._reduce("reduce_sum", axis, keepdims)
    def mean(self, axis=None, keepdims: bool = False): return self._reduce("reduce_mean", axis, keepdims)
    def max(self, axis=None, keepdims: bool = False): return self._reduce("reduce_max", axis, keepdims)
    def min(self, axis=None, keepdims: bool = False): return self._reduce("reduce_min", axis, keepdims)
    def prod(self, axis=None, keepdims: bool = False): return self._reduce("reduce_prod", axis, keepdims)
    def argmax(self, axis: int = -1, keepdims: bool = False):
        return self.graph._op("argmax", [self], {"axis": axis % max(self.ndim, 1), "keepdims": keepdims})
    def argmin(self, axis: int = -1, keepdims: bool = False):
        return self.graph._op("argmin", [self], {"axis": axis % max(self.ndim, 1), "keepdims": keepdims})
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
        return self.graph._op("permute", [self], {"perm": [p % self.ndim for p in perm]})

    def transpose(self, *perm) -> "Node":
        if not perm:
            perm = tuple(reversed(range(self.ndim)))
        return self.permute(*perm)

    @property
    def T(self) -> "Node":
        """Swaps the last two axes (matrix transpose)."""
        perm = list(range(self.ndim))
        perm[-2:] = perm[-1], perm[-2]
        return self.permute(perm)

    def expand(self, *shape) -> "Node":
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = tuple(shape[0])
        return self.graph._op("expand", [self], dtype=self.dtype, shape=list(shape))

    def squeeze(self, axis=None) -> "Node":
        axes = [i for i, d in enumerate(self.shape) if d == 1] if axis is None else self._axes(axis)
        return self.graph._op("squeeze", [self], {"axes": [a % self.ndim for a in axes]})

    def unsqueeze(self, axis) -> "Node":
        axes = self._axes(axis)
        r = self.ndim + len(axes)
        return self.graph._op("unsqueeze", [self], {"axes": sorted(a % r for a in axes)})

    def flip(self, axis) -> "Node":
        return self.graph._op("flip", [self], {"axes": sorted(a % self.ndim for a in self._axes(axis))})

    def __getitem__(self, key) -> "Node":
        return _index(self, key)


def _index(x: Node, key) -> Node:
    """numpy-style basic indexing: ints, slices (any step), None, Ellipsis; a Node or
    integer array indexes along the axis where it appears (index_select)."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise Error("an index can have only one Ellipsis")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - n_real))
        else:
            expanded.append(k)
    if sum(1 for k in expanded if k is not None) > x.ndim:
        raise Error(f"too many indices for a node of rank {x.ndim}")
    out, axis, drop, new_axes = x, 0, [], []
    for k in expanded:
        if k is None:
            new_axes.append(axis + len(new_axes) - len(drop))
            continue
        dim = out.shape[axis]
        if isinstance(k, (int, np.integer)):
            i = int(k)
            if not -dim <= i < dim:
                raise Error(f"index {i} is out of range for axis {axis} with extent {dim}")
            out = Node(out.graph, out.graph._g.slice(out.id, [axis], [i % dim], [i % dim + 1], [1]))
            drop.append(axis)
        elif isinstance(k, slice):
            start, stop, step = k.indices(dim)
            if step < 0:  # reverse, then take the mirrored forward slice
                out = out.flip(axis)
                start, stop, step = dim - 1 - start, dim - 1 - stop, -step
            out = Node(out.graph, out.graph._g.slice(out.id, [axis], [start], [max(stop, start)], [step]))
        elif isinstance(k, (Node, list, np.ndarray)):
            idx = out._lift(np.asarray(k, dtype=np.int64) if not isinstance(k, Node) else k)
            out = out.graph._op("index_select", [out, idx], {"axis": axis})
            axis += idx.ndim - 1
        else:
            raise Error(f"unsupported index {k!r}")
        axis += 1
    if drop:
        out = out.squeeze(drop)
    if new_axes:
        out = out.unsqueeze(new_axes)
    return out


class Graph:
    """A graph under construction. Use `rlx.graph(name)` as a context manager or construct directly."""

    def __init__(self, name: str = "graph", _native: Optional[Any] = None):
        self._g = _native if _native is not None else _C._Graph(name)

    @property
    def name(self) -> str:
        return self._g.name

    def __len__(self) -> int:
        return len(self._g)

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def _op(self, op: str, inputs: Sequence[Node], attrs: Optional[dict] = None, dtype=None, shape=None) -> Node:
        return Node(self, self._g.op(op, [self._node(i).id for i in inputs], attrs or {}, dtype, shape))

    def _node(self, x: Any) -> Node:
        if isinstance(x, Node):
            if x.graph is not self:
                raise Error("node belongs to a different graph")
            return x
        raise Error(f"expected a Node, got {type(x).__name__}")

    # ---- leaves and outputs ----
    def input(self, name: str, shape: ShapeLike, dtype: DTypeLike = "f32") -> Node:
        return Node(self, self._g.input(name, list(shape), _dtype_name(dtype)))

    def param(self, name: str, shape: ShapeLike, dtype: DTypeLike = "f32") -> Node:
        return Node(self, self._g.param(name, list(shape), _dtype_name(dtype)))

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
        return self._op("gather", [x, idx], {"axis": axis % x.ndim})
    def cast(self, x: Node, dtype: DTypeLike) -> Node: return x.astype(dtype)
    def layer_norm(self, x: Node, gamma=None, beta=None, eps: float = 1e-5) -> Node:
        return layer_norm(x, gamma, beta, eps)
    def rms_norm(self, x: Node, gamma=None, eps: float = 1e-6) -> Node: return rms_norm(x, gamma, eps)
    def attention(self, q: Node, k: Node, v: Node, mask=None, causal: bool = False, scale: float = 0.0) -> Node:
        return attention(q, k, v, mask, causal, scale)

    # ---- introspection ----
    def custom_op(self, name: str, *inputs: Node, **attrs) -> Node:
        """A node of an op added with rlx.register_op (or a C++ OpExtension)."""
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


def softmax(x: Node, axis: int = -1) -> Node: return _g(x)._op("softmax", [x], {"axis": axis % x.ndim})
def log_softmax(x: Node, axis: int = -1) -> Node: return _g(x)._op("log_softmax", [x], {"axis": axis % x.ndim})
def layer_norm(x: Node, gamma: Optional[Node] = None, beta: Optional[Node] = None, eps: float = 1e-5,
               axis: int = -1) -> Node:
    return _g(x)._op("layer_norm", [x] + _opt([gamma, beta]), {"axis": axis % x.ndim, "eps": eps})
def rms_norm(x: Node, gamma: Optional[Node] = None, eps: float = 1e-6) -> Node:
    return _g(x)._op("rms_norm", [x] + _opt([gamma]), {"eps": eps})
def linear(x: Node, w: Node, b: Optional[Node] = None) -> Node: return _g(x)._op("linear", [x, w] + _opt([b]))
def embedding(table: Node, ids: Node) -> Node: return _g(table)._op("embedding", [table, ids])
def matmul(a: Node, b: Node) -> Node: return a @ b
def concat(xs: Sequence[Node], axis: int = 0) -> Node:
    xs = list(xs)
    return _g(xs[0])._op("concat", xs, {"axis": axis % xs[0].ndim})
def where(cond: Node, a: Any, b: Any) -> Node:
    g = _g(cond)
    if isinstance(a, Node):
        b = a._lift(b)
    elif isinstance(b, Node):
        a = b._lift(a)
    else:
        a, b = g.constant(np.float32(a)), g.constant(np.float32(b))
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
    return _g(x)._op("max_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(stride or kernel), "padding": _pair(padding)})
def avg_pool2d(x: Node, kernel, stride=None, padding=0) -> Node:
    return _g(x)._op("avg_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(stride or kernel), "padding": _pair(padding)})


# ---- compile and run ----
class CompiledGraph:
    """A graph compiled for one device: set params, then run with numpy arrays."""

    def __init__(self, native: Any):
        self._c = native
        ins, params, outs = native.io()
        self._inputs = {n: d for n, d, _ in ins}
        self._params = {n: d for n, d, _ in params}
        self._out_dtypes = [d for _, d, _ in outs]
        self._bf16_outputs = "bf16" in self._out_dtypes
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
            if dtype is None or dtype == "bf16":
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

    def ir(self, level: str = "mir") -> str: return self._c.ir(level)
    def summary(self) -> str: return self._c.summary()
    def memory_plan(self) -> dict: return self._c.memory_plan()
    def dispatch_report(self) -> list: return self._c.dispatch_report()


class Session:
    """Compiles graphs for one device: `rlx.Session("cpu").compile(g)`."""

    def __init__(self, device: str = "cpu"):
        self._s = _C._Session(device)

    @property
    def device(self) -> str:
        return self._s.device

    def compile(self, g: Graph, optimize: bool = True, fusion: bool = True, num_threads: int = 0,
                dump: str = "", bind: Optional[dict] = None) -> CompiledGraph:
        """Compiles for this session's device. `bind` gives symbolic dims their extents: {"B": 64}."""
        if not isinstance(g, Graph):
            raise Error(f"compile expects an rlx.Graph, got {type(g).__name__}")
        return CompiledGraph(self._s.compile(g._g, optimize, fusion, num_threads, dump, bind or {}))


# ---- autodiff: graph transforms; the result compiles like any other graph ----
def _stop_ids(stop_gradient) -> list:
    return [n.id for n in (stop_gradient or [])]


def grad(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None) -> Graph:
    """For a graph whose first output is a scalar loss: a graph whose outputs are the gradients
    with respect to the named inputs or params, in the order given."""
    return Graph(_native=_C._grad(g._g, list(wrt), _stop_ids(stop_gradient)))


def value_and_grad(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None) -> Graph:
    """Like grad, with the loss as the first output."""
    return Graph(_native=_C._value_and_grad(g._g, list(wrt), _stop_ids(stop_gradient)))


def jvp(g: Graph, wrt: Sequence[str], stop_gradient: Optional[Sequence[Node]] = None) -> Graph:
    """Forward mode: adds an input `tangent_<name>` per name; outputs the primal outputs, then their tangents."""
    return Graph(_native=_C._jvp(g._g, list(wrt), _stop_ids(stop_gradient)))


# ---- custom ops ----
_ATTR_TYPES = {int: "int", float: "float", bool: "bool", str: "str", list: "ints", "dtype": "dtype"}


def _wrap_lower(lower, native_graph, input_ids, attrs):
    g = Graph(_native=native_graph)
    out = lower(g, *[Node(g, i) for i in input_ids], **attrs)
    if not isinstance(out, Node):
        raise Error(f"lower must return a Node, got {type(out).__name__}")
    return out.id


def _call_kernel(kernel, inputs, out_shape, out_dtype, attrs):
    arrays = [np.frombuffer(data, dtype=_RLX_TO_NP[dt] if dt != "bf16" else np.uint16).reshape(shape)
              for data, dt, shape in inputs]
    result = np.asarray(kernel(*arrays, **attrs))
    if result.shape != tuple(out_shape):
        raise Error(f"cpu_kernel returned shape {result.shape}, the op's infer_shape says {tuple(out_shape)}")
    return np.ascontiguousarray(result.astype(_RLX_TO_NP[out_dtype], copy=False)).tobytes()


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


def is_op_registered(name: str) -> bool: return _C.is_op_registered(name)


def available_devices() -> list: return _C.available_devices()
def is_available(name: str) -> bool: return _C.is_available(name)
def parse_device(name: str) -> str: return _C.parse_device(name)


def reference_run(g: Graph, inputs: dict, params: Optional[dict] = None) -> list:
    """Runs a graph on the float64 reference interpreter (the test oracle)."""
    conv = lambda d: [(n,) + _to_device_array(v) for n, v in (d or {}).items()]
    return _C.reference_run(g._g, conv(inputs), conv(params))
