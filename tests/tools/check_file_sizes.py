#!/usr/bin/env python3
"""Checks that no source file of RLX is longer than 1,500 lines (issue 13): a file past that is split along its
own sections, as src/backends/cpu/isa/kernels_impl.inc was.

  check_file_sizes.py ROOT          exits 1 listing each file over the limit
  check_file_sizes.py --self-test   checks that a long file is caught
"""
import pathlib
import sys
import tempfile

LIMIT = 1500
FOLDERS = ("src", "include", "python", "tests", "tools", "bench", "scripts", "examples")
SUFFIXES = {".cpp", ".hpp", ".h", ".inc", ".py", ".sh", ".txt", ".cmake"}


def too_long(root):
    root = pathlib.Path(root)
    out = []
    for folder in FOLDERS:
        for f in sorted((root / folder).rglob("*")):
            if f.is_file() and (f.suffix in SUFFIXES or f.name == "CMakeLists.txt"):
                lines = f.read_bytes().count(b"\n")
                if lines > LIMIT:
                    out.append(f"{f.relative_to(root).as_posix()}: {lines} lines (limit {LIMIT})")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp, "src", "ir")
        src.mkdir(parents=True)
        (src / "short.cpp").write_text("int x;\n" * LIMIT)
        assert too_long(tmp) == [], too_long(tmp)
        (src / "long.cpp").write_text("int x;\n" * (LIMIT + 1))
        found = too_long(tmp)
        assert found == [f"src/ir/long.cpp: {LIMIT + 1} lines (limit {LIMIT})"], found
    print("check_file_sizes self-test: a file of 1,501 lines is caught, one of 1,500 is not")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    bad = too_long(sys.argv[1])
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)
