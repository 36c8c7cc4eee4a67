"""rlx.distributed and Trainer(..., data_parallel=True). Under pytest the world is one process (the local
engine); the same script as two ranks, under `mpirun -np 2` (the mpi engine, test_under_mpirun) and started
torchrun-style with RANK/WORLD_SIZE (the tcp engine, test_under_a_rank_world_size_launcher), checks the
two-rank case."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pyrlx as rlx
from pyrlx import train


def digits_like(batch, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 17, size=(batch, 64)) / 16.0).astype(np.float32)
    y = rng.integers(0, 10, size=(batch,)).astype(np.int64)
    return x, y


def mlp(batch):
    with rlx.graph("digits_mlp") as g:
        x, y = g.input("x", (batch, 64)), g.input("y", (batch,), "i64")
        w1, b1 = g.param("w1", (64, 128)), g.param("b1", (128,))
        w2, b2 = g.param("w2", (128, 10)), g.param("b2", (10,))
        h = rlx.relu(rlx.linear(x, w1, b1))
        g.output(train.cross_entropy(rlx.linear(h, w2, b2), y), "loss")
    return g


def params(seed=1):
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, 128)) * 0.125).astype(np.float32), "b1": np.zeros(128, np.float32),
            "w2": (rng.standard_normal((128, 10)) * 0.088).astype(np.float32), "b2": np.zeros(10, np.float32)}


def run_dp_against_micro_batches(steps=5, global_batch=32):
    """Trains DP on this rank's share and, in the same process, one trainer on the whole global batch as
    world_size micro-batches; returns the largest difference of the final weights (0.0 when bit-identical)."""
    world, rank = rlx.distributed.world_size(), rlx.distributed.rank()
    local = global_batch // world
    dp = train.Trainer(mlp(local), params(), train.AdamW(lr=3e-3), num_threads=1, data_parallel=True)
    single = train.Trainer(mlp(local), params(), train.AdamW(lr=3e-3), num_threads=1, micro_batches=world)
    for s in range(steps):
        x, y = digits_like(global_batch, seed=s)
        l_dp = dp.step({"x": x[rank * local:(rank + 1) * local], "y": y[rank * local:(rank + 1) * local]})
        l_single = single.step({"x": x, "y": y})
        assert l_dp == l_single
    return max(float(np.max(np.abs(dp.param(n).view(np.int32) - single.param(n).view(np.int32)))) for n in params())


def test_world_of_one():
    rlx.distributed.init()
    assert rlx.distributed.is_initialized()
    if "OMPI_COMM_WORLD_SIZE" not in os.environ and "WORLD_SIZE" not in os.environ:
        assert (rlx.distributed.rank(), rlx.distributed.world_size(), rlx.distributed.engine()) == (0, 1, "local")
    a = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(rlx.distributed.all_reduce(a), a * rlx.distributed.world_size())
    rlx.distributed.barrier()


def test_engine_errors():
    with pytest.raises(rlx.Error, match="not an engine"):
        rlx.distributed.init(engine="gloo")
    assert "tcp" in rlx.distributed.ENGINES and rlx.distributed.unavailable_reason("tcp") == ""
    with pytest.raises(rlx.Error, match="op 'prod'"):
        rlx.distributed.all_reduce(np.ones(2, np.float32), op="prod")


def test_trainer_data_parallel_matches_micro_batches():
    assert run_dp_against_micro_batches() == 0.0
    t = train.Trainer(mlp(8), params(), train.SGD(lr=0.1), data_parallel=True, micro_batches=2)
    assert t.data_parallel and t.micro_batches == 2
    with pytest.raises(rlx.Error, match="micro_batches=2"):
        t.step({"x": np.zeros((8, 64), np.float32), "y": np.zeros(8, np.int64)})


def test_under_mpirun():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("already a rank")
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none", *extra, "--mca", "btl", "self,vader",
           "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "mpi_yield_when_idle", "1", sys.executable,
           __file__]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("dp-ok world 2") == 2, out.stdout + out.stderr


def test_under_a_rank_world_size_launcher():
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "WORLD_SIZE" in os.environ:
        pytest.skip("already a rank")
    import socket
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RLX_DISTRIBUTED_TIMEOUT="120")
        ranks.append(subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in ranks]
    for rank, (p, out) in enumerate(zip(ranks, outs)):
        assert p.returncode == 0, f"rank {rank}: {out}"
        assert f"dp-ok world 2 rank {rank} engine tcp" in out, out


if __name__ == "__main__":  # one rank of test_under_mpirun or test_under_a_rank_world_size_launcher
    rlx.distributed.init()
    diff = run_dp_against_micro_batches()
    assert diff == 0.0, diff
    print(f"dp-ok world {rlx.distributed.world_size()} rank {rlx.distributed.rank()} engine "
          f"{rlx.distributed.engine()}", flush=True)
