"""examples/train_mlp: the digits classifier reaches the issue's 95% test accuracy."""
import importlib.util
import pathlib

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_mlp" / "train_mlp.py"


def test_train_mlp_reaches_95_percent(capsys):
    spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    acc = example.main(["--epochs", "30", "--seed", "0"])
    assert acc >= 0.95
    assert "test accuracy" in capsys.readouterr().out
