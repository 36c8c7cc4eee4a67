"""pyrlx.train: losses, optimisers and a Trainer, on top of rlx::train.

    import pyrlx as rlx
    from pyrlx import train

    with rlx.graph("mlp") as g:
        x, y = g.input("x", (64, 784)), g.input("y", (64,), "i64")
        w = g.param("w", (784, 10))
        g.output(train.cross_entropy(x @ w, y), "loss")     # first output: the scalar loss
    trainer = train.Trainer(g, {"w": w0}, train.Adam(lr=1e-3))
    for xb, yb in batches:
        loss = trainer.step({"x": xb, "y": yb})             # forward + backward + update, one compiled graph
    weights = trainer.params                                # {name: numpy array}

A step is one graph (forward, the gradients from rlx.value_and_grad, and the
update), compiled once; params and optimiser state stay in the Trainer between
steps. docs/training.md describes the step graph and the update rules.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _C, _NP_TO_RLX, _STORAGE, Error, Graph, Node, _to_device_array

__all__ = ["cross_entropy", "mse", "SGD", "Adam", "AdamW", "Optimizer", "LossScaling", "Trainer", "train_step"]


def _same_graph(a: Node, b: Node) -> Graph:
    if not isinstance(a, Node) or not isinstance(b, Node):
        raise Error(f"expected two Nodes, got {type(a).__name__} and {type(b).__name__}")
    if a.graph is not b.graph:
        raise Error("nodes belong to different graphs")
    return a.graph


def cross_entropy(logits: Node, labels: Node) -> Node:
    """Mean of -log_softmax(logits)[label] over every position: logits [..., C] float,
    labels [...] integer class ids. Returns a scalar node."""
    g = _same_graph(logits, labels)
    return Node(g, _C._cross_entropy(g._g, logits.id, labels.id))


def mse(pred: Node, target: Node) -> Node:
    """Mean of (pred - target)**2; both of the same dtype and shape. Returns a scalar node."""
    g = _same_graph(pred, target)
    return Node(g, _C._mse(g._g, pred.id, target.id))


@dataclasses.dataclass(frozen=True)
class SGD:
    """torch.optim.SGD: buf = momentum * buf + grad (+ weight_decay * p); p -= lr * buf."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    _kind = "sgd"


@dataclasses.dataclass(frozen=True)
class Adam:
    """torch.optim.Adam, bias-corrected; weight_decay is L2 added to the gradient."""

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    _kind = "adam"


@dataclasses.dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW: decoupled weight decay, p *= 1 - lr * weight_decay, then the Adam step."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    _kind = "adamw"


Optimizer = Union[SGD, Adam, AdamW]


def _native_optimizer(opt: Any) -> tuple:
    if not isinstance(opt, (SGD, Adam, AdamW)):
        raise Error(f"expected an optimizer (train.SGD, train.Adam or train.AdamW), got {type(opt).__name__}")
    return opt._kind, {f.name: float(getattr(opt, f.name)) for f in dataclasses.fields(opt)}


def _named_arrays(values: dict) -> list:
    items = []
    for name, value in values.items():
        # C-contiguous arrays of a plain dtype are passed without a copy, as in CompiledGraph.run.
        dtype = _NP_TO_RLX.get(value.dtype) if type(value) is np.ndarray and value.flags.c_contiguous else None
        if dtype is None or dtype == "bf16" or dtype in _STORAGE:
            value, dtype = _to_device_array(value)
        items.append((name, value, dtype))
    return items


def train_step(graph: Graph, params: Sequence[str], optimizer: Optimizer) -> tuple:
    """The step graph the Trainer compiles, for inspection: returns (graph, state) where state
    lists (name, dtype, shape) of the optimiser state inputs. Inputs: the model's, then "opt_lr",
    then the state; outputs: the loss, "new_<param>" per param, "new_<state>" per state input."""
    kind, hyper = _native_optimizer(optimizer)
    native, state = _C._train_step(graph._g, list(params), kind, hyper)
    return Graph(_native=native), [tuple(s) for s in state]


@dataclasses.dataclass(frozen=True)
class LossScaling:
    """Dynamic loss scaling for f16 mixed precision (docs/training.md, "Loss scaling"): each step scales the
    loss by the current scale and the gradients by its inverse; a step with an inf or NaN gradient is skipped
    and the scale multiplied by `backoff_factor`; after `growth_interval` good steps in a row (0: never) it is
    multiplied by `growth_factor`. PyTorch's GradScaler rule and defaults."""
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def _native(self) -> dict:
        for name in ("init_scale", "growth_factor", "backoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise Error(f"LossScaling.{name} must be a number, got {value!r}")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, (int, np.integer)) \
                or not 0 <= self.growth_interval < 2**31:
            raise Error(f"LossScaling.growth_interval must be an int in [0, 2^31), got {self.growth_interval!r}")
        return {"init_scale": float(self.init_scale), "growth_factor": float(self.growth_factor),
                "backoff_factor": float(self.backoff_factor), "growth_interval": float(self.growth_interval)}


class Trainer:
    """Compiles one training step for `graph` (first output: a float scalar loss) and runs it per batch.

    `params` gives the initial value of every param of the graph; `trainable` names those to
    update (default: every float param; the others stay fixed). The Trainer keeps its own copy
    of the params and the optimiser state: read them back through `params`, `param(name)` and
    `state(name)`.

    `micro_batches=k`: each input's leading dim is k times the graph's; the gradients of the k
    micro-batches are summed in order and their mean applied once. `data_parallel=True`: each rank
    passes its own share of the global batch, and the gradients are all-reduced over
    `rlx.distributed` (initialised on first use) in rank order before the update (docs/distributed.md).

    `precision="bf16"` or `"f16"` trains with auto-mixed precision (docs/precision.md); with f16 the loss is
    scaled dynamically by default (`loss_scaling=LossScaling(...)` sets it, for any precision); `loss_scale`
    is the scale the next step uses and `skipped_steps` the steps skipped for an inf or NaN gradient.
    """

    def __init__(self, graph: Graph, params: dict, optimizer: Optimizer, device: str = "cpu",
                 trainable: Optional[Sequence[str]] = None, num_threads: int = 0, micro_batches: int = 1,
                 data_parallel: bool = False, precision: str = "f32", tf32: bool = False,
                 loss_scaling: Optional[LossScaling] = None):
        if not isinstance(graph, Graph):
            raise Error(f"Trainer expects an rlx.Graph, got {type(graph).__name__}")
        if loss_scaling is not None and not isinstance(loss_scaling, LossScaling):
            raise Error(f"loss_scaling must be an rlx.train.LossScaling or None, got {type(loss_scaling).__name__}")
        if not isinstance(precision, str):
            raise Error(f"precision must be a string (f32, bf16, f16), got {precision!r}")
        kind, hyper = _native_optimizer(optimizer)
        values = [(name,) + _to_device_array(value) for name, value in params.items()]
        self.optimizer = optimizer
        self._t = _C._Trainer(graph._g, values, kind, hyper, list(trainable or []), device, num_threads,
                              int(micro_batches), bool(data_parallel), precision, bool(tf32),
                              None if loss_scaling is None else loss_scaling._native())

    def step(self, inputs: dict) -> float:
        """One step on a batch {input name: array}: returns the loss before the update.
        The GIL is released while the step runs."""
        return self._t.step(_named_arrays(inputs))

    __call__ = step

    @property
    def params(self) -> dict:
        """Copies of the current param values, {name: numpy array}."""
        return self._t.params()

    def param(self, name: str) -> np.ndarray:
        return self._t.param(name)

    def state(self, name: str) -> np.ndarray:
        """Optimiser state by name, e.g. "opt_m_w" (see state_names)."""
        return self._t.state(name)

    @property
    def state_names(self) -> list:
        return self._t.state_names()

    @property
    def trained(self) -> list:
        """The params this Trainer updates, in the step graph's order."""
        return self._t.trained()

    @property
    def steps(self) -> int:
        return self._t.steps

    @property
    def loss_scale(self) -> float:
        """The loss scale the next step uses (1.0 without loss scaling)."""
        return self._t.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for an inf or NaN gradient under loss scaling (not counted in `steps`)."""
        return self._t.skipped_steps

    @property
    def micro_batches(self) -> int:
        return self._t.micro_batches

    @property
    def data_parallel(self) -> bool:
        return self._t.data_parallel

    @property
    def lr(self) -> float:
        return self._t.lr

    @lr.setter
    def lr(self, value: float) -> None:
        """Takes effect at the next step, without recompiling (the lr is an input of the step graph)."""
        self._t.lr = float(value)

    def step_graph(self) -> Graph:
        return Graph(_native=self._t.step_graph())

    def summary(self) -> str:
        return self._t.summary()
