"""The malformed-input corpus through Python and the command line: every case
gives rlx.Error (or `rlx: error:` and exit code 2), with the words that name
the problem. The IR text cases are shared with tests/ir/test_malformed.cpp."""
import pathlib
import subprocess

import numpy as np
import pytest

import pyrlx as rlx

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "malformed" / "ir_text.txt"


def _cases():
    cases, words, lines = [], None, []
    for line in CORPUS.read_bytes().decode("utf-8", "surrogateescape").split("\n"):
        if line.startswith("=== "):
            if words is not None:
                cases.append((words, "\n".join(lines) + "\n"))
            words, lines = line[4:], []
        elif words is not None:
            lines.append(line)
    cases.append((words, "\n".join(lines) + "\n"))
    return cases


CASES = _cases()
# The cases too large for the corpus file, as in the C++ test.
HUGE = [
    ("bodies nest more than 64 levels deep", "graph g {\n" + "body @b = graph n {\n" * 50000),
    ("a string is longer than 1048576 bytes", 'graph g { %x = input "' + "a" * (2**20 + 1) + '" : f32[2] }'),
    ("concat takes 1 to 64 operands, got 20000",
     'graph g {\n %x = input "x" : f32[1]\n %1 = concat ' + ", ".join(["%x"] * 20000) + " {axis=0} : f32[20000]\n}\n"),
]


def _cli():
    # The build tree holds the CLI next to the python/ folder the package is imported from.
    cli = pathlib.Path(rlx.__file__).parent.parent.parent / "rlx"
    if not cli.exists():
        pytest.skip(f"no rlx command line next to this pyrlx ({cli}): pyrlx was installed without the build tree")
    return cli


def test_corpus_is_large():
    assert len(CASES) + len(HUGE) >= 100


@pytest.mark.parametrize("words,text", CASES + HUGE, ids=[w[:60] for w, _ in CASES + HUGE])
def test_parse_gives_clear_error(words, text):
    with pytest.raises(rlx.Error) as e:
        rlx.parse(text)
    assert words in str(e.value)


def test_cli_gives_clear_errors(tmp_path):
    cli = _cli()
    bad = []
    for i, (words, text) in enumerate(CASES + HUGE):
        path = tmp_path / f"case{i}.rlx"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        r = subprocess.run([str(cli), "compile", str(path)], capture_output=True, text=True, errors="replace")
        if r.returncode != 2 or "rlx: error:" not in r.stderr or words not in r.stderr:
            bad.append((words, r.returncode, r.stderr[-300:]))
    assert not bad, bad[:5]


def test_cli_refuses_bad_arguments(tmp_path):
    cli = _cli()
    good = tmp_path / "g.rlx"
    good.write_text('graph g {\n  %x = input "x" : f32[B, 2]\n  %y = relu %x : f32[B, 2]\n  output %y\n}\n')
    for args, words in [
        (["compile", str(tmp_path / "missing.rlx")], "missing.rlx"),
        (["compile", str(good), "--bind", "B"], "--bind expects NAME=EXTENT"),
        (["compile", str(good), "--bind", "B=x"], "--bind expects NAME=EXTENT"),
        (["compile", str(good), "--bind", "Q=3"], "cannot bind the symbol 'Q'"),
        (["compile", str(good), "--bind", "B=-2"], "bound to -2"),
        (["compile", str(good), "--bind", "B=99999999999999999999"], "--bind expects NAME=EXTENT"),
        (["compile", str(good), "--bind", "B=2", "--dump", "mirr"], "unknown level or pass 'mirr'"),
        (["compile", str(good), "--bind", "B=2", "--device", "tpu"], "tpu"),
        (["compile", str(good)], "unbound symbolic dims B"),
    ]:
        r = subprocess.run([str(cli)] + args, capture_output=True, text=True)
        assert r.returncode == 2 and words in r.stderr, (args, r.returncode, r.stderr)


# ---- graphs built in Python ----

def _expect(words, fn):
    with pytest.raises(rlx.Error) as e:
        fn()
    assert words in str(e.value), str(e.value)


def test_hostile_dsl_graphs_give_clear_errors():
    g = rlx.Graph()
    _expect("does not fit in int64", lambda: g.input("a", (2**70,)))
    _expect("more than 2^48 elements", lambda: g.input("b", (2**32, 2**32)))
    _expect("negative extent", lambda: g.input("c", (-3,)))
    _expect("a shape must be a tuple or list", lambda: g.input("d", "banana"))
    _expect("must be an int", lambda: g.input("e", (2.5,)))
    x = g.input("x", (1,))
    _expect("more than 2^48 elements", lambda: x.expand(2**32, 2**32))
    _expect("more than 2^48 elements", lambda: g._op("iota", [], {"axis": 0}, dtype="f32", shape=(2**40, 2**20)))
    img = g.input("img", (1, 1, 4, 4))
    _expect("must be >= 1", lambda: rlx.max_pool2d(img, 2, stride=0))
    _expect("declared f32[5] but inference gives f32[1]", lambda: g._op("neg", [x], {}, dtype="f32", shape=(5,)))


def test_custom_op_results_are_checked():
    other = rlx.Graph()
    foreign = other.input("q", (4,))

    rlx.register_op("test_py_foreign_lower", infer_shape=lambda shapes, dtypes, attrs: shapes[0],
                    lower=lambda g, x: foreign)
    g = rlx.Graph()
    g.output(g._op("custom", [g.input("x", (4,))], {"op": "test_py_foreign_lower"}))
    _expect("another graph", lambda: rlx.Session("cpu").compile(g))

    rlx.register_op("test_py_banana", infer_shape=lambda shapes, dtypes, attrs: "banana", lower=lambda g, x: x)
    g2 = rlx.Graph()
    _expect("a shape must be a tuple or list", lambda: g2._op("custom", [g2.input("x", (4,))], {"op": "test_py_banana"}))

    rlx.register_op("test_py_negative", infer_shape=lambda shapes, dtypes, attrs: [-3], lower=lambda g, x: x)
    g3 = rlx.Graph()
    _expect("negative extent -3", lambda: g3._op("custom", [g3.input("x", (4,))], {"op": "test_py_negative"}))


def test_compile_options_are_checked():
    g = rlx.Graph()
    x = g.input("x", ("B", 4))
    g.output(x.relu())
    s = rlx.Session("cpu")
    _expect("cannot bind the symbol 'Q'", lambda: s.compile(g, bind={"B": 2, "Q": 3}))
    _expect("unknown level or pass 'bogus'", lambda: s.compile(g, bind={"B": 2}, dump="bogus"))
    _expect("fits in int64", lambda: s.compile(g, bind={"B": 2**70}))


def test_while_loop_trip_count_is_checked():
    g = rlx.Graph()
    x = g.input("x", ())
    with pytest.raises(rlx.Error, match="max_trip_count must be an int >= 0"):
        rlx.while_loop(lambda c: c < 10.0, lambda c: c + 1.0, x, max_trip_count=-3)


def test_huge_but_valid_graph_is_refused_before_allocating():
    g = rlx.Graph()
    w = g.param("w", (2**38,))  # 1 TiB of f32: valid IR, more memory than any machine here
    g.output(w * 2.0)
    _expect("more than this machine's", lambda: rlx.Session("cpu").compile(g))


# ---- wrong run-time inputs ----

def test_wrong_run_time_inputs_give_clear_errors():
    g = rlx.Graph()
    x = g.input("x", (2, 3))
    w = g.param("w", (3, 4))
    g.output(x @ w)
    c = rlx.Session("cpu").compile(g)
    good_x = np.ones((2, 3), np.float32)
    _expect("'w'", lambda: c.run({"x": good_x}))  # the param is unset
    c.set_param("w", np.ones((3, 4), np.float32))
    _expect("'v'", lambda: c.set_param("v", np.ones((3, 4), np.float32)))
    _expect("'w'", lambda: c.set_param("w", np.ones((4, 3), np.float32)))
    _expect("'x'", lambda: c.run({}))
    _expect("'x'", lambda: c.run({"x": np.ones((3, 2), np.float32)}))
    _expect("'x'", lambda: c.run({"x": np.ones((2, 3), np.float16)}))
    _expect("'typo'", lambda: c.run({"x": good_x, "typo": good_x}))
    _expect("lirr", lambda: c.ir("lirr"))
    np.testing.assert_allclose(c.run({"x": good_x})[0], np.full((2, 4), 3.0, np.float32))
