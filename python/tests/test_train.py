"""pyrlx.train: losses and optimiser steps against numpy, convergence, errors."""
import numpy as np
import pytest

import pyrlx as rlx
from pyrlx import train


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_cross_entropy_matches_numpy(rng):
    for label_dtype in ("i64", "i32"):
        g = rlx.Graph("ce")
        logits = g.input("logits", (6, 5), "f64")
        labels = g.input("labels", (6,), label_dtype)
        loss = train.cross_entropy(logits, labels)
        assert loss.shape == () and loss.dtype == "f64"
        g.output(loss, "loss")
        x = rng.standard_normal((6, 5)) * 3
        y = rng.integers(0, 5, 6).astype(np.int64 if label_dtype == "i64" else np.int32)
        want = -log_softmax(x)[np.arange(6), y].mean()
        (got,) = rlx.reference_run(g, {"logits": x, "labels": y})
        np.testing.assert_allclose(got, want, rtol=1e-12)
        (got,) = rlx.Session("cpu").compile(g).run({"logits": x, "labels": y})
        np.testing.assert_allclose(got, want, rtol=1e-9)


def test_mse_matches_numpy(rng):
    g = rlx.Graph("mse")
    p, t = g.input("p", (3, 4)), g.input("t", (3, 4))
    g.output(train.mse(p, t), "loss")
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32)
    (got,) = rlx.Session("cpu").compile(g).run({"p": a, "t": b})
    np.testing.assert_allclose(got, ((a - b) ** 2).mean(), rtol=1e-5)


def regression_graph(n=16, d=4, o=2, dtype="f64"):
    g = rlx.Graph("regression")
    x, y = g.input("x", (n, d), dtype), g.input("y", (n, o), dtype)
    w, b = g.param("w", (d, o), dtype), g.param("b", (o,), dtype)
    g.output(train.mse(rlx.linear(x, w, b), y), "loss")
    return g


def numpy_steps(opt, params, x, y, steps):
    """torch.optim's update rules in numpy for the regression above."""
    p = {k: v.copy() for k, v in params.items()}
    state = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in p.items()}
    for t in range(1, steps + 1):
        err = x @ p["w"] + p["b"] - y
        grads = {"w": 2 * x.T @ err / err.size, "b": 2 * err.sum(0) / err.size}
        for k in p:
            g, (s0, s1) = grads[k], state[k]
            if isinstance(opt, train.SGD):
                g = g + opt.weight_decay * p[k]
                s0[:] = opt.momentum * s0 + g
                p[k] = p[k] - opt.lr * (s0 if opt.momentum else g)
                continue
            if isinstance(opt, train.Adam):
                g = g + opt.weight_decay * p[k]
            else:
                p[k] = p[k] * (1 - opt.lr * opt.weight_decay)
            s0[:] = opt.b1 * s0 + (1 - opt.b1) * g
            s1[:] = opt.b2 * s1 + (1 - opt.b2) * g * g
            mhat, vhat = s0 / (1 - opt.b1**t), s1 / (1 - opt.b2**t)
            p[k] = p[k] - opt.lr * mhat / (np.sqrt(vhat) + opt.eps)
    return p, state


@pytest.mark.parametrize("opt", [
    train.SGD(lr=0.1),
    train.SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
    train.Adam(lr=0.01, b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.05),
    train.AdamW(lr=0.02, weight_decay=0.1),
])
def test_optimizer_steps_match_numpy(rng, opt):
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 2))
    params = {"w": rng.standard_normal((4, 2)), "b": rng.standard_normal(2)}
    trainer = train.Trainer(regression_graph(), params, opt)
    losses = [trainer.step({"x": x, "y": y}) for _ in range(3)]
    want, state = numpy_steps(opt, params, x, y, 3)
    for k in ("w", "b"):
        np.testing.assert_allclose(trainer.param(k), want[k], rtol=1e-9, atol=1e-12)
        assert not np.allclose(trainer.param(k), params[k])  # the comparison above is not vacuous
    err = x @ params["w"] + params["b"] - y
    np.testing.assert_allclose(losses[0], (err**2).mean(), rtol=1e-12)
    assert trainer.steps == 3
    if isinstance(opt, (train.Adam, train.AdamW)):
        assert trainer.state_names == ["opt_step", "opt_m_w", "opt_v_w", "opt_m_b", "opt_v_b"]
        assert trainer.state("opt_step") == 3
        np.testing.assert_allclose(trainer.state("opt_v_w"), state["w"][1], rtol=1e-9, atol=1e-15)


def test_linear_regression_converges(rng):
    n, d = 64, 8
    w_true = rng.uniform(-2, 2, (d, 1)).astype(np.float32)
    g = regression_graph(n, d, 1, "f32")
    trainer = train.Trainer(g, {"w": np.zeros((d, 1), np.float32), "b": np.zeros(1, np.float32)},
                            train.Adam(lr=0.05))
    for _ in range(400):
        x = rng.uniform(-1, 1, (n, d)).astype(np.float32)
        loss = trainer.step({"x": x, "y": x @ w_true + 0.5})
    assert loss < 1e-6
    np.testing.assert_allclose(trainer.params["w"], w_true, atol=1e-3)
    np.testing.assert_allclose(trainer.params["b"], [0.5], atol=1e-3)


def test_frozen_params_and_lr(rng):
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 2))
    params = {"w": rng.standard_normal((4, 2)), "b": rng.standard_normal(2)}
    trainer = train.Trainer(regression_graph(), params, train.SGD(lr=0.1), trainable=["w"])
    assert trainer.trained == ["w"]
    trainer.step({"x": x, "y": y})
    np.testing.assert_array_equal(trainer.param("b"), params["b"])
    trainer.lr = 0.0
    assert trainer.lr == 0.0
    w = trainer.param("w")
    trainer.step({"x": x, "y": y})
    np.testing.assert_array_equal(trainer.param("w"), w)
    # params() hands out copies: the next step does not change them under the caller.
    snapshot = trainer.params
    trainer.lr = 0.1
    trainer.step({"x": x, "y": y})
    np.testing.assert_array_equal(snapshot["w"], w)


def test_train_step_graph():
    step, state = train.train_step(regression_graph(), ["w", "b"], train.SGD(lr=0.1, momentum=0.9))
    assert [s[0] for s in state] == ["opt_momentum_w", "opt_momentum_b"]
    assert step.input_names() == ["x", "y", "opt_lr", "opt_momentum_w", "opt_momentum_b"]
    assert step.param_names() == ["w", "b"]
    assert len(step.outputs()) == 5


def test_errors(rng):
    g = regression_graph()
    params = {"w": np.zeros((4, 2)), "b": np.zeros(2)}
    with pytest.raises(rlx.Error, match="nope"):
        train.Trainer(g, params, train.SGD(), trainable=["nope"])
    with pytest.raises(rlx.Error, match="no initial value"):
        train.Trainer(g, {"w": params["w"]}, train.SGD())
    with pytest.raises(rlx.Error, match="no param named"):
        train.Trainer(g, dict(params, extra=np.zeros(1)), train.SGD())
    with pytest.raises(rlx.Error, match="optimizer"):
        train.Trainer(g, params, "sgd")
    with pytest.raises(rlx.Error, match="momentum"):
        train.Trainer(g, params, train.SGD(momentum=1.5))
    vec = rlx.Graph("vector_loss")
    w = vec.param("w", (3,))
    vec.output(w * w, "loss")
    with pytest.raises(rlx.Error, match="scalar"):
        train.Trainer(vec, {"w": np.zeros(3, np.float32)}, train.SGD())
    with pytest.raises(rlx.Error, match="integer"):
        train.cross_entropy(g.input("logits", (4, 3)), g.input("labels", (4,)))
    with pytest.raises(rlx.Error):
        train.mse(g.input("a", (4, 3)), g.input("b", (3, 4)))
    trainer = train.Trainer(g, params, train.Adam())
    with pytest.raises(rlx.Error, match="missing"):
        trainer.step({"x": np.zeros((16, 4))})
    with pytest.raises(rlx.Error, match="no param named"):
        trainer.param("nope")
    assert trainer.steps == 0


# ---- mixed precision and loss scaling through the Python Trainer (docs/training.md, "Loss scaling") ----

def test_loss_scaling_power_of_two_trains_as_without_it_and_grows(rng):
    g = regression_graph(16, 4, 2, "f32")
    params = {"w": rng.standard_normal((4, 2)).astype(np.float32), "b": rng.standard_normal(2).astype(np.float32)}
    plain = train.Trainer(g, params, train.Adam(lr=0.05))
    scaled = train.Trainer(g, params, train.Adam(lr=0.05),
                           loss_scaling=train.LossScaling(init_scale=1024, growth_interval=3))
    assert plain.loss_scale == 1.0 and scaled.loss_scale == 1024.0
    for _ in range(5):
        batch = {"x": rng.standard_normal((16, 4)).astype(np.float32),
                 "y": rng.standard_normal((16, 2)).astype(np.float32)}
        want, got = plain.step(batch), scaled.step(batch)
        assert abs(got - want) <= 1e-6 * (1 + abs(want))
        for k in ("w", "b"):
            np.testing.assert_allclose(scaled.param(k), plain.param(k), rtol=1e-6, atol=1e-6)
    assert not np.allclose(scaled.param("w"), params["w"])
    assert scaled.steps == 5 and scaled.skipped_steps == 0
    assert scaled.loss_scale == 2048.0  # grown once, after the third step


def test_loss_scaling_overflow_skips_the_step_and_halves_the_scale(rng):
    g = regression_graph(16, 4, 2, "f32")
    params = {"w": rng.standard_normal((4, 2)).astype(np.float32), "b": rng.standard_normal(2).astype(np.float32)}
    t = train.Trainer(g, params, train.Adam(lr=0.05), loss_scaling=train.LossScaling(init_scale=2.0**127))
    batch = {"x": rng.uniform(10, 20, (16, 4)).astype(np.float32),
             "y": rng.standard_normal((16, 2)).astype(np.float32)}
    t.step(batch)
    assert (t.skipped_steps, t.steps, t.loss_scale) == (1, 0, 2.0**126)
    np.testing.assert_array_equal(t.param("w"), params["w"])
    assert t.state("opt_step") == 0
    for _ in range(64):
        if t.steps:
            break
        loss = t.step(batch)
    assert t.steps == 1 and np.isfinite(loss) and t.skipped_steps > 1
    assert t.loss_scale == 2.0 ** (127 - t.skipped_steps)
    assert np.isfinite(t.param("w")).all() and not np.array_equal(t.param("w"), params["w"])


def test_mixed_precision_trainer(rng):
    g = regression_graph(64, 8, 1, "f32")
    w_true = rng.uniform(-2, 2, (8, 1)).astype(np.float32)
    zeros = {"w": np.zeros((8, 1), np.float32), "b": np.zeros(1, np.float32)}
    f16 = train.Trainer(g, zeros, train.Adam(lr=0.05), precision="f16")
    bf16 = train.Trainer(g, zeros, train.Adam(lr=0.05), precision="bf16")
    assert f16.loss_scale == 65536.0, "f16 scales the loss by default"
    assert bf16.loss_scale == 1.0, "bf16 has f32's range: nothing to scale"
    for _ in range(300):
        x = rng.uniform(-1, 1, (64, 8)).astype(np.float32)
        batch = {"x": x, "y": x @ w_true + 0.5}
        f16.step(batch)
        bf16.step(batch)
    # Low-precision matmuls: the fit is as good as their rounding allows (f16 ~1e-3, bf16 ~1e-2 relative).
    np.testing.assert_allclose(f16.params["w"], w_true, atol=2e-2)
    np.testing.assert_allclose(bf16.params["w"], w_true, atol=6e-2)
    assert f16.skipped_steps <= 2


def test_loss_scaling_errors(rng):
    g = regression_graph(16, 4, 2, "f32")
    params = {"w": np.zeros((4, 2), np.float32), "b": np.zeros(2, np.float32)}
    with pytest.raises(rlx.Error, match="init_scale"):
        train.Trainer(g, params, train.SGD(lr=0.1), loss_scaling=train.LossScaling(init_scale=0))
    with pytest.raises(rlx.Error, match="backoff_factor"):
        train.Trainer(g, params, train.SGD(lr=0.1), loss_scaling=train.LossScaling(backoff_factor=2))
    with pytest.raises(rlx.Error, match="growth_interval"):
        train.Trainer(g, params, train.SGD(lr=0.1), loss_scaling=train.LossScaling(growth_interval=-1))
    with pytest.raises(rlx.Error, match="init_scale must be a number"):
        train.Trainer(g, params, train.SGD(lr=0.1), loss_scaling=train.LossScaling(init_scale="big"))
    with pytest.raises(rlx.Error, match="loss_scaling must be"):
        train.Trainer(g, params, train.SGD(lr=0.1), loss_scaling=65536)
    with pytest.raises(rlx.Error, match="fused step|micro"):
        train.Trainer(g, params, train.SGD(lr=0.1), micro_batches=2, loss_scaling=train.LossScaling())
    with pytest.raises(rlx.Error, match="f32|bf16|f16"):
        train.Trainer(g, params, train.SGD(lr=0.1), precision="f8")
