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
    "max_pool2d", "avg_pool2d", "linear", "embedding", "where", "concat", "matmul", "grad", "value_and_grad", "jvp",
    "vmap", "register_op", "is_op_registered", "scan", "cond", "while_loop",
    # backend selection (docs/backend-selection.md)
    "DevicePolicy", "DeviceCandidate", "DeviceReport", "DeviceBenchResult", "GraphDevices", "FlexibleSession",
    "DeviceRouter", "device_report", "fastest_device_for", "resolve_device", "devices_for", "advisory_capabilities",
    "backends_manifest",
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
            if other.graph is not self.graph and not _nested(self.graph, other.graph):
                raise Error("nodes belong to different graphs")
            return other  # a node of an enclosing graph is captured when the op is added
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

    def _op(self, op: str, inputs: Sequence[Node], attrs: Optional[dict] = None, dtype=None, shape=None) -> Node:
        g = self  # the innermost graph among the operands': a body being traced takes outer nodes in
        for i in inputs:
            if isinstance(i, Node) and i.graph is not g and _encloses(g, i.graph):
                g = i.graph
        return Node(g, g._g.op(op, [g._node(i).id for i in inputs], attrs or {}, dtype, shape))

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
        return self._op("gather", [x, idx], {"axis": axis % x.ndim})
    def cast(self, x: Node, dtype: DTypeLike) -> Node: return x.astype(dtype)
    def layer_norm(self, x: Node, gamma=None, beta=None, eps: float = 1e-5) -> Node:
        return layer_norm(x, gamma, beta, eps)
    def rms_norm(self, x: Node, gamma=None, eps: float = 1e-6) -> Node: return rms_norm(x, gamma, eps)
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
    return _g(x)._op("max_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(kernel if stride is None else stride), "padding": _pair(padding)})
def avg_pool2d(x: Node, kernel, stride=None, padding=0) -> Node:
    return _g(x)._op("avg_pool2d", [x], {"kernel": _pair(kernel), "stride": _pair(kernel if stride is None else stride), "padding": _pair(padding)})


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
                dump: str = "", bind: Optional[dict] = None) -> CompiledGraph:
        """Compiles for this session's device. `bind` gives symbolic dims their extents: {"B": 64}."""
        if not isinstance(g, Graph):
            raise Error(f"compile expects an rlx.Graph, got {type(g).__name__}")
        for sym, extent in (bind or {}).items():
            if isinstance(extent, bool) or not isinstance(extent, (int, np.integer)) or not -2**63 <= extent < 2**63:
                raise Error(f"bind: symbol '{sym}' must be bound to an int extent that fits in int64, got {extent!r}")
        return CompiledGraph(self._s.compile(g._g, optimize, fusion, num_threads, dump, bind or {}))


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


# ---- backend selection (docs/backend-selection.md): devices are labels, "cpu", "vulkan", ... ----
DevicePolicy = _C.DevicePolicy
DeviceCandidate = _C.DeviceCandidate
DeviceReport = _C.DeviceReport
DeviceBenchResult = _C.DeviceBenchResult


def _policy(policy: Optional[DevicePolicy]) -> DevicePolicy:
    if policy is None:
        return DevicePolicy.all()
    if not isinstance(policy, DevicePolicy):
        raise Error(f"expected an rlx.DevicePolicy, got {type(policy).__name__}")
    return policy


def _native_graph(g: Graph) -> Any:
    if not isinstance(g, Graph):
        raise Error(f"expected an rlx.Graph, got {type(g).__name__}")
    return g._g


def _named(inputs: dict) -> list:
    return [(name,) + _to_device_array(value) for name, value in inputs.items()]


def device_report(g: Graph, policy: Optional[DevicePolicy] = None) -> DeviceReport:
    """Every device with its blockers, cost estimate and why; report[0] is the recommended one."""
    return _C.device_report(_native_graph(g), _policy(policy))


def fastest_device_for(g: Graph, policy: Optional[DevicePolicy] = None) -> str:
    return _C.fastest_device_for(_native_graph(g), _policy(policy))


def resolve_device(g: Graph, device: Optional[str] = None, policy: Optional[DevicePolicy] = None) -> str:
    """The hint, else the policy's default device, else RLX_DEVICE, else the cost-model pick."""
    return _C.resolve_device(_native_graph(g), device, _policy(policy))


def devices_for(g: Graph) -> list: return _C.devices_for(_native_graph(g))
def advisory_capabilities(device: str) -> list: return _C.advisory_capabilities(device)
def backends_manifest() -> str:
    """JSON: every device, whether a backend is built in, whether it is available here and why not."""
    return _C.backends_manifest()


class GraphDevices:
    """One graph, compiled lazily per device; params set here are mirrored to every device."""

    def __init__(self, g: Graph, policy: Optional[DevicePolicy] = None):
        self._r = _C._GraphDevices(_native_graph(g), _policy(policy))

    @classmethod
    def with_policy(cls, g: Graph, policy: DevicePolicy) -> "GraphDevices": return cls(g, policy)

    def set_param(self, name: str, value: Any) -> None:
        self._r.set_param(name, *_to_device_array(value))

    def set_param_typed(self, name: str, data: bytes, dtype: DTypeLike) -> None:
        """Raw bytes of the param's shape in `dtype`, converted to the param's dtype."""
        self._r.set_param_typed(name, bytes(data), _dtype_name(dtype))

    def sync_params_to_all(self) -> None: self._r.sync_params_to_all()
    def devices(self) -> list: return self._r.devices()
    def report(self) -> DeviceReport: return self._r.report()
    def fastest(self) -> str: return self._r.fastest()
    def resolve(self, device: Optional[str] = None) -> str: return self._r.resolve(device)
    def compile(self, device: str) -> None: self._r.compile(device)
    def run(self, device: str, inputs: dict) -> list: return self._r.run(device, _named(inputs))

    def run_resolved(self, inputs: dict, device: Optional[str] = None) -> list:
        return self._r.run_resolved(_named(inputs), device)

    def run_resolved_with_inputs(self, device: Optional[str], inputs: dict) -> list:
        return self.run_resolved(inputs, device)

    def run_chain(self, inputs: dict, chain: Optional[Sequence[str]] = None) -> tuple:
        """(device, outputs) from the first device of the chain that runs."""
        return self._r.run_chain(_named(inputs), None if chain is None else list(chain))

    def run_try(self, devices: Sequence[str], inputs: dict) -> tuple:
        return self._r.run_try(list(devices), _named(inputs))

    def failures(self) -> list: return self._r.failures()
    def warm_all(self) -> list: return self._r.warm_all()
    def benchmark(self, inputs: dict, runs: int = 20) -> list: return self._r.benchmark(_named(inputs), runs)
    @property
    def benchmark_winner(self) -> Optional[str]: return self._r.benchmark_winner
    def invalidate_cache(self) -> None: self._r.invalidate_cache()
    def cached_devices(self) -> list: return self._r.cached_devices()


class FlexibleSession:
    """Like Session, with the device chosen per compile by a policy and an optional hint."""

    def __init__(self, policy: Optional[DevicePolicy] = None):
        self.policy = _policy(policy)

    @classmethod
    def from_env(cls) -> "FlexibleSession": return cls(DevicePolicy.from_env())

    def resolve(self, g: Graph, device: Optional[str] = None) -> str: return resolve_device(g, device, self.policy)

    def compile_resolved(self, g: Graph, device: Optional[str] = None, **options) -> CompiledGraph:
        return Session(self.resolve(g, device)).compile(g, **options)

    def compile_on(self, g: Graph, device: str, **options) -> CompiledGraph:
        reason = self.policy.blocked_reason(device)
        if reason:
            raise Error(f"compile_on: device '{parse_device(device)}' is {reason}")
        return Session(device).compile(g, **options)


class DeviceRouter:
    """Serving wrapper: every viable device is compiled at construction; runs go to the pick."""

    def __init__(self, g: Graph, policy: Optional[DevicePolicy] = None):
        self._r = _C._DeviceRouter(_native_graph(g), _policy(policy))

    @classmethod
    def from_env(cls, g: Graph) -> "DeviceRouter": return cls(g, DevicePolicy.from_env())

    def set_param(self, name: str, value: Any) -> None: self._r.set_param(name, *_to_device_array(value))

    def set_param_typed(self, name: str, data: bytes, dtype: DTypeLike) -> None:
        self._r.set_param_typed(name, bytes(data), _dtype_name(dtype))

    def set_rebench_on_throttle(self, on: bool, check_every_s: float = 1.0) -> None:
        self._r.set_rebench_on_throttle(on, check_every_s)

    def with_rebench_on_throttle(self, on: bool, check_every_s: float = 1.0) -> "DeviceRouter":
        self.set_rebench_on_throttle(on, check_every_s)
        return self

    def set_snapshot_source(self, fn) -> None:
        """fn() returns (current MHz, maximum MHz); below 85% of the maximum counts as throttled."""
        self._r.set_snapshot_source(fn)

    def run(self, inputs: dict, device: Optional[str] = None) -> tuple: return self._r.run(_named(inputs), device)
    def run_chain(self, inputs: dict) -> tuple: return self._r.run_chain(_named(inputs))
    def run_on(self, device: str, inputs: dict) -> list: return self._r.run_on(device, _named(inputs))
    @property
    def current(self) -> Optional[str]: return self._r.current
    @property
    def rebenchmarks(self) -> int: return self._r.rebenchmarks
    @property
    def warmed(self) -> list: return self._r.warmed
