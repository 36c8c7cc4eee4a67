"""rlx.distributed: the process's place among ranks, and collectives on numpy arrays (docs/distributed.md).

Start the ranks with mpirun (the mpi engine), with a launcher that sets RANK/WORLD_SIZE and MASTER_ADDR/MASTER_PORT
such as torchrun (the tcp engine), or run one process (the local engine, world size 1)::

    import pyrlx as rlx
    rlx.distributed.init()                      # engine from RLX_DISTRIBUTED or the launcher's variables
    print(rlx.distributed.rank(), rlx.distributed.world_size())
    trainer = rlx.train.Trainer(g, params, rlx.train.AdamW(), data_parallel=True)
"""
from __future__ import annotations

import numpy as np

from . import _pyrlx as _C

ENGINES = ("auto", "local", "mpi", "tcp", "nccl")
_info: tuple | None = None


def init(engine: str = "auto", device: int = -1) -> None:
    """Joins the world: MPI under mpirun, else tcp when WORLD_SIZE > 1 (meeting at MASTER_ADDR:MASTER_PORT), else
    world size 1. Later calls return at once; an explicit engine that
    differs from the one running raises rlx.Error. `device`: the nccl engine's GPU (-1: LOCAL_RANK)."""
    global _info
    _info = _C._distributed_init(str(engine), int(device))


def _world() -> tuple:
    if _info is None:
        init()
    return _info


def is_initialized() -> bool:
    return _C._distributed_is_initialized()


def rank() -> int:
    """This process's rank (init() with the defaults first, if needed)."""
    return _world()[0]


def world_size() -> int:
    return _world()[1]


def engine() -> str:
    """"local", "mpi", "tcp" or "nccl"."""
    return _world()[2]


def unavailable_reason(engine: str) -> str:
    """Why `engine` cannot run in this process ("" when it can)."""
    return _C._distributed_unavailable(str(engine))


def all_reduce(array, op: str = "sum") -> np.ndarray:
    """The op ("sum", "max", "min") over every rank's `array` (float32 or float64), summed in rank order.
    Returns a new array; the input is not modified."""
    _world()
    out = np.array(array, copy=True, order="C")
    if out.dtype not in (np.float32, np.float64):
        out = out.astype(np.float32)
    _C._distributed_all_reduce(out, str(op))
    return out


def barrier() -> None:
    _world()
    _C._distributed_barrier()
