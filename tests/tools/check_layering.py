#!/usr/bin/env python3
"""Checks every #include edge between RLX's layers against the allowed table.

Dependencies run one way: ir <- reference <- compile <- runtime <- backends,
with autodiff, codegen, flow, models, distributed and train (which uses
distributed for data parallelism) above, the umbrella header
rlx/extend.hpp above those, and Python and the CLI at the edge. A file's layer
is its folder (src/<layer>/, include/rlx/<layer>/, src/backends/* is
"backends"); an include's layer is the folder it names. rlx/error.hpp,
rlx/env.hpp and rlx/run_control.hpp are the base every layer may use.

  check_layering.py ROOT          exits 1 listing each forbidden edge
  check_layering.py --self-test   checks that a forbidden edge is caught
"""
import pathlib
import re
import sys
import tempfile

# Each layer and the layers it may include directly (the closure is taken below).
BELOW = {
    "base": set(),
    "ir": {"base"},
    "ops": {"ir"},  # the op table's entries; lower layers read them through rlx/ir/op_def.hpp
    "reference": {"ir"},
    "compile": {"reference"},
    "runtime": {"compile"},
    "backends": {"runtime", "codegen"},  # the GPU backends generate kernels with the C target's emitter
    "flow": {"ir"},
    "gguf": {"ir"},  # the GGUF container; the block types and their codecs are IR dtypes (rlx/ir/quants.hpp)
    "llm": {"gguf", "flow", "runtime"},  # GGUF language models: tokenizer, Llama, generation
    "models": {"flow", "gguf"},
    "onnx": {"reference"},  # ONNX import; the reference interpreter folds what is known at import
    "autodiff": {"compile"},
    "codegen": {"compile"},
    "distributed": {"runtime"},  # collectives (local, MPI, NCCL); train's data parallelism reduces through it
    "train": {"autodiff", "runtime", "distributed"},
    "extend": {"backends", "codegen", "flow", "models", "train", "distributed", "llm", "onnx"},
}
BASE_HEADERS = {"rlx/error.hpp", "rlx/env.hpp", "rlx/run_control.hpp"}
# Source folders at the edge include anything; tests are outside the layering.
EDGE = ("python/", "tools/", "tests/", "bench/", "examples/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def closure(layer):
    seen, todo = set(), [layer]
    while todo:
        for d in BELOW[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen | {layer, "base"}


def layer_of_file(rel):
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return "backends" if parts[1] == "backends" else parts[1]
    if parts[:2] == ["include", "rlx"]:
        if len(parts) == 3:
            return "extend" if parts[2] == "extend.hpp" else "base"
        return parts[2]
    return None


def layer_of_include(path):
    if path in BASE_HEADERS:
        return "base"
    if path == "rlx/extend.hpp":
        return "extend"
    parts = path.split("/")
    if parts[0] == "rlx" and len(parts) > 2:
        return parts[1]
    if len(parts) > 1 and parts[0] in BELOW:  # src-relative, e.g. "backends/cpu/kernels.hpp"
        return parts[0]
    return None  # a generated or local header in the same folder


def violations(root):
    root = pathlib.Path(root)
    out = []
    for f in sorted(list(root.glob("src/**/*")) + list(root.glob("include/**/*"))):
        if not f.is_file() or f.suffix not in (".cpp", ".hpp", ".inc", ".h"):
            continue
        rel = f.relative_to(root).as_posix()
        layer = layer_of_file(rel)
        if layer is None or rel.startswith(EDGE):
            continue
        if layer not in BELOW:
            out.append(f"{rel}: folder '{layer}' is not in the layer table (tests/tools/check_layering.py)")
            continue
        allowed = closure(layer)
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            target = layer_of_include(inc)
            if target is not None and target not in allowed:
                out.append(f"{rel}: layer '{layer}' includes \"{inc}\" from layer '{target}' "
                           f"(it may include: {', '.join(sorted(allowed))})")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "src/ir").mkdir(parents=True)
        (root / "src/runtime").mkdir(parents=True)
        (root / "src/ir/ok.cpp").write_text('#include "rlx/ir/graph.hpp"\n#include "rlx/error.hpp"\n')
        (root / "src/runtime/ok.cpp").write_text('#include "rlx/compile/lir.hpp"\n#include "rlx/ir/graph.hpp"\n')
        assert violations(root) == [], violations(root)
        (root / "src/ir/bad.cpp").write_text('#include "rlx/runtime/session.hpp"\n')
        found = violations(root)
        assert len(found) == 1 and "src/ir/bad.cpp" in found[0] and "'runtime'" in found[0], found
        (root / "src/ir/bad.cpp").write_text('#include "backends/cpu/kernels.hpp"\n')
        found = violations(root)
        assert len(found) == 1 and "'backends'" in found[0], found
    print("check_layering self-test: a forbidden include is caught")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    bad = violations(sys.argv[1] if len(sys.argv) > 1 else ".")
    for line in bad:
        print(line)
    print(f"check_layering: {len(bad)} forbidden include edge(s)")
    sys.exit(1 if bad else 0)
