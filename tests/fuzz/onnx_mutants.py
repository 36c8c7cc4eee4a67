#!/usr/bin/env python3
"""Structure-aware mutants of ONNX's node-test models for the importer's fuzz harness, where clang's libFuzzer
is not at hand: attributes, dims, element types, opsets, op types, inputs and outputs changed at random, plus
byte-level flips, cuts and insertions. Replay them with the harness; a crash names its file.

  onnx_mutants.py NODE_DIR OUT SEED COUNT    (NODE_DIR: build/onnx-node-tests, written by tests/onnx/gen_node_tests.py)
  build/tests/fuzz/fuzz_onnx_replay OUT
"""
import os, random, sys, glob
import onnx
from onnx import helper
random.seed(int(sys.argv[3]))
node_dir, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for f in glob.glob(out + "/*"): os.remove(f)
models = sorted(glob.glob(os.path.join(node_dir, "*", "model.onnx")))
def mutate_model(m):
    g = m.graph
    for _ in range(random.randint(1, 4)):
        kind = random.randrange(8)
        if kind == 0 and g.node:
            n = random.choice(g.node)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.INT: a.i = random.choice([0, 1, -1, 2, 3, -5, 7, 1 << 40, -(1 << 62)])
                elif a.type == onnx.AttributeProto.INTS and a.ints:
                    a.ints[random.randrange(len(a.ints))] = random.choice([0, -1, 5, 1 << 33, -9])
                elif a.type == onnx.AttributeProto.FLOAT: a.f = random.choice([0.0, -1.0, 1e30, float('nan')])
                elif a.type == onnx.AttributeProto.STRING: a.s = random.choice([b"", b"foo", b"SAME_UPPER", b"reflect", b"nearest"])
        elif kind == 1 and g.input:
            vi = random.choice(g.input)
            dims = vi.type.tensor_type.shape.dim
            if dims:
                d = random.choice(dims)
                d.dim_value = random.choice([0, 1, 2, 1 << 20, 7])
        elif kind == 2 and g.node:
            n = random.choice(g.node)
            if n.input and random.random() < 0.5: del n.input[-1]
            else: n.input.append(random.choice([""] + [i.name for i in g.input]))
        elif kind == 3 and g.node:
            n = random.choice(g.node)
            n.op_type = random.choice(["Add", "Reshape", "Slice", "Conv", "Resize", "Attention", "Einsum", "TopK", "Pad", "Gather", "GatherND", "ScatterND", "Expand", "Tile", "CumSum", "ConvTranspose", "MaxPool", "LRN", "OneHot", "Range", "ConstantOfShape", "Split", "Concat", "Transpose"])
        elif kind == 4 and g.input:
            random.choice(g.input).type.tensor_type.elem_type = random.choice([1, 6, 7, 9, 10, 11, 2, 3])
        elif kind == 5:
            m.opset_import[0].version = random.choice([1, 7, 10, 11, 13, 18, 21, 28, 29])
        elif kind == 6 and g.node:
            n = random.choice(g.node)
            if n.output and random.random() < 0.5: n.output.append("extra_out")
            elif n.output: n.output[0] = random.choice([o.name for o in g.output] + ["x"])
        elif kind == 7:
            # constant-input variant: turn an input into an initializer with random ints
            if g.input:
                vi = g.input[random.randrange(len(g.input))]
                shp = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                if all(0 <= s <= 8 for s in shp) and len(shp) <= 2:
                    import numpy as np
                    n_el = int(np.prod(shp)) if shp else 1
                    arr = np.array([random.choice([-3, -1, 0, 1, 2, 5, 1 << 40]) for _ in range(n_el)], np.int64).reshape(shp)
                    g.initializer.append(onnx.numpy_helper.from_array(arr, vi.name))
    return m
for i in range(int(sys.argv[4])):
    src = random.choice(models)
    data = open(src, "rb").read()
    if random.random() < 0.7:
        m = onnx.ModelProto(); m.ParseFromString(data)
        try:
            data = mutate_model(m).SerializeToString()
        except Exception:
            pass
    else:
        b = bytearray(data)
        for _ in range(random.randint(1, 8)):
            op = random.randrange(3)
            if op == 0 and b: b[random.randrange(len(b))] = random.randrange(256)
            elif op == 1 and b: del b[random.randrange(len(b)):][:random.randint(1, 16)]
            else: b.insert(random.randrange(len(b) + 1), random.randrange(256))
        data = bytes(b)
    open(f"{out}/m{i:05d}.onnx", "wb").write(data)
