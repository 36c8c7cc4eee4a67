"""pyrlx quickstart: build a graph with the DSL, compile it, run it with numpy.

    pip install ./python && python examples/python/dsl_quickstart.py
"""
import numpy as np

import pyrlx as rlx

with rlx.graph("quickstart") as g:
    x = g.input("x", (64, 1024))
    w1, b1 = g.param("w1", (1024, 1024)), g.param("b1", (1024,))
    w2, b2 = g.param("w2", (1024, 10)), g.param("b2", (10,))
    h = rlx.linear(x, w1, b1).relu()
    g.output(rlx.softmax(rlx.linear(h, w2, b2)), "probs")

compiled = rlx.Session("cpu").compile(g)
print(compiled.summary())

rng = np.random.default_rng(0)
for name, shape in [("w1", (1024, 1024)), ("b1", (1024,)), ("w2", (1024, 10)), ("b2", (10,))]:
    compiled.set_param(name, (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))
(probs,) = compiled.run({"x": rng.standard_normal((64, 1024)).astype(np.float32)})
print("probs", probs.shape, "rows sum to", probs.sum(axis=1)[:3])
