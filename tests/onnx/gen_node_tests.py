#!/usr/bin/env python3
"""Writes ONNX's backend node tests as files: OUT/<test name>/model.onnx and test_data_set_0/{input,output}_N.pb.

The onnx wheel ships the cases as Python (onnx.backend.test.case.node) rather than as the data folder of
the source tree; this writes the same layout that ONNX's own backend runner reads.

  gen_node_tests.py OUT
"""
import os
import re
import sys
import warnings

import onnx
from onnx import numpy_helper
import onnx.backend.test.case.node as node_cases


def main(out: str) -> int:
    warnings.filterwarnings("ignore")
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    count = 0
    cases = node_cases.collect_testcases(None)
    by_name = {c.name: c for c in cases}
    manifest = []
    for case in cases:
        # The op a test is about: its one node's, or for an _expanded test (the op's function body) the
        # one node of the test it expands.
        base = by_name.get(re.sub(r"_expanded.*$", "", case.name), case)
        node = base.model.graph.node[0]
        inits = {t.name for t in case.model.graph.initializer}
        inputs = [i.name for i in case.model.graph.input if i.name not in inits]
        manifest.append("\t".join([case.name, node.op_type, node.domain or "ai.onnx"] + inputs) + "\n")
        d = os.path.join(tmp, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(ds, exist_ok=True)
            for kind, values, infos in (("input", inputs, case.model.graph.input),
                                        ("output", outputs, case.model.graph.output)):
                for j, v in enumerate(values):
                    if not infos[j].type.HasField("tensor_type"):
                        continue  # sequences, maps, optionals: RLX reads tensors only
                    t = v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(v, infos[j].name)
                    with open(os.path.join(ds, f"{kind}_{j}.pb"), "wb") as f:
                        f.write(t.SerializeToString())
        count += 1
    with open(os.path.join(tmp, "manifest.tsv"), "w") as f:
        f.writelines(manifest)
    with open(os.path.join(tmp, "VERSION"), "w") as f:
        f.write(f"onnx {onnx.__version__}, {count} node tests\n")
    if os.path.exists(out):
        import shutil
        shutil.rmtree(out)
    os.rename(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
