"""Trains an MLP classifier (64 -> 128 -> 10) on scikit-learn's digits with pyrlx.train.

    PYTHONPATH=build/python .venv/bin/python examples/train_mlp/train_mlp.py [--epochs 30]

The digits (1797 8x8 images, 10 classes) ship inside the scikit-learn wheel
(sklearn/datasets/data/digits.csv.gz); load_digits() reads that file, so no
network is needed. One training step (forward, backward, Adam update) is one
compiled graph; the test split is scored by a second graph, the forward pass
alone, that takes the trainer's current weights.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import pyrlx as rlx
from pyrlx import train


def mlp(g: rlx.Graph, x: rlx.Node, hidden: int, classes: int) -> rlx.Node:
    w1, b1 = g.param("w1", (x.shape[1], hidden)), g.param("b1", (hidden,))
    w2, b2 = g.param("w2", (hidden, classes)), g.param("b2", (classes,))
    return rlx.linear(rlx.linear(x, w1, b1).relu(), w2, b2)


def init_params(rng: np.random.Generator, features: int, hidden: int, classes: int) -> dict:
    """He-uniform weights for the relu layer, Glorot-uniform for the output layer, zero biases."""
    def uniform(shape, limit):
        return rng.uniform(-limit, limit, shape).astype(np.float32)
    return {"w1": uniform((features, hidden), np.sqrt(6 / features)), "b1": np.zeros(hidden, np.float32),
            "w2": uniform((hidden, classes), np.sqrt(6 / (hidden + classes))), "b2": np.zeros(classes, np.float32)}


def load(seed: int, test_fraction: float = 0.2):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixel intensities are 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, tr = order[:n_test], order[n_test:]
    return x[tr], y[tr], x[test], y[test]


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)

    x_train, y_train, x_test, y_test = load(a.seed)
    features, classes = x_train.shape[1], 10

    # The training graph: logits, then the mean cross-entropy as its first output.
    with rlx.graph("digits_train") as g:
        xb = g.input("x", (a.batch, features))
        yb = g.input("y", (a.batch,), "i64")
        g.output(train.cross_entropy(mlp(g, xb, a.hidden, classes), yb), "loss")
    # The scoring graph: the same MLP over the whole test split, predicting a class per row.
    with rlx.graph("digits_eval") as e:
        xt = e.input("x", (len(x_test), features))
        e.output(mlp(e, xt, a.hidden, classes).argmax(1), "pred")
    scorer = rlx.Session("cpu").compile(e)

    rng = np.random.default_rng(a.seed)
    trainer = train.Trainer(g, init_params(rng, features, a.hidden, classes),
                            train.AdamW(lr=a.lr, weight_decay=a.weight_decay))

    def accuracy() -> float:
        for name, value in trainer.params.items():
            scorer.set_param(name, value)
        (pred,) = scorer.run({"x": x_test})
        return float((pred == y_test).mean())

    steps_per_epoch = len(x_train) // a.batch  # the remainder changes with every shuffle, so all rows get used
    start = time.perf_counter()
    bar = tqdm(range(a.epochs), desc="train", unit="epoch", disable=a.quiet, file=sys.stdout)
    acc = 0.0
    for epoch in bar:
        order = rng.permutation(len(x_train))
        total = 0.0
        for s in range(steps_per_epoch):
            idx = order[s * a.batch:(s + 1) * a.batch]
            total += trainer.step({"x": x_train[idx], "y": y_train[idx]})
        acc = accuracy()
        bar.set_postfix(loss=f"{total / steps_per_epoch:.4f}", test_acc=f"{acc:.4f}")
    elapsed = time.perf_counter() - start
    print(f"test accuracy {acc:.4f} on {len(x_test)} held-out digits after {a.epochs} epochs "
          f"({trainer.steps} steps of batch {a.batch}, {elapsed:.2f} s)")
    return acc


if __name__ == "__main__":
    main()
